"""Compiled CPU selection of the exact k-NN of all points (neighbors.knn).

The distance matrix of a point set with itself is symmetric, so the CPU path
computes only its upper triangle: strip s holds the rows of block s against
every column from the block's first row on, one GEMM of b x (N - start).  Each
entry is offered to both of its rows (the strip's row and, right of the
diagonal block, the column's row).  Every point keeps its m best candidates in
a max-heap, so an offer is one comparison with the heap's top and only the
rare improvements (about m log(N / m) per point, the points being in random
order) sift down.  Half the GEMM of the full matrix, and the selection runs
on all cores in one pass instead of NumPy's partition, filter and gather.
For sparse rows the strips come from ``sparse_gram``, compiled here too, and
``centred_float32`` and ``candidate_sqdist`` serve the float32 search of float64
points (neighbors._mixed_precision_knn): its input, and its candidates' float64
distances (the k-d tree's too); ``pair_sqdist`` recomputes the GEMM distances
rounding could dominate; ``best_sorted`` puts every CPU search's candidates in
(distance, index) order.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.sparse
from numba import njit, prange

# Columns per task of the transposed pass.  It walks the strip down its rows, a
# page apart, so each row visit should read several cache lines: the 90-NN of
# Fashion-MNIST 70k took 32-33 s with 64 against 35-38 s with 16 (a line of float32).
# With the chunk's heap tops and norms in small arrays, 512 took the pass from 2.25
# to 1.46 ns per entry (a 2,200 x 30,000 strip, 98 candidates, 2 cores; 64: 2.04).
COLUMN_CHUNK = 512
# sparse_gram: a feature in more than 1 / FREQUENT_SHARE of the rows goes to the
# dense GEMM (at most FREQUENT_MAX features; 1.8x at 29 to 115 of them on TF-IDF
# rows, slower at 1,447).
FREQUENT_SHARE = 16
FREQUENT_MAX = 128


@njit(inline="always")
def _replace_top(values, indices, d, j):
    """Put (d, j) in place of the max-heap's top (d below it) and sift down."""
    m = values.size
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= m:
            break
        if child + 1 < m and values[child + 1] > values[child]:
            child += 1
        if values[child] <= d:
            break
        values[pos] = values[child]
        indices[pos] = indices[child]
        pos = child
    values[pos] = d
    indices[pos] = j


@njit(parallel=True, cache=True)
def offer_strip(T, sq, start, values, indices):
    """Offer the squared distances of strip T = Y[start:start + b] @ Y[start:].T
    (sq: the squared norms |y|^2) to the heaps ``values``, ``indices`` (N, m).

    Rows of the strip take every column but their own; a column right of the
    diagonal block takes the strip's rows (the transposed half)."""
    b, width = T.shape
    for r in prange(b):
        i = start + r
        vi, ii = values[i], indices[i]
        for c in range(width):
            j = start + c
            d = sq[i] + sq[j] - 2 * T[r, c]
            if d < vi[0] and j != i:
                _replace_top(vi, ii, d, j)
    n_chunks = (width - b + COLUMN_CHUNK - 1) // COLUMN_CHUNK
    for chunk in prange(n_chunks):
        lo = b + chunk * COLUMN_CHUNK
        hi = min(width, lo + COLUMN_CHUNK)
        # The chunk's columns are this task's alone: their heaps' tops and norms
        # stay in two small arrays instead of being read a heap row apart.
        tops = np.empty(hi - lo, dtype=values.dtype)
        sq_cols = np.empty(hi - lo, dtype=sq.dtype)
        for c in range(hi - lo):
            tops[c] = values[start + lo + c, 0]
            sq_cols[c] = sq[start + lo + c]
        for r in range(b):
            i = start + r
            row = T[r, lo:hi]
            for c in range(hi - lo):
                d = sq[i] + sq_cols[c] - 2 * row[c]
                if d < tops[c]:
                    j = start + lo + c
                    _replace_top(values[j], indices[j], d, i)
                    tops[c] = values[j, 0]


