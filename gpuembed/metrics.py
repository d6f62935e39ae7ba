"""Embedding quality metrics.

Rank-based quality (../shared/papers/004_13864de36f3612a6.txt, section 5.1): with
rho_ij and r_ij the ranks of j among i's neighbours in the high- and
low-dimensional spaces, Q_NX(K) is the average overlap of the K-ary
neighbourhoods (eq. 5.8), R_NX(K) its rescaling so that a random embedding
scores 0 and a perfect one 1 (eq. 5.9), and the AUC weighs R_NX(K) by 1/K
(eq. 5.10), so small and large neighbourhoods count alike on a log scale.

Costs: ``rnx`` never forms the (N-1)^2 co-ranking matrix.  It ranks blocks of
rows: O(N^2 D) for the distances plus O(N^2 log N) for the sorts when
k_max = N - 2 (the full AUC; O(N^2) with partial sorts for small k_max),
in O(block x N) memory.  The full curve of Fashion-MNIST (784-D, float64) against a
2-D layout takes 2.3 s at N = 5,000 and 34 s at N = 20,000 on 2 CPU cores
(benchmarks/results/msne_metrics.json), the two sorts per row most of it.

Distances by GEMM round to about eps |x|^2 (the rows are centred first); where
that reaches the distances between neighbours (groups far apart against their
spread) the ranks come out wrong, so each row is checked (RANK_RTOL) and, where
the check fails, computed again in float64, and past float64's reach coordinate
by coordinate.
"""
from __future__ import annotations

import numba
import numpy as np

from ._checks import check_data, check_int, check_labels
from ._sparse import BlockProducts, is_sparse, row_sqnorms, transposed
from .backend import get_backend
from .metrics_cpu import max_rank_counts
from .neighbors import graph_smallest, is_graph, knn, metric_rows, rounding, smallest_sorted
from .nbody.exact import centred, coordinate_squared_distances, squared_distances

__all__ = ["knn_accuracy", "clustering_error", "rnx", "auc_rnx", "log_k_auc", "coranking",
           "procrustes_error"]

BLOCK_BYTES = 64 * 2**20
# A row of GEMM distances whose rounding, about sqrt(D) eps (|x| + max |x|)^2, exceeds
# RANK_RTOL of its RANK_REFERENCE-th nearest distance is computed again more precisely
# (_Space.precise_rows): 3,000 of Fashion-MNIST's float32 images with their halves moved
# 300 up and down (pixels in [0, 1]) had an AUC of 0.352 against 0.415 from float64,
# where float32's rounding exceeded the neighbours' distances.  At 1e-3 every row of a
# float32 layout of 8,000 points in clusters of radius 4 spread over 100 went again
# (2.8-4.0 s against 2.0-2.3 s), for the same AUC to 6 digits.
RANK_RTOL = 1e-2
RANK_REFERENCE = 10
# knn_accuracy moves layouts of up to this many columns to the CPU's k-d tree.
LAYOUT_MAX_DIM = 3


def knn_accuracy(X_low, labels, k=10, *, backend="cpu"):
    """Leave-one-out k-NN classification accuracy of the embedding.

    Each point's label is predicted by majority vote of the ``labels`` (N,) of its
    k nearest neighbours in ``X_low`` (itself excluded; ties go to the smallest
    label).
    Up to LAYOUT_MAX_DIM columns (a layout) the neighbours come from the CPU's
    k-d tree whatever the backend: O(N log N), where brute force on a GPU would
    compute 1e12 distances for 1e6 points.
    """
    be = get_backend(backend)
    labels = check_labels(be.to_host(labels))
    n = labels.shape[0]
    if getattr(X_low, "shape", (None,))[0] != n:
        raise ValueError(f"labels must have one entry per row of X_low, got {n}")
    k = check_int(k, "k", 1, n - 1)
    X_low = check_data(X_low, be, name="X_low")
    if X_low.shape[1] <= LAYOUT_MAX_DIM:  # the CPU's k-d tree, for a GPU's layout too
        X_low, be = be.to_host(X_low), get_backend("cpu")
    idx = be.to_host(knn(X_low, k, backend=be)[1])
    classes, codes = np.unique(labels, return_inverse=True)
    votes = np.zeros((n, classes.size), dtype=np.int64)
    np.add.at(votes, (np.repeat(np.arange(n), k), codes[idx.ravel()]), 1)
    return float((votes.argmax(axis=1) == codes).mean())


