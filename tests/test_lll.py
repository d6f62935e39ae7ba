"""Laplacian eigenmaps, spectral clustering and Locally Linear Landmarks (dissertation ch. 4)."""
import itertools

import numpy as np
import pytest
import scipy.sparse

import gpuembed as ge
from gpuembed.metrics import procrustes_error
from gpuembed.spectral import choose_landmarks, kmeans, reconstruction_weights


@pytest.fixture(scope="module")
def roll():
    X, t = ge.datasets.swiss_roll(4000, random_state=0)
    exact = ge.LaplacianEigenmaps(2, n_neighbors=20, backend="cpu").fit_transform(X)
    return X, t, exact


def test_exact_le_unrolls_the_roll(roll):
    X, t, exact = roll
    assert abs(np.corrcoef(exact[:, 0], t)[0, 1]) > 0.95


def test_all_points_as_landmarks_reproduce_the_exact_solution(roll):
    X, _, _ = roll
    X = X[:800]
    exact = ge.LaplacianEigenmaps(2, n_neighbors=20, backend="cpu").fit_transform(X)
    lll = ge.LaplacianEigenmaps(2, n_neighbors=20, n_landmarks=800, kz=1, backend="cpu")
    assert procrustes_error(exact, lll.fit_transform(X)) < 1e-8


def test_lll_error_decreases_with_landmarks_and_is_small_at_300(roll):
    X, _, exact = roll
    errors = [procrustes_error(exact, ge.LaplacianEigenmaps(
        2, n_neighbors=20, n_landmarks=L, random_state=0, backend="cpu").fit_transform(X))
        for L in (100, 300, 1000)]
    print("Procrustes error for L = 100, 300, 1000:", errors)
    assert errors[0] > errors[1] > errors[2]
    assert errors[1] < 0.10


def test_out_of_sample_of_training_points(roll):
    X, _, _ = roll
    model = ge.LaplacianEigenmaps(2, n_neighbors=20, n_landmarks=300, random_state=0,
                                  backend="cpu").fit(X)
    mapped = model.transform(X[:50])
    np.testing.assert_allclose(mapped, model.embedding_[:50], rtol=1e-8, atol=1e-10)
    lm = model.landmarks_[:5]
    np.testing.assert_allclose(model.transform(X[lm]), model.landmark_embedding_[:5], atol=1e-12)
    exact = ge.LaplacianEigenmaps(2, n_neighbors=20, backend="cpu").fit(X[:1000])
    np.testing.assert_allclose(exact.transform(X[:10]), exact.embedding_[:10], atol=1e-12)
    # A new point between training points lands between their embeddings.
    new = exact.transform((X[:1] + X[1:2]) / 2)
    assert np.linalg.norm(new - exact.embedding_[0]) < 2 * np.linalg.norm(
        exact.embedding_[0] - exact.embedding_[1]) + 1e-12


@pytest.mark.parametrize("loops", [False, True])
@pytest.mark.parametrize("kz, path", [(3, "dense"), (4, "products"), (3, "products (L)"),
                                      (3, "products (rows)")])
