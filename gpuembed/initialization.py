"""Initial layouts of the embedding estimators: the data's principal component
scores (classical MDS for a precomputed distance matrix), a random start or an
estimator's own (spectral), scaled to a given spread, and the checks of a given
``init`` array.
"""
import math

import numpy as np
import scipy.linalg
import scipy.sparse.linalg

from ._checks import check_choice, make_rng, warn
from ._sparse import BlockProducts, is_sparse
from .backend import get_backend
from .neighbors import is_graph

# Standard deviation of the first initial coordinate: openTSNE's 1e-4 for the
# classic optimizer (its huge learning rate expands it at once); 0.1 for the
# line-search optimizers, which otherwise start next to the X = 0 saddle of the
# normalized objectives.
INIT_STD = {"tsne": 1e-4, "default": 0.1}
# The classic optimizer's fixed schedule pulls a wide given start together too slowly:
# on 1,000 digits KL 0.552 from a PCA start of standard deviation 1e-4, 0.558 from
# 10, 0.584 from 30, 0.713 from 100 and 1.688 (10-NN accuracy 0.74) from 1,000
# (1,797 digits: 0.735, 0.746, 0.758, 0.857, 1.934).  Wider starts are warned of.
CLASSIC_INIT_STD_MAX = 10.0
# The named starts (MultiscaleSNE: the first two).
INITS = ("pca", "random", "spectral")


def check_graph_init(init, X, metric, inits):
    """init="pca" refused, before the affinities, for a sparse k-NN graph of
    precomputed distances: classical MDS needs every pair's distance."""
    if isinstance(init, str) and init == "pca" and is_graph(X, metric):
        others = " or ".join(repr(i) for i in inits if i != "pca")
        raise ValueError("init='pca' with metric='precomputed' is classical MDS, which needs "
                         "every pair's distance, and X is a sparse k-NN graph: take init="
                         f"{others} or an (N, n_components) array")


def initial_layout(init, X, d, be, dtype, std, random_state, extra=None, n=None,
                   metric="euclidean"):
    """Initial embedding (N, d) on the device: "pca", "random", a name in ``extra``
    (a function returning the layout) scaled so its first coordinate has standard
    deviation ``std``, or a given array used as it is (as check_init returns it).
    ``n``: the number of points where X is None (affinities alone).  For a
    precomputed distance matrix X "pca" is classical MDS, which gives Euclidean
    distances' points their principal component scores."""
    n = X.shape[0] if n is None else n
    if isinstance(init, str):
        scores = classical_mds if metric == "precomputed" else pca
        builders = {"pca": lambda: scores(be.to_host(X), d),
                    "random": lambda: make_rng(random_state).standard_normal((n, d)),
                    **(extra or {})}
        check_choice(init, "init", tuple(builders))
        Y = builders[init]()
        Y = Y / max(float(np.std(Y[:, 0])), 1e-300) * std
        # A coordinate that is constant over all points never moves (its gradient is
        # zero): PCA of data with fewer features than components or of collinear
        # data gives one.  The leading eigenvectors of a graph of (nearly) separate
        # clusters are (nearly) constant on each, so in float32 (the GPU's default)
        # a spectral start's points can share one position, and points in one place
        # never separate (EE on 5 clusters: 79.0 against 10.08 in float64).  A
        # jitter of 1e-4 of the scale, as UMAP adds to its spectral start, frees
        # both; a start without such ties is left as it is.
        flat = np.std(Y, axis=0) <= 1e-12 * std
        if flat.any() or (init == "spectral" and _has_duplicate_rows(Y.astype(dtype))):
            seed = 0 if random_state is None else random_state
            Y = Y + 1e-4 * std * make_rng(seed).standard_normal(Y.shape)
    else:
        Y = init
    return be.asarray(Y, dtype=dtype)


