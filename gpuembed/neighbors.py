"""Exact k nearest neighbours by blocked GEMM and partial selection.

For a block of B query rows the squared distances to all N points are
``|x|^2 + |y|^2 - 2 x.y`` (one GEMM on centred data).  The ``k + margin``
smallest per row are selected: on the GPU by a warp-per-row CUDA kernel, which
adds |y|^2 and leaves out the query's own column as it reads the block; on
the CPU, for queries against other points, by a compiled heap per row, and for
the k-NN of all points (``knn``) from the upper triangle of the symmetric distance
matrix alone, each GEMM strip offered to both of its rows' candidate heaps
(neighbors_cpu.py: half the GEMM, the selection compiled on all cores).  A GEMM
distance carries a rounding error of about
``sqrt(D) eps (|x|^2 + |y|^2)``; candidates where that exceeds ``RTOL`` times
the distance (1e-4 in float32, 1e-10 in float64) are recomputed exactly from
the coordinates, so duplicates of a point come out at exactly 0.  The k best are
returned sorted by (distance, index): equal distances come in index order.  Distances
equal in exact arithmetic that the GEMM rounds differently (points of an integer grid
in more than TREE_MAX_DIM dimensions) come in the order of their rounded values, and a
tie larger than the candidate margin is cut where the rounding cuts it: every
returned neighbour is still at its rank's distance (to RTOL), but which of the tied
points come, and in what order, follows the rounding.  That finish runs once the candidates of
all blocks are in, over large chunks of rows: per 268-row block of a 1e6-point
k-NN its sorts and synchronization would be repeated 3,700 times.

The margin is checked, row by row (_unsure_rows): where by the same estimate of
the rounding a point left out could lie nearer than the k-th neighbour, the row
is searched again (_settle).  That happens where the points' spread about
their mean is large against their neighbour distances, as for groups far apart:
Fashion-MNIST's first 20,000 images (pixels in [0, 1], float32, 90-NN) with their
halves moved 30 up and down had wrong neighbours in 2 of 200 rows checked, moved
300 in every one; now none, in 9.8 and 9.4 s against 3.7 and 3.2 s without the
check (results/knn_split.json at 9cd0390, 2-core AMD EPYC VM).  Moved 10, 90% of
the rows go again, 8.2 s against 3.4 s, where float32 had the checked rows right;
moved 3, 26 rows, 3.6 s against 3.4 s; not moved, none (2.5 s both).  Unsure rows
go first, where there are enough of them, in groups each centred on its own mean
(_recentred), in X's dtype; the rest go, float32 points in float64 and float64
ones by every distance from the coordinates.  On the CPU the float32 k-NN of all
points goes to float64 at once where more than half of its rows are unsure (its
float64 self search takes half the products).  Every tenth of those images as
queries among the others (results/knn_split_queries.json): all settled about their
own centres, 0.83-0.89 s against 1.41-1.65 s through float64 (0.39-0.40 s not
searched again: wrong from 30 on); the first 5,000 images as float64 moved 1e6 or
1e8, all rows unsure: 1.55 and 1.89 s against 6.43 and 6.99 s from the
coordinates (knn_split_float64.json; both at 88c5de6).

Float64 points on the CPU, when there are many, are searched in float32 and their
candidates' distances recomputed in float64, with a bound that sends any row the
float32 search cannot settle back to the float64 search (_mixed_precision_knn):
the same neighbours in half to two thirds of the time.

Dense data of at most TREE_MAX_DIM features (layouts, point clouds, a few
principal components) is searched on the CPU by a k-d tree instead, with the
same finish and ordering.

Sparse X (scipy or cupyx) is searched as it is: no centring (it would make
the rows dense), each block a sparse product made dense, the exact
recomputation on sparse row differences (gpuembed._sparse).

A precomputed distance matrix (``metric="precomputed"``: row i holds point i's
distances to the N points) is not searched but sorted: each row's k smallest,
ties by index, by a compiled heap per row on the CPU and by sorts of blocks of
rows on the GPU.  A sparse one is a k-NN graph of distances (scikit-learn's
``kneighbors_graph(X, k, mode="distance")``): each row's k smallest stored
entries, the rows padded to the widest with inf and sorted in blocks.

Memory bound: apart from X, the (N, k) outputs and the (N, k + margin)
candidates, one block holds a B x N distance matrix (at most ``block_bytes``,
default 256 MiB on the CPU and 1 GiB on the GPU), so N can grow to millions.
"""
from __future__ import annotations

import concurrent.futures

import numba
import numpy as np
import scipy.sparse

from ._checks import check_choice, check_data, check_int
from ._sparse import (BlockProducts, column_means, is_sparse, row_sqnorms, same_kind,
                      transposed)
from .backend import get_backend
from .metrics_cpu import ties_by_index

__all__ = ["knn", "knn_query"]