def test_laplacian_reduced_matrices_against_dense_products(rng, loops, kz, path, monkeypatch):
    """laplacian_reduced: Z^T (D - W) Z and Z^T D Z, D = diag(W 1), as dense
    products, for a symmetric W with and without a diagonal (the half of W it
    multiplies leaves the diagonal out), by its dense sums (kz <= 3) and by
    sparse products (kz = 4; more landmarks than DENSE_REDUCED_L; rows of Z
    with other numbers of landmarks)."""
    from gpuembed.spectral import lll

    n, L = 120, 15
    W = scipy.sparse.random(n, n, density=0.1, random_state=1, format="lil")
    W.setdiag(rng.random(n) if loops else 0.0)
    W = scipy.sparse.csr_matrix(W + W.T)
    W.eliminate_zeros()
    assert W.diagonal().any() == loops
    Z = reconstruction_weights(rng.standard_normal((n, 3)), rng.standard_normal((L, 3)), kz)
    if path == "products (L)":
        monkeypatch.setattr(lll, "DENSE_REDUCED_L", L - 1)
    if path == "products (rows)":
        Z = Z.tolil()
        Z[5, Z.rows[5][0]] = 0.0
        Z = Z.tocsr()
    ran = []
    reduced_dense = lll.reduced_dense
    monkeypatch.setattr(lll, "reduced_dense", lambda *a: ran.append(1) or reduced_dense(*a))
    A, B = lll.laplacian_reduced(Z, W)
    assert bool(ran) == (path == "dense")
    Wd, Zd = W.toarray(), Z.toarray()
    D = np.diag(Wd.sum(axis=1))
    assert scipy.sparse.issparse(A) and scipy.sparse.issparse(B)
    np.testing.assert_allclose(A.toarray(), Zd.T @ (D - Wd) @ Zd, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(B.toarray(), Zd.T @ D @ Zd, rtol=1e-12, atol=1e-12)


@pytest.fixture(scope="module")
def reduced_problems(roll):
    """Reduced matrices (A, B) of 2,000 landmarks of the swiss roll (a smooth
    manifold) and of 1,600 landmarks of 5,000 points of a 10-D Gaussian."""
    from gpuembed.spectral import affinity_graph
    from gpuembed.spectral import lll

    blob = np.random.default_rng(0).standard_normal((5000, 10))
    problems = {}
    for name, X, sigma, L in (("roll", roll[0], 1.5, 2000), ("blob", blob, 2.0, 1600)):
        Z = reconstruction_weights(X, X[lll.choose_landmarks(X, L, random_state=0)], 3)
        problems[name] = lll.laplacian_reduced(Z, affinity_graph(X, 20, sigma=sigma))
    return problems


def record_stages(monkeypatch):
    """A list to which each LOBPCG run of the reduced problem appends its
    preconditioner, told by its tolerance: "sparsified" or "factor"."""
    from gpuembed.spectral import lll

    ran = []
    lobpcg = lll._lobpcg
    monkeypatch.setattr(lll, "_lobpcg", lambda A, B, X, M, tol, *rest: ran.append(
        "sparsified" if tol == lll.SPARSIFIED_TOL else "factor")
        or lobpcg(A, B, X, M, tol, *rest))
    return ran


@pytest.mark.parametrize("data, sparse_factor, sparsified_maxiter, factor_maxiter, stages", [
    ("blob", False, None, None, ["sparsified"]),
    ("roll", False, None, None, ["sparsified"]),
    ("roll", True, None, None, ["factor"]),
    ("roll", False, 1, None, ["sparsified", "factor"]),
    ("roll", False, 1, 1, ["sparsified", "factor", "dense"]),
    ("roll", True, None, 1, ["factor", "dense"]),
])
def test_sparse_reduced_eigensolver_equals_dense(reduced_problems, monkeypatch, data,
                                                 sparse_factor, sparsified_maxiter,
                                                 factor_maxiter, stages):
    """Above DENSE_MAX_L landmarks the reduced problem goes to LOBPCG, preconditioned
    by the factor of the sparsified landmark graph and then (or, with
    ``sparse_factor``, at once) by that of A, and to dense eigh where neither run
    converges (one iteration): the same eigenvalues and B-orthonormal vectors (up
    to sign) as dense eigh after any of them."""
    from gpuembed.spectral import lll

    A, B = reduced_problems[data]
    assert scipy.sparse.issparse(A) and A.shape[0] > lll.DENSE_MAX_L
    for name, maxiter in (("SPARSIFIED_MAXITER", sparsified_maxiter),
                          ("FACTOR_MAXITER", factor_maxiter)):
        if maxiter is not None:
            monkeypatch.setattr(lll, name, maxiter)
    ran = record_stages(monkeypatch)
    dense = lll._trailing_dense
    monkeypatch.setattr(lll, "_trailing_dense", lambda *a: ran.append("dense") or dense(*a))
    vals, U = lll.trailing_generalized(A, B, 4, skip=1, sparse_factor=sparse_factor)
    assert ran == stages
    ridge = 1e-12 * B.diagonal().sum() / A.shape[0]
    vals_ref, U_ref = dense(A, B, ridge, 4, 1)
    np.testing.assert_allclose(vals, vals_ref, rtol=1e-7)
    np.testing.assert_allclose(U.T @ (B @ U), np.eye(4), atol=1e-8)
    np.testing.assert_allclose(np.abs(U), np.abs(U_ref), atol=1e-6 * np.abs(U_ref).max())


def test_sparsified_landmark_laplacian(reduced_problems, monkeypatch):
    """The sparsified Laplacian of the landmarks' graph: rows summing to 0, its
    links those of A's negative off-diagonal entries (none for a positive one),
    each landmark keeping (at least) its SPARSIFIED_KAPPA strongest, and
    connected where A's graph is, also at a kappa of 1, which alone splits it."""
    from scipy.sparse.csgraph import connected_components

    from gpuembed.optim.directions import sparsify
    from gpuembed.spectral import lll

    path = np.array([[1.0, -1.0, 0.2], [-1.0, 2.0, -1.0], [0.2, -1.0, 1.0]])   # 0.2: no link
    np.testing.assert_array_equal(
        lll._sparsified_laplacian(scipy.sparse.csr_matrix(path)).toarray(),
        [[1.0, -1.0, 0.0], [-1.0, 2.0, -1.0], [0.0, -1.0, 1.0]])
    A = reduced_problems["blob"][0].toarray()
    A = (A + A.T) / 2                       # as trailing_generalized symmetrizes it
    links = np.where(A < 0, -A, 0.0)
    np.fill_diagonal(links, 0.0)
    for kappa in (lll.SPARSIFIED_KAPPA, 1):
        monkeypatch.setattr(lll, "SPARSIFIED_KAPPA", kappa)
        S = lll._sparsified_laplacian(scipy.sparse.csr_matrix(A)).toarray()
        np.testing.assert_allclose(S.sum(axis=1), 0.0, atol=1e-12 * np.abs(A).max())
        kept = -S
        np.fill_diagonal(kept, 0.0)
        assert np.all((kept == 0) | (kept == links))
        strongest = np.argsort(-links, axis=1, kind="stable")[:, :kappa]
        assert np.all((np.take_along_axis(links, strongest, axis=1) == 0)
                      | (np.take_along_axis(kept, strongest, axis=1) > 0))
        assert connected_components(kept, directed=False)[0] == 1
    alone = sparsify(ge.get_backend("cpu"), scipy.sparse.csr_matrix(links), 1)
    assert connected_components(alone, directed=False)[0] > 1


def separated_clusters(noise, sigma):
    """5 Gaussian clusters of 400 points (10-D) with ``noise`` added, and their
    15-NN Gaussian graph of width ``sigma``."""
    from gpuembed.spectral import affinity_graph

    X, _ = ge.datasets.gaussian_clusters(2000, 5, 10, random_state=3)
    X = X + np.random.default_rng(0).normal(scale=noise, size=X.shape)
    return X, affinity_graph(X, 15, sigma=sigma, backend="cpu")


@pytest.mark.parametrize("d", [2, 4])
@pytest.mark.parametrize("z_neighbors", ["input", "graph"])
def test_lll_of_separated_clusters_takes_the_exact_component_vectors(d, z_neighbors):
    """A graph of 5 components and at most as many vectors wanted: LLL's vectors
    of eigenvalue 0 are the components' as exact LE takes them, in its order (the
    data graph's components by first point), so the two agree to rounding (a
    solver's basis of that multiple eigenvalue had been 0.95-1.0 off, and the
    components taken by first landmark 0.70-0.83 at d = 2)."""
    X, _ = separated_clusters(2.0, 0.5)
    kw = dict(n_neighbors=15, sigma=0.5, backend="cpu")
    exact = ge.LaplacianEigenmaps(d, **kw).fit_transform(X)
    lll = ge.LaplacianEigenmaps(d, n_landmarks=600, z_neighbors=z_neighbors, random_state=0,
                                **kw).fit_transform(X)
    assert procrustes_error(exact, lll) < 1e-10


@pytest.mark.parametrize("solver", ["eigh", "lobpcg"])
def test_reduced_problem_of_a_split_graph(monkeypatch, solver):
    """3 components of the landmarks' graph and 5 vectors wanted: the first 3 of
    eigenvalue 0, constant on each component (the first the constant vector, as
    exact LE takes them, not a solver's basis of them), the other 2 eigenvectors
    B-orthogonal to them, by eigh or by LOBPCG (constrained to B's orthogonal
    complement of the 3): the same vectors either way."""
    from scipy.sparse.csgraph import connected_components

    from gpuembed.spectral import lll

    X, W = separated_clusters(3.0, 2.0)
    Z = reconstruction_weights(X, X[choose_landmarks(X, 600, random_state=0)], 5)
    A, B = lll.laplacian_reduced(Z, W)
    n_comp, labels = connected_components(abs(A) + abs(B), directed=False)
    assert n_comp == 3
    if solver == "eigh":
        monkeypatch.setattr(lll, "DENSE_MAX_L", 10 ** 9)
    else:
        monkeypatch.setattr(lll, "DENSE_MAX_L", 0)
        monkeypatch.setattr(lll, "LANDMARKS_PER_VECTOR", 1)
    ran = record_stages(monkeypatch)
    vals, U = lll.trailing_generalized(A, B, 5)
    assert ran == ([] if solver == "eigh" else ["sparsified"])
    ridge = 1e-12 * B.diagonal().sum() / A.shape[0]
    vals_ref, U_ref = lll._trailing_dense(A, B, ridge, 5, 0)   # any basis of eigenvalue 0
    np.testing.assert_allclose(vals[3:], vals_ref[3:], rtol=1e-6)
    np.testing.assert_allclose(np.abs(U[:, 3:]), np.abs(U_ref[:, 3:]),
                               atol=1e-6 * np.abs(U_ref).max())
    assert procrustes_error(U_ref[:, :3], U[:, :3]) < 1e-6
    np.testing.assert_array_equal(vals[:3], 0.0)
    assert (vals[3:] > 1e-8).all()
    np.testing.assert_allclose(U[:, 0], U[0, 0], rtol=1e-12)     # exact LE's: 1 first
    for c in range(3):
        np.testing.assert_allclose(U[labels == c, :3], U[labels == c][:1, :3].repeat(
            (labels == c).sum(), axis=0), rtol=0, atol=1e-12 * np.abs(U).max())
    np.testing.assert_allclose(U.T @ (B @ U), np.eye(5), atol=1e-8)
    np.testing.assert_allclose(A @ U, (B @ U) * vals, atol=1e-7 * abs(A).max())


@pytest.mark.parametrize("solver", ["eigh", "lobpcg"])
def test_reduced_problem_with_landmarks_of_tiny_degree(monkeypatch, solver):
    """The Laplacian and degrees (A0, B0) of a 20 x 20 grid of random weights
    scaled by S = diag(s), s 2^-40 on three landmarks (as if their points'
    degrees were 1e-24 of the others'): S A0 S u' = lambda S B0 S u' has A0's
    eigenvalues, with u = S u'.  A ridge of 1e-12 of B's mean diagonal swamped
    those three B_ll, and two of them gave eigenvalues near 0 (A_ll / ridge,
    2e-13 and 4e-13) with vectors on them alone, the others shifted down: the
    ridge is now relative to each landmark's own B_ll."""
    from gpuembed.spectral import lll

    path, ones = scipy.sparse.diags(np.ones(19), 1), scipy.sparse.identity(20)
    W = (scipy.sparse.kron(path + path.T, ones) + scipy.sparse.kron(ones, path + path.T)).tocsr()
    W.data = np.random.default_rng(0).uniform(0.5, 1.5, W.data.size)
    W = (W + W.T) / 2
    L = W.shape[0]
    degree = np.asarray(W.sum(axis=1)).ravel()
    A0, B0 = (scipy.sparse.diags(degree) - W).tocsr(), scipy.sparse.diags(degree).tocsr()
    s = np.ones(L)
    s[[7, 150, 301]] = 2.0**-40                # exact: the scaled problem rounds as A0's
    S = scipy.sparse.diags(s)
    A, B = (S @ A0 @ S).tocsr(), (S @ B0 @ S).tocsr()
    if solver == "eigh":
        monkeypatch.setattr(lll, "DENSE_MAX_L", 10 ** 9)
    else:
        monkeypatch.setattr(lll, "DENSE_MAX_L", 0)
    vals, U = lll.trailing_generalized(A, B, 4, skip=1)
    ref = scipy.linalg.eigh(A0.toarray(), B0.toarray(), subset_by_index=[1, 4])[0]
    np.testing.assert_allclose(vals, ref, rtol=1e-9)
    np.testing.assert_allclose(U.T @ (B @ U), np.eye(4), atol=1e-8)


def test_lll_of_a_weak_graph_has_no_columns_on_lone_landmarks():
    """Clusters with noise 1.0 and width 0.5, whose 15-NN weights fall to 1e-36,
    6 vectors from 1,000 landmarks: two columns of LLL's embedding had norms of
    3.6e7, on the landmarks whose points' degrees fell below the reduced problem's
    ridge, where exact LE's largest is 504 (a vector on near-isolated points);
    now 168 at most."""
    X, _ = ge.datasets.gaussian_clusters(2000, 5, 10, random_state=3)
    X = X + np.random.default_rng(0).normal(scale=1.0, size=X.shape)
    kw = dict(n_neighbors=15, sigma=0.5, backend="cpu")
    exact = ge.LaplacianEigenmaps(6, **kw).fit_transform(X)
    lll = ge.LaplacianEigenmaps(6, n_landmarks=1000, random_state=0, **kw).fit_transform(X)
    assert np.linalg.norm(lll, axis=0).max() < 2 * np.linalg.norm(exact, axis=0).max()
    np.testing.assert_allclose(np.abs(lll[:, :4]), np.abs(exact[:, :4]), rtol=1e-8,
                               atol=1e-10 * np.abs(exact).max())   # the components'
    assert procrustes_error(exact[:, :4], lll[:, :4]) < 1e-10


def test_lll_of_duplicated_points(roll):
    """Every point twice: where both copies of a point are landmarks, the points
    take one of them, and the other reconstructs none (a zero row and column of
    the reduced matrices, an eigenvalue 0 whose vectors had taken the
    embedding's place: Procrustes error 0.75-1.0 against exact LE).  Such
    landmarks now stay out of the eigenproblem and take their copy's
    coordinates."""
    X = np.concatenate([roll[0][:2000]] * 2)
    exact = ge.LaplacianEigenmaps(2, n_neighbors=20, backend="cpu").fit_transform(X)
    errors = []
    for L in (600, 1600):
        est = ge.LaplacianEigenmaps(2, n_neighbors=20, n_landmarks=L, random_state=0,
                                    backend="cpu")
        Y = est.fit_transform(X)
        unused = np.flatnonzero(abs(est.Z_).sum(axis=0).A.ravel() == 0)
        assert len(unused) > 0
        copies = est.landmarks_[unused] % 2000
        np.testing.assert_array_equal(est.landmark_embedding_[unused], Y[copies])
        np.testing.assert_allclose(est.transform(X[:100]), Y[:100], atol=1e-12)
        errors.append(procrustes_error(exact, Y))
    assert errors[0] < 0.1 and errors[1] < errors[0]


@pytest.mark.filterwarnings("ignore:.*all neighbour distances equal:RuntimeWarning")
@pytest.mark.parametrize("distinct", [1, 2])
def test_lll_of_fewer_distinct_points_than_vectors_names_n_landmarks(distinct):
    """Data of 1 or 2 distinct points, each repeated: every landmark is a copy of
    one of them, and only 1 or 2 of them reconstruct points, fewer than the 3
    vectors LLL solves for (2 and the constant one).  A ValueError naming
    n_landmarks, where LAPACK's had said "Requested eigenvalue indices are not
    valid"; along the graph's Z, which reaches the copies too, the fit works."""
    X = np.repeat(np.random.default_rng(0).normal(size=(distinct, 3)), 60 // distinct, axis=0)
    kw = dict(n_neighbors=5, n_landmarks=10, random_state=0, backend="cpu")
    for est in (ge.LaplacianEigenmaps(2, **kw), ge.SpectralClustering(2, **kw),
                ge.LaplacianEigenmaps(2, landmarks="spread", **kw)):
        if isinstance(est, ge.SpectralClustering) and distinct == 2:
            continue                    # 2 vectors: 2 distinct landmarks are enough
        with pytest.raises(ValueError, match=rf"n_landmarks: {distinct} of the 10 landmarks "
                                             r"reconstruct any point .* fewer than the"):
            est.fit(X)
    Y = ge.LaplacianEigenmaps(2, z_neighbors="graph", **kw).fit_transform(X)
    assert np.isfinite(Y).all()


def test_lll_does_not_depend_on_the_number_of_blas_threads():
    """The landmarks' distances (a GEMM) and the dense reduced eigenproblem (LAPACK)
    gave other last bits on 1 and 2 OpenBLAS threads; now on one thread."""
    import threadpoolctl

    X, _ = ge.datasets.gaussian_clusters(3000, 6, 400, random_state=2)
    fits = []
    for threads in (1, 2):
        with threadpoolctl.threadpool_limits(threads, user_api="blas"):
            fits.append(ge.LaplacianEigenmaps(2, n_neighbors=10, n_landmarks=600,
                                              random_state=0, backend="cpu").fit_transform(X))
    np.testing.assert_array_equal(fits[0], fits[1])


def test_reconstruction_weights_are_local_affine_and_reconstruct(rng):
    landmarks = rng.standard_normal((200, 3))
    Y = rng.standard_normal((100, 3)) * 0.8
    Z = reconstruction_weights(Y, landmarks, 4)
    np.testing.assert_allclose(np.asarray(Z.sum(axis=1)).ravel(), 1.0)          # eq. 4.6
    assert (np.diff(Z.indptr) == 4).all()
    D = ((Y[:, None] - landmarks[None]) ** 2).sum(-1)
    nearest4 = np.sort(np.argsort(D, axis=1)[:, :4], axis=1)
    np.testing.assert_array_equal(np.sort(Z.indices.reshape(100, 4), axis=1), nearest4)
    # Locally linear reconstruction beats snapping to the nearest landmark by far.
    err = np.linalg.norm(Z @ landmarks - Y, axis=1)
    snap = np.sqrt(D.min(axis=1))
    assert np.median(err) < 0.1 * np.median(snap)


@pytest.mark.parametrize("sparse", [False, True])
def test_reconstruction_weights_solve_each_points_gram_system(rng, sparse):
    """Each row of Z against its local Gram system built from the differences
    y - l_j (eqs 4.7-4.8, with the ridge); the Gram entries of the code come from
    distances alone, between landmarks only for the pairs that some point uses
    (dense rows) or for all (sparse rows).  An odd number of landmarks: the
    compiled pairs run rows t and L - 1 - t together."""
    from gpuembed.spectral import lll
    landmarks = rng.standard_normal((201, 3)) + 5
    Y = rng.standard_normal((150, 3)) * 0.8 + 5
    as_input = scipy.sparse.csr_matrix if sparse else np.asarray
    Z = reconstruction_weights(as_input(Y), as_input(landmarks), 4)
    for n in range(len(Y)):
        nb = Z.indices[Z.indptr[n]:Z.indptr[n + 1]]
        diff = Y[n] - landmarks[nb]
        G = diff @ diff.T
        G += lll.REGULARIZATION * np.trace(G) / 4 * np.eye(4)
        w = np.linalg.solve(G, np.ones(4))
        np.testing.assert_allclose(Z.data[Z.indptr[n]:Z.indptr[n + 1]], w / w.sum(),
                                   rtol=1e-7, atol=1e-9)


def test_small_solver_pivots(rng):
    """The local Gram systems' elimination against NumPy's, on matrices whose
    leading entry is 0 (a row swap is needed) and on random ones."""
    from gpuembed.spectral.lll_cpu import _solve_in_place
    for G in (np.array([[0.0, 2.0, 1.0], [1.0, 1.0, 0.0], [3.0, 0.0, 1.0]]),
              rng.standard_normal((6, 6))):
        b = rng.standard_normal(G.shape[0])
        w = b.copy()
        _solve_in_place(G.copy(), w)
        np.testing.assert_allclose(w, np.linalg.solve(G, b), rtol=1e-10, atol=1e-12)


def test_landmark_pair_distances_are_those_of_the_pairs_in_use(rng):
    from gpuembed.spectral.lll_cpu import landmark_pair_sqdist
    landmarks = rng.standard_normal((31, 5))
    neighbours = rng.integers(0, 31, (40, 3))
    out = landmark_pair_sqdist(landmarks, neighbours)
    brute = ((landmarks[:, None] - landmarks[None]) ** 2).sum(-1)
    a, b = neighbours[:, :, None], neighbours[:, None, :]
    np.testing.assert_allclose(out[a, b], brute[a, b], rtol=1e-13, atol=1e-14)
    np.testing.assert_array_equal(np.diag(out), 0.0)


@pytest.mark.parametrize("method", ["random", "random-pruned", "kmeans"])
def test_landmark_choices(rng, method):
    Y = rng.standard_normal((500, 2))
    idx = choose_landmarks(Y, 50, method, random_state=0)
    assert len(np.unique(idx)) == len(idx) and 40 <= len(idx) <= 50
    assert idx.min() >= 0 and idx.max() < 500


def test_pruned_landmarks_are_more_spread_out(rng):
    Y = rng.random((2000, 2))
    def min_gap(idx):
        D = ((Y[idx, None] - Y[None, idx]) ** 2).sum(-1)
        np.fill_diagonal(D, np.inf)
        return np.sqrt(D.min(axis=1)).mean()
    gaps = [min_gap(choose_landmarks(Y, 100, m, random_state=s))
            for m in ("random", "random-pruned") for s in range(5)]
    assert np.mean(gaps[5:]) > np.mean(gaps[:5])


def test_kmeans_landmarks_find_each_separated_cluster():
    """k-means landmarks are the points nearest to the centroids: 8 landmarks on 8
    separated clusters (20-D) fall one in each cluster for 19 of 20 seeds (one
    k-means run can end in a local minimum; 16 of 20 with the seeds drawn among all
    of the sample and 50 iterations), random landmarks for 1 of 20."""
    X, y = ge.datasets.gaussian_clusters(2000, 8, 20, random_state=0)

    def covering(method):
        return sum(len(set(y[choose_landmarks(X, 8, method, random_state=seed)])) == 8
                   for seed in range(20))
    assert covering("kmeans") >= 17
    assert covering("random") <= 3
    np.testing.assert_array_equal(choose_landmarks(scipy.sparse.csr_matrix(X), 8, "kmeans",
                                                   random_state=0),
                                  choose_landmarks(X, 8, "kmeans", random_state=0))


def test_spectral_clustering_with_lll_is_perfect_on_separated_clusters():
    from sklearn.metrics import adjusted_rand_score

    X, y = ge.datasets.gaussian_clusters(3000, 5, 10, random_state=2)
    exact = ge.SpectralClustering(5, n_neighbors=15, random_state=0, backend="cpu").fit_predict(X)
    lll = ge.SpectralClustering(5, n_neighbors=15, n_landmarks=200, random_state=0,
                                backend="cpu").fit_predict(X)
    assert adjusted_rand_score(y, exact) == 1.0
    assert adjusted_rand_score(y, lll) == 1.0


@pytest.mark.parametrize("params", [{}, {"n_landmarks": 150}], ids=["exact", "lll"])
def test_spectral_clustering_predicts_new_points(params):
    """predict gives the training points their labels_ back and puts held-out
    points of separated clusters in their cluster, through the out-of-sample
    embedding (exact: from the nearest training points; LLL: from the landmarks)."""
    from sklearn.metrics import adjusted_rand_score

    X, y = ge.datasets.gaussian_clusters(2400, 5, 10, random_state=3)
    train, held = slice(0, 2000), slice(2000, None)
    model = ge.SpectralClustering(5, n_neighbors=15, random_state=0, backend="cpu",
                                  **params).fit(X[train])
    np.testing.assert_array_equal(model.predict(X[train]), model.labels_)
    assert adjusted_rand_score(y[train], model.labels_) == 1.0
    labels = model.predict(X[held])
    # the held-out points take their own cluster's training label
    cluster_label = {c: np.bincount(model.labels_[y[train] == c]).argmax() for c in range(5)}
    np.testing.assert_array_equal(labels, [cluster_label[c] for c in y[held]])
    with pytest.raises(ValueError, match="features"):
        model.predict(X[held, :3])
    with pytest.raises(ge.NotFittedError, match="call fit before predict"):
        ge.SpectralClustering(5, n_neighbors=15).predict(X)


def test_kmeans_is_a_lloyd_fixed_point_for_dense_and_sparse_rows(rng, monkeypatch):
    """At its end each centre is the mean of its points, each label the nearest
    centre and the inertia their squared distances' sum (brute force); the
    compiled assignment (dense rows, few centre entries), the distances' GEMM in
    blocks of rows and sparse rows give the same clusters; k-means++'s distances to
    a row, from the squared norms, are the differences' ones."""
    import importlib
    km = importlib.import_module("gpuembed.spectral.kmeans")
    X = rng.standard_normal((400, 6)) + 6.0 * rng.integers(0, 4, (400, 1))
    assert 4 * 6 <= km.COMPILED_MAX_CENTER_ENTRIES
    labels, centres, inertia = kmeans(X, 4, n_init=3, random_state=0, tol=0)
    D = ((X[:, None] - centres[None]) ** 2).sum(axis=-1)
    np.testing.assert_array_equal(labels, D.argmin(axis=1))
    np.testing.assert_allclose(centres, [X[labels == c].mean(axis=0) for c in range(4)],
                               rtol=1e-12)
    assert inertia == pytest.approx(D.min(axis=1).sum(), rel=1e-12)
    sparse = kmeans(scipy.sparse.csr_matrix(X), 4, n_init=3, random_state=0, tol=0)
    monkeypatch.setattr(km, "COMPILED_MAX_CENTER_ENTRIES", 0)
    monkeypatch.setattr(km, "TILE_ROWS", 64)        # the distances in 7 blocks, one partial
    gemm = kmeans(X, 4, n_init=3, random_state=0, tol=0)
    for other in (sparse, gemm):
        np.testing.assert_array_equal(other[0], labels)
        np.testing.assert_allclose(other[1], centres, rtol=1e-12)
        assert other[2] == pytest.approx(inertia, rel=1e-12)
    # Equal distances go to the first centre, as argmin's.
    labels2, nearest2 = np.empty(2, dtype=np.int64), np.empty(2)
    km.assign(np.array([[0.0, 0.0], [1.0, 1.0]]), np.array([[1.0, 0.0], [0.0, 1.0]]),
              labels2, nearest2)
    np.testing.assert_array_equal(labels2, [0, 0])
    np.testing.assert_array_equal(nearest2, [1.0, 1.0])
    for rows in (X, scipy.sparse.csr_matrix(X)):
        np.testing.assert_allclose(km._sqdist_to_row(rows, 7, (X * X).sum(axis=1)),
                                   ((X - X[7]) ** 2).sum(axis=1), rtol=1e-9, atol=1e-9)


def test_kmeans_landmarks_snap_to_the_nearest_point_in_blocks(rng, monkeypatch):
    """Each k-means landmark is the data point nearest to its centre, found block
    by block of the data's rows (here 7 rows, the last block partial): the first
    of equally near points, as argmin over all of them."""
    import importlib
    km = importlib.import_module("gpuembed.spectral.kmeans")
    lll = importlib.import_module("gpuembed.spectral.lll")
    Y = rng.standard_normal((40, 3))
    Y[31] = Y[2]                              # a tie across blocks goes to the first
    Y[5] = Y[3]                               # and one within a block
    centres = np.concatenate([Y[[2, 3]] + 1e-3, rng.standard_normal((10, 3))])
    monkeypatch.setattr(km, "TILE_ROWS", 7)
    nearest = lll._nearest_rows(centres, Y)
    np.testing.assert_array_equal(
        nearest, ((centres[:, None] - Y[None]) ** 2).sum(axis=-1).argmin(axis=1))
    assert list(nearest[:2]) == [2, 3]
    np.testing.assert_array_equal(lll._nearest_rows(centres, scipy.sparse.csr_matrix(Y)),
                                  nearest)


def test_kmeans_distances_do_not_depend_on_the_number_of_threads(rng):
    """The distances to many centres (a GEMM): one 5,000 x 200 product gave other
    bits on 1 and 2 OpenBLAS threads; now fixed blocks of rows, each on one BLAS
    thread, whatever the number of numba's or BLAS's threads."""
    import numba
    import threadpoolctl

    from gpuembed.spectral.kmeans import nearest_centers

    X = rng.standard_normal((5000, 300))
    centres = X[rng.choice(5000, 200, replace=False)] + 0.01
    threads, results = numba.get_num_threads(), []
    try:
        for n_threads in (1, 2):
            numba.set_num_threads(min(n_threads, numba.config.NUMBA_NUM_THREADS))
            with threadpoolctl.threadpool_limits(n_threads, user_api="blas"):
                results.append(nearest_centers(X, centres))
    finally:
        numba.set_num_threads(threads)
    for one, two in zip(*results):
        np.testing.assert_array_equal(one, two)
    D = ((X[:500, None] - centres[None]) ** 2).sum(axis=-1)
    np.testing.assert_array_equal(results[0][0][:500], D.argmin(axis=1))
    np.testing.assert_allclose(results[0][1][:500], D.min(axis=1), rtol=1e-9)


@pytest.mark.parametrize("sparse", [False, True])
def test_kmeans_refills_an_empty_cluster_and_warns_when_it_cannot(rng, sparse):
    """A centre that takes no points moves to the point farthest from its centre:
    from three blob centres and one far from every point, four blobs end as four
    clusters with the brute-force optimal inertia (the far centre had stayed
    empty, the inertia 643 times that).  With fewer distinct rows than clusters
    k-means says how many clusters stayed empty and why."""
    blobs = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]])
    X = np.repeat(blobs, 50, axis=0) + 0.1 * rng.standard_normal((200, 2))
    start = np.vstack([blobs[:2], blobs[2:].mean(axis=0), [1e3, 1e3]])
    rows = scipy.sparse.csr_matrix(X) if sparse else X
    labels, centres, inertia = kmeans(rows, 4, init=start)
    best = sum(((X[i * 50:(i + 1) * 50] - X[i * 50:(i + 1) * 50].mean(axis=0)) ** 2).sum()
               for i in range(4))
    assert np.unique(labels).size == 4
    assert inertia == pytest.approx(best, rel=1e-9)
    duplicates = np.repeat(np.eye(3), 20, axis=0)
    with pytest.warns(RuntimeWarning, match="left 2 of n_clusters=5 clusters empty: X has "
                                            "only 3 distinct rows"):
        labels, _, inertia = kmeans(scipy.sparse.csr_matrix(duplicates) if sparse
                                    else duplicates, 5, random_state=0)
    assert np.unique(labels).size == 3 and inertia == 0.0


