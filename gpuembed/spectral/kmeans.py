"""k-means (Lloyd's iterations, k-means++ seeding), vectorized over points.

X may be a scipy sparse matrix (the centers are dense, K x D)."""
from __future__ import annotations

import numpy as np
import scipy.sparse

from .._checks import check_data, check_float, check_int, make_rng, warn
from .._sparse import TILE_ROWS, BlockProducts, is_sparse, row_sqnorms
from ..backend import get_backend
from ..nbody.exact import squared_distances
from .kmeans_cpu import assign, cluster_sums

# Dense rows against centres of at most this many K x D entries are assigned by the
# compiled pass (kmeans_cpu), larger problems by the distance matrix's GEMM.  One
# Lloyd step, 10,000 / 70,000 rows: K = D = 10 0.43 / 3.0 ms against 1.4 / 9.8 ms,
# K = D = 20 1.5 / 10.2 against 2.4 / 16.4, K = D = 30 3.1 / 22 against 3.5 / 23,
# K = D = 50 8.7 / 63 against 6.7 / 36 (2-core Xeon VM).
COMPILED_MAX_CENTER_ENTRIES = 500


def kmeans(X, n_clusters, *, n_init=10, max_iter=300, tol=1e-9, init=None, random_state=None):
    """Best of ``n_init`` runs: (labels (N,), centers (K, D), inertia), K =
    ``n_clusters``.  Each run starts from k-means++ seeds drawn by ``random_state``
    and takes Lloyd iterations until the inertia falls by at most ``tol`` (relative)
    or ``max_iter``.  A cluster left without points moves to the point farthest
    from its centre; one that stays empty (X has fewer distinct rows than K) keeps
    its centre, and k-means warns.

    ``init`` (K, D) starts one run from the given centers instead (warm start).
    X: dense or sparse, on the host or the device (copied to the host).
    """
    labels, centers, inertia = _kmeans(X, n_clusters, n_init=n_init, max_iter=max_iter,
                                       tol=tol, init=init, random_state=random_state)
    found = np.count_nonzero(np.bincount(labels, minlength=n_clusters))
    if found < n_clusters:
        why = (f"X has only {found} distinct rows" if inertia == 0
               else "max_iter ended the iterations before they took points")
        warn(f"k-means left {n_clusters - found} of n_clusters={n_clusters} clusters empty: {why}")
    return labels, centers, inertia


def _kmeans(X, n_clusters, *, n_init=10, max_iter=300, tol=1e-9, init=None, random_state=None):
    """:func:`kmeans` without its warning, for callers that handle empty clusters."""
    cpu = get_backend("cpu")
    X = check_data(X, cpu, min_samples=1, sparse=True)
    X = X.astype(np.float64) if is_sparse(X) else np.asarray(X, dtype=np.float64)
    check_int(n_clusters, "n_clusters", 1, X.shape[0])
    check_int(n_init, "n_init", 1)
    check_int(max_iter, "max_iter", 1)
    check_float(tol, "tol", 0.0)
    if init is not None:
        init = np.asarray(cpu.asarray(init), dtype=np.float64)
        if init.shape != (n_clusters, X.shape[1]):
            raise ValueError(f"init must hold n_clusters x n_features = "
                             f"{(n_clusters, X.shape[1])} centers, got shape {init.shape}")
    rng = make_rng(random_state)
    best = None
    runs = [init] if init is not None else [None] * n_init
    for start in runs:
        centers = plusplus_seeds(X, n_clusters, rng) if start is None else np.array(start, float)
        result = _lloyd(X, centers, max_iter, tol)
        if best is None or result[2] < best[2]:
            best = result
    return best


def plusplus_seeds(X, k, rng):
    """k-means++ seeding: each new center drawn with probability proportional to the
    squared distance to the nearest center so far."""
    n = X.shape[0]
    chosen = [rng.integers(n)]
    sq = row_sqnorms(np, X)
    d2 = _sqdist_to_row(X, chosen[0], sq)
    for _ in range(1, k):
        total = d2.sum()
        idx = rng.integers(n) if total <= 0 else rng.choice(n, p=d2 / total)
        chosen.append(idx)
        d2 = np.minimum(d2, _sqdist_to_row(X, idx, sq))
    return X[chosen].toarray() if is_sparse(X) else X[chosen]


