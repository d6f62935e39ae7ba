"""Locally Linear Landmarks (dissertation chapter 4, Algorithm 3).

The spectral problem min tr(X A X^T) s.t. X B X^T = I (eq. 4.1) is restricted
to X = X_L Z^T: each point is the locally linear reconstruction of its K_Z
nearest landmarks (eqs 4.6-4.8), so only the L x L problem Z^T A Z, Z^T B Z
(eq. 4.5) is solved, and Z maps new points too.  Here Z is stored (N, L),
one row per point (the dissertation's Z transposed).
"""
from __future__ import annotations

import functools
import warnings

import numpy as np
import scipy.linalg
import scipy.sparse
import scipy.sparse.csgraph
import scipy.sparse.linalg

from .._checks import check_choice, check_data, check_int, make_rng
from .._sparse import rows_product
from ..backend import get_backend
from ..neighbors import knn_query
from ..nbody.exact import centred, squared_distances
from ..optim.directions import connected_sparsify, factorize_cpu
from ..optim.sparse_cpu import csr_times
from .embedding import component_values
from .kmeans import _kmeans, distance_blocks, plusplus_seeds
from .lll_cpu import (by_affinity, dense_to_csr, graph_landmarks, landmark_pair_sqdist,
                      local_weights, reduced_dense, select_columns, spread_points)

LANDMARK_METHODS = ("random", "random-pruned", "kmeans", "spread")
REGULARIZATION = 1e-3   # ridge on the local Gram matrix, relative to its trace (as in LLE)
KZ_MAX = 6
# laplacian_reduced's dense sums: at most this many landmarks a point (N kz^2
# additions, against N kz for SciPy's products) and landmarks (2 L^2 floats).
DENSE_REDUCED_KZ, DENSE_REDUCED_L = 3, 2048
DENSE_MAX_L = 500       # reduced problems above this size, with at least
LANDMARKS_PER_VECTOR = 40   # this many landmarks per wanted vector, go to LOBPCG
# LOBPCG's tolerance, iterations and preconditioner's shift (times diag(B),
# scaled to mean 1) with a Cholesky factor of the reduced graph's Laplacian
# sparsified to each landmark's SPARSIFIED_KAPPA strongest links, then with one of
# A itself, whose iterations cost little where it stays sparse (the vectors then
# as close to eigh's as the dense path's); then dense eigh.
SPARSIFIED_KAPPA = 8
SPARSIFIED_TOL, SPARSIFIED_MAXITER, SPARSIFIED_SHIFT = 1e-8, 500, 1e-4
FACTOR_TOL, FACTOR_MAXITER, FACTOR_SHIFT = 1e-10, 200, 1e-6
LOBPCG_CHECK = 1e-6     # largest residual norm accepted from LOBPCG
# With lll_spectral's ``refine`` the whole graph's Rayleigh-Ritz takes over from the
# reduced problem's vectors, and its LOBPCG stops sooner: Fashion-MNIST 70k, 750
# spread landmarks, kz = 3, 25 iterations and 40 ms at 1e-8, 18 and 32 ms at 1e-6,
# 12 and 23 ms at 1e-4, the error after one step the same to 3 digits (at 1,000:
# 0.0574 against 0.0575); a swiss roll of 4,000 points (1,000 landmarks) 0.0150
# at 1e-5 and 1e-8, 0.0154 at 1e-4.
LOOSE_TOL, LOOSE_CHECK = 1e-5, 1e-3
# Where each point's kz landmarks come from: "input", the nearest in the input space
# (eqs 4.6-4.8); "graph", the nearest of those within 2 hops on the affinity graph
# (3 where fewer lie that close; for a new point, from its nearest training point),
# so that landmarks across a fold of the manifold are not taken (section 4.4 wants
# them along it).  Fashion-MNIST 70k, 20-NN Gaussian graph, d = 10, random
# landmarks, Procrustes error against exact LE (1.97 s) and seconds of LLL (lll.json
# at be52b92, AMD EPYC, 2 cores), input / graph: 250 landmarks 0.234 in 0.73 s /
# 0.218 in 0.67 s; 1,000 0.159 in 1.54 s / 0.141 in 0.60 s; 2,000 0.127 in 2.84 s /
# 0.106 in 0.69 s; 3,000 0.112 in 2.92 s / 0.098 in 0.87 s; at d = 50 the graph's
# error is lower at every number too (1,000: 0.419 against 0.424).  With 250
# landmarks 67,295 of 70,000 points have fewer than kz within 2 hops; 3 hops read
# through each point's list of neighbouring landmarks cost little, where a
# breadth-first walk over the points took 4.0 s.
Z_NEIGHBORS = ("input", "graph")