def check_init(init, n, d, be, names):
    """``init``: one of ``names``, or a dense finite (n, d) array, returned as
    initial_layout takes it (an array on the host).  The estimators call it
    before the affinities."""
    if isinstance(init, str):
        return check_choice(init, "init", names)
    if is_sparse(init):
        raise TypeError("init array is a sparse matrix; pass a dense (N, n_components) array")
    Y = be.to_host(init) if hasattr(init, "shape") else np.asarray(init)
    if Y.shape != (n, d):
        raise ValueError(f"init array must have shape {(n, d)}, got {Y.shape}")
    if not np.all(np.isfinite(Y)):
        raise ValueError("init array contains NaN or infinite values")
    # Every objective's gradient along a coordinate that is the same for all points
    # is zero (its forces come from differences x_n - x_m): that column never moves,
    # and an array of equal rows came back unchanged after 0 iterations.
    flat = np.flatnonzero(np.all(Y == Y[:1], axis=0))
    if flat.size:
        raise ValueError(f"init array has the same value in every row of column(s) "
                         f"{flat.tolist()}: the gradient along such a coordinate is zero, "
                         f"so it never moves; give each column distinct values")
    return Y


def warn_wide_classic_start(init):
    """Warn where a given start is wider than the classic optimizer can pull
    together in its schedule (CLASSIC_INIT_STD_MAX), as openTSNE warns."""
    std = float(np.std(init, axis=0).max())
    if std > CLASSIC_INIT_STD_MAX:
        warn(f"init array has standard deviation {std:.3g}: the classic optimizer "
             f"(optimizer='tsne') starts from {INIT_STD['tsne']:g}, as openTSNE and "
             f"scikit-learn do, and from above {CLASSIC_INIT_STD_MAX:g} it ends at a higher "
             f"KL; scale the array down (e.g. init / init[:, 0].std() * 1e-4)")


def _centred_operator(X, mean):
    """X - mean as a LinearOperator, for sparse X."""
    return scipy.sparse.linalg.LinearOperator(
        X.shape, dtype=X.dtype,
        matvec=lambda v: X @ v - mean @ v,
        matmat=lambda V: X @ V - mean @ V,
        rmatvec=lambda u: X.T @ u - mean * u.sum(),
        rmatmat=lambda U: X.T @ U - np.outer(mean, U.sum(axis=0)))


def _has_duplicate_rows(Y):
    return np.unique(Y, axis=0).shape[0] < Y.shape[0]


# PCA of data with more than 2,000 features (_subspace_scores): the columns the
# subspace keeps beyond the d components, the relative change of the singular
# values that ends the iterations, and their most (fewer where the Gram matrix's
# eigenvectors cost less, _gram_budget, which then take over).
PCA_OVERSAMPLING = 10
PCA_TOL = 1e-10
PCA_MAX_ITERATIONS = 100
# Dense rows are centred this many bytes at a time (on each thread) for PCA's
# scatter matrix and scores: the centred copy of all of them (2.9 GB for 10^6
# Fashion-MNIST images in float32) set the peak memory of the default t-SNE fit,
# 12.4 GB.
PCA_BLOCK_BYTES = 2**23