DEFAULT_BLOCK_BYTES = {"cpu": 256 * 2**20, "gpu": 2**30}
# Extra candidates kept beyond k before the exact recomputation, so that GEMM
# rounding at the k-th boundary cannot drop a true neighbour.
CANDIDATE_MARGIN = 8
# knn_query centres its queries this many bytes of rows at a time, in one reused
# buffer: a centred copy of them all was 440 MB for LLL's 70,000 x 784 float64
# queries (6 GB at 1e6), and writing its fresh pages took 0.65 s.  LLL with 250
# landmarks on Fashion-MNIST 70k, first call in a process: 0.80-0.83 s against
# 1.30-1.49 s (later calls, which reused the freed pages, 0.79-0.84 s both ways).
QUERY_BLOCK_BYTES = 32 * 2**20
SELECT_WARPS = 16384       # GPU selection: warps per launch to aim for (an H100 holds 132 x 64)
SEGMENT_COLUMNS = 128      # a row segment has at least this many columns per selected one
SHARED_BYTES = 48 * 1024   # static shared memory per block without opting in
# Float64 points (dense, on the CPU, more than TREE_MAX_DIM features) are searched
# in float32 and checked (_mixed_precision_knn) from MIXED_MIN_RATIO points per
# candidate and MIXED_MIN_QUERIES queries: the float32 GEMM saves time in proportion
# to the points times the queries, the recomputation costs time in proportion to
# the candidates, rounding to float32 in proportion to the points and queries.
# Fashion-MNIST as float64, 20-NN of all points (28 candidates), best of 3 alternating
# on the 2-core Xeon VM: 3,000 points 0.14 s against 0.12 s in float64, 6,000 0.33 s
# against 0.46 s.
MIXED_MIN_RATIO = 200
MIXED_MIN_QUERIES = 500
# Rows the GEMM's rounding leaves unsure are searched again about the means of at
# most RECENTRED_GROUPS groups of at least RECENTRED_GROUP_ROWS of them (_recentred).
RECENTRED_GROUPS, RECENTRED_GROUP_ROWS = 16, 256
# Relative accuracy of the returned distances, per dtype (see module doc).
RTOL = {np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-10}
# Up to this many features the CPU walks a k-d tree instead (_tree_knn), 2 cores,
# benchmarks/results/knn_lowdim.json (bbd0378): the 10-NN of 70,000 uniform 2-D
# points in 0.10 s against 6.9 s by brute force, their 90-NN in 5-D in 1.0 s
# against 5.2 s, of 20 Gaussian clusters in 10-D in 2.3 s against 6.5 s.  Uniform
# 10-D points, whose intrinsic dimension is all 10, are its worst case: 8.0 s
# against 5.8 s, ahead only from a few times more points (N log N against N^2).
# In 16-D uniform float32 points took 180 s against 12 s (an earlier run).
TREE_MAX_DIM = 10
METRICS = ("euclidean", "cosine", "precomputed")


def metric_rows(be, X, metric, name="X", square=True):
    """X's rows as the Euclidean search compares them under ``metric``:
    "euclidean" as they are, "cosine" scaled to unit length (dense or sparse,
    X's dtype).  Between unit rows |x - y|^2 = 2 - 2 cos(x, y), so the
    neighbours and their order are the cosine distance's, and entropic
    affinities, whose precisions absorb the factor 2, are those of the cosine
    distance.  A row of zeros has no direction, and is refused.  "precomputed":
    X holds distances, as they are, once checked (>= 0, and with ``square`` N x
    N: each point's distances to all N; sparse: a k-NN graph, see
    :func:`is_graph`)."""
    check_choice(metric, "metric", METRICS)
    if metric == "precomputed":
        return _checked_distances(be, X, name, square)
    if metric == "euclidean":
        return X
    xp = be.xp
    norms = xp.sqrt(row_sqnorms(xp, X))
    zero = xp.flatnonzero(norms == 0)
    if zero.size:
        raise ValueError(f"metric='cosine': {int(zero.size)} row(s) of {name} are all zeros "
                         f"(the first is row {int(zero[0])}), and a zero vector has no cosine "
                         f"distance; drop them or take metric='euclidean'")
    norms = norms.astype(X.dtype, copy=False)
    if is_sparse(X):
        return (be.sparse.diags(1 / norms) @ X).tocsr()
    return X / norms[:, None]           # divided, as scikit-learn's normalize does


def search_metric(metric):
    """The metric that the searches take on :func:`metric_rows`' output: a
    precomputed matrix stays one, rows of any other metric are compared as
    Euclidean."""
    return "precomputed" if metric == "precomputed" else "euclidean"


def _checked_distances(be, D, name, square):
    if square and D.shape[0] != D.shape[1]:
        raise ValueError(f"metric='precomputed' needs {name} square, each point's distances "
                         f"to all N points, got shape {D.shape}")
    if bool(((D.data if is_sparse(D) else D) < 0).any()):
        raise ValueError(f"metric='precomputed': {name} holds negative distances")
    return D


def is_graph(X, metric):
    """Whether X is a sparse k-NN graph of precomputed distances, which holds only
    some pairs' distances: what needs them all (classical MDS, R_NX's AUC, the Gram
    systems of LE's out-of-sample weights) refuses it."""
    return metric == "precomputed" and is_sparse(X)


def graph_depth(be, D):
    """The fewest distances a row of the sparse graph D (canonical CSR) stores to
    other points: the most neighbours every row can give."""
    return int(_stored_entries(be.xp, D, 0, D.shape[0], True)[3].min())


def _stored_entries(xp, D, start, stop, exclude_self):
    """Rows start:stop of the sparse graph D as (row - start, column, value) of
    their stored entries (``exclude_self``: each row's own column left out) and
    the count of each row's."""
    lo, hi = int(D.indptr[start]), int(D.indptr[stop])
    rows = xp.searchsorted(D.indptr[start:stop + 1], xp.arange(lo, hi), side="right") - 1
    columns, values = D.indices[lo:hi].astype(xp.int64), D.data[lo:hi]
    if exclude_self:
        other = columns != rows + start
        rows, columns, values = rows[other], columns[other], values[other]
    return rows, columns, values, xp.bincount(rows, minlength=stop - start)