def clustering_error(labels, clusters):
    """The dissertation's clustering error (section 4.8.4): the fraction of points
    whose class differs from their cluster's majority class (1 - purity), so 0 for
    clusters that each hold one class; ties go to the smallest class.  Both are
    (N,) arrays of any labels (host or device)."""
    to_host = get_backend("cpu").to_host              # device arrays come back too
    labels, clusters = (check_labels(to_host(a), name) for a, name in
                        ((labels, "labels"), (clusters, "clusters")))
    if clusters.shape != labels.shape:
        raise ValueError(f"labels and clusters must be two (N,) arrays, got shapes "
                         f"{labels.shape} and {clusters.shape}")
    _, classes = np.unique(labels, return_inverse=True)
    _, groups = np.unique(clusters, return_inverse=True)
    counts = np.zeros((groups.max() + 1, classes.max() + 1), dtype=np.int64)
    np.add.at(counts, (groups, classes), 1)
    return float(1.0 - counts.max(axis=1).sum() / labels.size)


def _pair(X_high, X_low, be, metric):
    """X_high and X_low checked, each centred (a precomputed X_high, distances, as
    it is)."""
    X_high = metric_rows(be, check_data(X_high, be, name="X_high", min_samples=3, sparse=True),
                         metric, "X_high")
    X_low = check_data(X_low, be, name="X_low", min_samples=3)
    if X_high.shape[0] != X_low.shape[0]:
        raise ValueError(f"X_high has {X_high.shape[0]} rows but X_low has {X_low.shape[0]}")
    if metric != "precomputed":
        X_high = centred(be.xp, X_high)
    return X_high, centred(be.xp, X_low)