def default_kz(d):
    """Landmarks per point for a d-dimensional Laplacian embedding: min(d + 1, KZ_MAX).

    Section 4.4 puts K_Z between the manifold's intrinsic dimension + 1 and D + 1,
    "not much bigger" than the former, and independent of the output dimension d;
    d + 1 (this release's earlier default) grows with d and blurs Z.  Procrustes
    error against exact LE (random landmarks; 20k Fashion-MNIST on a 20-NN graph,
    1,797 digits on a 10-NN graph):
      Fashion d = 50, L = 500 / 2,000:  K_Z 51 0.566 / 0.402, 11 0.446 / 0.222,
        8 0.438 / 0.214, 6 0.441 / 0.219, 4 0.456 / 0.237;
      Fashion d = 10:  11 0.180 / 0.106, 6 0.170 / 0.098, 4 0.388 / 0.103;
      digits d = 20, L = 300 / 800:  21 0.376 / 0.181, 6 0.320 / 0.124, 4 0.264 / 0.103;
      Fashion d = 2:  3 0.157 / 0.087 (L = 250 / 1,000), 8 0.167 / 0.094.
    6 is never far from the best; small d keeps d + 1, which is best there.  Past
    D + 1 the weights are not unique, but the ridge below fixes them, and on the
    3-feature pixels of the segmentation benchmark (d = 5) K_Z = 6 fits exact
    spectral clustering a little better than D + 1 = 4 (Procrustes 0.24 against
    0.26 with 500 landmarks)."""
    return min(d + 1, KZ_MAX)


def choose_landmarks(Y, n_landmarks, method="random", random_state=None, graph=None):
    """Indices of L = ``n_landmarks`` landmarks among the rows of Y (section 4.4),
    by ``method``, drawn with ``random_state``.

    "random": uniform without replacement.  "random-pruned": draw L + M (M = L / 10),
    then drop one point of each of the M closest pairs, which spreads them out.
    "kmeans": the data points nearest to the centroids of a k-means with L clusters:
    10 Lloyd iterations on a sample of 20 L points from k-means++ seeds drawn among
    max(2 L, 2,000) of them.  On Fashion-MNIST 20k LLL's Procrustes error is then
    0.1045 / 0.0826 with 1,000 / 2,000 landmarks in 4.8 / 9.8 s, against 0.1038 /
    0.0833 in 11.8 / 19.8 s with the seeds drawn among all 20 L (a cost of 20 L^2
    D) and up to 50 iterations (random landmarks: 0.131 / 0.098 in 0.5 / 0.9 s).
    "spread": along the affinity ``graph`` (N x N, symmetric; sparse or dense, on
    the host or the device), the points in a random order, each taken unless it is
    among the m nearest graph neighbours (largest affinities) of one taken before, m
    the largest that leaves L (:func:`_spread_landmarks`): spread out, no two of
    them near neighbours while L is below the graph's independent sets (about N / 8
    on 20-NN graphs), as far apart as L allows beyond.  LLL's Procrustes error
    against exact LE, mean of 4 seeds, random / spread landmarks: a swiss roll of
    4,000 points (20-NN, d = 2) with 100 / 300 / 1,000 landmarks 0.54 / 0.041 /
    0.018 against 0.25 / 0.024 / 0.016; digits (10-NN, d = 10, input-space Z) with
    200 / 800 0.43 / 0.29 against 0.32 / 0.14 (400: 0.26 against 0.28);
    Fashion-MNIST 70k (20-NN, d = 10, the graph's Z) with 1,500 / 2,000 / 2,500 /
    3,000 0.117 / 0.106 / 0.098 / 0.093 against 0.114 / 0.099 / 0.092 / 0.093, in
    the same time (the choice takes 2 ms; "random-pruned" 0.108 at 2,000, in 0.1 s
    more).  Not where L is a large share of the points: Fashion-MNIST 10k with
    2,000, 0.134 against 0.169 (with 500 and 1,000, 0.24 and 0.21 against 0.23 and
    0.20).  Level on the 30,602 pixels of the segmentation benchmark (3 features,
    10-NN): the segmentation's ARI against exact spectral clustering 0.818-0.912
    against 0.817-0.916 with 100-2,000 landmarks.
    Y: dense or sparse, on the host or the device (copied to the host).
    """
    Y = check_data(Y, get_backend("cpu"), name="Y", min_samples=1, sparse=True)
    return _choose_landmarks(Y, n_landmarks, method, random_state, graph)