def test_kmeans_warm_start_matches_restarts(rng):
    centres = rng.standard_normal((6, 4)) * 8
    X = np.concatenate([c + rng.standard_normal((300, 4)) for c in centres])
    _, _, cold = kmeans(X, 6, n_init=10, random_state=0)
    sub = X[rng.choice(len(X), 200, replace=False)]
    _, warm_centres, _ = kmeans(sub, 6, n_init=10, random_state=0)
    _, _, warm = kmeans(X, 6, init=warm_centres)
    assert warm == pytest.approx(cold, rel=1e-9)


@pytest.mark.parametrize("make,match", [
    (lambda: ge.LaplacianEigenmaps(2, n_neighbors=10, n_landmarks=500), "n_landmarks"),
    (lambda: ge.LaplacianEigenmaps(2, n_neighbors=10, n_landmarks=50, kz=0), "kz"),
    (lambda: ge.LaplacianEigenmaps(2, n_neighbors=10, n_landmarks=50, kz=51), "kz"),
    (lambda: ge.LaplacianEigenmaps(2, n_neighbors=10, landmarks="grid", n_landmarks=50),
     "landmarks"),
    (lambda: ge.SpectralClustering(400, n_neighbors=10), "n_clusters"),
    (lambda: ge.LaplacianEigenmaps(2, n_neighbors=0), "n_neighbors"),
    (lambda: ge.LaplacianEigenmaps(2, n_neighbors=10, sigma=-1.0), "sigma"),
    (lambda: ge.LaplacianEigenmaps(2, n_neighbors=10, sigma=1.0, perplexity=5.0), "not both"),
    (lambda: ge.LaplacianEigenmaps(2, n_neighbors=10, n_landmarks=50, refine=-1), "refine"),
])
def test_bad_arguments(make, match):
    X = np.random.default_rng(0).standard_normal((300, 3))
    with pytest.raises(ValueError, match=match):
        make().fit(X)