def _sqdist_to_row(X, i, sq):
    """Squared distances of X's rows to row i from the squared row norms ``sq``: one
    product with the row, where the differences made an (N, D) temporary at each
    of k-means++'s K steps (Fashion-MNIST, 10,000 x 784, K = 500: 9.8 s, now 0.6 s)."""
    product = (X @ X[i].T).toarray().ravel() if is_sparse(X) else X @ X[i]
    return np.maximum(sq + sq[i] - 2.0 * product, 0.0)


def _cluster_sums(X, labels, k):
    """(k, D) sums of each cluster's points, added in index order: compiled for dense
    rows, a product with the (k, N) membership matrix for sparse ones.  A bincount
    per column before took 1.3 s over 23 Lloyd iterations at 10,000 x 784."""
    if not is_sparse(X):
        return cluster_sums(X, labels, k)
    member = scipy.sparse.csr_matrix((np.ones(X.shape[0]), (labels, np.arange(X.shape[0]))),
                                     shape=(k, X.shape[0]))
    return (member @ X).toarray()


def nearest_centers(X, centers):
    """(labels, squared distance to the nearest centre) of every row."""
    if not is_sparse(X) and centers.size <= COMPILED_MAX_CENTER_ENTRIES:
        labels = np.empty(X.shape[0], dtype=np.int64)
        nearest = np.empty(X.shape[0])
        assign(X, centers, labels, nearest)
        return labels, nearest

    def nearest_in(_, D):
        labels = D.argmin(axis=1)
        return labels, D[np.arange(D.shape[0]), labels]

    labels, nearest = zip(*distance_blocks(X, centers, nearest_in))
    return np.concatenate(labels), np.concatenate(nearest)


def distance_blocks(X, centers, reduce):
    """[reduce(rows, D) for each block of TILE_ROWS ``rows`` (a slice) of X and D,
    their squared distances to the centres], in the blocks' order.  Each block's
    product runs on one BLAS thread, the blocks on numba's threads, so the bits do
    not depend on the number of threads (OpenBLAS's threads cut one N x K product
    by their count: 5,000 x 300 rows against 200 centres gave other distances on
    1 and 2 threads), and a block's distances are held at a time, not N x K
    (k-means landmarks of Fashion-MNIST 70k, 2,000 of them: 0.88 GB at most
    instead of 2.17 GB, the same landmarks in 16 s)."""
    sq_x, sq_c = row_sqnorms(np, X), row_sqnorms(np, centers)
    centers_t = np.ascontiguousarray(centers.T)

    def block(start):
        rows = slice(start, start + TILE_ROWS)
        return reduce(rows, squared_distances(np, X[rows], centers, sq_x[rows], sq_c,
                                             centers_t))

    with BlockProducts(get_backend("cpu")) as blocks:
        return list(blocks.map(block, range(0, X.shape[0], TILE_ROWS)))


def _refill(X, centers, empty, nearest):
    """Moves the ``empty`` centres to the points farthest from their centres
    (``nearest``: each point's squared distance), those at a positive distance;
    returns whether any moved."""
    farthest = np.argsort(-nearest, kind="stable")[:empty.size]
    farthest = farthest[nearest[farthest] > 0]
    if farthest.size:
        rows = X[farthest]
        centers[empty[:farthest.size]] = rows.toarray() if is_sparse(rows) else rows
    return farthest.size > 0


def _lloyd(X, centers, max_iter, tol):
    """Lloyd's iterations from ``centers``.  A centre left without points moves to
    one of the points farthest from their centres (as scikit-learn's do), where it
    had stayed empty to the end; where every point is a centre, it stays."""
    previous = np.inf
    for _ in range(max_iter):
        labels, nearest = nearest_centers(X, centers)
        inertia = float(nearest.sum())
        counts = np.bincount(labels, minlength=len(centers))
        sums = _cluster_sums(X, labels, len(centers))
        empty = counts == 0
        centers = np.where(empty[:, None], centers, sums / np.maximum(counts, 1)[:, None])
        # Sorted for a refill only where a cluster emptied: sorting at every step
        # took 20 restarts on 70,000 rows from 1.7 s to 4.3 s.
        refilled = empty.any() and _refill(X, centers, np.flatnonzero(empty), nearest)
        if not refilled and previous - inertia <= tol * max(inertia, 1e-300):
            break
        previous = inertia
    labels, nearest = nearest_centers(X, centers)
    return labels, centers, float(nearest.sum())