def _choose_landmarks(Y, n_landmarks, method, random_state, graph=None):
    """:func:`choose_landmarks` of a Y already checked, on the host."""
    n = Y.shape[0]
    L = check_int(n_landmarks, "n_landmarks", 1, n)
    check_choice(method, "landmarks", LANDMARK_METHODS)
    rng = make_rng(random_state)
    if method == "spread":
        if graph is None:
            raise ValueError("landmarks='spread' spreads them along an affinity graph, and "
                             "none was given (graph): the linear methods and "
                             "landmark_basis take 'random', 'random-pruned' or 'kmeans'")
        graph = scipy.sparse.csr_matrix(get_backend("cpu").to_host(graph))
        return _spread_landmarks(graph, n, L, rng)
    if method == "random" or L == n:
        return np.sort(rng.choice(n, L, replace=False))
    if method == "random-pruned":
        M = min(max(1, L // 10), n - L)
        cand = rng.choice(n, L + M, replace=False)
        Yc = centred(np, Y[cand])
        D = squared_distances(np, Yc, Yc)
        D[np.tril_indices(len(cand))] = np.inf
        keep = np.ones(len(cand), dtype=bool)
        dropped = 0
        for flat in np.argsort(D, axis=None):
            i, j = divmod(int(flat), len(cand))
            if keep[i] and keep[j]:
                keep[j] = False
                dropped += 1
                if dropped == M:
                    break
        return np.sort(cand[keep])
    sample = Y if n <= 20 * L else Y[rng.choice(n, 20 * L, replace=False)]
    among = min(sample.shape[0], max(2 * L, 2000))
    seeds = plusplus_seeds(sample[rng.choice(sample.shape[0], among, replace=False)], L, rng)
    _, centers, _ = _kmeans(sample, L, init=seeds, max_iter=10)
    return np.unique(_nearest_rows(centers, Y))


def _spread_landmarks(graph, n, L, rng):
    """landmarks="spread": in a random order, each point unless it is among the m
    nearest graph neighbours of one taken before (spread_points), for the largest
    m that leaves at least L such points (a bisection over m)."""
    if graph.shape != (n, n):
        raise ValueError(f"graph has shape {graph.shape}, Y {n} points")
    order = rng.permutation(n)
    widest = int(np.diff(graph.indptr).max(initial=0))
    # Every neighbour near (m = widest) needs no ranking, and L usually fits there:
    # at 70,000 points the ranking took 28 ms, about 5% of LLL.
    taken, found = spread_points(graph.indptr, graph.indices, order, L, widest)
    if found < L:
        ranked = by_affinity(graph.indptr, graph.indices, graph.data)
        spread = lambda m: spread_points(graph.indptr, ranked, order, L, m)
        low, high = 0, widest - 1                                  # m = 0 takes all N
        while low < high:
            m = (low + high + 1) // 2
            low, high = (m, high) if spread(m)[1] >= L else (low, m - 1)
        taken = spread(low)[0]
    return np.sort(taken)


def _nearest_rows(centers, Y):
    """Index of the row of Y nearest to each centre (the first of ties), from
    :func:`~gpuembed.spectral.kmeans.distance_blocks` over Y's rows."""
    columns = np.arange(len(centers))

    def nearest_in(rows, D):
        where = D.argmin(axis=0)
        return D[where, columns], where + rows.start

    least, where = (np.stack(parts) for parts in zip(*distance_blocks(Y, centers, nearest_in)))
    return where[least.argmin(axis=0), columns]


def reconstruction_weights(Y, Y_landmarks, kz, *, backend="auto", search=None,
                           metric="euclidean"):
    """Sparse (N, L) Z: each row of ``Y`` (N, D) is reconstructed from its kz nearest
    rows of ``Y_landmarks`` (L, D) with
    weights summing to one (LLE-style local Gram system, eqs 4.7-4.8; ridge
    1e-3 trace(G) / kz, needed when kz > D or landmarks are degenerate).  A point
    equal to a landmark gets exactly that landmark.

    G_ij = (y - l_i).(y - l_j) = (|y - l_i|^2 + |y - l_j|^2 - |l_i - l_j|^2) / 2 comes
    from the k-NN distances and the landmarks' own distances, so no (N, kz, D)
    array of differences is formed: O(N kz^2 + P D) instead of O(N kz^2 D), P
    the pairs of landmarks that are both among one point's nearest (dense rows,
    lll_cpu.landmark_pair_sqdist; sparse rows: all L^2 pairs by a product).
    The k-NN search runs on ``backend`` in the inputs' dtype (``search(Y, kz)``:
    another search of the landmarks, such as a :class:`~gpuembed.neighbors_ivf.QuerySearch`
    of them), the Gram systems on the host in float64 (lll_cpu.local_weights).
    ``metric="precomputed"``: Y's rows are the points' distances to the landmarks
    and ``Y_landmarks`` the landmarks' (L, L) distance matrix, which gives the
    Gram systems the same way.
    """
    n, L = Y.shape[0], Y_landmarks.shape[0]
    kz = check_int(kz, "kz", 1, L)
    be = get_backend(backend)
    neighbours = (search(Y, kz) if search is not None
                  else knn_query(Y, Y_landmarks, kz, metric=metric, backend=be))
    sqdist, idx = (be.to_host(a) for a in neighbours)
    sqdist = sqdist.astype(np.float64, copy=False)
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    landmarks = be.to_host(Y_landmarks)
    if metric == "precomputed":
        between = np.square(landmarks, dtype=np.float64)
    elif scipy.sparse.issparse(landmarks):
        with get_backend("cpu").serial_blas():  # the same bits on any number of threads
            between = squared_distances(np, landmarks, landmarks)
    else:                                       # only the pairs that share a point
        between = landmark_pair_sqdist(np.ascontiguousarray(landmarks, dtype=np.float64), idx)
    W = local_weights(sqdist, idx, np.asarray(between, dtype=np.float64), REGULARIZATION)
    exact = sqdist[:, 0] == 0
    W[exact] = 0.0
    W[exact, 0] = 1.0
    rows = np.repeat(np.arange(n), kz)
    return scipy.sparse.csr_matrix((W.ravel(), (rows, idx.ravel())), shape=(n, L))


def graph_landmark_neighbours(Q, seeds, X, landmarks, graph, kz, *, backend="auto"):
    """(sqdist, positions), each (M, kz) on the host: for each row of Q (M, D) the
    kz landmarks (indices ``landmarks`` into the rows of X, (N, D)) closest along
    ``graph`` (N x N affinities) to the point ``seeds[m]``, by paths of at most 2
    edges, a path's score the product of its affinities (the seed itself, when a
    landmark, first): for Gaussian affinities the paths shortest in their edges'
    summed squared distances.  ``sqdist``: their squared distances to the row,
    ascending.  A row with fewer landmarks that close takes paths of 3 edges, and
    one with fewer still the kz nearest of all (the input-space search, on
    ``backend``).  X dense; Q made dense (new points, a few).

    Ranked by their distances to the point instead (the earlier rule: the kz
    nearest of those within 2 or 3 hops), the landmarks gave Z more error against
    exact LE in 10 of 12 cases (Fashion-MNIST 70k, 20-NN graph, d = 10: spread
    landmarks 0.1004 against 0.0894 at 2,000, 0.0856 against 0.0785 at 3,000,
    random ones 0.1055 against 0.0948 at 2,000; d = 50: random 0.351 against 0.338
    at 2,000, spread 0.306 against 0.294 at 2,000 but 0.295 against 0.301 and
    0.272 against 0.294 at 3,000 and 4,000), and their distances took about 35
    landmarks a point in 784-D where kz take them now."""
    graph = scipy.sparse.csr_matrix(graph, dtype=np.float64)
    n = X.shape[0]
    if graph.shape != (n, n):
        raise ValueError(f"the graph has shape {graph.shape}, X {n} points")
    position = np.full(n, -1, np.int64)
    position[landmarks] = np.arange(len(landmarks))
    near = _selected(graph, position, len(landmarks))   # each point's neighbouring landmarks
    landmark_rows = np.ascontiguousarray(X[landmarks])
    Q = np.ascontiguousarray(Q.toarray() if scipy.sparse.issparse(Q) else Q,
                             dtype=landmark_rows.dtype)
    seeds = np.asarray(seeds, dtype=np.int64)
    search = functools.partial(graph_landmarks, graph.indptr, graph.indices, graph.data,
                               near.indptr, near.indices, near.data, position, Q)
    none = (np.empty((0, kz), np.int64), np.empty((0, kz)), np.empty(0, np.int64))
    sqdist, nearest, score, found = search(np.arange(len(Q)), seeds, landmark_rows, kz, 2,
                                           *none)
    short = np.flatnonzero(found < kz)
    if short.size:                               # one hop further
        # A fit's rows (each point its own seed) go on from every point's 2-hop result.
        fit = len(seeds) == n and (seeds == np.arange(n)).all()
        farther = search(short, seeds[short], landmark_rows, kz, 3,
                         *((nearest, score, found) if fit else none))
        sqdist[short], nearest[short] = farther[:2]
        short = short[farther[3] < kz]
    if short.size:
        be = get_backend(backend)
        far = knn_query(be.asarray(Q[short]), be.asarray(landmark_rows), kz, backend=be)
        sqdist[short], nearest[short] = (be.to_host(a) for a in far)
    return sqdist, nearest


def landmark_basis(X, d, n_landmarks, kz=None, landmarks="random", random_state=None,
                   backend="auto"):
    """Algorithm 3's affinity-free part: (landmark indices, Z (N, L), kz) for ``d``
    output dimensions (the default kz), ``n_landmarks`` landmarks chosen by
    ``landmarks`` with ``random_state`` (:func:`choose_landmarks`).  Z depends on
    the data and the landmarks alone (section 4.5), so one basis serves every
    affinity graph of a parameter sweep (:func:`fit_grid`).  X: dense or sparse,
    on the host or the device (copied to the host; the k-NN search runs on
    ``backend``)."""
    X = check_data(X, get_backend("cpu"), min_samples=2, sparse=True)
    return _landmark_basis(X, d, n_landmarks, kz, landmarks, random_state, backend)


def _landmark_basis(X, d, n_landmarks, kz, landmarks, random_state, backend, graph=None,
                    z_neighbors="input"):
    """:func:`landmark_basis` of an X already checked, on the host (the estimators');
    with the affinity ``graph``, landmarks="spread" and z_neighbors="graph" (X dense)."""
    n = X.shape[0]
    d = check_int(d, "d", 1)
    L = check_int(n_landmarks, "n_landmarks", d + 2, n)
    kz = default_kz(d) if kz is None else check_int(kz, "kz", 1, L)
    idx = _choose_landmarks(X, L, landmarks, random_state, graph)
    search = None if z_neighbors == "input" else (lambda Y, k: graph_landmark_neighbours(
        Y, np.arange(n), X, idx, graph, k, backend=backend))
    return idx, reconstruction_weights(X, X[idx], kz, backend=backend, search=search), kz


def _selected(W, new_column, n_columns, above_row=False):
    """The CSR matrix of :func:`~gpuembed.spectral.lll_cpu.select_columns` of W."""
    indptr, indices, data = select_columns(W.indptr, W.indices, W.data, new_column, above_row)
    return scipy.sparse.csr_matrix((data, indices, indptr), shape=(W.shape[0], n_columns))


def laplacian_reduced(Z, W, degree=None):
    """Z^T (D - W) Z and Z^T D Z (eq. 4.5 for Laplacian eigenmaps, D = diag(W 1))
    for symmetric sparse affinities W, without forming any dense N x N product.

    Z^T W Z = S + S^T + Z^T diag(W) Z with S = Z^T triu(W, 1) Z: the products go
    over half of W's entries.  Fashion-MNIST 70k (20-NN graph, 3,000 landmarks,
    kz = 6; 2-core EPYC, SciPy's products): 0.14 s against 0.19 s for
    Z^T ((D - W) Z) and Z^T (D Z); each product cut into row spans on the cores
    (:func:`~gpuembed._sparse.rows_product`), 0.11 s against 0.14 s at 2,500.
    ``degree``: W's row sums, where the caller has them already.

    A Z of kz <= DENSE_REDUCED_KZ landmarks a point (the same kz in every row)
    and at most DENSE_REDUCED_L landmarks goes through dense sums instead
    (:func:`~gpuembed.spectral.lll_cpu.reduced_dense`, faster there)."""
    ZT = Z.T.tocsr()
    if degree is None:                      # lll_spectral passes the degrees it checked
        degree = np.asarray(W.sum(axis=1)).ravel()
    n, L = Z.shape
    kz = Z.nnz // n
    if kz <= DENSE_REDUCED_KZ and L <= DENSE_REDUCED_L and (np.diff(Z.indptr) == kz).all():
        z_idx, z_val = Z.indices.reshape(n, kz), Z.data.reshape(n, kz)
        dense = reduced_dense(ZT.indptr, ZT.indices, ZT.data, z_idx, z_val, W.indptr,
                              W.indices, W.data, np.asarray(degree, dtype=np.float64))
        sparse = [dense_to_csr(M) for M in dense]
        return tuple(scipy.sparse.csr_matrix((data, indices, indptr), shape=(L, L))
                     for indptr, indices, data in sparse)
    B = rows_product(ZT, scipy.sparse.diags(degree) @ Z)
    upper = _selected(W, np.arange(W.shape[0]), W.shape[0], above_row=True)
    S = rows_product(ZT, rows_product(upper, Z))
    loops = W.diagonal()
    A = rows_product(ZT, scipy.sparse.diags(degree - loops) @ Z) if loops.any() else B
    return (A - (S + S.T)).tocsr(), B


def smoothed_embedding(W, degree, Y, steps, fixed=0):
    """LLL's embedding Y (N, k) of the graph W (its row sums ``degree``) moved
    toward exact LE's: ``steps`` steps of the random walk D^-1 W, each followed
    by the Rayleigh-Ritz vectors of L u = lambda D u (L = D - W) in the span
    reached, D-orthonormal, ascending, each column's sign that of its
    correlation with Y's.  The first ``fixed`` columns (eigenvectors of
    eigenvalue 0, indicators of the graph's components) are kept as they are.

    The walk keeps LE's vectors (D^-1 W u = (1 - lambda) u) and damps most the
    directions of large lambda, where the error of the landmarks' piecewise
    linear Z lies: on Fashion-MNIST 70k (20-NN graph, d = 10, 1,000 spread
    landmarks along the graph) one step took the Procrustes error against exact
    LE from 0.128 to 0.058 with kz = 3 and from 0.112 to 0.067 with kz = 6, at
    a cost of 2 products with W (about 20 ms on 2 cores).  A span D-orthogonal
    to the constant stays so (1^T D D^-1 W Y = (W 1)^T Y)."""
    moving = Y[:, fixed:]
    if steps == 0 or moving.shape[1] == 0:
        return Y
    product = lambda V: csr_times(W.indptr, W.indices, W.data, np.ascontiguousarray(V))
    scaled = lambda V: V * degree[:, None]
    k = moving.shape[1]
    # Entries of order 1, not 1 / sqrt(sum(degree)): a Gaussian graph's far
    # affinities (1e-300) times those made subnormal numbers, which took the
    # products 3 times longer.  Rayleigh-Ritz undoes any scale.
    V = moving * np.sqrt(degree.sum())
    WV = product(V)
    # BLAS on one thread: its workers' busy wait after the small products below
    # took the cores from numba's threads (an LLL fit's graph search right after
    # threaded BLAS calls: 0.11 s against 0.064 s).
    with get_backend("cpu").serial_blas():
        for _ in range(steps):
            V = WV / degree[:, None]
            WV = product(V)
            B = V.T @ scaled(V)
            _, C = dense_generalized_eigh(B - V.T @ WV, B, 1e-12 * np.trace(B) / k,
                                          [0, k - 1])
            V, WV = V @ C, WV @ C
    signs = np.where(np.einsum("ij,ij->j", moving, scaled(V)) < 0, -1.0, 1.0)
    return np.concatenate([Y[:, :fixed], V * signs], axis=1)


def trailing_generalized(A, B, d, skip=0, sparse_factor=False, data_components=None,
                         loose=False):
    """d trailing eigenvectors of A u = lambda B u (L x L, symmetric, B > 0), after
    ``skip``, B-orthonormal.

    Where the landmarks' graph (A's and B's off-diagonal pattern) splits into
    components, each one's indicator is an eigenvector of eigenvalue 0 (A = Z^T
    L Z has rows summing to 0, as Z's sum to one and L's to 0, and so do the rows
    of each of its diagonal blocks), and the vectors of that multiple eigenvalue
    are taken from the components as exact LE takes them (:func:`_null_basis`),
    the others found B-orthogonal to them, not whatever basis of them a solver
    returns (the LLL of 5 separated clusters had been 0.95-1.0 off exact LE in
    Procrustes error).  ``data_components``: None, or a function that gives each landmark's
    component in the data graph, numbered by first point as exact LE numbers them
    (called only where the landmarks' graph splits); the landmarks' components
    are then taken in the order of the smallest such number among their
    landmarks, else of their first landmarks.

    Dense eigh up to DENSE_MAX_L, for more than L / LANDMARKS_PER_VECTOR vectors,
    or when A or B is dense.  Otherwise LOBPCG on the sparse matrices: the dense
    solve is O(L^3) and the reduced matrices of a k-NN graph stay sparse (6%
    nonzero at L = 4,000 on Fashion-MNIST 70k, 3% at 8,000); ARPACK needed 1.3 s
    and 3.5 s there for 11 vectors (334-388 solves with a Cholesky factor of B),
    against eigh's 4.2-5.5 s at 4,000.  LOBPCG's cost grows with the vectors
    wanted, faster than eigh's (Fashion-MNIST 70k's graph Z, the preconditioner
    below): at L = 1,000 21 vectors took 0.064 s against eigh's 0.081 s, 51 took
    1.1 s against 0.09 s; 51 at 2,000 / 3,000 / 4,000 0.40 / 1.05 / 0.81 s against
    0.57 / 2.2 / 5.7 s, 31 0.22 / 0.38 / 0.55 s against 0.54 / 2.1 / 5.8 s.

    LOBPCG is preconditioned by a Cholesky factor of the Laplacian of the
    landmarks' graph (A's negative off-diagonal entries) sparsified to each
    landmark's SPARSIFIED_KAPPA strongest links, more where that splits it
    (optim.directions.connected_sparsify), plus SPARSIFIED_SHIFT diag(B).  For 11
    vectors at L = 1,500 / 2,000 / 3,000 of Fashion-MNIST 70k (the graph's Z) it
    took 0.062 / 0.083 / 0.13 s (36 / 35 / 31 iterations), against 0.093 / 0.13 /
    0.17 s with Jacobi's preconditioner (104 iterations at 2,000, 78 at 3,000) and
    0.24 / 0.53 / 2.3 s for eigh; 21 vectors at 3,000 0.20 s against 0.26 s.  It
    also reaches the smooth manifolds where Jacobi's crawls, their trailing
    eigenvalues crowded near 0: the landmarks of a swiss roll of 70,000 points took
    66 / 75 iterations at L = 2,000 / 4,000 (0.04 / 0.09 s), where Jacobi's had not
    converged after 500 (1,974 to converge on another roll).  A shift of 1e-6 left
    LOBPCG unstable with 31 and 51 vectors (5-18 s).  A factor of A itself took
    0.33 s at L = 3,000 on Fashion-MNIST; on the landmarks of points with few
    coordinates (``sparse_factor``:
    :func:`~gpuembed.spectral.embedding.points_suit_shift_invert`) it stays sparse
    and, shifted by FACTOR_SHIFT diag(B), preconditions better: those swiss-roll
    landmarks took 12 / 13 iterations to FACTOR_TOL and 0.017 / 0.038 s.  A run
    that does not converge goes on from its vectors with the next preconditioner
    (the sparsified factor, then A's), the last to dense eigh where it leaves a
    residual above LOBPCG_CHECK (``loose``: LOBPCG to LOOSE_TOL, a residual up to
    LOOSE_CHECK accepted)."""
    L, k = A.shape[0], skip + d
    # B's diagonal raised by 1e-12 of itself (of its mean where it is 0: landmarks far
    # from all data).  A ridge of 1e-12 of the mean swamped landmarks whose points'
    # degrees lie below it, and each became an eigenvalue near 0 (A_ll / ridge) with a
    # vector on it alone (clusters whose 15-NN weights fall to 1e-36, 1,000
    # landmarks: columns of norm 3.6e7 where exact LE's largest is 504).
    diagonal = B.diagonal()
    scale = diagonal.mean()
    ridge = 1e-12 * np.where(diagonal > 0, diagonal, scale)
    known = _null_basis(A, B, k, data_components)
    c = 0 if known is None else known.shape[1]
    if c == k:
        return np.zeros(d), known[:, skip:]
    if (L <= DENSE_MAX_L or k * LANDMARKS_PER_VECTOR > L
            or not (scipy.sparse.issparse(A) and scipy.sparse.issparse(B))):
        vals, vecs = _trailing_dense(A, B, ridge, k, 0)
        return _with_known(vals, vecs, known, skip)
    # One scale for both, so that tol is relative; the eigenvalues do not change, the
    # B-orthonormal vectors shrink by sqrt(scale), undone at the end.
    A = ((A + A.T) / (2 * scale)).tocsr()
    B = ((B + B.T) / (2 * scale) + scipy.sparse.diags(ridge / scale)).tocsr()
    known = None if known is None else known * np.sqrt(scale)
    shifted_factor = lambda M, shift: factorize_cpu(
        (M + scipy.sparse.diags(shift * B.diagonal())).tocsr())
    sparsified_tol, factor_tol, accepted = ((LOOSE_TOL, LOOSE_TOL, LOOSE_CHECK) if loose
                                            else (SPARSIFIED_TOL, FACTOR_TOL, LOBPCG_CHECK))
    stages = [] if sparse_factor else [
        (lambda: shifted_factor(_sparsified_laplacian(A), SPARSIFIED_SHIFT), sparsified_tol,
         SPARSIFIED_MAXITER)]
    stages.append((lambda: shifted_factor(A, FACTOR_SHIFT), factor_tol, FACTOR_MAXITER))
    vecs = np.random.default_rng(0).standard_normal((L, k - c))
    for preconditioner, tol, maxiter in stages:
        vals, vecs = _lobpcg(A, B, vecs, preconditioner(), tol, maxiter, known)
        if np.linalg.norm(A @ vecs - (B @ vecs) * vals, axis=0).max() <= accepted:
            vals, vecs = np.concatenate([np.zeros(c), vals]), _stack(known, vecs)
            break
    else:
        vals, vecs = _with_known(*_trailing_dense(A, B, 0.0, k, 0), known, 0)
    return vals[skip:], vecs[:, skip:] / np.sqrt(scale)


def _null_basis(A, B, k, data_components):
    """B-orthonormal vectors (L, min(k, c)) of A's eigenvalue 0 from the c
    components of the landmarks' graph (the pattern of A and B; None where it is
    connected): the landmarks' values of
    :func:`~gpuembed.spectral.embedding.component_values`, the components'
    volumes their indicators' B-norms (B's row sums: B too splits into their
    blocks), in the order that :func:`trailing_generalized` says."""
    pattern = abs(scipy.sparse.csr_matrix(A)) + abs(scipy.sparse.csr_matrix(B))
    pattern.eliminate_zeros()
    n_comp, labels = scipy.sparse.csgraph.connected_components(pattern, directed=False)
    if n_comp == 1:
        return None
    if data_components is not None:
        first = np.full(n_comp, np.inf)
        np.minimum.at(first, labels, data_components())
        labels = np.argsort(np.argsort(first, kind="stable"))[labels]
    volume = np.bincount(labels, weights=np.asarray(B.sum(axis=1)).ravel(), minlength=n_comp)
    return component_values(np, volume, min(k, n_comp))[labels]


def _stack(known, vecs):
    """The columns of ``known`` (None: none), then those of vecs."""
    return vecs if known is None else np.concatenate([known, vecs], axis=1)


def _with_known(vals, vecs, known, skip):
    """A dense solver's (vals, vecs) of the k trailing vectors with the first c,
    a basis of eigenvalue 0 (any, from the solver), replaced by ``known``; after
    ``skip``."""
    if known is not None:
        c = known.shape[1]
        vals, vecs = np.concatenate([np.zeros(c), vals[c:]]), _stack(known, vecs[:, c:])
    return vals[skip:], vecs[:, skip:]


def _sparsified_laplacian(A):
    """Laplacian of the landmarks' graph, whose link weights are A's negative
    off-diagonal entries (A's few positive ones, which weights of Z below zero
    give, left out), each landmark's SPARSIFIED_KAPPA strongest links kept."""
    links = (-A).tocsr()
    links.setdiag(0)
    links.data = np.maximum(links.data, 0.0)
    links.eliminate_zeros()
    kept = connected_sparsify(get_backend("cpu"), links, SPARSIFIED_KAPPA, True)[0]
    return scipy.sparse.diags(np.asarray(kept.sum(axis=1)).ravel()) - kept


def _lobpcg(A, B, X, M, tol, maxiter, known=None):
    """LOBPCG's smallest eigenpairs of A u = lambda B u from the block X,
    preconditioned by M, B-orthogonal to the columns of ``known``, ascending."""
    # BLAS on one thread: its workers' busy wait after LOBPCG's small dense products
    # took the cores from the parallel sparse ones (2.7 ms per product against 0.5).
    with warnings.catch_warnings(), get_backend("cpu").serial_blas():
        warnings.simplefilter("ignore", UserWarning)    # non-convergence: checked after
        vals, vecs = scipy.sparse.linalg.lobpcg(_on_all_cores(A), X, B=_on_all_cores(B),
                                                M=_operator(M, A.shape[0]), Y=known,
                                                largest=False, tol=tol, maxiter=maxiter)
    order = np.argsort(vals)
    return vals[order], vecs[:, order]


def _on_all_cores(M):
    """V -> M V for LOBPCG by the compiled parallel product (SciPy's runs on one
    core), the same bits: at 3,000 landmarks of Fashion-MNIST 70k (230 nonzeros
    per row) LOBPCG's 156 products took 0.08 s against 0.17 s."""
    return _operator(lambda V: csr_times(M.indptr, M.indices, M.data,
                                         np.ascontiguousarray(V, dtype=np.float64)),
                     M.shape[0])


def _operator(apply, n):
    """``apply`` (V (n, k) -> (n, k)) as an n x n LinearOperator: SciPy's LOBPCG
    takes bare callables from 1.10 on (1.9 raises "type not understood")."""
    return scipy.sparse.linalg.LinearOperator(
        (n, n), matvec=lambda v: apply(v.reshape(n, 1)).reshape(v.shape), matmat=apply,
        dtype=np.float64)


def _trailing_dense(A, B, ridge, d, skip):
    vals, vecs = dense_generalized_eigh(A, B, ridge, [0, skip + d - 1])
    return vals[skip:], vecs[:, skip:]


def dense_generalized_eigh(A, B, ridge, subset):
    """Eigenpairs ``subset`` (first and last index, ascending) of the symmetrized
    A u = lambda (B + diag(ridge)) u (``ridge`` a number or one per row), by LAPACK;
    sparse inputs are densified."""
    dense = lambda M: M.toarray() if scipy.sparse.issparse(M) else np.asarray(M)
    A, B = dense(A), dense(B)
    A = (A + A.T) / 2
    B = (B + B.T) / 2 + np.diag(np.broadcast_to(ridge, len(B)))
    with get_backend("cpu").serial_blas():      # the same bits on any number of threads
        return scipy.linalg.eigh(A, B, subset_by_index=subset)