def test_bad_arguments_of_the_functions():
    from gpuembed.spectral import kernel_pca_lll, landmark_basis

    X = np.random.default_rng(0).standard_normal((100, 3))
    with pytest.raises(ValueError, match="d must be >= 1, got 0"):
        landmark_basis(X, 0, 20)
    with pytest.raises(ValueError, match="block must be >= 1, got 0"):
        kernel_pca_lll(X, 2, sigma=1.0, n_landmarks=20, block=0)
    Xn = X.copy()
    Xn[5, 2] = np.nan
    for call, match in (
            (lambda: kmeans(X, 0), "n_clusters must be in \\[1, 100\\], got 0"),
            (lambda: kmeans(X, 101), "n_clusters must be in \\[1, 100\\], got 101"),
            (lambda: kmeans(Xn, 3), "X contains NaN"),
            (lambda: kmeans(X[:, 0], 3), "X must be 2-D"),
            (lambda: kmeans(X, 3, n_init=0), "n_init must be >= 1"),
            (lambda: kmeans(X, 3, max_iter=0), "max_iter must be >= 1"),
            (lambda: kmeans(X, 3, tol=-1.0), "tol must be"),
            (lambda: kmeans(X, 3, init=X[:2]), "init must hold n_clusters x n_features"),
            (lambda: choose_landmarks(Xn, 20, "kmeans"), "Y contains NaN"),
            (lambda: choose_landmarks(X[:, 0], 20), "Y must be 2-D"),
            (lambda: landmark_basis(Xn, 2, 20), "X contains NaN")):
        with pytest.raises(ValueError, match=match):
            call()
    with pytest.raises(TypeError, match="n_clusters must be an integer"):
        kmeans(X, 2.5)
    with pytest.raises(TypeError, match="refine must be an integer"):
        ge.LaplacianEigenmaps(2, n_neighbors=10, n_landmarks=20, refine=0.5).fit(X)