def pca(X, d):
    """Top-d principal component scores of host data X (signs fixed); columns
    beyond the number of features are zero.  Sparse X is centred implicitly
    (its centred copy would be dense), dense X up to 2,000 features a block of
    rows at a time (the scatter matrix summed in float64); beyond 2,000 features
    by subspace iteration, or where that does not settle within what the Gram
    matrix costs, from the Gram matrix's eigenvectors."""
    n, D = X.shape
    if D < d:
        return np.hstack([pca(X, D), np.zeros((n, d - D))])
    # Summed in float64: float32 rows far from the origin had means off by more
    # than their spread (column_means), and the scatter matrix of rows centred on
    # such a mean is that offset's outer product (20,000 x 50 integer rows moved
    # 1e5 from the origin, in float32: scores 0.70 off in Procrustes error).
    mean = np.asarray(X.mean(axis=0, dtype=np.float64)).ravel()
    if D > 2000:
        # Dense rows centred in float64 once: the products with the float64
        # subspace had cast float32 rows anew each time, at twice the time.
        Xc = (_centred_operator(X, mean) if is_sparse(X)
              else np.subtract(X, mean, dtype=np.float64))
        # One BLAS thread: the products of few columns gave other last bits on 1
        # and 2 OpenBLAS threads (as the scores below did), and on one thread they
        # do not wake OpenBLAS's workers, whose busy-waiting held up the
        # optimizer's first numba sweeps.
        with get_backend("cpu").serial_blas():
            # The Gram matrix after its budget of iterations only where both cost
            # no more than the most iterations (at 5,000 x 50,000 they would have
            # cost 1.3 times as much).
            budget = _gram_budget(n, D, min(d + PCA_OVERSAMPLING, n, D))
            gram_after = 2 * budget <= PCA_MAX_ITERATIONS
            scores, settled = _subspace_scores(Xc, d,
                                               budget if gram_after else PCA_MAX_ITERATIONS)
            if not settled and gram_after:
                scores = _gram_scores(_centred_gram(X, Xc, mean), d)
            return _fixed_signs(scores)
    if is_sparse(X):
        scatter = (X.T @ X).toarray() - n * np.outer(mean, mean)
    else:
        # Dense blocks are centred in X's dtype on the mean rounded to it, c; the
        # float64 mean m = c + delta then enters exactly, as the sum of the rows
        # x - c is N delta: the scatter about m is theirs less N delta delta^T, and
        # the scores are (x - c) V - delta V.  (Fashion-MNIST 70k: 0.39-0.41 s, as
        # before the float64 mean; its blocks centred in float64 took 0.45 s.)
        rounded = mean.astype(X.dtype)
        delta = mean - rounded
        scatter = _scatter_matrix(X, rounded) - n * np.outer(delta, delta)
    # The eigenvectors and scores on one BLAS thread: LAPACK's eigensolver and the
    # scores' product (N x D times D x d) gave other last bits on 1 and 2 OpenBLAS
    # threads (as the scatter matrix of float32 rows did), and so did every fit from
    # this start.  On Fashion-MNIST (784 features) the eigensolver takes 0.1 s.
    with get_backend("cpu").serial_blas():
        V = np.linalg.eigh(scatter)[1][:, ::-1][:, :d]
        if is_sparse(X):
            return _fixed_signs(X @ V - mean @ V)
        Y = np.empty((n, d))
        for rows, block in _centred_blocks(X, rounded):
            Y[rows] = block @ V - delta @ V
    return _fixed_signs(Y)


def classical_mds(D, d):
    """Classical (Torgerson) MDS of the distance matrix D (N x N): the top-d
    eigenvectors of B = -J S J / 2, S the squared distances made symmetric, J the
    centring, scaled by the square roots of their eigenvalues (0 for a negative
    one, which distances that no Euclidean points have can give).  For the
    distances of points X these are X's principal component scores.  By ARPACK
    from a fixed start on one BLAS thread (the same vectors at every call), B
    applied as products with S, which is never centred."""
    n = D.shape[0]
    S = np.square(D, dtype=np.float64)

    def centred(V):
        return V - V.mean(axis=0)

    def times_b(V):
        V = centred(V)
        return -0.25 * centred(S @ V + S.T @ V)
    op = scipy.sparse.linalg.LinearOperator((n, n), matvec=times_b, matmat=times_b,
                                            dtype=np.float64)
    with get_backend("cpu").serial_blas():
        values, V = scipy.sparse.linalg.eigsh(
            op, k=d, which="LA", v0=np.random.default_rng(0).standard_normal(n))
    top = np.argsort(values)[::-1]
    return _fixed_signs(V[:, top] * np.sqrt(np.maximum(values[top], 0.0)))