def _sorted_distances(be, D, k, exclude_self, block_bytes):
    """The k smallest distances of each row of the precomputed D (squared, as the
    searches return them) and their columns, ties by index; ``exclude_self``
    leaves out each row's own column (duplicates at distance 0 stay).  Compiled
    on the CPU (neighbors_cpu.smallest_of_rows), by sorts of blocks of rows on
    the GPU."""
    if is_sparse(D):
        return graph_smallest(be, D, k, exclude_self, block_bytes)
    if not be.is_gpu:
        from .neighbors_cpu import smallest_of_rows

        values, columns = smallest_of_rows(np.ascontiguousarray(D), k, 0, exclude_self)
        return values ** 2, columns
    xp = be.xp
    n = D.shape[0]
    sqdist = xp.empty((n, k), dtype=D.dtype)
    indices = xp.empty((n, k), dtype=xp.int64)
    block_bytes = block_bytes or DEFAULT_BLOCK_BYTES[be.name]
    step = max(1, block_bytes // (D.shape[1] * D.itemsize))
    for start in range(0, n, step):
        rows = slice(start, min(n, start + step))
        block = D[rows]
        if exclude_self:                    # a copy: the caller's D stays as it is
            block = block.copy()
            own = xp.arange(rows.start, rows.stop)
            block[own - start, own] = xp.inf
        order = smallest_sorted(xp, block, k)
        sqdist[rows] = xp.take_along_axis(block, order, axis=1) ** 2
        indices[rows] = order
    return sqdist, indices


def graph_smallest(be, D, k, exclude_self, block_bytes=None,
                   asked="n_neighbors; for affinities ceil(3 * perplexity) by default"):
    """_sorted_distances of a sparse k-NN graph D (canonical CSR): each row's k
    smallest stored distances (an explicit zero is a distance 0, an entry not
    stored no distance), ties by column.  Rows go in blocks, each made dense with
    its stored values and inf beyond (the widest row's width), then as a dense
    matrix's rows.  ``asked``: what set k, named by the error of a row with fewer."""
    xp = be.xp
    n = D.shape[0]
    sqdist = xp.empty((n, k), dtype=D.dtype)
    indices = xp.empty((n, k), dtype=xp.int64)
    width = max(1, int(xp.diff(D.indptr).max()))
    per_row = width * (D.dtype.itemsize + 8)
    step = max(1, (block_bytes or DEFAULT_BLOCK_BYTES[be.name]) // per_row)
    for start in range(0, n, step):
        stop = min(n, start + step)
        rows, columns, values, counts = _stored_entries(xp, D, start, stop, exclude_self)
        short = xp.flatnonzero(counts < k)
        if short.size:
            row = int(short[0])
            raise ValueError(
                f"metric='precomputed': row {start + row} of the sparse k-NN graph holds "
                f"{int(counts[row])} distance(s) to other points, fewer than the {k} "
                f"neighbours asked for ({asked}): store at least {k} per row, e.g. scikit-learn's "
                f"kneighbors_graph(X, {k}, mode='distance'), or ask for fewer")
        position = xp.arange(rows.size) - (xp.cumsum(counts) - counts)[rows]
        block = xp.full((stop - start, width), xp.inf, dtype=D.dtype)
        block[rows, position] = values
        block_columns = xp.zeros((stop - start, width), dtype=xp.int64)
        block_columns[rows, position] = columns
        order = smallest_sorted(xp, block, k)
        sqdist[start:stop] = xp.take_along_axis(block, order, axis=1) ** 2
        indices[start:stop] = xp.take_along_axis(block_columns, order, axis=1)
    return sqdist, indices


def smallest_sorted(xp, D, k):
    """Column indices of the k smallest entries of each row, in ascending order
    (ties by index, also across the k-th place); a partition first where k is a
    small part of the row."""
    if 4 * k >= D.shape[1]:
        return _stable_argsort(xp, D)[:, :k]
    part = xp.sort(xp.argpartition(D, k - 1, axis=1)[:, :k], axis=1)
    values = xp.take_along_axis(D, part, axis=1)
    order = xp.take_along_axis(part, _stable_argsort(xp, values), axis=1)
    # The partition may keep a value tied with the k-th place over a smaller
    # index: such rows are sorted whole.
    kth = values.max(axis=1, keepdims=True)
    split = xp.flatnonzero((D == kth).sum(axis=1) != (values == kth).sum(axis=1))
    if split.size:
        order[split] = _stable_argsort(xp, D[split])[:, :k]
    return order


def _stable_argsort(xp, V):
    """Argsort of each row of V, ties in the order of position."""
    if xp is not np:
        return xp.argsort(V, axis=1)      # CuPy's sort is stable
    # NumPy's quicksort (SIMD; it releases the GIL, so threads share the rows),
    # then the ties.
    order = np.empty(V.shape, dtype=np.intp)
    bounds = np.linspace(0, V.shape[0], numba.get_num_threads() + 1).astype(int)

    def sort(lo, hi):
        order[lo:hi] = np.argsort(V[lo:hi], axis=1)

    with concurrent.futures.ThreadPoolExecutor(len(bounds) - 1) as pool:
        list(pool.map(sort, bounds[:-1], bounds[1:]))
    ties_by_index(V, order)
    return order


def knn(X, n_neighbors, *, metric="euclidean", backend="auto", block_bytes=None):
    """Exact k nearest neighbours of every row of ``X`` (self excluded).

    Parameters
    ----------
    X : array (N, D), numpy or cupy, finite, or a sparse matrix (scipy or cupyx).
    n_neighbors : int in [1, N - 1].
    metric : "euclidean" | "cosine" (the rows scaled to unit length first: see
        :func:`metric_rows`) | "precomputed" (X an (N, N) matrix of distances,
        sorted, or a sparse k-NN graph of them with at least k entries in each row
        besides its own column: see the module doc).
    backend : "auto" | "cpu" | "gpu" | Backend.
    block_bytes : bytes for one block of the distance matrix (see module doc).

    Returns
    -------
    sqdist : (N, k) squared Euclidean distances (for "cosine" 2 - 2 cos; for
        "precomputed" the given distances squared), ascending in each row, dtype of X
        (float64 for integer input on the CPU).
    indices : (N, k) int64 neighbour indices; equal distances are ordered by index (see
        the module doc for distances that tie only before the GEMM's rounding).
    Both live on the backend's device.
    """
    be = get_backend(backend)
    X = metric_rows(be, check_data(X, be, sparse=True), metric)
    k = check_int(n_neighbors, "n_neighbors", 1, X.shape[0] - 1)
    if metric == "precomputed":
        return _sorted_distances(be, X, k, True, block_bytes)
    return _knn(be, X, X, k, True, block_bytes)


def knn_query(Q, X, n_neighbors, *, metric="euclidean", backend="auto", block_bytes=None):
    """Exact k nearest neighbours in ``X`` of every row of ``Q`` (no self exclusion);
    either may be sparse.  With ``metric="precomputed"`` X is the points' (N, N)
    distance matrix and Q's rows the queries' distances to those N points."""
    be = get_backend(backend)
    X = metric_rows(be, check_data(X, be, min_samples=1, sparse=True), metric)
    Q = check_data(Q, be, name="Q", dtype=X.dtype, min_samples=1, sparse=True)
    if Q.shape[1] != X.shape[1]:
        raise ValueError(f"Q has {Q.shape[1]} features but X has {X.shape[1]}")
    Q = metric_rows(be, Q, metric, "Q", square=False)
    k = check_int(n_neighbors, "n_neighbors", 1, X.shape[0])
    if metric == "precomputed":         # Q's rows alone, whatever kind X is
        return _sorted_distances(be, Q, k, False, block_bytes)
    return _knn(be, *same_kind(be, Q, X), k, False, block_bytes)


def _knn(be, Q, X, k, exclude_self, block_bytes, mixed=True, points=None):
    """The k-NN search behind knn and knn_query; ``mixed``: float64 points may take
    the float32 search (_mixed_precision_knn); ``points``: (Yp, perm, sq,
    mean), dense X's rows centred on its mean in the order perm, their squared
    norms and that mean (a ListIndex's), which the search of new points takes for
    its own copy of X, scaling the queries by -2 instead of them (the same
    products: a power of two): at 10^6 images that copy, 2.9 GB, set approx_knn's
    peak memory."""
    xp = be.xp
    n = X.shape[0]
    if block_bytes is None:
        block_bytes = DEFAULT_BLOCK_BYTES[be.name]
    block_bytes = check_int(block_bytes, "block_bytes", 1)

    n_cand = _n_candidates(n, k, exclude_self)
    sparse = is_sparse(X)
    if (mixed and points is None and not be.is_gpu and not sparse and X.dtype == np.float64
            and X.shape[1] > TREE_MAX_DIM and n >= MIXED_MIN_RATIO * n_cand
            and Q.shape[0] >= MIXED_MIN_QUERIES):
        return _mixed_precision_knn(be, Q, X, k, exclude_self, block_bytes, n_cand)
    # Centring leaves distances unchanged but shrinks the norms, which is what
    # GEMM-based distances lose precision to.  Sparse rows stay uncentred: the
    # exact recomputation in _finish and the check of _unsure_rows cover the larger
    # rounding.
    mean = 0 if sparse else (column_means(xp, X) if points is None else points[3])
    if not be.is_gpu and not sparse and X.shape[1] <= TREE_MAX_DIM:
        sqnorms = [row_sqnorms(xp, X - mean)]
        if not exclude_self:
            sqnorms.append(row_sqnorms(xp, Q - mean))
        _check_spread(xp, X.dtype, sqnorms)
        return _tree_knn(Q, X, k, exclude_self, block_bytes)
    sqdist, indices, unsure = _gemm_knn(be, Q, X, k, exclude_self, block_bytes, mean, sparse,
                                        points)
    return _settle(be, Q, X, k, exclude_self, block_bytes, sqdist, indices, unsure)


def _n_candidates(n, k, exclude_self):
    """Candidates kept per query among n points: k + CANDIDATE_MARGIN, at most all."""
    return min(n - 1 if exclude_self else n, k + CANDIDATE_MARGIN)


def _gemm_knn(be, Q, X, k, exclude_self, block_bytes, mean, keep, points):
    """_knn's search by blocked GEMM (Q and X centred on ``mean`` unless ``keep``):
    (sqdist, indices, unsure), the last the rows whose k-NN the GEMM's rounding
    leaves uncertain (_unsure_rows)."""
    xp = be.xp
    n = X.shape[0]
    n_cand = _n_candidates(n, k, exclude_self)
    sparse = is_sparse(X)
    if points is None:
        # A fixed random column order keeps the improvements to the CPU's candidate
        # heaps few whatever the input's order.
        perm = xp.asarray(np.random.default_rng(0).permutation(n))
        inv_perm = xp.empty_like(perm)
        inv_perm[perm] = xp.arange(n)
        # The points centred in that order: the search's one copy of them, where a
        # centred copy, its permuted copy and -2 times that took three.
        Yp = X[perm]
        if not keep:
            Yp -= mean
        sq = row_sqnorms(xp, Yp)
    else:
        Yp, perm, sq, _ = points
    if exclude_self:                    # the queries are the points: their norms are at hand
        Qc, sq_q = (X if keep else None), sq[inv_perm]
    elif keep or X.shape[1] <= TREE_MAX_DIM:
        Qc = Q if keep else Q - mean
        sq_q = row_sqnorms(xp, Qc)
    else:                               # centred a block at a time below, norms with it
        Qc, sq_q = None, xp.empty(Q.shape[0], dtype=Q.dtype)
    _check_spread(xp, X.dtype, [sq] if exclude_self or Qc is None else [sq, sq_q])
    if exclude_self and not be.is_gpu:
        values, cand = _self_knn_cpu(Yp, sq, inv_perm, n_cand, block_bytes)
        return _certified(xp, X, X, values, sq_q, sq, perm, cand, k, True, block_bytes)
    if sparse:
        right = transposed(-2 * Yp)       # for every block's product, prepared once
    else:
        if points is None:
            Yp *= -2                      # exact: a power of two
        right = transposed(Yp)

    m = Q.shape[0]
    rows = _block_rows(m, n, X, block_bytes)
    if Qc is None:
        rows = min(rows, _query_rows(Q))
        centred = xp.empty((rows, Q.shape[1]), dtype=Q.dtype)
    select = _select_gpu if be.is_gpu else _select_cpu
    values = xp.empty((m, n_cand), dtype=X.dtype)
    cand = xp.empty((m, n_cand), dtype=xp.int64)
    with BlockProducts(be) as products:
        for start in range(0, m, rows):
            stop = min(m, start + rows)
            if Qc is None:
                block = xp.subtract(Q[start:stop], mean, out=centred[:stop - start])
                if not exclude_self:
                    sq_q[start:stop] = row_sqnorms(xp, block)
            else:
                block = Qc[start:stop]
            # D[i, j] + |y_j|^2 = |y_j|^2 - 2 x_i.y_j ranks j like the distance does.
            skip = inv_perm[start:stop] if exclude_self else xp.full(stop - start, -1, xp.int64)
            if points is not None:      # the block is the search's own (centred) copy
                block *= -2
            values[start:stop], cand[start:stop] = select(be, products(block, right), sq, skip,
                                                          n_cand)
    if Qc is None and not exclude_self:
        _check_spread(xp, X.dtype, [sq_q])
    values += sq_q[:, None]
    return _certified(xp, Q, X, values, sq_q, sq, perm, cand, k, exclude_self, block_bytes)


def _certified(xp, Q, X, values, sq_q, sq, perm, cand, k, exclude_self, block_bytes):
    """_finish_all's k-NN of the candidates ``values`` (the GEMM's), and the rows
    that _unsure_rows cannot vouch for."""
    last = values.max(axis=1)             # before _finish overwrites recomputed values
    sqdist, indices = _finish_all(xp, Q, X, values, sq_q, sq, perm, cand, k, block_bytes)
    n_left = X.shape[0] - values.shape[1] - int(exclude_self)
    unsure = (_unsure_rows(xp, last, sq_q, sq.max(), sqdist[:, -1], X.shape[1])
              if n_left > 0 else xp.zeros(Q.shape[0], dtype=bool))
    return sqdist, indices, unsure


def _unsure_rows(xp, last, sq_q, sq_max, kth, dim):
    """Rows where a point the GEMM left out could lie nearer than the k-th neighbour.

    A point left out came, by the GEMM, at least as far as the last candidate
    (``last``).  One nearer than the k-th recomputed distance (``kth``, less RTOL:
    a tie within RTOL may go either way) would carry a rounding error of at most
    about ``rounding(.., kth)``; where ``last`` less that does not exceed ``kth``,
    such a point could exist and the row is unsure.  A k-th neighbour at distance
    0 cannot be beaten.  How many rows that is on Fashion-MNIST moved apart: the
    module doc."""
    within = kth.astype(np.float64) * (1.0 - RTOL[kth.dtype])
    lowest = last.astype(np.float64) - rounding(xp, sq_q, sq_max, dim, kth.dtype, within)
    return (lowest < within) & (kth > 0)


def rounding(xp, sq_q, sq_max, dim, dtype, within):
    """The estimate ``sqrt(D) eps (|q| + |x|)^2`` (the module doc's
    ``sqrt(D) eps (|q|^2 + |x|^2)`` with the cross term at its largest) of the
    rounding of the GEMM's squared distances from queries of squared norms sq_q
    to the points x within squared distance ``within`` of them, float64: |x| is at
    most max |x| (``sq_max`` its square) and at most |q| + sqrt(within).  By the
    first bound alone, five rows of Fashion-MNIST set to 300 (pixels in [0, 1])
    sent every other row of its 20,000 images' 90-NN to the float64 search."""
    eps = float(np.finfo(dtype).eps)
    norm_q = xp.sqrt(sq_q.astype(np.float64))
    norm_x = xp.minimum(np.sqrt(float(sq_max)), norm_q + xp.sqrt(within))
    return np.sqrt(dim) * eps * (norm_q + norm_x) ** 2


def _settle(be, Q, X, k, exclude_self, block_bytes, sqdist, indices, unsure):
    """sqdist, indices with the unsure rows searched again: dense ones first in
    X's dtype about centres of their own (_recentred), and those still unsure
    float32 points in float64 (_rows_in_float64, a float64 copy of X), float64
    ones from every point's distance computed from the coordinates
    (_rows_exactly)."""
    xp = be.xp
    rows = xp.flatnonzero(unsure)
    whole = X.dtype != np.float64 and _whole_search_pays(be, X, rows, exclude_self)
    if rows.size and not (is_sparse(X) or whole):
        rows = _recentred(be, Q, X, rows, k, exclude_self, block_bytes, sqdist, indices)
    if rows.size == 0:
        return sqdist, indices
    if X.dtype == np.float64:
        again = _rows_exactly(xp, Q, X, rows, k, exclude_self, block_bytes)
    else:
        X64 = X.astype(np.float64)
        rows, *again = _float64_search(be, X64 if Q is X else Q.astype(np.float64), X64, rows,
                                       k, exclude_self, block_bytes)
    sqdist[rows], indices[rows] = (a.astype(sqdist.dtype, copy=False) for a in again)
    return sqdist, indices


def _recentred(be, Q, X, rows, k, exclude_self, block_bytes, sqdist, indices):
    """The queries Q[rows] searched again in X's dtype, each group of them
    (_farthest_point_groups) centred on its own mean; the rows this settles are
    written into ``sqdist``, ``indices`` and the others returned.

    Rows go unsure where their distance from the points' mean is large against
    their neighbour distances (groups far apart).  About a centre among them, a
    query's norm is its group's spread, and so is that of every point within its
    k-th distance (rounding's ``within``): the check then vouches for rows that
    otherwise took float64, a float64 copy of X and, on GPUs whose float64 runs
    at 1/32 to 1/64 of float32, that much slower products.  A group costs a
    centred copy of X and its norms, as much as the GEMM of some tens of rows: at
    most RECENTRED_GROUPS groups of at least RECENTRED_GROUP_ROWS rows, none for
    fewer rows (groups of 64 rows took 1.12 s where 256 took 0.77 s, for 2,000
    queries in the module doc's case moved 10, a side run).  Times: the module
    doc."""
    xp = be.xp
    n_groups = min(RECENTRED_GROUPS, rows.size // RECENTRED_GROUP_ROWS)
    if n_groups == 0:
        return rows
    m = k + int(exclude_self)            # with its own row, dropped below
    labels = _farthest_point_groups(xp, Q[rows], n_groups)
    left = []
    for group in range(n_groups):
        own = rows[labels == group]
        if own.size == 0:                # identical rows: fewer distinct seeds
            continue
        queries = Q[own]
        try:
            found, cand, unsure = _gemm_knn(be, queries, X, m, False, block_bytes,
                                            column_means(xp, queries), False, None)
        except _SpreadTooFar:
            # About the group's centre points lie up to twice as far as about the
            # mean, past the dtype's range of squared distances: the rows go on.
            left.append(own)
            continue
        if exclude_self:
            found, cand = _without_own(found, cand, own)
        settled = ~unsure
        sqdist[own[settled]], indices[own[settled]] = found[settled], cand[settled]
        left.append(own[unsure])
    return xp.sort(xp.concatenate(left))


def _farthest_point_groups(xp, P, n_groups):
    """Each of P's rows labelled by the nearest of ``n_groups`` seeds, chosen by
    farthest-point traversal: the first row, then each time the row farthest from
    the seeds so far, so that groups far apart get seeds of their own before any
    group a second one.  Distances from coordinate differences (no GEMM)."""
    labels = xp.zeros(P.shape[0], dtype=xp.int64)
    nearest = row_sqnorms(xp, P - P[0])
    for group in range(1, n_groups):
        sqdist = row_sqnorms(xp, P - P[int(nearest.argmax())])
        closer = sqdist < nearest
        labels[closer] = group
        nearest[closer] = sqdist[closer]
    return labels


def _without_own(sqdist, indices, rows):
    """The sorted k + 1 neighbours of queries that are the points ``rows`` without
    each row's own index (or its last, where as many copies at distance 0 come
    before it): their k neighbours."""
    drop = indices == rows[:, None]
    drop[~drop.any(axis=1), -1] = True
    keep = ~drop
    shape = (len(rows), indices.shape[1] - 1)
    return sqdist[keep].reshape(shape), indices[keep].reshape(shape)


def _float64_search(be, Q, X, rows, k, exclude_self, block_bytes):
    """(rows, sqdist, indices): the k-NN of float64 queries Q[rows] by the float64
    search (_rows_in_float64), or of all points where _whole_search_pays."""
    if _whole_search_pays(be, X, rows, exclude_self):
        return (be.xp.arange(X.shape[0]),
                *_knn(be, X, X, k, True, block_bytes, mixed=False))
    return (rows, *_rows_in_float64(be, Q, X, rows, k, exclude_self, block_bytes))


def _whole_search_pays(be, X, rows, exclude_self):
    """Whether the CPU's k-NN of all points costs less than that of the queries
    X[rows]: where they are more than half of them, since it takes half the
    products of as many queries (the GPU's, all of them)."""
    return exclude_self and not be.is_gpu and 2 * rows.size > X.shape[0]


class _SpreadTooFar(ValueError):
    """_check_spread's error, which _recentred takes as a sign to go on."""


def _check_spread(xp, dtype, sqnorms):
    """Squared distances reach 4 x the largest of the squared norms about the mean
    (a list of arrays); past the dtype's range they were inf, and the affinities
    failed deep in numba."""
    largest = float(xp.stack([s.max() for s in sqnorms]).max())
    if not 4.0 * largest < float(np.finfo(dtype).max):
        raise _SpreadTooFar(f"X spreads too far for {dtype} squared distances (largest squared "
                         f"distance from the mean {largest:.3g}); rescale it, e.g. X / X.std()")


def _query_rows(Q):
    """Rows of the dense queries Q in QUERY_BLOCK_BYTES."""
    return max(1, QUERY_BLOCK_BYTES // (Q.shape[1] * Q.dtype.itemsize))


def _mixed_precision_knn(be, Q, X, k, exclude_self, block_bytes, n_cand):
    """The k-NN of float64 queries among float64 points by the float32 search (half
    the GEMM's time) and the float64 distances of its candidates, checked row by row.

    Both sets are centred on the points' mean and rounded to float32 in one pass
    (neighbors_cpu.centred_float32), which the float32 search (_gemm_knn) takes as
    they are (centring its centred copy again cost 0.08 s of float32 arithmetic
    and a 220 MB copy at 70,000 x 784); it returns each query's
    k + CANDIDATE_MARGIN nearest; their float64 distances are recomputed from the
    coordinates (_recomputed_best) and sorted by (distance, index).  A point left
    out lies, in float32, at least as far as the last candidate, a, up to the
    search's relative error RTOL[float32]; rounding a centred point to float32
    moves it by at most 2^-24 of its norm, so in float64 it lies at least
    sqrt(a (1 - 2 RTOL)) - 2^-23 (|q| + max |x|) away (twice both bounds).
    Where that does not exceed the k-th recomputed distance, a point left out
    could belong, and the row is searched again in float64 (_rows_in_float64).
    Fashion-MNIST as float64 (results/knn_float64.json, 2-core Xeon VM, best of 2
    alternating with the float64 search): 70,000 points' 90-NN in 29.1 s against
    44.0 s (a profile: about 25 s the float32 search, 4 s the recomputation,
    which gathers 784 coordinates per candidate), their 20-NN in 24.6 s against
    43.2 s; every image's 6 nearest of 4,000 landmarks (LLL's Z) 2.4 s against
    3.9 s; 2,000 images' 90 nearest of the other 68,000 1.6 s against 3.4 s.
    Smaller, one run each: 20,000 points' 90-NN 3.6 s against 4.0 s, 10,000
    points' 20-NN 0.76 s against 0.96 s.  The same neighbours on every row; at
    70,000 the nearest point left out lay at least 0.27% beyond the 90th
    neighbour, where the bound needs about 0.02%.  The distances are the
    recomputed ones, exact where the float64 search's come from the GEMM
    (within RTOL[float64]).  The worst case is data spread about a million times
    its neighbour distances, where no row settles and all go back: 20 clusters
    of unit spread 1e6 apart (20,000 points in 50-D) took 6.5 s against 3.9 s
    for the float64 search alone.  Rows whose candidates the float32 GEMM's own
    rounding leaves unsure (_unsure_rows) go back too: the bound above takes the
    float32 distances as exact."""
    from .neighbors_cpu import centred_float32

    mean = X.mean(axis=0)
    X32, sq_x = centred_float32(X, mean)
    Q32, sq_q = (X32, sq_x) if exclude_self else centred_float32(Q, mean)
    # Beyond float32's range the float64 search; twice the float32 search's own test,
    # so that its norms, rounded to float32, cannot fail that.
    if not 8.0 * max(sq_x.max(), sq_q.max()) < float(np.finfo(np.float32).max):
        return _knn(be, Q, X, k, exclude_self, block_bytes, mixed=False)
    approx, cand, unsettled = _gemm_knn(be, Q32, X32, n_cand, exclude_self, block_bytes,
                                        mean=0, keep=True, points=None)
    sqdist, indices = _recomputed_best(np, Q, X, cand, k, block_bytes)
    slack = 2.0**-23 * (np.sqrt(sq_q) + np.sqrt(sq_x.max()))
    beyond = np.sqrt(approx[:, -1].astype(np.float64)
                     * (1.0 - 2.0 * RTOL[np.dtype(np.float32)])) - slack
    unsure = np.flatnonzero(~(beyond > np.sqrt(sqdist[:, -1])) | unsettled)
    if unsure.size:
        rows, *again = _float64_search(be, Q, X, unsure, k, exclude_self, block_bytes)
        sqdist[rows], indices[rows] = again
    return sqdist, indices


def _rows_in_float64(be, Q, X, rows, k, exclude_self, block_bytes):
    """The k-NN of the queries Q[rows] from the float64 search's candidates, their
    distances recomputed (so that exact ties come in index order, as in the other
    rows); with ``exclude_self`` (Q is X) without each row's own index (or its
    last candidate, where as many copies at distance 0 come before it)."""
    m = min(X.shape[0], k + int(exclude_self) + CANDIDATE_MARGIN)
    sqdist, cand = _knn(be, Q[rows], X, m, False, block_bytes, mixed=False)
    if exclude_self:
        cand = _without_own(sqdist, cand, rows)[1]
    return _recomputed_best(be.xp, Q[rows], X, cand, k, block_bytes)


def _rows_exactly(xp, Q, X, rows, k, exclude_self, block_bytes):
    """The k-NN of the queries Q[rows] among all points (but the row's own, with
    ``exclude_self``) by every distance recomputed from the coordinates: no GEMM,
    for points spread too far from their mean for even float64's.  Chunks of rows
    whose (rows, N) candidates fit about ``block_bytes``."""
    n = X.shape[0] - int(exclude_self)
    sqdist = xp.empty((rows.size, k), dtype=X.dtype)
    indices = xp.empty((rows.size, k), dtype=xp.int64)
    step = max(1, block_bytes // (5 * 8 * n))
    for start in range(0, rows.size, step):
        own = rows[start:start + step]
        cand = xp.tile(xp.arange(n), (own.size, 1))
        if exclude_self:                # every column but the row's own
            cand += cand >= own[:, None]
        sqdist[start:start + step], indices[start:start + step] = _recomputed_best(
            xp, Q[own], X, cand, k, block_bytes)
    return sqdist, indices


def _recomputed_best(xp, Q, X, cand, k, block_bytes):
    """The k best of each query's candidates by their distances recomputed from the
    coordinates, sorted by (distance, index): dense on the CPU compiled
    (neighbors_cpu.candidate_sqdist), else by _recompute."""
    if xp is np and not is_sparse(X):
        from .neighbors_cpu import candidate_sqdist

        return _best_sorted(np, candidate_sqdist(Q, X, cand), cand, k)
    dist = xp.empty(cand.shape, dtype=X.dtype)
    _recompute(xp, Q, X, cand, dist, *xp.divmod(xp.arange(cand.size), cand.shape[1]),
               block_bytes)
    return _best_sorted(xp, dist, cand, k)


def _tree_knn(Q, X, k, exclude_self, block_bytes):
    """The CPU's k-NN in up to TREE_MAX_DIM dimensions: a k-d tree's
    k + CANDIDATE_MARGIN nearest (O(log N) per query where brute force computes
    a row of N distances), self left out, their squared distances recomputed from
    the coordinates (summed in float64) and sorted by (distance, index) as the
    brute force sorts them, compiled (neighbors_cpu.best_sorted: the 10-NN of
    70,000 2-D points took 0.10 s, with NumPy's gather and lexsort 0.17 s); in
    blocks of query rows whose candidate lists fit ``block_bytes``."""
    import numba
    from scipy.spatial import cKDTree

    from .neighbors_cpu import best_sorted, candidate_sqdist

    n, m_rows = X.shape[0], Q.shape[0]
    m = min(n, k + int(exclude_self) + CANDIDATE_MARGIN)
    tree = cKDTree(X)
    sqdist = np.empty((m_rows, k), dtype=X.dtype)
    indices = np.empty((m_rows, k), dtype=np.int64)
    # Per candidate: the tree's distance and index, the index's int64 copy, d2.
    rows = max(1, block_bytes // (m * 4 * 8))
    for start in range(0, m_rows, rows):
        q = Q[start:start + rows]
        idx = tree.query(q, m, workers=numba.get_num_threads())[1]   # as the compiled loops
        idx = idx.reshape(len(q), m).astype(np.int64)
        d2 = candidate_sqdist(q, X, idx)
        if exclude_self:                    # wherever the tree put it among its copies
            d2[idx == np.arange(start, start + len(q))[:, None]] = np.inf
        sqdist[start:start + len(q)], indices[start:start + len(q)] = best_sorted(d2, idx, k)
    return sqdist, indices


def _self_knn_cpu(Yp, sq, inv_perm, n_cand, block_bytes):
    """All points' n_cand nearest candidates (GEMM distances, positions in Yp) on the
    CPU from the upper triangle of the distance matrix (neighbors_cpu.offer_strip);
    Yp: the centred points in the random order, sq their squared norms."""
    from .neighbors_cpu import offer_strip

    n = Yp.shape[0]
    values = np.full((n, n_cand), np.inf, dtype=Yp.dtype)
    cand = np.full((n, n_cand), -1, dtype=np.int64)
    rows = _block_rows(n, n, Yp, block_bytes)
    with BlockProducts(get_backend("cpu")) as products:
        for start in range(0, n, rows):
            offer_strip(products(Yp[start:start + rows], transposed(Yp[start:])), sq, start,
                        values, cand)
    # Back to the caller's order: row r is Yp's row inv_perm[r].
    return values[inv_perm], cand[inv_perm]


def _block_rows(m, n, X, block_bytes):
    """Rows of a block of the B x n distance matrix within ``block_bytes``; for
    sparse X on the GPU the product's sparse form (a value and a column index
    per entry) comes before the dense block."""
    on_device_sparse = is_sparse(X) and not scipy.sparse.issparse(X)
    per_entry = X.dtype.itemsize * (3 if on_device_sparse else 1)
    return max(1, min(m, block_bytes // (n * per_entry)))


def _select_cpu(be, D, offset, skip, m):
    """(values, columns) of the m smallest entries of each row of D + offset,
    leaving out column skip[row] (-1: none); unordered (neighbors_cpu.select_rows,
    compiled: a heap per row, which few entries of a row in random column order
    enter)."""
    from .neighbors_cpu import select_rows

    return select_rows(D, offset, skip, m)


def _offset_skip(xp, D, offset, skip):
    """D + offset (per column) with inf at each row's column skip[row] >= 0."""
    S = D + offset[None, :]
    own = xp.flatnonzero(skip >= 0)
    S[own, skip[own]] = xp.inf
    return S


def _select_gpu(be, D, offset, skip, m):
    """GPU version of _select_cpu (D is left as it is, the values come in
    column order): kernels/knn_select.cu, one warp per row and column segment,
    then the m best of the segments' winners."""
    xp = be.xp
    b, n = D.shape
    if _warps_per_block(m) == 0:                # no room for the list: a full stable sort
        D = _offset_skip(xp, D, offset, skip)
        columns = xp.argsort(D, axis=1, kind="stable")[:, :m]
        return xp.take_along_axis(D, columns, axis=1), columns
    D = xp.ascontiguousarray(D)
    # Enough warps to fill the GPU, each lane scanning at least 4 m columns.
    segments = max(1, min(-(-SELECT_WARPS // b), n // (SEGMENT_COLUMNS * m)))
    values, columns = _select_launch(be, D, offset, skip, m, segments)
    if segments == 1:
        return values, columns
    # Segments are runs of columns in order: (value, position) ties in the
    # winners break as (value, column) do in D.
    values, best = _select_launch(be, values, xp.zeros(values.shape[1], D.dtype),
                                  xp.full(b, -1, xp.int64), m, 1)
    return values, xp.take_along_axis(columns, best, axis=1)


def _select_launch(be, D, offset, skip, m, segments):
    """Values and columns (b, segments * m) of each row's segments' m smallest entries."""
    xp = be.xp
    b, n = D.shape
    values = xp.empty((b, segments * m), dtype=D.dtype)
    columns = xp.empty((b, segments * m), dtype=xp.int64)
    bound = xp.full(b, np.iinfo(np.uint64).max, dtype=xp.uint64)   # shared by a row's segments
    warps = _warps_per_block(m)
    kernel = be.kernel("knn_select.cu", "knn_select", D.dtype,
                       defines={"KNN_MAX_K": _pow2(m), "KNN_WARPS": warps})
    grid = ((b + warps - 1) // warps, segments)
    kernel(grid, (32 * warps,), (D, offset, skip, bound, np.int64(b), np.int64(n), np.int32(m),
                                 values, columns))
    return values, columns


def _warps_per_block(m):
    """Warps per block whose lists of m (value, column) pairs fit the 48 KiB of
    static shared memory a kernel gets without opting in (at most 4; 0: none).
    Counted for double values: the source instantiates both types."""
    return min(4, SHARED_BYTES // (_pow2(m) * 16))


def _pow2(m):
    return 1 << (int(m) - 1).bit_length()


def _finish_all(xp, Q, X, dist, sq_q, sq, perm, cand, k, block_bytes):
    """_finish over all queries, in chunks of rows whose sorts fit about
    ``block_bytes``; cand: the candidates' positions in the permuted points
    (their squared norms sq and their indices perm)."""
    m, n_cand = cand.shape
    sqdist = xp.empty((m, k), dtype=X.dtype)
    indices = xp.empty((m, k), dtype=xp.int64)
    # _finish holds about 5 arrays of (rows, n_cand) int64 at once.
    rows = max(1, block_bytes // (5 * 8 * n_cand))
    for start in range(0, m, rows):
        stop = min(m, start + rows)
        c = cand[start:stop]
        sqdist[start:stop], indices[start:stop] = _finish(
            xp, Q[start:stop], X, dist[start:stop], sq_q[start:stop], sq[c], perm[c], k,
            block_bytes)
    return sqdist, indices


def _finish(xp, Q, X, dist, sq_rows, sq_cand, cand, k, block_bytes):
    """The candidates' GEMM distances ``dist`` of queries Q, recomputed where
    rounding could dominate; best k sorted by (distance, index).  sq_rows, sq_cand:
    the centred squared norms of the queries and the candidates.  The recomputed
    pairs' differences (D values each) are taken about ``block_bytes`` at a time:
    all at once, the 90-NN of Fashion-MNIST moved 1e4 from the origin, centred on a
    float32 mean 9.9 off, which sent most pairs here, was killed for memory at 24 GB
    (6.9M pairs: three arrays of 21 GB each)."""
    share = np.sqrt(X.shape[1]) * np.finfo(X.dtype).eps / RTOL[X.dtype]
    r, c = xp.nonzero(dist <= share * (sq_rows[:, None] + sq_cand))
    _recompute(xp, Q, X, cand, dist, r, c, block_bytes)
    return _best_sorted(xp, dist, cand, k)


def _recompute(xp, Q, X, cand, dist, r, c, block_bytes):
    """dist[r, c] = |Q[r] - X[cand[r, c]]|^2 from the coordinates' differences (D
    values each): dense on the CPU compiled pair by pair (neighbors_cpu.pair_sqdist),
    else taken about ``block_bytes`` at a time.  NumPy's gathers and differences
    took 6.7 s of the 15.0 s of the 90-NN of Fashion-MNIST 20k as float64 with its
    halves moved 30 up and down, where every candidate came here, twice (now
    10.1 s; the float64 search alone 10.0 s, now 5.4 s)."""
    if xp is np and not is_sparse(X):
        from .neighbors_cpu import pair_sqdist

        pair_sqdist(Q, X, cand, r, c, dist)
        return
    step = max(1, block_bytes // (3 * X.shape[1] * X.dtype.itemsize))
    for start in range(0, r.size, step):
        rows, cols = r[start:start + step], c[start:start + step]
        dist[rows, cols] = row_sqnorms(xp, Q[rows] - X[cand[rows, cols]])


def _best_sorted(xp, dist, cand, k):
    """The k best of each row's candidates, sorted by (distance, index)."""
    if xp is np:
        from .neighbors_cpu import best_sorted

        return best_sorted(dist, cand, k)
    # Sort by index, then stably by distance: ties end up in index order.
    by_index = xp.argsort(cand, axis=1)
    cand = xp.take_along_axis(cand, by_index, axis=1)
    dist = xp.take_along_axis(dist, by_index, axis=1)
    order = xp.argsort(dist, axis=1, kind="stable")[:, :k]
    return xp.take_along_axis(dist, order, axis=1), xp.take_along_axis(cand, order, axis=1)