def _rank_blocks(X_high, X_low, k_max, be, metric):
    """Yield, per block of rows, the k_max nearest in high-D order and in low-D
    order (B, k_max each, column indices); with ``metric="precomputed"`` the
    high-D order is that of X_high's rows of distances (of a sparse graph, each
    row's stored ones, all sorted at once)."""
    xp = be.xp
    n = X_high.shape[0]
    graph_order = (graph_smallest(be, X_high, k_max, True, asked="k_max")[1]
                   if is_graph(X_high, metric) else None)
    # Each space's norms and right factor (sparse X_high: its feature split),
    # prepared once for all the blocks; None: the precomputed distances' rows.
    spaces = [None if metric == "precomputed" and X is X_high else _Space(xp, X)
              for X in (X_high, X_low)]
    rows = max(1, min(n, BLOCK_BYTES // (8 * n)))
    # In fixed tiles: OpenBLAS's threads cut a float32 product differently, and a
    # tie in the ranks moved the log-K AUC of Fashion-MNIST 3k in its 6th digit.
    with BlockProducts(be) as products:
        for start in range(0, n, rows):
            stop = min(n, start + rows)
            own = xp.arange(start, stop)
            orders = []
            for space in spaces:
                if graph_order is not None and space is None:
                    orders.append(graph_order[start:stop])
                    continue
                D = X_high[start:stop].copy() if space is None else space.distances(
                    start, stop, products)
                D[own - start, own] = xp.inf
                order = smallest_sorted(xp, D, k_max)
                if space is not None:
                    _rank_again(xp, space, D, order, own, k_max)
                orders.append(order)
            yield orders


def _rank_again(xp, space, D, order, own, k_max):
    """``order`` (of the block's rows ``own``, distances D) with the rows whose
    rounding could reorder them ranked again from the space's precise distances."""
    again = space.imprecise(D, order, own)
    if again.size:
        D = space.precise_rows(own[again])
        D[xp.arange(again.size), own[again]] = xp.inf
        order[again] = smallest_sorted(xp, D, k_max)


class _Space:
    """One space's rows (centred, or sparse), their squared norms and GEMM factor,
    and, made when first needed, their float64 copies."""

    def __init__(self, xp, X):
        self.xp, self.X = xp, X
        self.sq = row_sqnorms(xp, X)
        self.Xt = transposed(X)
        self.sq_max = float(self.sq.max())
        self._float64 = None

    def distances(self, start, stop, products):
        return squared_distances(self.xp, self.X[start:stop], self.X, self.sq[start:stop],
                                 self.sq, self.Xt, products)

    def imprecise(self, D, order, rows, dtype=None):
        """Positions in the block (distances D, their ``order``) of the rows whose
        rounding could reorder their RANK_REFERENCE nearest: see RANK_RTOL."""
        xp = self.xp
        col = min(order.shape[1], RANK_REFERENCE) - 1
        nearest = xp.take_along_axis(D, order[:, col:col + 1], axis=1)[:, 0]
        error = rounding(xp, self.sq[rows], self.sq_max, self.X.shape[1], dtype or self.X.dtype,
                         nearest)
        return xp.flatnonzero(error > RANK_RTOL * nearest)

    def precise_rows(self, rows):
        """The distances of ``rows`` to all rows by a float64 GEMM, and where
        float64's rounding could still reorder them, dense, coordinate by
        coordinate."""
        xp = self.xp
        if self._float64 is None:
            X64 = self.X.astype(np.float64)
            self._float64 = (X64, row_sqnorms(xp, X64), transposed(X64))
        X64, sq64, Xt64 = self._float64
        D = squared_distances(xp, X64[rows], X64, sq64[rows], sq64, Xt64)
        if is_sparse(X64):
            return D
        D[xp.arange(rows.size), rows] = xp.inf
        again = self.imprecise(D, smallest_sorted(xp, D, min(D.shape[1], RANK_REFERENCE)),
                               rows, np.float64)
        if again.size:
            D[again] = coordinate_squared_distances(xp, X64[rows[again]], X64)
        return D


def _low_ranks(xp, order_l, n, k_max):
    """Every point's low-D rank (B, N), 1-based, k_max + 1 for 'beyond k_max'."""
    rank_l = xp.full((order_l.shape[0], n), k_max + 1, dtype=xp.int64)
    # Indexed, not put_along_axis, which CuPy has only from 14 on.
    rank_l[xp.arange(order_l.shape[0])[:, None], order_l] = xp.arange(1, k_max + 1)[None, :]
    return rank_l


def rnx(X_high, X_low, k_max=None, *, metric="euclidean", backend="cpu"):
    """R_NX(K) for K = 1 .. k_max (eqs 5.8-5.9), default k_max = N - 2: how much
    better than chance the K-neighbourhoods of the rows of ``X_high`` (N, D; dense or
    sparse; ``metric`` "euclidean", "cosine" or "precomputed", X_high then the
    (N, N) distances, as in :func:`gpuembed.knn`) are kept among those of ``X_low``
    (N, d), computed on ``backend``.

    A sparse k-NN graph of precomputed distances gives R_NX exactly up to k_max =
    the fewest distances a row stores to other points (a pair counts for K once
    both its ranks are at most K, so ranks beyond k_max never enter); k_max must
    then be given."""
    be = get_backend(backend)
    xp = be.xp
    X_high, X_low = _pair(X_high, X_low, be, metric)
    n = X_high.shape[0]
    if k_max is None and is_graph(X_high, metric):
        raise ValueError("k_max=None asks for R_NX up to N - 2, which needs every pair's "
                         "distance, and X_high is a sparse k-NN graph: give k_max, at most "
                         "the distances each row stores to other points")
    k_max = n - 2 if k_max is None else check_int(k_max, "k_max", 1, n - 2)
    # counts[m]: pairs (i, j) whose larger rank max(rho_ij, r_ij) is m; such a pair is
    # in both K-ary neighbourhoods exactly when K >= m.
    counts = xp.zeros(k_max + 2, dtype=xp.int64)
    for order_h, order_l in _rank_blocks(X_high, X_low, k_max, be, metric):
        if xp is np:
            counts += max_rank_counts(order_h, order_l, n, k_max, numba.get_num_threads())
            continue
        rank_l = _low_ranks(xp, order_l, n, k_max)
        m = xp.maximum(xp.arange(1, k_max + 1)[None, :],
                       xp.take_along_axis(rank_l, order_h, axis=1))
        counts += xp.bincount(m.ravel(), minlength=k_max + 2)
    K = np.arange(1, k_max + 1)
    Q = np.cumsum(be.to_host(counts)[1:k_max + 1]) / (K * n)
    return ((n - 1) * Q - K) / (n - 1 - K)


def auc_rnx(X_high, X_low, *, metric="euclidean", backend="cpu"):
    """Area under R_NX(K) of ``X_high`` and ``X_low`` (as in :func:`rnx`, with
    ``metric``, on ``backend``) with log-K weighting (eq. 5.10), in [0, 1] for
    embeddings better than random.  It needs R_NX up to N - 2, which a sparse
    k-NN graph does not give: ``log_k_auc(rnx(G, X_low, k_max))`` is the area up
    to k_max."""
    if is_graph(X_high, metric):
        raise ValueError("auc_rnx needs R_NX(K) up to K = N - 2, that is every pair's "
                         "distance, and X_high is a sparse k-NN graph: take log_k_auc(rnx("
                         "X_high, X_low, k_max)) for the area up to k_max")
    return log_k_auc(rnx(X_high, X_low, metric=metric, backend=backend))


def log_k_auc(R):
    """The log-K weighted area (eq. 5.10) of an R_NX(K) curve for K = 1 .. len(R)."""
    R = np.asarray(get_backend("cpu").asarray(R), dtype=np.float64)
    if R.ndim != 1 or R.size == 0:
        raise ValueError(f"R must be a non-empty 1-D array (an R_NX curve), got shape {R.shape}")
    if not np.isfinite(R).all():
        raise ValueError("R contains NaN or infinite values")
    w = 1.0 / np.arange(1, len(R) + 1)
    return float((R * w).sum() / w.sum())


def coranking(X_high, X_low, *, metric="euclidean", max_n=5000):
    """The (N-1) x (N-1) co-ranking matrix q_kl = #{(i, j): rho_ij = k, r_ij = l}
    (eq. 5.1) of the ranks rho in ``X_high`` (``metric`` as in :func:`rnx`) and r
    in ``X_low``, for small N only (dense, O(N^2) memory; more than ``max_n``
    points raise)."""
    be = get_backend("cpu")
    X_high, X_low = _pair(X_high, X_low, be, metric)
    if is_graph(X_high, metric):
        raise ValueError("coranking needs every pair's rank, and X_high is a sparse k-NN "
                         "graph: give the dense (N, N) matrix, or take rnx with k_max")
    n = X_high.shape[0]
    if n > max_n:
        raise ValueError(f"coranking forms an (N-1)^2 matrix: N = {n} exceeds max_n = {max_n}; "
                         "use rnx for large N")
    Q = np.zeros((n - 1, n - 1), dtype=np.int64)
    for order_h, order_l in _rank_blocks(X_high, X_low, n - 1, be, metric):
        l = np.take_along_axis(_low_ranks(np, order_l, n, n - 1), order_h, axis=1)
        np.add.at(Q, (np.broadcast_to(np.arange(n - 1), l.shape).ravel(), l.ravel() - 1), 1)
    return Q


def procrustes_error(X_ref, X):
    """Relative Frobenius error ||X_ref - (s X R + t)|| / ||X_ref - mean|| after the
    optimal translation t, orthogonal R and scale s."""
    be = get_backend("cpu")
    X_ref = check_data(X_ref, be, name="X_ref", min_samples=2)
    X = check_data(X, be, name="X", min_samples=2)
    if X_ref.shape != X.shape:
        raise ValueError(f"X_ref and X must have the same shape, got {X_ref.shape} and {X.shape}")
    A = X_ref - X_ref.mean(axis=0, dtype=np.float64)
    B = X - X.mean(axis=0, dtype=np.float64)
    norm_a, norm_b = np.linalg.norm(A), np.linalg.norm(B)
    if norm_a == 0 or norm_b == 0:
        raise ValueError("procrustes_error needs point sets that are not all one point")
    U, S, Vt = np.linalg.svd(B.T @ A)
    R = U @ Vt
    scale = S.sum() / norm_b ** 2
    return float(np.linalg.norm(A - scale * B @ R) / norm_a)