@njit(parallel=True, cache=True)
def select_rows(D, offset, skip, m):
    """(values, columns) of the m smallest entries of each row of D + offset,
    leaving out column skip[row] (-1: none); unordered, any m of a tie.  Each row
    streams through a max-heap of its best m, as offer_strip's rows do: 0.036 s
    for the 98 best of 2,000 rows x 10,000 columns, against 0.10-0.14 s for the
    NumPy threshold filter and partition it replaced (LLL's landmark search on
    Fashion-MNIST 20k, 4,000 landmarks: 2.2 s against 2.65 s for the whole fit)."""
    b, n = D.shape
    values = np.full((b, m), np.inf, dtype=D.dtype)
    columns = np.full((b, m), -1, dtype=np.int64)
    for r in prange(b):
        vr, cr = values[r], columns[r]
        for c in range(n):
            d = D[r, c] + offset[c]
            if d < vr[0] and c != skip[r]:
                _replace_top(vr, cr, d, c)
    return values, columns


@njit(parallel=True, cache=True)
def centred_float32(X, mean):
    """(X - mean) rounded to float32, and its rows' squared norms summed in float64
    before the rounding: one pass over X, without the float64 centred copy."""
    n, d = X.shape
    out = np.empty((n, d), dtype=np.float32)
    sq = np.empty(n)
    for i in prange(n):
        s = 0.0
        for j in range(d):
            u = X[i, j] - mean[j]
            out[i, j] = u
            s += u * u
        sq[i] = s
    return out, sq


@njit(inline="always")
def _sqdist(q, x):
    """|q - x|^2, the squares of the coordinates' differences summed in float64 (no
    GEMM's cancellation)."""
    s = 0.0
    for t in range(q.shape[0]):
        u = q[t] - x[t]
        s += u * u
    return s


@njit(parallel=True, cache=True)
def candidate_sqdist(Q, X, cand):
    """|q_i - x_j|^2 for every query row i and each of its candidates j = cand[i, e]
    (_sqdist), in Q's dtype."""
    m, c = cand.shape
    out = np.empty((m, c), dtype=Q.dtype)
    for i in prange(m):
        q = Q[i]
        for e in range(c):
            out[i, e] = _sqdist(q, X[cand[i, e]])
    return out


@njit(parallel=True, cache=True)
def pair_sqdist(Q, X, cand, r, c, dist):
    """dist[i, e] = |q_i - x_j|^2 (_sqdist), j = cand[i, e], for the pairs
    (i, e) = (r[p], c[p])."""
    for p in prange(r.size):
        i, e = r[p], c[p]
        dist[i, e] = _sqdist(Q[i], X[cand[i, e]])


@njit(inline="always")
def _before(values, indices, a, b):
    """Whether entry a comes before entry b in (distance, index) order."""
    return values[a] < values[b] or (values[a] == values[b] and indices[a] < indices[b])


@njit(inline="always")
def _sift_down(values, indices, root, end):
    """Restore the max-heap (in (distance, index) order) of entries [0, end)
    below ``root``."""
    while True:
        child = 2 * root + 1
        if child >= end:
            return
        if child + 1 < end and _before(values, indices, child, child + 1):
            child += 1
        if not _before(values, indices, root, child):
            return
        values[root], values[child] = values[child], values[root]
        indices[root], indices[child] = indices[child], indices[root]
        root = child


