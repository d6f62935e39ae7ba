"""metric="precomputed": X is an (N, N) matrix of distances.  Each point's
neighbours are its row's smallest entries (brute force below); for the
Euclidean distances of points every entry point gives what it gives for the
points, and init="pca" (classical MDS) their principal component scores."""
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse
from scipy.spatial.distance import cdist

import gpuembed as ge
from gpuembed.initialization import classical_mds, pca
from gpuembed.neighbors import graph_depth, knn_query
from gpuembed.parametric import ParametricEmbedding

CPU = ge.get_backend("cpu")


def data(n=150, seed=0):
    """Points with a clear principal axis order (distinct variances)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 6)) * [5.0, 3.0, 2.0, 1.0, 1.0, 0.5]


def brute(D, k, exclude_self):
    """Each row's k smallest entries (ties by column), its own left out."""
    D = np.array(D, dtype=np.float64)
    if exclude_self:
        np.fill_diagonal(D, np.inf)
    order = np.argsort(D, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(D, order, axis=1) ** 2, order


def test_neighbours_are_each_rows_smallest_distances():
    """Distances of no point set (asymmetric, rounded to few values so that many
    tie, duplicates at 0, a nonzero diagonal): the sorted rows, ties by index,
    also across the k-th place, and for queries against the points."""
    rng = np.random.default_rng(1)
    D = (np.round(rng.random((90, 90)) * 8) + 1) / 2      # 9 values from 0.5
    D[5, 17] = D[5, 40] = 0.0
    k = 12
    sq, idx = ge.knn(D, k, metric="precomputed", backend=CPU)
    ref_sq, ref_idx = brute(D, k, True)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_array_equal(sq, ref_sq)
    assert list(idx[5, :2]) == [17, 40]
    Q = np.round(rng.random((20, 90)) * 8) / 2
    sq, idx = knn_query(Q, D, k, metric="precomputed", backend=CPU)
    ref_sq, ref_idx = brute(Q, k, False)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_array_equal(sq, ref_sq)
    sq, idx = ge.knn(D.astype(np.float32), k, metric="precomputed", backend=CPU)
    assert sq.dtype == np.float32
    np.testing.assert_array_equal(idx, brute(D, k, True)[1])


def test_precomputed_on_each_backend(backend):
    """The backend's selection from each row (with ties: 16 values), whole and in
    blocks of 30 rows: the CPU's neighbours, in order."""
    rng = np.random.default_rng(2)
    D = (np.round(rng.random((120, 120)) * 15) + 1).astype(np.float32)
    ref_sq, ref_idx = brute(D, 9, True)
    for block_bytes in (None, 30 * 120 * 4):
        sq, idx = (backend.to_host(a) for a in ge.knn(
            backend.asarray(D), 9, metric="precomputed", backend=backend,
            block_bytes=block_bytes))
        np.testing.assert_array_equal(idx, ref_idx)
        np.testing.assert_allclose(sq, ref_sq, rtol=1e-6)
    X = data(120)
    model = ge.TSNE(perplexity=10, max_iter=5, random_state=0, metric="precomputed",
                    backend=backend).fit(backend.asarray(cdist(X, X)))
    points = ge.TSNE(perplexity=10, max_iter=5, random_state=0, backend=backend).fit(
        backend.asarray(X))
    scale = np.abs(points.embedding_).max()
    np.testing.assert_allclose(model.embedding_, points.embedding_, atol=1e-4 * scale)
    X_new = data(6, seed=5)
    np.testing.assert_allclose(model.transform(backend.asarray(cdist(X_new, X))),
                               points.transform(backend.asarray(X_new)), atol=1e-3 * scale)


def test_classical_mds_gives_the_principal_component_scores():
    """Euclidean distances: the points' PCA scores (signs fixed alike).  Other
    distances: the leading eigenpairs of B = -J S J / 2 (S squared and made
    symmetric), against a dense eigensolver, a negative eigenvalue's column 0."""
    X = data()
    np.testing.assert_allclose(classical_mds(cdist(X, X), 3), pca(X, 3), rtol=1e-9,
                               atol=1e-9 * np.abs(X).max())
    rng = np.random.default_rng(3)
    D = rng.random((60, 60))                    # no point set has these distances
    S = (D ** 2 + (D ** 2).T) / 2
    J = np.eye(60) - 1 / 60
    values, vectors = np.linalg.eigh(-J @ S @ J / 2)
    assert values[0] < 0
    Y = classical_mds(D, 2)
    for j in (0, 1):
        v = vectors[:, -1 - j]
        np.testing.assert_allclose(np.abs(Y[:, j] @ v), np.sqrt(values[-1 - j]), rtol=1e-8)
    # Two far pairs among 5 points at distance 1: B's eigenvalues -49, -9.4, 0, 50, 50;
    # the third column, of eigenvalue 0 (to rounding, either sign), is 0.
    D = np.ones((5, 5)) - np.eye(5)
    D[0, 1] = D[1, 0] = D[2, 3] = D[3, 2] = 10.0
    Y = classical_mds(D, 3)
    np.testing.assert_allclose((Y[:, :2] ** 2).sum(axis=0), [50.0, 50.0], rtol=1e-10)
    assert np.all(np.abs(Y[:, 2]) < 1e-6)


ESTIMATORS = {
    "tsne": lambda **kw: ge.TSNE(perplexity=10, max_iter=40, random_state=0, backend=CPU, **kw),
    "ee": lambda **kw: ge.EE(perplexity=10, max_iter=20, random_state=0, backend=CPU, **kw),
    "sne": lambda **kw: ge.SNE(perplexity=10, max_iter=20, random_state=0, backend=CPU, **kw),
    "msne": lambda **kw: ge.MultiscaleSNE(max_iter=10, random_state=0, backend=CPU, **kw),
    "le": lambda **kw: ge.LaplacianEigenmaps(2, n_neighbors=10, backend=CPU, **kw),
    "clustering": lambda **kw: ge.SpectralClustering(3, n_neighbors=10, random_state=0,
                                                     backend=CPU, **kw),
}


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_estimators_of_euclidean_distances_are_those_of_the_points(name):
    """Fit to the distance matrix of points and map new points by their distances
    to the training points: the fit and map of the points, to the rounding of
    the two ways of computing distances (the neighbours are the same)."""
    X, X_new = data(), data(12, seed=4)
    make = ESTIMATORS[name]
    given, points = make(metric="precomputed").fit(cdist(X, X)), make().fit(X)
    if name == "clustering":
        np.testing.assert_array_equal(given.labels_, points.labels_)
        np.testing.assert_array_equal(given.predict(cdist(X_new, X)), points.predict(X_new))
        return
    scale = np.abs(points.embedding_).max()
    np.testing.assert_allclose(given.embedding_, points.embedding_, rtol=0, atol=1e-5 * scale)
    np.testing.assert_allclose(given.transform(cdist(X_new, X)), points.transform(X_new),
                               rtol=0, atol=1e-5 * scale)


def test_affinities_and_quality_of_euclidean_distances_are_those_of_the_points():
    X = data()
    D = cdist(X, X)
    A, B = (ge.entropic_affinities(D, 10.0, metric="precomputed", backend=CPU),
            ge.entropic_affinities(X, 10.0, backend=CPU))
    assert abs(A.P - B.P).max() < 1e-14
    M = ge.multiscale_affinities(D, 2.0, metric="precomputed", backend=CPU)
    assert abs(M.P - ge.multiscale_affinities(X, 2.0, backend=CPU).P).max() < 1e-14
    Y = np.random.default_rng(0).standard_normal((X.shape[0], 2))
    np.testing.assert_array_equal(ge.metrics.rnx(D, Y, 30, metric="precomputed"),
                                  ge.metrics.rnx(X, Y, 30))
    np.testing.assert_array_equal(ge.metrics.coranking(D[:50, :50], Y[:50],
                                                       metric="precomputed"),
                                  ge.metrics.coranking(X[:50], Y[:50]))


def test_parametric_mapping_of_distance_rows():
    """F maps each point's distances to the training points: the training rows
    map to the embedding's F(Y)."""
    X = data(100)
    D = cdist(X, X)
    model = ParametricEmbedding(ge.EE(perplexity=10, max_iter=20, random_state=0,
                                      backend=CPU, metric="precomputed"),
                                mapping="linear", n_mu=3).fit(D)
    np.testing.assert_allclose(model.transform(D), model.embedding_, rtol=1e-9,
                               atol=1e-9 * np.abs(model.embedding_).max())


@pytest.mark.parametrize("call, match", [
    (lambda D: ge.knn(D[:, :-1], 5, metric="precomputed"), r"X square.*shape \(60, 59\)"),
    (lambda D: ge.TSNE(metric="precomputed").fit(-D), "X holds negative distances"),
    (lambda D: ge.knn(scipy.sparse.csr_matrix(-D), 5, metric="precomputed"),
     "X holds negative distances"),
    (lambda D: ge.knn(scipy.sparse.csr_matrix(D[:, :-1]), 5, metric="precomputed"),
     r"X square.*shape \(60, 59\)"),
    (lambda D: ge.approx_knn(D, 5, metric="precomputed"), "lists need coordinates"),
    (lambda D: ge.ListIndex(D, metric="precomputed"), "lists need coordinates"),
    (lambda D: ge.TSNE(perplexity=5, metric="precomputed", neighbors="approx").fit(D),
     "lists need coordinates"),
    (lambda D: ge.LaplacianEigenmaps(2, n_neighbors=5, n_landmarks=20,
                                     metric="precomputed").fit(D), "n_landmarks=None"),
    (lambda D: knn_query(D[:3, :-1], D, 5, metric="precomputed"), "Q has 59 features"),
    (lambda D: ge.TSNE(perplexity=5, metric="precomputed").fit(D).transform(-D[:2]),
     "X_new holds negative distances"),
])
def test_bad_distance_matrices_raise(call, match):
    X = data(60)
    with pytest.raises(ValueError, match=match):
        call(cdist(X, X))


def test_command_line_precomputed(tmp_path):
    X = data(100)
    np.save(tmp_path / "d.npy", cdist(X, X))
    out = subprocess.run([sys.executable, "-m", "gpuembed.cli", "embed", str(tmp_path / "d.npy"),
                          "-o", str(tmp_path / "y.npy"), "--backend", "cpu", "--perplexity",
                          "10", "--max-iter", "20", "--random-state", "1", "--metric",
                          "precomputed"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    expected = ge.TSNE(2, 10.0, max_iter=20, random_state=1, backend="cpu",
                       metric="precomputed").fit_transform(cdist(X, X))
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expected)
    demo = subprocess.run([sys.executable, "-m", "gpuembed.cli", "demo", "--metric",
                           "precomputed", "-o", str(tmp_path / "demo.png")],
                          capture_output=True, text=True, timeout=600)
    assert demo.returncode == 1 and "datasets are points" in demo.stderr, demo.stderr
    assert not (tmp_path / "demo.png").exists()


# -- sparse k-NN graphs of distances ------------------------------------------


def graph_of(D, counts, rng):
    """D's entries kept at random, ``counts[i]`` of row i (its own column among
    the candidates), as a CSR graph; the dense matrix of its distances with inf
    where nothing is stored."""
    n, m = D.shape
    keep = np.zeros(D.shape, dtype=bool)
    for i, c in enumerate(counts):
        keep[i, rng.choice(m, c, replace=False)] = True
    rows, cols = np.nonzero(keep)
    G = scipy.sparse.csr_matrix((D[rows, cols], (rows, cols)), shape=D.shape)
    return G, np.where(keep, D, np.inf)


def test_graph_neighbours_are_each_rows_smallest_stored_distances():
    """A sparse graph of distances (rows of 13 to 40 entries, 9 values so that
    many tie, explicit zeros, stored diagonals): each row's smallest stored
    entries, ties by column, its own column left out (knn) or not (queries),
    whole and in blocks of a few rows; entries not stored are no neighbours."""
    rng = np.random.default_rng(3)
    D = (np.round(rng.random((80, 80)) * 8) + 1) / 2
    D[7, 30] = D[7, 61] = 0.0
    counts = rng.integers(13, 41, size=80)
    counts[7] = 80
    G, dense = graph_of(D, counts, rng)
    assert G[7, 30] == 0 and G.nnz == counts.sum()        # the zeros are stored
    k = 12
    for block_bytes in (None, 3 * 80 * 16):
        sq, idx = ge.knn(G, k, metric="precomputed", backend=CPU, block_bytes=block_bytes)
        ref_sq, ref_idx = brute(dense, k, True)
        np.testing.assert_array_equal(idx, ref_idx)
        np.testing.assert_array_equal(sq, ref_sq)
        assert list(idx[7, :2]) == [30, 61]
        sq, idx = knn_query(G[:30], D, 13, metric="precomputed", backend=CPU,
                            block_bytes=block_bytes)
        ref_sq, ref_idx = brute(dense[:30], 13, False)
        np.testing.assert_array_equal(idx, ref_idx)
        np.testing.assert_array_equal(sq, ref_sq)


def test_graph_on_each_backend(backend):
    """The backend's selection from a graph's rows, whole and in blocks: the dense
    reference's neighbours, in order; its depth, each row's stored diagonal aside."""
    rng = np.random.default_rng(4)
    D = (np.round(rng.random((100, 100)) * 15) + 1).astype(np.float32)
    counts = rng.integers(10, 30, size=100)
    G, dense = graph_of(D, counts, rng)
    own = np.isfinite(np.diag(dense))
    assert own.any() and graph_depth(backend, backend.sparse.csr_matrix(G)) == (counts - own).min()
    ref_sq, ref_idx = brute(dense, 9, True)
    for block_bytes in (None, 7 * 30 * 12):
        sq, idx = (backend.to_host(a) for a in ge.knn(
            backend.sparse.csr_matrix(G), 9, metric="precomputed", backend=backend,
            block_bytes=block_bytes))
        np.testing.assert_array_equal(idx, ref_idx)
        np.testing.assert_allclose(sq, ref_sq, rtol=1e-6)


def knn_graph(X, k, Q=None):
    """scikit-learn's graph of each row's k nearest (of Q's rows among X's)."""
    from sklearn.neighbors import NearestNeighbors

    return NearestNeighbors(n_neighbors=k).fit(X).kneighbors_graph(Q, mode="distance")


GRAPH_ESTIMATORS = {
    "tsne": lambda **kw: ge.TSNE(perplexity=10, max_iter=20, init="random", random_state=0,
                                 backend=CPU, **kw),
    "ee": lambda **kw: ge.EE(perplexity=10, max_iter=20, init="random", random_state=0,
                             backend=CPU, **kw),
    "msne": lambda **kw: ge.MultiscaleSNE(max_iter=10, n_neighbors=40, init="random",
                                          random_state=0, backend=CPU, **kw),
}


@pytest.mark.parametrize("name", sorted(GRAPH_ESTIMATORS))
def test_estimators_of_a_knn_graph_are_those_of_the_points(name):
    """The points' 40-NN graph of distances holds every neighbour the
    affinities take (30 for perplexity 10; 40 for msne): the fit and the new
    points' map (by their own graph rows) are those of the points, to the
    rounding of the two ways of computing distances."""
    X, X_new = data(), data(12, seed=4)
    make = GRAPH_ESTIMATORS[name]
    given = make(metric="precomputed").fit(knn_graph(X, 40))
    points = make().fit(X)
    scale = np.abs(points.embedding_).max()
    np.testing.assert_allclose(given.embedding_, points.embedding_, rtol=0, atol=1e-6 * scale)
    np.testing.assert_allclose(given.transform(knn_graph(X, 40, X_new)),
                               points.transform(X_new), rtol=0, atol=1e-6 * scale)


def test_affinities_and_spectral_fits_of_a_knn_graph_are_those_of_the_points():
    X = data()
    G = knn_graph(X, 35)
    A, B = (ge.entropic_affinities(G, 10.0, metric="precomputed", backend=CPU),
            ge.entropic_affinities(X, 10.0, neighbors="exact", backend=CPU))
    assert abs(A.P - B.P).max() < 1e-14
    le = ge.LaplacianEigenmaps(2, n_neighbors=10, metric="precomputed", backend=CPU).fit(G)
    np.testing.assert_allclose(np.abs(le.embedding_), np.abs(
        ge.LaplacianEigenmaps(2, n_neighbors=10, neighbors="exact", backend=CPU).fit_transform(X)),
        atol=1e-10)
    labels = ge.SpectralClustering(3, n_neighbors=10, metric="precomputed", random_state=0,
                                   backend=CPU).fit(G).labels_
    np.testing.assert_array_equal(labels, ge.SpectralClustering(
        3, n_neighbors=10, neighbors="exact", random_state=0, backend=CPU).fit(X).labels_)


@pytest.mark.parametrize("call, match", [
    (lambda G: ge.knn(G, 21, metric="precomputed"),
     r"row 0 of the sparse k-NN graph holds 20 distance\(s\).*fewer than the 21"),
    (lambda G: ge.TSNE(perplexity=8, metric="precomputed").fit(G),
     r"init='pca'.*sparse k-NN graph: take init='random' or 'spectral'"),
    (lambda G: ge.MultiscaleSNE(metric="precomputed").fit(G),
     r"init='pca'.*take init='random' or an"),
    (lambda G: ge.metrics.rnx(G, np.zeros((60, 2)), metric="precomputed"),
     "k_max=None asks for R_NX up to N - 2.*give k_max"),
    (lambda G: ge.metrics.rnx(G, np.zeros((60, 2)), 21, metric="precomputed"),
     r"holds 20 distance\(s\).*fewer than the 21 neighbours asked for \(k_max\)"),
    (lambda G: ge.metrics.auc_rnx(G, np.zeros((60, 2)), metric="precomputed"),
     r"auc_rnx needs R_NX\(K\) up to K = N - 2.*log_k_auc"),
    (lambda G: ge.metrics.coranking(G, np.zeros((60, 2)), metric="precomputed"),
     "coranking needs every pair's rank"),
    (lambda G: ge.LaplacianEigenmaps(2, n_neighbors=5, metric="precomputed").fit(G).transform(
        G[:2]), "transform with metric='precomputed' needs the training points' full"),
    (lambda G: ge.SpectralClustering(2, n_neighbors=5, metric="precomputed").fit(G).predict(
        G[:2]), "predict with metric='precomputed' needs"),
])
def test_graph_uses_that_need_every_distance_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call(knn_graph(data(60), 20))


def test_rnx_of_a_graph_is_that_of_its_distances_up_to_its_depth(backend):
    """R_NX from each row's 25 smallest distances (plus 10 stored at random among
    the farther ones, which rank beyond) equals R_NX of the full matrix for K up
    to 25, on each backend: a pair enters Q_NX(K) only with both ranks <= K."""
    rng = np.random.default_rng(6)
    X = data(120)
    D = cdist(X, X)
    Y = X[:, :2] + 0.3 * rng.standard_normal((120, 2))
    keep = np.zeros(D.shape, dtype=bool)
    order = np.argsort(D + np.diag(np.full(120, np.inf)), axis=1)
    np.put_along_axis(keep, order[:, :25], True, axis=1)
    farther = np.take_along_axis(order, 30 + rng.integers(0, 80, (120, 10)), axis=1)
    np.put_along_axis(keep, farther, True, axis=1)
    G = scipy.sparse.csr_matrix(np.where(keep, D, 0.0))
    G = backend.sparse.csr_matrix(G) if backend.is_gpu else G
    expected = ge.metrics.rnx(D, Y, 25, metric="precomputed")
    got = ge.metrics.rnx(G, Y, 25, metric="precomputed", backend=backend)
    np.testing.assert_allclose(backend.to_host(got), expected, rtol=0, atol=1e-12)
    assert 0.2 < expected[9] < 0.95                     # neither trivial nor random


def test_command_line_knn_graph(tmp_path):
    """A graph saved by scipy.sparse.save_npz embeds from its spectral start; --auc
    gives the area of R_NX up to the graph's depth, 35 here (its stored diagonal
    aside)."""
    X = data(100)
    G = knn_graph(X, 35)
    scipy.sparse.save_npz(tmp_path / "g.npz", G)
    command = [sys.executable, "-m", "gpuembed.cli", "embed", str(tmp_path / "g.npz"), "-o",
               str(tmp_path / "y.npy"), "--backend", "cpu", "--perplexity", "10", "--max-iter",
               "20", "--random-state", "1", "--metric", "precomputed"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    expected = ge.TSNE(2, 10.0, max_iter=20, init="spectral", random_state=1, backend="cpu",
                       metric="precomputed").fit_transform(G)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expected)
    G.setdiag(0.0)                          # an explicit zero: no distance to another point
    scipy.sparse.save_npz(tmp_path / "g.npz", G)
    auc = subprocess.run(command + ["--auc"], capture_output=True, text=True, timeout=600)
    assert auc.returncode == 0, auc.stderr
    value = ge.metrics.log_k_auc(ge.metrics.rnx(G, expected, 35, metric="precomputed"))
    assert f"R_NX AUC (log K, K <= 35, the graph's depth) {value:.4f}" in auc.stdout, auc.stdout
    assert 0.3 < value < 0.95