def test_nan_and_transform_errors():
    X = np.random.default_rng(0).standard_normal((100, 3))
    Xn = X.copy()
    Xn[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        ge.LaplacianEigenmaps(2, n_neighbors=10).fit(Xn)
    model = ge.LaplacianEigenmaps(2, n_neighbors=10, backend="cpu").fit(X)
    with pytest.raises(ValueError, match="features"):
        model.transform(X[:, :2])
    with pytest.raises(ge.NotFittedError, match="call fit before transform"):
        ge.LaplacianEigenmaps(2, n_neighbors=10).transform(X)
    # Empty or one-point data is named as such, not as an out-of-range n_components.
    for model in (ge.LaplacianEigenmaps(2, n_neighbors=10),
                  ge.SpectralClustering(2, n_neighbors=10)):
        for data in (X[:0], X[:1]):
            with pytest.raises(ValueError, match="X needs at least 3 samples"):
                model.fit(data)
    with pytest.raises(ValueError, match="random_state"):
        ge.SpectralClustering(2, n_neighbors=10, random_state=-3).fit(X)


@pytest.mark.parametrize("estimator,grid", [
    (ge.LaplacianEigenmaps(2, n_neighbors=10, n_landmarks=120, random_state=0, backend="cpu"),
     {"sigma": [0.5, 2.0], "n_neighbors": [5, 15]}),
    (ge.LaplacianEigenmaps(2, n_neighbors=10, random_state=0, backend="cpu"),
     {"perplexity": [3.0, 8.0], "n_neighbors": (12, 30)}),
    (ge.SpectralClustering(4, n_neighbors=10, n_landmarks=80, random_state=0, backend="cpu"),
     {"sigma": np.array([1.0, 3.0]), "n_neighbors": [8, 20]}),
    (ge.LaplacianEigenmaps(2, n_neighbors=10, n_landmarks=120, kz=2, refine=1, random_state=0,
                           backend="cpu"), {"sigma": [0.5, 2.0], "n_neighbors": [5, 15]}),
])
def test_fit_grid_equals_separate_fits_and_shares_the_search_and_z(estimator, grid,
                                                                     monkeypatch):
    """Section 4.5: the sweep searches the k-NN once (for the largest n_neighbors) and
    builds one Z, yet every point equals the estimator fitted alone with its params."""
    from gpuembed.spectral import laplacian, lll

    X, _ = ge.datasets.gaussian_clusters(500, 4, 6, random_state=0)
    calls = {"knn": [], "reconstruction_weights": 0}
    knn, weights = laplacian.SEARCHES["auto"], lll.reconstruction_weights
    monkeypatch.setitem(laplacian.SEARCHES, "auto", lambda X, k, **kw: calls["knn"].append(k)
                        or knn(X, k, **kw))
    monkeypatch.setattr(lll, "reconstruction_weights", lambda *a, **kw: (
        calls.__setitem__("reconstruction_weights", calls["reconstruction_weights"] + 1)
        or weights(*a, **kw)))
    results = ge.spectral.fit_grid(estimator, X, grid)
    assert calls == {"knn": [max(grid["n_neighbors"])],
                     "reconstruction_weights": int(estimator.n_landmarks is not None)}
    keys = sorted(grid)              # every combination, as scikit-learn's ParameterGrid
    assert [params for params, _ in results] == [
        dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]
    monkeypatch.undo()
    for params, fitted in results:
        alone = type(estimator)(**{**estimator.get_params(), **params}).fit(X)
        np.testing.assert_array_equal(fitted.embedding_, alone.embedding_)
        if isinstance(estimator, ge.SpectralClustering):
            np.testing.assert_array_equal(fitted.labels_, alone.labels_)
        else:
            np.testing.assert_array_equal(fitted.transform(X[:5]), alone.transform(X[:5]))
        assert fitted.get_params() == {**estimator.get_params(), **params}


def test_fit_grid_with_lll_follows_the_exact_model_selection_curve():
    """Model selection with LLL (figs 4.7 and 4.14): over a range of Gaussian widths
    the clustering error of LLL spectral clustering follows the exact one's, both
    failing at the narrowest width (measured 0.20 and 0.20) and near 0 from the
    third on (0.001-0.003), and the width LLL's sweep picks clusters exactly too.
    At the second width the exact error is 0.20 against LLL's 0.006: that graph has
    3 components, and the 2 vectors beyond them (eigenvalues 1, 1, 1, 0.99999982,
    0.99963, as a dense eigh gives them) do not split the 3 clusters of the
    largest; ARPACK, before the components were deflated, missed one of the three
    and clustered it at 0.001 by that accident."""
    X, y = ge.datasets.gaussian_clusters(2000, 5, 10, random_state=3)
    X = X + np.random.default_rng(0).normal(scale=3.0, size=X.shape)
    grid = {"sigma": [1.0, 2.0, 4.0, 8.0, 16.0]}
    errors = {}
    for L in (None, 200):
        est = ge.SpectralClustering(5, n_neighbors=15, n_landmarks=L, random_state=0,
                                    backend="cpu")
        errors[L] = np.array([ge.metrics.clustering_error(y, fitted.labels_)
                              for _, fitted in ge.spectral.fit_grid(est, X, grid)])
    print("clustering error per sigma, exact:", errors[None], "LLL:", errors[200])
    for e in errors.values():
        assert e[0] > 0.1 and (e[2:] < 0.01).all()
    assert errors[None][1] > 0.1 and errors[200][1] < 0.01
    assert errors[None][np.argmin(errors[200])] < 0.01


def test_one_basis_serves_every_method(digits):
    """Section 4.5's algorithm selection: a landmark basis made once gives PCA, LDA,
    kernel PCA and LE(Z) exactly what each gets building its own from the same
    landmarks and kz."""
    from gpuembed.spectral import (kernel_pca_lll, landmark_basis, lda_lll,
                                   le_landmarks_only, pca_lll)

    X, y = digits
    kw = dict(n_landmarks=200, random_state=0, backend="cpu")
    basis = landmark_basis(X, 2, kz=3, **kw)
    for fn in (lambda **b: pca_lll(X, 2, **b),
               lambda **b: lda_lll(X, y, 2, **b),
               lambda **b: kernel_pca_lll(X, 2, sigma=30.0, **b),
               lambda **b: le_landmarks_only(X, 2, n_neighbors=10, sigma=20.0, **b)):
        np.testing.assert_array_equal(fn(basis=basis, backend="cpu"), fn(kz=3, **kw))
    with pytest.raises(ValueError, match="basis was made for 1797 points, but Y has 100"):
        pca_lll(X[:100], 2, basis=basis)
    with pytest.raises(ValueError, match="n_landmarks is required unless a basis"):
        pca_lll(X, 2)
    with pytest.raises(ValueError, match="n_components"):
        pca_lll(X, 200, basis=basis)


def test_narrow_width_falls_back_to_shift_invert_or_says_why(monkeypatch):
    """A narrow Gaussian leaves M's eigenvalues crowded within rounding of 1: the plain
    Lanczos gave up after 20,000 restarts (17 s) with ArpackNoConvergence.  After
    LANCZOS_MAXITER restarts the CPU now solves by shift-invert, and where even that
    cannot separate them (the graph numerically disconnected) says so (fewer
    restarts here, for time).  The graphs have 5 and 3 components, and more
    vectors are wanted (as many take no solver: the next test)."""
    from gpuembed.spectral import affinity_graph, embedding, spectral_embedding

    monkeypatch.setattr(embedding, "LANCZOS_MAXITER", 100)
    shift_invert = embedding._shift_invert_eigsh
    calls = []
    monkeypatch.setattr(embedding, "_shift_invert_eigsh",
                        lambda *a: calls.append(1) or shift_invert(*a))

    X, _ = ge.datasets.gaussian_clusters(2000, 5, 10, random_state=3)
    X1 = X + np.random.default_rng(0).normal(scale=1.0, size=X.shape)
    W = affinity_graph(X1, 15, sigma=0.5, backend="cpu")
    fallback = spectral_embedding(W, 6, drop_first=False, backend="cpu")
    direct = spectral_embedding(W, 6, drop_first=False, shift_invert=True, backend="cpu")
    assert len(calls) == 2
    assert procrustes_error(direct, fallback) < 1e-6
    X3 = X + np.random.default_rng(0).normal(scale=3.0, size=X.shape)
    with pytest.raises(ValueError, match="numerically disconnected.*wider sigma"):
        ge.SpectralClustering(5, n_neighbors=15, sigma=0.5, backend="cpu").fit(X3)


def test_as_many_vectors_as_components_take_no_eigensolver(monkeypatch):
    """A graph of as many components as vectors wanted (or more): eigenvalue 1's
    vectors, D^1/2 times the components' indicators, without the Lanczos, which
    finds a multiple eigenvalue only through rounding.  On these 5 clusters
    (weights within them down to 1e-62) it and shift-invert failed, and at
    another width ARPACK returned 4 of the 5 and a mixture (ARI 0.82)."""
    from sklearn.metrics import adjusted_rand_score

    from gpuembed.spectral import affinity_graph, embedding, spectral_embedding

    X, y = ge.datasets.gaussian_clusters(2000, 5, 10, random_state=3)
    X2 = X + np.random.default_rng(0).normal(scale=2.0, size=X.shape)
    W = affinity_graph(X2, 15, sigma=0.5, backend="cpu")
    monkeypatch.setattr(embedding, "_largest", None)           # not called
    degree = np.asarray(W.sum(axis=1)).ravel()
    for n_components, drop_first in ((5, False), (4, True), (2, False)):
        Y = spectral_embedding(W, n_components, drop_first=drop_first, backend="cpu")
        np.testing.assert_allclose(Y.T @ (degree[:, None] * Y), np.eye(n_components),
                                   atol=1e-12)
        for c in range(5):                                      # constant on each cluster
            np.testing.assert_allclose(Y[y == c], Y[y == c][:1].repeat(400, axis=0),
                                       rtol=0, atol=1e-12 * np.abs(Y).max())
        if drop_first:                                          # D-orthogonal to 1
            np.testing.assert_allclose(degree @ Y, 0.0, atol=1e-12)
    model = ge.SpectralClustering(5, n_neighbors=15, sigma=0.5, backend="cpu").fit(X2)
    assert adjusted_rand_score(y, model.labels_) == 1.0


def test_more_vectors_than_components_with_the_components_deflated():
    """A graph of 3 components and 5 vectors wanted: the 3 of eigenvalue 1 come
    from the components, the solver finds the other 2 with those deflated, and
    the 5 span what a dense eigh of M gives (the Lanczos on M itself returned a
    basis 0.49 off in Procrustes error, missing one eigenvalue-1 vector).  The
    same columns without the trivial one for Laplacian eigenmaps."""
    import scipy.linalg

    from gpuembed.spectral import affinity_graph, spectral_embedding
    from gpuembed.optim.directions import connected_components

    X, _ = ge.datasets.gaussian_clusters(600, 5, 10, random_state=3)
    X = X + np.random.default_rng(0).normal(scale=3.0, size=X.shape)
    W = affinity_graph(X, 15, sigma=2.0, backend="cpu")
    assert connected_components(ge.get_backend("cpu"), W)[0] == 3
    degree = np.asarray(W.sum(axis=1)).ravel()
    root = np.sqrt(degree)
    _, V = scipy.linalg.eigh(W.toarray() / root[:, None] / root[None, :])
    dense = V[:, -5:] / root[:, None]
    Y = spectral_embedding(W, 5, drop_first=False, backend="cpu")
    assert procrustes_error(dense, Y) < 1e-8
    np.testing.assert_allclose(Y.T @ (degree[:, None] * Y), np.eye(5), atol=1e-10)
    le = spectral_embedding(W, 4, backend="cpu")
    np.testing.assert_allclose(np.abs(le), np.abs(Y[:, 1:]), atol=1e-10)
    np.testing.assert_allclose(degree @ le, 0.0, atol=1e-10)


@pytest.mark.parametrize("n_components", [2, 4])
def test_component_vectors_are_the_same_on_either_backend(backend, n_components):
    """The vectors of a graph of 3 components (3 wanted, or 5: the 2 beyond them
    by the host's deflated solver), from the labels that each backend's
    connected_components gives."""
    from gpuembed.spectral import affinity_graph, spectral_embedding

    X, _ = ge.datasets.gaussian_clusters(300, 3, 5, random_state=0)
    W = affinity_graph(X, 10, sigma=1.0, backend="cpu")
    on_host = spectral_embedding(W, n_components, backend="cpu")
    got = spectral_embedding(backend.sparse.csr_matrix(backend.asarray(W.toarray())),
                             n_components, backend=backend)
    np.testing.assert_allclose(backend.to_host(got), on_host, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("estimator,grid,error,match", [
    ("not an estimator", {"sigma": [1.0]}, TypeError, "estimator"),
    (ge.TSNE(), {"sigma": [1.0]}, TypeError, "estimator"),
    (None, {"n_landmarks": [50, 100]}, ValueError, "grid key"),
    (None, {"sigma": []}, ValueError, "sigma"),
    (None, {"sigma": 1.0}, ValueError, "sigma"),
    (None, {}, ValueError, "grid"),
    (None, {"n_neighbors": [5, 0]}, ValueError, "n_neighbors"),
    (None, {"sigma": [1.0, -2.0]}, ValueError, "sigma"),
    (None, {"perplexity": [3.0]}, ValueError, "not both"),
    (None, {"sigma": "1.0"}, ValueError, "sigma"),
])
def test_fit_grid_bad_arguments(estimator, grid, error, match, monkeypatch):
    """Every grid point's parameters are checked before the shared search."""
    from gpuembed.spectral import laplacian

    X = np.random.default_rng(0).standard_normal((100, 3))
    estimator = estimator or ge.LaplacianEigenmaps(2, n_neighbors=10, sigma=1.0)
    monkeypatch.setitem(laplacian.SEARCHES, "auto", None)
    with pytest.raises(error, match=match):
        ge.spectral.fit_grid(estimator, X, grid)


def test_affinity_graph_takes_a_wider_search():
    from gpuembed.spectral import affinity_graph

    X = np.random.default_rng(0).standard_normal((200, 4))
    wide = ge.knn(X, 30, backend="cpu")
    for kw in ({"sigma": 1.5}, {"perplexity": 4.0}):
        np.testing.assert_array_equal(
            affinity_graph(X, 12, neighbors=wide, backend="cpu", **kw).toarray(),
            affinity_graph(X, 12, backend="cpu", **kw).toarray())
    with pytest.raises(ValueError, match="neighbors must hold at least n_neighbors = 31"):
        affinity_graph(X, 31, sigma=1.0, neighbors=wide, backend="cpu")
    # Given lists are checked as entropic_affinities checks them, Gaussian or not: a
    # pair listed twice had doubled its weight, a point its own neighbour made a loop.
    twice, own = wide[1].copy(), wide[1].copy()
    twice[3, 5] = twice[3, 4]
    own[8, 0] = 8
    for kw in ({"sigma": 1.5}, {"perplexity": 4.0}):
        with pytest.raises(ValueError, match="row 3 lists a point twice"):
            affinity_graph(X, 12, neighbors=(wide[0], twice), backend="cpu", **kw)
        with pytest.raises(ValueError, match=r"own neighbour \(row 8\)"):
            affinity_graph(X, 12, neighbors=(wide[0], own), backend="cpu", **kw)


def unit_columns(A):
    return A / np.linalg.norm(A, axis=0)


@pytest.fixture(scope="module")
def digits():
    pytest.importorskip("sklearn")
    return ge.datasets.digits()


def test_pca_lda_kernel_pca_with_lll(digits):
    """Section 4.6.2-4.6.4: every point a landmark gives the exact method; fewer
    landmarks approximate it (compared column-normalized, up to rotation)."""
    from sklearn.decomposition import PCA, KernelPCA
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from gpuembed.spectral import kernel_pca_lll, lda_lll, pca_lll

    X, y = digits
    n = len(X)
    # LAPACK's SVD: scikit-learn before 1.5 took its randomized one here (error 2.6e-7).
    pca = unit_columns(PCA(2, svd_solver="full").fit_transform(X))
    assert procrustes_error(pca, unit_columns(pca_lll(X, 2, n_landmarks=n, kz=1))) < 1e-10
    assert procrustes_error(pca, unit_columns(pca_lll(X, 2, n_landmarks=300, kz=10,
                                                      random_state=0))) < 0.2
    lda = unit_columns(LinearDiscriminantAnalysis(n_components=2).fit(X, y).transform(X))
    assert procrustes_error(lda, unit_columns(lda_lll(X, y, 2, n_landmarks=n, kz=1))) < 1e-3
    assert procrustes_error(lda, unit_columns(lda_lll(X, y, 2, n_landmarks=300, kz=10,
                                                      random_state=0))) < 0.02
    kpca = unit_columns(KernelPCA(2, kernel="rbf", gamma=1 / (2 * 30.0 ** 2)).fit_transform(X))
    exact = kernel_pca_lll(X, 2, sigma=30.0, n_landmarks=n, kz=1)
    assert procrustes_error(kpca, unit_columns(exact)) < 1e-10
    # Checked before the landmarks and Z (n_landmarks = N + 1 would fail there).
    with pytest.raises(ValueError, match="n_components"):
        lda_lll(X, y, 10, n_landmarks=n + 1)
    with pytest.raises(ValueError, match="labels"):
        lda_lll(X, y[:-1], 2, n_landmarks=n + 1)
    with pytest.raises(ValueError, match="labels contains NaN"):
        lda_lll(X, np.where(np.arange(n) == 3, np.nan, y), 2, n_landmarks=n + 1)
    with pytest.raises(ValueError, match="n_components"):     # returned null-space columns
        pca_lll(X[:, :3], 4, n_landmarks=n + 1)


def test_default_kz_is_not_tied_to_the_output_dimension(digits):
    """Section 4.4: K_Z follows the manifold's intrinsic dimension, not d.  At d = 20
    the default (6) approximates exact LE much better than d + 1 = 21 landmarks
    per point (jittered digits: integer pixels tie distances)."""
    from gpuembed.spectral import affinity_graph, spectral_embedding
    from gpuembed.spectral.laplacian import lll_spectral
    from gpuembed.spectral.lll import default_kz

    assert (default_kz(2), default_kz(5), default_kz(20)) == (3, 6, 6)
    X = digits[0] + np.random.default_rng(0).normal(0.0, 0.01, digits[0].shape)
    W = affinity_graph(X, 10, sigma=20.0)
    exact = spectral_embedding(W, 20)
    Y, _, _, _, kz = lll_spectral(X, W, 20, 800, random_state=0)
    Y21 = lll_spectral(X, W, 20, 800, kz=21, random_state=0)[0]
    errors = procrustes_error(exact, Y), procrustes_error(exact, Y21)
    print("Procrustes error at d = 20, default kz and kz = 21:", errors)
    assert kz == 6 and errors[0] < 0.8 * errors[1]


def test_lll_beats_landmark_only_baselines(roll):
    """Dissertation fig. 4.5: at equal L, LLL is far closer to exact LE than LE on the
    landmarks alone projected with Z, or the Nystrom extension."""
    from gpuembed.spectral import le_landmarks_only, nystrom_le

    X, _, _ = roll
    X = X[:2000]
    exact = ge.LaplacianEigenmaps(2, n_neighbors=20, sigma=1.5, backend="cpu").fit_transform(X)
    kw = dict(n_landmarks=200, random_state=0)
    lll = ge.LaplacianEigenmaps(2, n_neighbors=20, sigma=1.5, backend="cpu", **kw).fit_transform(X)
    lez = le_landmarks_only(X, 2, n_neighbors=20, sigma=1.5, **kw)
    nys = nystrom_le(X, 2, sigma=1.5, **kw)
    errors = [procrustes_error(exact, Y) for Y in (lll, lez, nys)]
    print("Procrustes error LLL, LE(Z), Nystrom:", errors)
    assert errors[0] < 0.5 * min(errors[1:])


def test_nystrom_le_against_its_formula(rng):
    """nystrom_le against the one-shot Nystrom extension written out densely: the
    full Gaussian cross-affinities C (N x L, no self affinity), degrees C 1 N / L,
    the landmarks' normalized affinities' leading eigenvectors after the trivial
    one, extended by D^-1/2 C D_L^-1/2 U / lambda and scaled by D^-1/2."""
    from gpuembed.spectral import choose_landmarks, nystrom_le

    X = rng.standard_normal((300, 4))
    sigma, L = 1.2, 60
    Y = nystrom_le(X, 3, n_landmarks=L, sigma=sigma, random_state=0, backend="cpu")
    idx = choose_landmarks(X, L, random_state=0)
    C = np.exp(-((X[:, None] - X[idx][None]) ** 2).sum(-1) / (2 * sigma ** 2))
    C[idx, np.arange(L)] = 0.0
    s = 1 / np.sqrt(C.sum(axis=1) * 300 / L)
    vals, U = np.linalg.eigh(s[idx, None] * C[idx] * s[None, idx])
    vals, U = vals[::-1][1:4], U[:, ::-1][:, 1:4]
    expected = s[:, None] * ((s[:, None] * C * s[None, idx]) @ U / vals)
    np.testing.assert_allclose(np.abs(Y), np.abs(expected), rtol=1e-9,
                               atol=1e-12 * np.abs(expected).max())


def test_isolated_points_are_refused_with_landmarks_as_exactly(digits):
    """A Gaussian width under which some points' neighbour weights all underflow
    leaves them without any affinity.  Exact LE refused such a graph; LLL turned
    it into an embedding 1e50 across.  Both now raise, saying how many rows and
    what gives them weights."""
    X, _ = digits
    for kw in ({}, {"n_landmarks": 100, "random_state": 0}):
        for est in (ge.LaplacianEigenmaps(2, n_neighbors=10, sigma=0.5, **kw),
                    ge.SpectralClustering(5, n_neighbors=10, sigma=0.5, **kw)):
            with pytest.raises(ValueError, match=r"W has \d+ row\(s\) without any affinity "
                                                 r"\(isolated points.*a larger sigma"):
                est.fit(X)


def test_kernel_methods_of_float32_rows_far_from_the_origin(rng):
    """Kernel PCA by LLL and Nystrom's extension take Gaussian kernels of GEMM
    distances, which round to eps |y|^2: float32 rows moved 1e4 from the origin
    came out 0.5 and 0.9 off in Procrustes error uncentred.  Centred, they equal
    the float64 embedding of the unmoved rows; "random-pruned" drops the same
    close pairs (9 of 100 landmarks differed uncentred)."""
    from gpuembed.spectral import kernel_pca_lll, landmark_basis, nystrom_le

    X = rng.standard_normal((500, 6))
    far = (X + 1e4).astype(np.float32)
    np.testing.assert_array_equal(choose_landmarks(far, 100, "random-pruned", random_state=0),
                                  choose_landmarks(X, 100, "random-pruned", random_state=0))
    basis = landmark_basis(X, 2, 100, kz=7, random_state=0)
    for fn in (lambda Y: kernel_pca_lll(Y, 2, sigma=2.0, basis=basis),
               lambda Y: nystrom_le(Y, 2, n_landmarks=100, sigma=2.0, random_state=0)):
        assert procrustes_error(fn(X), fn(far)) < 1e-3


def test_lda_of_float32_rows_far_from_the_origin():
    """LDA by LLL centres the rows on their mean summed in float64: 20,000 integer
    rows moved 1e5 from the origin (exact in float32) give the projection of the
    unmoved rows; on NumPy's float32 mean (up to 11 units off) it was 0.71 off in
    Procrustes error."""
    from gpuembed.spectral import lda_lll

    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 20000)
    X = (rng.integers(0, 4, (20000, 50)) + 2 * (y[:, None] == np.arange(50) % 4)
         ).astype(np.float64)
    fit = lambda Y: lda_lll(Y, y, 2, n_landmarks=200, kz=5, random_state=0)
    assert procrustes_error(fit(X), fit((X + 1e5).astype(np.float32))) < 1e-9


@pytest.mark.gpu
def test_gpu_equals_cpu():
    """Laplacian eigenmaps (exact and LLL, also refined) and spectral clustering
    with the eigensolver on the GPU against the CPU's."""
    from sklearn.metrics import adjusted_rand_score

    X, _ = ge.datasets.swiss_roll(1500, random_state=0)
    for params in ({}, {"n_landmarks": 300}, {"n_landmarks": 300, "z_neighbors": "graph"},
                   {"n_landmarks": 300, "landmarks": "spread"},
                   {"n_landmarks": 300, "kz": 2, "refine": 2}):
        models = [ge.LaplacianEigenmaps(2, n_neighbors=15, random_state=0, backend=b,
                                        **params).fit(X) for b in ("cpu", "gpu")]
        assert procrustes_error(*(m.embedding_ for m in models)) < 1e-5
        if params.get("refine"):            # new points as exact LE's, from the device search
            new = [m.transform(X[:40] + 0.01) for m in models]
            assert procrustes_error(*new) < 1e-5
    X, y = ge.datasets.gaussian_clusters(1500, 4, 8, random_state=1)
    for params in ({}, {"n_landmarks": 200}):
        models = [ge.SpectralClustering(4, n_neighbors=15, random_state=0, backend=b,
                                        **params).fit(X[:1200]) for b in ("cpu", "gpu")]
        assert adjusted_rand_score(models[0].labels_, models[1].labels_) == 1.0
        new = [model.predict(X[1200:]) for model in models]
        assert adjusted_rand_score(new[0], new[1]) == 1.0


@pytest.mark.gpu
def test_fit_grid_gpu_equals_separate_gpu_fits():
    """The shared k-NN search stays on the device and is sliced there (the entropic
    path calibrates on it), the landmark basis searches there too."""
    X, _ = ge.datasets.gaussian_clusters(400, 4, 6, random_state=0)
    for est, grid in ((ge.LaplacianEigenmaps(2, n_neighbors=10, n_landmarks=80, random_state=0,
                                             backend="gpu"), {"sigma": [1.0, 3.0]}),
                      (ge.SpectralClustering(4, n_neighbors=10, random_state=0, backend="gpu"),
                       {"perplexity": [3.0], "n_neighbors": [12, 24]})):
        for params, fitted in ge.spectral.fit_grid(est, X, grid):
            alone = type(est)(**{**est.get_params(), **params}).fit(X)
            np.testing.assert_allclose(fitted.embedding_, alone.embedding_, rtol=0, atol=1e-12)


@pytest.mark.gpu
def test_host_functions_take_device_arrays(digits):
    """The landmark choice, Z, the basis and k-means run on the host: device arrays
    are copied there (Z's k-NN search runs on the GPU either way)."""
    from gpuembed.spectral import landmark_basis

    gpu = ge.get_backend("gpu")
    X = digits[0][:600] + np.random.default_rng(0).normal(scale=0.01, size=(600, 64))
    Xd = gpu.asarray(X)
    for method in ("random", "random-pruned", "kmeans"):
        np.testing.assert_array_equal(choose_landmarks(Xd, 50, method, 0),
                                      choose_landmarks(X, 50, method, 0))
    W = ge.spectral.affinity_graph(X, 10, sigma=20.0, backend="cpu")
    np.testing.assert_array_equal(
        choose_landmarks(Xd, 50, "spread", 0, graph=gpu.sparse.csr_matrix(W)),
        choose_landmarks(X, 50, "spread", 0, graph=W))
    Z = [reconstruction_weights(A, A[:50], 4, backend="gpu") for A in (X, Xd)]
    assert abs(Z[0] - Z[1]).max() == 0
    basis = [landmark_basis(A, 2, 50, random_state=0, backend="gpu") for A in (X, Xd)]
    np.testing.assert_array_equal(basis[0][0], basis[1][0])
    assert abs(basis[0][1] - basis[1][1]).max() == 0
    for a, b in zip(kmeans(X, 5, random_state=0), kmeans(Xd, 5, random_state=0)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.gpu
def test_landmark_functions_gpu_equal_cpu(digits):
    """The affinity graph (Gaussian and entropic), the linear LLL methods and the
    landmark baselines with their k-NN searches and dense sums on the GPU (float64
    inputs stay float64) against the CPU's.  Jittered digits: the integer pixels tie
    distances, which the two GEMMs' last bits would order differently."""
    from gpuembed.spectral import (affinity_graph, kernel_pca_lll, lda_lll, le_landmarks_only,
                                   nystrom_le, pca_lll)

    X, y = digits
    X = X + np.random.default_rng(0).normal(scale=0.01, size=X.shape)
    for kw in ({"sigma": 20.0}, {"perplexity": 5.0}):
        W = [affinity_graph(X, 15, backend=b, **kw) for b in ("cpu", "gpu")]
        assert (W[0] != W[1]).nnz == 0 or abs(W[0] - W[1]).max() < 1e-12 * W[0].max()
    kw = dict(n_landmarks=300, random_state=0)
    for fn in (lambda b: pca_lll(X, 2, kz=10, backend=b, **kw),
               lambda b: lda_lll(X, y, 2, kz=10, backend=b, **kw),
               lambda b: kernel_pca_lll(X, 2, sigma=30.0, kz=10, backend=b, **kw),
               lambda b: le_landmarks_only(X, 2, n_neighbors=10, sigma=20.0, backend=b, **kw),
               lambda b: nystrom_le(X, 2, sigma=20.0, backend=b, **kw)):
        cpu, gpu = fn("cpu"), fn("gpu")
        assert isinstance(gpu, np.ndarray)
        assert procrustes_error(cpu, gpu) < 1e-8


@pytest.mark.parametrize("seeds", ["random", "all in order"])
def test_graph_landmark_neighbours_against_brute_force(rng, seeds):
    """z_neighbors="graph": each point's kz landmarks closest along the graph by
    paths of at most 2 edges, a path's score the product of its affinities (the
    seed itself first), with their squared distances ascending; rows with fewer
    take paths of 3 edges, and rows with fewer still the input-space search's kz
    nearest of all landmarks; a new point walks from its seed.  Scores by dense
    max-product matrix products (the same products: rounding keeps their order).
    Seeds "all in order" (a fit's rows) take 3 edges from the 2-edge results of
    their neighbours (see lll_cpu.graph_landmarks), others walk the graph."""
    from gpuembed.spectral.lll import graph_landmark_neighbours

    n, kz = 300, 5
    X = rng.standard_normal((n, 5))
    X[-10:] += 100                          # a separate group that holds one landmark
    graph = ge.spectral.affinity_graph(X, 4, sigma=1.0, backend="cpu")
    landmarks = np.append(rng.choice(n - 10, 79, replace=False), n - 5)
    W = graph.toarray()
    Q = X + 0.01 * rng.standard_normal(X.shape)
    seeds = rng.integers(n, size=n) if seeds == "random" else np.arange(n)
    sqdist, nearest = graph_landmark_neighbours(Q, seeds, X, landmarks, graph, kz,
                                                backend="cpu")
    all_sq = ((Q[:, None, :] - X[landmarks][None]) ** 2).sum(axis=2)
    kinds = np.zeros(3, dtype=int)          # rows by 2 hops, by 3, by the input search
    for r in range(n):
        i = seeds[r]
        best_via = (W[i][:, None] * W).max(axis=0)          # best path of 2 edges to each u
        two = np.maximum(W[i], best_via)[landmarks]
        three = np.maximum(two, (best_via[:, None] * W).max(axis=0)[landmarks])
        for score in (two, three):
            score[landmarks == i] = 1.0     # the empty path (the affinities are below 1)
        kind = 0
        score = two
        if (two > 0).sum() < kz:
            score, kind = three, 1
        if (score > 0).sum() < kz:
            kind = 2
            expected = np.argsort(all_sq[r], kind="stable")[:kz]
        else:
            expected = np.argsort(-score, kind="stable")[:kz]
        kinds[kind] += 1
        np.testing.assert_array_equal(np.sort(nearest[r]), np.sort(expected))
        np.testing.assert_allclose(sqdist[r], np.sort(all_sq[r, expected]), rtol=1e-12)
    assert (kinds > 0).all(), kinds.tolist()  # every kind of row was checked


def test_three_hops_from_the_two_hop_results_equal_the_walk(rng):
    """A fit's rows take paths of 3 edges from every point's kz best within 2
    (lll_cpu.graph_landmarks given those): the same landmarks, scores (to
    rounding: the products associate otherwise), distances and counts as the walk
    over the points 3 hops away, for every row, also those that find kz within 2."""
    from gpuembed.spectral.lll_cpu import graph_landmarks

    n, kz = 400, 6
    X = rng.standard_normal((n, 4))
    graph = scipy.sparse.csr_matrix(ge.spectral.affinity_graph(X, 4, sigma=1.0, backend="cpu"))
    landmarks = rng.choice(n, 80, replace=False)
    position = np.full(n, -1, np.int64)
    position[landmarks] = np.arange(len(landmarks))
    near = graph[:, landmarks].tocsr()
    rows, every = np.ascontiguousarray(X[landmarks]), np.arange(n)
    none = (np.empty((0, kz), np.int64), np.empty((0, kz)), np.empty(0, np.int64))
    search = lambda hops, lists: graph_landmarks(
        graph.indptr, graph.indices, graph.data, near.indptr, near.indices, near.data,
        position, X, every, every, rows, kz, hops, *lists)
    _, idx2, score2, found2 = two = search(2, none)
    sqdist, idx, score, found = search(3, none)
    got = search(3, two[1:])
    assert 0 < (found2 < kz).sum() < n and (found < kz).sum() < (found2 < kz).sum()
    np.testing.assert_array_equal(got[3], found)
    np.testing.assert_array_equal(got[1], idx)
    np.testing.assert_allclose(got[0], sqdist, rtol=1e-12)
    np.testing.assert_allclose(got[2], score, rtol=1e-12)


def test_graph_z(roll):
    """z_neighbors="graph": every point a landmark gives the exact solution; the
    error falls with more landmarks; training points map to their own rows, new
    ones near them; fit_grid makes each graph's own Z and equals separate fits."""
    X, _, exact = roll
    small = X[:800]
    lll = ge.LaplacianEigenmaps(2, n_neighbors=20, n_landmarks=800, kz=1,
                                z_neighbors="graph", backend="cpu")
    assert procrustes_error(ge.LaplacianEigenmaps(2, n_neighbors=20, backend="cpu")
                            .fit_transform(small), lll.fit_transform(small)) < 1e-8
    errors = [procrustes_error(exact, ge.LaplacianEigenmaps(
        2, n_neighbors=20, n_landmarks=L, z_neighbors="graph", random_state=0,
        backend="cpu").fit_transform(X)) for L in (100, 300, 1000)]
    assert errors[0] > errors[1] > errors[2] and errors[1] < 0.10
    model = ge.LaplacianEigenmaps(2, n_neighbors=20, n_landmarks=300, z_neighbors="graph",
                                  random_state=0, backend="cpu").fit(X)
    np.testing.assert_allclose(model.transform(X[:50]), model.embedding_[:50], rtol=1e-8,
                               atol=1e-10)
    moved = model.transform(X[:50] + 0.01)
    spread = np.abs(model.embedding_).max()
    assert np.abs(moved - model.embedding_[:50]).max() < 0.05 * spread
    grid = {"sigma": [0.5, 2.0]}
    estimator = ge.SpectralClustering(4, n_neighbors=10, n_landmarks=80, z_neighbors="graph",
                                      random_state=0, backend="cpu")
    points, _ = ge.datasets.gaussian_clusters(500, 4, 6, random_state=0)
    for params, fitted in ge.spectral.fit_grid(estimator, points, grid):
        alone = type(estimator)(**{**estimator.get_params(), **params}).fit(points)
        np.testing.assert_array_equal(fitted.embedding_, alone.embedding_)


def test_graph_z_bad_arguments():
    X, _ = ge.datasets.gaussian_clusters(200, 3, 5, random_state=0)
    with pytest.raises(ValueError, match="z_neighbors must be one of"):
        ge.LaplacianEigenmaps(2, n_neighbors=10, n_landmarks=50, z_neighbors="knn").fit(X)
    with pytest.raises(ValueError, match="z_neighbors='graph' computes distances between "
                                         "dense rows"):
        ge.LaplacianEigenmaps(2, n_neighbors=10, n_landmarks=50, z_neighbors="graph").fit(
            scipy.sparse.csr_matrix(np.abs(X)))


def test_spread_landmarks_against_brute_force(rng):
    """landmarks="spread": each row's graph neighbours ranked nearest first (a
    stable sort by affinity); taken in a random order, each point not among the m
    nearest neighbours of one taken before, then the others in that order; m the
    largest that leaves at least L points of the first kind."""
    from gpuembed.spectral.lll import _spread_landmarks
    from gpuembed.spectral.lll_cpu import by_affinity, spread_points

    n = 300
    W = ge.spectral.affinity_graph(rng.standard_normal((n, 3)), 8, sigma=1.0, backend="cpu")
    W.data = np.round(W.data, 1)                    # ties, kept in their stored order
    rows = [slice(W.indptr[i], W.indptr[i + 1]) for i in range(n)]
    ranked = [W.indices[r][np.argsort(-W.data[r], kind="stable")] for r in rows]
    np.testing.assert_array_equal(by_affinity(W.indptr, W.indices, W.data),
                                  np.concatenate(ranked))

    def brute(order, count, m):
        taken = []
        for i in order:
            if not any(i == t or i in ranked[t][:m] for t in taken):
                taken.append(i)
        first = len(taken)
        taken += [i for i in order if i not in taken]
        return taken[:count], first

    order = rng.permutation(n)
    flat = np.concatenate(ranked)
    widest = np.diff(W.indptr).max()
    spread_sizes = []
    for m in (0, 1, 3, widest):
        for count in (10, 150, n):
            out, first = spread_points(W.indptr, flat, order, count, m)
            expected, size = brute(order, count, m)
            np.testing.assert_array_equal(out, expected)
            assert first == min(size, count)
        spread_sizes.append(size)
    assert spread_sizes[0] == n > spread_sizes[1] > spread_sizes[2] > spread_sizes[3] > 10
    for L in (10, 60, 150, n):
        idx = _spread_landmarks(W, n, L, np.random.default_rng(5))
        order = np.random.default_rng(5).permutation(n)
        m = max(m for m in range(widest + 1) if brute(order, L, m)[1] >= L)
        np.testing.assert_array_equal(idx, np.sort(brute(order, L, m)[0]))
        if L == 10:                     # fewer than the graph's independent sets hold
            assert m == widest and W[idx][:, idx].nnz == 0


def test_spread_landmarks_lower_the_error_of_few_landmarks(roll):
    """With 100 landmarks on the 4,000-point roll LLL's Procrustes error against
    exact LE is about half that of random landmarks (measured 0.25 against 0.54 on
    average over 4 seeds, lower on each); fit_grid builds each graph's own
    landmarks and equals separate fits; training points map to their own rows."""
    X, _, exact = roll

    def error(landmarks, seed):
        return procrustes_error(exact, ge.LaplacianEigenmaps(
            2, n_neighbors=20, n_landmarks=100, landmarks=landmarks, random_state=seed,
            backend="cpu").fit_transform(X))
    errors = np.array([[error(method, seed) for seed in range(4)]
                       for method in ("random", "spread")])
    print("Procrustes error with 100 landmarks, random / spread:", errors.tolist())
    assert (errors[1] < errors[0]).all() and errors[1].mean() < 0.7 * errors[0].mean()
    estimator = ge.SpectralClustering(4, n_neighbors=10, n_landmarks=80, landmarks="spread",
                                      random_state=0, backend="cpu")
    points, _ = ge.datasets.gaussian_clusters(500, 4, 6, random_state=0)
    fits = ge.spectral.fit_grid(estimator, points, {"n_neighbors": [5, 15]})
    for params, fitted in fits:
        alone = type(estimator)(**{**estimator.get_params(), **params}).fit(points)
        np.testing.assert_array_equal(fitted.landmarks_, alone.landmarks_)
        np.testing.assert_array_equal(fitted.embedding_, alone.embedding_)
    assert not np.array_equal(fits[0][1].landmarks_, fits[1][1].landmarks_)
    model = ge.LaplacianEigenmaps(2, n_neighbors=20, n_landmarks=300, landmarks="spread",
                                  random_state=0, backend="cpu").fit(X)
    np.testing.assert_allclose(model.transform(X[:50]), model.embedding_[:50], rtol=1e-8,
                               atol=1e-10)


def test_spread_landmarks_bad_arguments(digits):
    from gpuembed.spectral import pca_lll

    X = digits[0][:200]
    with pytest.raises(ValueError, match="landmarks='spread' spreads them along an affinity "
                                         "graph, and none was given"):
        choose_landmarks(X, 20, "spread", random_state=0)
    with pytest.raises(ValueError, match="landmarks='spread'.*none was given"):
        pca_lll(X, 2, n_landmarks=20, landmarks="spread")
    with pytest.raises(ValueError, match=r"graph has shape \(199, 199\), Y 200 points"):
        choose_landmarks(X, 20, "spread", graph=scipy.sparse.identity(199, format="csr"))


def dense_le(W, k):
    """The k trailing vectors of L u = lambda D u by dense eigh, D-orthonormal."""
    import scipy.linalg

    Wd = W.toarray()
    D = np.diag(Wd.sum(axis=1))
    return scipy.linalg.eigh(D - Wd, D, subset_by_index=[0, k - 1])


def test_smoothing_keeps_exact_vectors_and_its_rayleigh_ritz_is_optimal(roll):
    """smoothed_embedding: LE's own vectors are a fixed point (up to rounding);
    from LLL's, each step's vectors are D-orthonormal, lower the Rayleigh
    quotients' sum below LLL's, and equal the dense Rayleigh-Ritz of the span
    D^-1 W Y (brute force: the generalized eigenproblem of that span's n x k
    basis); the columns keep the signs of their correlation with Y's."""
    import scipy.linalg

    from gpuembed.spectral import affinity_graph
    from gpuembed.spectral.laplacian import lll_spectral
    from gpuembed.spectral.lll import smoothed_embedding

    X = roll[0][:1500]
    W = affinity_graph(X, 12, sigma=1.5, backend="cpu")
    degree = np.asarray(W.sum(axis=1)).ravel()
    vals, exact = dense_le(W, 4)
    exact = exact[:, 1:]
    np.testing.assert_allclose(smoothed_embedding(W, degree, exact, 2), exact, atol=1e-9)
    Y = lll_spectral(X, W, 3, 60, random_state=0)[0]
    Wd, D = W.toarray(), np.diag(degree)
    quotients = lambda V: np.trace(V.T @ (D - Wd) @ V)
    once = smoothed_embedding(W, degree, Y, 1)
    np.testing.assert_allclose(once.T @ D @ once, np.eye(3), atol=1e-10)
    basis = (Wd @ Y) / degree[:, None]
    ritz_vals, C = scipy.linalg.eigh(basis.T @ (D - Wd) @ basis, basis.T @ D @ basis)
    expected = basis @ C
    expected *= np.sign(np.einsum("ij,ij->j", Y, D @ expected))
    np.testing.assert_allclose(once, expected, atol=1e-9)
    np.testing.assert_allclose(np.diag(once.T @ (D - Wd) @ once), ritz_vals, rtol=1e-9)
    assert (np.einsum("ij,ij->j", Y, D @ once) > 0).all()
    steps = [quotients(smoothed_embedding(W, degree, Y, s)) for s in (0, 1, 3, 30)]
    assert steps[0] > steps[1] > steps[2] > steps[3] > vals[1:].sum()
    # Slowly: the roll's eigenvalues crowd near 0, where the walk damps little.
    assert steps[3] - vals[1:].sum() < 0.5 * (steps[0] - vals[1:].sum())


def test_smoothing_keeps_the_given_component_vectors():
    """The ``fixed`` first columns come back as they were (the components'
    indicators, which LLL takes as exact LE does), the others move and stay
    D-orthogonal to them; on 5 separated clusters LLL with refine still equals
    exact LE (its vectors are those indicators)."""
    from gpuembed.spectral.lll import smoothed_embedding

    X, W = separated_clusters(0.0, 2.0)
    degree = np.asarray(W.sum(axis=1)).ravel()
    kw = dict(n_neighbors=15, sigma=2.0, backend="cpu")
    exact = ge.LaplacianEigenmaps(4, **kw).fit_transform(X)
    lll = ge.LaplacianEigenmaps(4, n_landmarks=600, random_state=0, refine=2, **kw)
    assert procrustes_error(exact, lll.fit_transform(X)) < 1e-10
    # Landmarks along the graph: each point's in its own component, so that the
    # first vectors are the data graph's (input-space ones may lie across a gap).
    Y = ge.LaplacianEigenmaps(6, n_landmarks=300, z_neighbors="graph", random_state=0,
                              **kw).fit_transform(X)
    moved = smoothed_embedding(W, degree, Y, 1, fixed=4)
    np.testing.assert_array_equal(moved[:, :4], Y[:, :4])
    assert np.abs(moved[:, 4:] - Y[:, 4:]).max() > 1e-6
    np.testing.assert_allclose(Y[:, :4].T @ (degree[:, None] * moved[:, 4:]), 0, atol=1e-10)


def test_refined_lll_is_closer_to_exact_and_maps_new_points_as_exact(roll, monkeypatch):
    """Each step of refine lowers LLL's Procrustes error against exact LE (the
    swiss roll at 300 and 1,000 landmarks, input and graph Z; little there, 6-12%
    a step: a smooth 2-D manifold, 4 to 13 points a landmark; on Fashion-MNIST
    70k one step halves it); new points then map from the nearest training
    points' rows, so a training point gets its own row, and the landmarks'
    embedding is the embedding's landmark rows; refine=0 is Algorithm 3."""
    X, _, exact = roll
    kw = dict(n_neighbors=20, random_state=0, backend="cpu")
    for L, z_neighbors in ((300, "input"), (1000, "input"), (300, "graph")):
        fits = [ge.LaplacianEigenmaps(2, n_landmarks=L, z_neighbors=z_neighbors, refine=r,
                                      **kw).fit(X) for r in (0, 1, 3)]
        errors = [procrustes_error(exact, m.embedding_) for m in fits]
        print(L, z_neighbors, errors)
        assert errors[2] < errors[1] < 0.95 * errors[0]
        plain, refined = fits[:2]
        np.testing.assert_array_equal(plain.Z_.toarray(), refined.Z_.toarray())
    # 1,000 landmarks: the reduced problem went to LOBPCG, stopped at LOOSE_TOL, and
    # the refined embedding is that of the tight solve to well below its error.
    from gpuembed.spectral import lll

    tols = []
    lobpcg = lll._lobpcg
    monkeypatch.setattr(lll, "_lobpcg", lambda A, B, X, M, tol, *rest: tols.append(tol)
                        or lobpcg(A, B, X, M, tol, *rest))
    loose = ge.LaplacianEigenmaps(2, n_landmarks=1000, refine=1, **kw).fit_transform(X)
    assert tols == [lll.LOOSE_TOL]
    monkeypatch.setattr(lll, "LOOSE_TOL", lll.SPARSIFIED_TOL)
    tight = ge.LaplacianEigenmaps(2, n_landmarks=1000, refine=1, **kw).fit_transform(X)
    assert tols[1:] == [lll.SPARSIFIED_TOL]
    error = procrustes_error(exact, tight)
    assert procrustes_error(exact, loose) < 1.01 * error
    assert procrustes_error(tight, loose) < 0.1 * error
    np.testing.assert_allclose(refined.transform(X[:50]), refined.embedding_[:50], atol=1e-12)
    np.testing.assert_array_equal(refined.landmark_embedding_,
                                  refined.embedding_[refined.landmarks_])
    np.testing.assert_allclose(plain.embedding_, plain.Z_ @ plain.landmark_embedding_,
                               atol=1e-12)
    clusters = ge.SpectralClustering(5, n_neighbors=15, sigma=0.5, n_landmarks=300, refine=1,
                                     random_state=0, backend="cpu")
    X5, _ = separated_clusters(0.0, 0.5)
    labels = clusters.fit_predict(X5)
    assert len(np.unique(labels)) == 5
    np.testing.assert_array_equal(clusters.predict(X5[:40]), labels[:40])


def test_selected_columns_equal_scipys_triangle_and_columns(rng):
    """lll._selected: W's strict upper triangle and its columns of some
    landmarks (renumbered by their position), entry for entry and in SciPy's
    order, with empty rows; with a row's indices unsorted, the same matrices."""
    from gpuembed.spectral.lll import _selected

    W = scipy.sparse.random(200, 200, density=0.05, random_state=2, format="lil")
    W[7] = 0
    W[:, 7] = 0
    W = (W + W.T).tocsr()
    landmarks = rng.choice(200, 30, replace=False)
    position = np.full(200, -1)
    position[landmarks] = np.arange(30)
    for got, want in ((_selected(W, np.arange(200), 200, above_row=True),
                       scipy.sparse.triu(W, k=1, format="csr")),
                      (_selected(W, position, 30), W[:, landmarks].tocsr())):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got.indptr, want.indptr)
        np.testing.assert_array_equal(got.indices, want.indices)
        np.testing.assert_array_equal(got.data, want.data)
    W.indices[W.indptr[3]:W.indptr[4]] = W.indices[W.indptr[3]:W.indptr[4]][::-1].copy()
    W.has_sorted_indices = False
    np.testing.assert_array_equal(_selected(W, np.arange(200), 200, above_row=True).toarray(),
                                  np.triu(W.toarray(), 1))
    np.testing.assert_array_equal(_selected(W, position, 30).toarray(),
                                  W.toarray()[:, landmarks])