@njit(parallel=True, cache=True)
def best_sorted(dist, cand, k):
    """(distances, indices) of each row's k best candidates cand[i, e] at
    dist[i, e], sorted by (distance, index): a heapsort of each row on that key.
    On 2 cores 0.15 s for the 90 best of 98 unordered candidates of 70,000 rows,
    where NumPy's argsort by index, then stably by distance, took 0.80 s."""
    m, width = dist.shape
    out_dist = np.empty((m, k), dtype=dist.dtype)
    out_cand = np.empty((m, k), dtype=np.int64)
    for i in prange(m):
        # Copies by loops: with the rows' copy() and astype() numba took 3.2 s
        # instead of 1.5 to compile this.
        values = np.empty(width, dtype=dist.dtype)
        indices = np.empty(width, dtype=np.int64)
        for e in range(width):
            values[e] = dist[i, e]
            indices[e] = cand[i, e]
        for root in range(width // 2 - 1, -1, -1):
            _sift_down(values, indices, root, width)
        _sorted_into(values, indices, out_dist[i], out_cand[i])
    return out_dist, out_cand


@njit(inline="always")
def _sorted_into(values, indices, out_values, out_indices):
    """Heapsort the max-heap (values, indices) into (value, index) order and write
    its first out_values.size entries to the outputs."""
    for end in range(values.size - 1, 0, -1):
        values[0], values[end] = values[end], values[0]
        indices[0], indices[end] = indices[end], indices[0]
        _sift_down(values, indices, 0, end)
    for e in range(out_values.size):
        out_values[e] = values[e]
        out_indices[e] = indices[e]


@njit(parallel=True, cache=True)
def smallest_of_rows(D, k, first_row, exclude_self):
    """(values, columns) of the k smallest entries of each row of D (finite) in
    (value, column) order, sorted; with ``exclude_self`` row r leaves out column
    first_row + r.  Each row streams through a max-heap of its best k in that
    order (a later column enters only below the top, and a tie at the top leaves
    its highest column), then a heapsort: a precomputed distance matrix's
    neighbours without a copy of it (NumPy's argpartition of 5,000 x 5,000 took
    0.6 s, and the copy that leaves each row's own column out 0.5 s more)."""
    b, n = D.shape
    out_values = np.empty((b, k), dtype=D.dtype)
    out_columns = np.empty((b, k), dtype=np.int64)
    for r in prange(b):
        values = np.full(k, np.inf, dtype=D.dtype)
        columns = np.full(k, n, dtype=np.int64)
        own = first_row + r if exclude_self else -1
        for c in range(n):
            d = D[r, c]
            if d < values[0] and c != own:
                values[0] = d
                columns[0] = c
                _sift_down(values, columns, 0, k)
        _sorted_into(values, columns, out_values[r], out_columns[r])
    return out_values, out_columns


class FeatureSplit(NamedTuple):
    """B's rows (b x D) prepared as the right factor of sparse_gram: the
    ``frequent`` features' columns dense and transposed, ``common`` (F, b), and
    the rest as B^T in CSR, ``rare`` (D, b), the frequent features' rows empty."""
    frequent: np.ndarray
    common: np.ndarray
    rare: scipy.sparse.csr_matrix


def split_features(B):
    """FeatureSplit of scipy CSR B: features present in more than
    1/FREQUENT_SHARE of its rows (at most FREQUENT_MAX of them), the common
    words of a text, go to the dense part.  Made once for all the products
    with one B (knn_query's blocks), it is O(nnz(B)) per product otherwise."""
    Bt = B.T.tocsr()
    present = np.diff(Bt.indptr)
    frequent = np.argsort(present)[::-1][:FREQUENT_MAX]
    frequent = np.sort(frequent[present[frequent] * FREQUENT_SHARE > B.shape[0]])
    if not frequent.size:
        return FeatureSplit(frequent, np.zeros((0, B.shape[0]), dtype=B.dtype), Bt)
    keep = np.ones(Bt.shape[0], dtype=B.dtype)
    keep[frequent] = 0
    rare = (scipy.sparse.diags(keep) @ Bt).tocsr()
    rare.eliminate_zeros()
    return FeatureSplit(frequent, Bt[frequent].toarray(), rare)


def sparse_gram(A, B):
    """A @ B.T, dense (a, b), for scipy CSR A and B of one dtype (or B's
    split_features).

    The frequent features go through one dense GEMM; for the rest each row of
    A is accumulated straight into its output row over the rows of B^T, the
    rows in parallel: no count of the output's entries and no sparse
    intermediate as in scipy's product.  On TF-IDF rows
    (benchmarks/common.bag_of_words, 2 cores) the accumulation alone was
    2.7-5.5x as fast as scipy's product made dense; the GEMM for the common
    words takes 1.8x off that."""
    right = B if isinstance(B, FeatureSplit) else split_features(B)
    dtype = np.result_type(A.dtype, right.rare.dtype)
    if right.frequent.size:
        out = np.ascontiguousarray(A[:, right.frequent].toarray() @ right.common, dtype=dtype)
    else:
        out = np.zeros((A.shape[0], right.rare.shape[1]), dtype=dtype)
    rare = right.rare
    _accumulate_rows(A.indptr, A.indices, A.data, rare.indptr, rare.indices, rare.data, out)
    return out


@njit(parallel=True, cache=True)
def _accumulate_rows(a_ptr, a_idx, a_val, c_ptr, c_idx, c_val, out):
    for i in prange(out.shape[0]):
        row = out[i]
        for p in range(a_ptr[i], a_ptr[i + 1]):
            k, v = a_idx[p], a_val[p]
            for q in range(c_ptr[k], c_ptr[k + 1]):
                row[c_idx[q]] += v * c_val[q]