def _subspace_scores(Xc, d, max_iterations):
    """The top-d principal component scores of centred Xc (an array or a
    LinearOperator, N x D) by subspace iteration from a fixed random start: products
    with Xc, then QR and a small eigh, all in one order.  ARPACK's svds, before,
    gave other vectors at every call on an AMD EPYC VM, even on one BLAS thread:
    rotating_objects' two leading singular values are equal, so every rotation of
    that plane is a solution and the call's last bits chose one, and two fits of
    one seed took other paths.  The iterations stop once the leading d singular
    values of the subspace (of the small QR factor, whatever basis it takes for
    equal ones) change by less than PCA_TOL (relative), or after
    ``max_iterations``.  Returns the scores and whether the values settled."""
    n, D = Xc.shape
    b = min(d + PCA_OVERSAMPLING, n, D)
    Q = np.random.default_rng(0).standard_normal((D, b))
    values, settled = np.zeros(d), False
    for _ in range(max_iterations):
        Q = np.linalg.qr(Xc @ Q)[0]
        Q, R = np.linalg.qr(Xc.T @ Q)
        previous, values = values, np.linalg.svd(R, compute_uv=False)[:d]
        settled = np.all(np.abs(values - previous) <= PCA_TOL * values[0])
        if settled:
            break
    B = Xc @ Q                              # Xc on the subspace, (N, b)
    V = np.linalg.eigh(B.T @ B)[1][:, ::-1][:, :d]
    return B @ V, settled


def _gram_budget(n, D, b):
    """The subspace iterations (of b columns) that cost about as much as the
    leading eigenvectors of the N x N Gram matrix (its product, N^2 D / 2 flops,
    and LAPACK's reduction to tridiagonal form, 4 N^3 / 3), against the 4 N D b of
    an iteration's two products; on one thread of a 2-core EPYC the three ran at
    23-27 GFlop/s alike (600 x 50,000: the Gram matrix took the time of 5.7
    iterations, 7 by this count; rotating_objects, 720 x 4,096, settles in 7
    iterations of its 12)."""
    return math.ceil((n * n * D / 2 + 4 * n**3 / 3) / (4 * n * D * b))


def _centred_gram(X, Xc, mean):
    """The Gram matrix (N x N, float64) of the centred rows Xc of X: Xc's own
    product, or for sparse X (Xc an operator) X's less the mean's terms, in
    float64 (float32 products left float32 rows' scores 4e-6 off)."""
    if not is_sparse(X):
        return Xc @ Xc.T
    X, mean = X.astype(np.float64), mean.astype(np.float64)
    inner = X @ mean
    return (X @ X.T).toarray() - inner[:, None] - inner[None, :] + mean @ mean


def _gram_scores(gram, d):
    """The top-d principal component scores U S = U sqrt(eigenvalues) from the
    leading eigenvectors of the Gram matrix of the centred rows: for few rows of a
    spectrum too flat for subspace iteration to settle (600 x 50,000 Gaussian
    noise: 0.9 s against 6.6 s for 100 iterations, which had not)."""
    n = gram.shape[0]
    values, U = scipy.linalg.eigh(gram, subset_by_index=[n - d, n - 1], driver="evr")
    return U[:, ::-1] * np.sqrt(np.maximum(values[::-1], 0.0))


def _block_rows(X):
    """Slices of rows of dense X, PCA_BLOCK_BYTES each."""
    step = max(1, PCA_BLOCK_BYTES // (X.shape[1] * X.itemsize))
    return [slice(start, start + step) for start in range(0, X.shape[0], step)]


def _centred_blocks(X, mean):
    """(rows, X[rows] - mean) for the blocks of :func:`_block_rows`."""
    for rows in _block_rows(X):
        yield rows, X[rows] - mean


def _scatter_matrix(X, mean):
    """The scatter matrix (X - mean)^T (X - mean) of dense X: each block's product
    (in X's dtype) on one BLAS thread, the blocks spread over numba's threads
    (_sparse.BlockProducts), their products summed in float64 in block order.
    OpenBLAS's threaded product of float32 rows gave other last bits on 1 and 2
    threads (Fashion-MNIST), and so did every fit from this start."""
    def centred_product(rows):
        block = X[rows] - mean
        return block.T @ block

    scatter = np.zeros((X.shape[1], X.shape[1]))
    with BlockProducts(get_backend("cpu")) as products:
        for part in products.map(centred_product, _block_rows(X)):
            scatter += part
    return scatter


def _fixed_signs(Y):
    """Y with each column's largest entry (in magnitude) positive."""
    return Y * np.sign(Y[np.argmax(np.abs(Y), axis=0), np.arange(Y.shape[1])])
