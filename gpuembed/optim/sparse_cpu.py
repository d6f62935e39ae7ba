"""Compiled matrix helpers of the spectral direction (optim/directions.py).

``largest_per_row`` sparsifies L+: the array code it replaces ranked all
entries with one ``np.lexsort`` over (row, -weight), 1.0 s for t-SNE's 2.7M
affinities on Fashion-MNIST 20k, paid again for every mu of a MAC run, each of
which builds its own direction.  ``csr_times`` is the CG's product with the
SD matrix on all cores (SciPy's runs on one), ``jacobi_pcg`` SD's whole CG,
``cholesky_solve`` the solve by a dense Cholesky factor.  SD's two-level solve
(directions.two_level_cpu): ``aggregate`` and ``smoothed_prolongator`` make its
coarse level, ``csr_transpose`` and ``csr_times_csr_dense`` its coarse matrix,
``two_level_apply`` the solve.  ``component_split`` and ``component_join`` are
its moves of whole components (Spectral._split, _join), ``connected_components``
finds them.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(parallel=True, cache=True)
def largest_per_row(indptr, data, kappa):
    """Boolean mask over the entries: each row's ``kappa`` largest values (all of a
    row with fewer); among equal values the earlier stored ones.

    Each row streams through a descending buffer of its best ``kappa`` so far,
    which a value enters only if it beats the buffer's last: a few dozen
    insertions in a row of t-SNE's ~140 affinities, where a sort of the row
    (as before) cost 0.2 s per refresh of SD at Fashion-MNIST 70k."""
    keep = np.zeros(data.shape[0], dtype=np.bool_)
    for i in prange(indptr.shape[0] - 1):
        lo, hi = indptr[i], indptr[i + 1]
        if hi - lo <= kappa:
            keep[lo:hi] = True
            continue
        best = np.empty(kappa, dtype=data.dtype)
        where = np.empty(kappa, dtype=np.int64)
        m = 0
        for e in range(lo, hi):
            m = _keep_largest(best, where, m, data[e], e)
        for j in range(kappa):
            keep[where[j]] = True
    return keep


@njit(inline="always")
def _keep_largest(best, where, m, v, item):
    """Offer (v, item) to the descending buffer (best, where) holding m entries
    (at most its length): it enters only if it beats the last kept value, ties
    going to the entry already kept.  Returns the new count."""
    capacity = best.shape[0]
    if m == capacity and v <= best[m - 1]:
        return m
    j = m if m < capacity else capacity - 1
    while j > 0 and best[j - 1] < v:
        best[j], where[j] = best[j - 1], where[j - 1]
        j -= 1
    best[j], where[j] = v, item
    return min(m + 1, capacity)


@njit(parallel=True, cache=True)
def csr_times(indptr, indices, data, V):
    """The CSR matrix (indptr, indices, data) times the dense (N, k) V."""
    n, k = indptr.shape[0] - 1, V.shape[1]
    out = np.zeros((n, k), dtype=V.dtype)
    for i in prange(n):
        for e in range(indptr[i], indptr[i + 1]):
            j, w = indices[e], data[e]
            for c in range(k):
                out[i, c] += w * V[j, c]
    return out


# Rows per partial sum of jacobi_pcg's dot products.
SUM_BLOCK = 1024


@njit(parallel=True, cache=True)
def jacobi_pcg(indptr, indices, data, diag, B, X0, rtol, maxiter, tiny):
    """directions.pcg for the CSR matrix A = (indptr, indices, data) with the
    Jacobi preconditioner 1 / ``diag``, compiled: the vector updates of a step
    and its two dot products are one pass per column on all cores (as array
    code they cost as much as the product with A at 20,000 points).

    The dot products sum blocks of SUM_BLOCK rows in parallel, then the blocks'
    sums in order, so the solution does not depend on the number of threads:
    prange's own reductions add one partial sum per thread, and a t-SNE fit of
    6,000 points took another path on 1, 2 and 3 threads.  A block's rows are
    slices indexed from 0 (indexed from the block's first row, each access kept
    a check for negative indices: 1.75x slower)."""
    n, k = B.shape
    X = X0.copy()
    R = B - csr_times(indptr, indices, data, X)
    Z = np.empty_like(R)
    n_blocks = (n + SUM_BLOCK - 1) // SUM_BLOCK
    sums = np.zeros((3, n_blocks))
    rz, rr, target = np.zeros(k), np.zeros(k), np.zeros(k)
    for c in range(k):
        for b in prange(n_blocks):
            lo, hi = b * SUM_BLOCK, min(n, (b + 1) * SUM_BLOCK)
            r, z, g, dg = R[lo:hi, c], Z[lo:hi, c], B[lo:hi, c], diag[lo:hi]
            s_rz, s_rr, s_bb = 0.0, 0.0, 0.0
            for i in range(hi - lo):
                z[i] = r[i] / dg[i]
                s_rz += r[i] * z[i]
                s_rr += r[i] * r[i]
                s_bb += g[i] * g[i]
            sums[0, b], sums[1, b], sums[2, b] = s_rz, s_rr, s_bb
        rz[c], rr[c], target[c] = _total(sums[0]), _total(sums[1]), rtol * np.sqrt(_total(sums[2]))
    P = Z.copy()
    for _ in range(maxiter):
        if np.all(np.sqrt(rr) <= target):
            break
        AP = csr_times(indptr, indices, data, P)
        for c in range(k):
            for b in prange(n_blocks):
                lo, hi = b * SUM_BLOCK, min(n, (b + 1) * SUM_BLOCK)
                p, ap = P[lo:hi, c], AP[lo:hi, c]
                pap = 0.0
                for i in range(hi - lo):
                    pap += p[i] * ap[i]
                sums[0, b] = pap
            alpha = rz[c] / max(_total(sums[0]), tiny)
            for b in prange(n_blocks):
                lo, hi = b * SUM_BLOCK, min(n, (b + 1) * SUM_BLOCK)
                x, r, z, p, ap, dg = (X[lo:hi, c], R[lo:hi, c], Z[lo:hi, c], P[lo:hi, c],
                                      AP[lo:hi, c], diag[lo:hi])
                s_rz, s_rr = 0.0, 0.0
                for i in range(hi - lo):
                    x[i] += alpha * p[i]
                    ri = r[i] - alpha * ap[i]          # in float64, stored in r's dtype
                    r[i] = ri
                    zi = ri / dg[i]
                    z[i] = zi
                    s_rz += ri * zi
                    s_rr += ri * ri
                sums[0, b], sums[1, b] = s_rz, s_rr
            s_rz, s_rr = _total(sums[0]), _total(sums[1])
            beta = s_rz / max(rz[c], tiny)
            for i in prange(n):
                P[i, c] = Z[i, c] + beta * P[i, c]
            rz[c], rr[c] = s_rz, s_rr
    return X


@njit(cache=True)
def _total(a):
    """The sum of a's entries in order (``a.sum()`` inside a parallel function
    becomes a reduction over the threads)."""
    total = 0.0
    for x in a:
        total += x
    return total


@njit(cache=True, fastmath={"contract", "reassoc"})
def cholesky_solve(U, G):
    """X with U^T U X = G, U upper triangular (C order; its strict lower triangle
    is not read), G (N, k): one pass over U's rows for each triangle, every
    column of G in turn while the row is in cache.  At 720 points (t-SNE's SD
    on rotating_objects) 0.096 ms for two columns against 0.16 ms for LAPACK's
    potrs (best of 30; 2-core EPYC).  Each inner loop runs over slices from 0:
    over range(j + 1, N) they did not vectorize (4-5x slower)."""
    n, k = G.shape
    Y = np.empty((k, n))
    for i in range(n):
        for c in range(k):
            Y[c, i] = G[i, c]
    for j in range(n):                  # U^T Y = G: row j of U is column j of U^T
        row, pivot = U[j, j + 1:], U[j, j]
        for c in range(k):
            y = Y[c, j + 1:]
            t = Y[c, j] / pivot
            Y[c, j] = t
            for i in range(n - j - 1):
                y[i] -= row[i] * t
    for i in range(n - 1, -1, -1):      # U X = Y
        row, pivot = U[i, i + 1:], U[i, i]
        for c in range(k):
            y = Y[c, i + 1:]
            s = Y[c, i]
            for j in range(n - i - 1):
                s -= row[j] * y[j]
            Y[c, i] = s / pivot
    return np.ascontiguousarray(Y.T)


@njit(cache=True)
def aggregate(indptr, indices, data, order, size):
    """(labels, number of aggregates): greedy aggregation of the graph whose
    off-diagonal CSR entries (SD's B: minus 4 times the weights) link the
    points.  In ``order``, each point not yet taken starts an aggregate with up
    to ``size`` - 1 of its free neighbours, the most strongly linked first (the
    most negative entries; among equal ones the earlier stored)."""
    n = indptr.shape[0] - 1
    labels = np.full(n, -1, dtype=np.int64)
    best = np.empty(size - 1, dtype=data.dtype)
    where = np.empty(size - 1, dtype=np.int64)
    m = 0
    for i in order:
        if labels[i] >= 0:
            continue
        labels[i] = m
        k = 0
        for e in range(indptr[i], indptr[i + 1]):
            j = indices[e]
            if j != i and labels[j] < 0 and size > 1:
                k = _keep_largest(best, where, k, -data[e], j)
        for t in range(k):
            labels[where[t]] = m
        m += 1
    return labels, m


@njit(cache=True)
def smoothed_prolongator(indptr, indices, data, diag, labels, m, omega, drop=0.0):
    """The CSR (indptr, indices, data) of smoothed aggregation's (N, m)
    prolongator (I - omega D^-1 B) R0, R0 the aggregates' indicator: row i is
    its own aggregate's column minus omega / B_ii times B's row i summed per
    aggregate, one entry per aggregate its row reaches, in the order reached.
    A row has at most one entry more than B's.  Entries below ``drop`` times
    their row's largest magnitude are dropped and the rest scaled to keep the
    row's sum (the coarse space keeps the constant vector)."""
    n = indptr.shape[0] - 1
    out_ptr = np.zeros(n + 1, dtype=np.int64)
    out_idx = np.empty(indices.shape[0] + n, dtype=np.int64)
    out_val = np.empty(indices.shape[0] + n)
    seen_in_row = np.full(m, -1, dtype=np.int64)
    slot = np.empty(m, dtype=np.int64)
    count = 0
    for i in range(n):
        scale = omega / diag[i]
        for e in range(indptr[i], indptr[i + 1]):
            a = labels[indices[e]]
            if seen_in_row[a] != i:
                seen_in_row[a], slot[a] = i, count
                out_idx[count], out_val[count] = a, 0.0
                count += 1
            out_val[slot[a]] -= scale * data[e]
        a = labels[i]
        if seen_in_row[a] != i:         # a row without its diagonal stored
            seen_in_row[a], slot[a] = i, count
            out_idx[count], out_val[count] = a, 0.0
            count += 1
        out_val[slot[a]] += 1.0
        if drop > 0.0:
            count = _drop_small(out_idx, out_val, out_ptr[i], count, drop)
        out_ptr[i + 1] = count
    return out_ptr, out_idx[:count].copy(), out_val[:count].copy()


@njit(cache=True, inline="always")
def _drop_small(idx, val, start, end, drop):
    """Compacts the entries start:end of (idx, val) to those of magnitude at least
    ``drop`` times the largest, scaled to the same sum; returns the new end."""
    top, total = 0.0, 0.0
    for e in range(start, end):
        top, total = max(top, abs(val[e])), total + val[e]
    kept, end_kept = 0.0, start
    for e in range(start, end):
        if abs(val[e]) >= drop * top:
            idx[end_kept], val[end_kept] = idx[e], val[e]
            kept += val[e]
            end_kept += 1
    scale = total / kept if kept != 0.0 else 1.0
    for e in range(start, end_kept):
        val[e] *= scale
    return end_kept


@njit(cache=True)
def csr_transpose(indptr, indices, data, n_cols):
    """The CSR of the transpose of the CSR (indptr, indices, data) with
    ``n_cols`` columns, each row's entries in the original's row order."""
    counts = np.zeros(n_cols + 1, dtype=np.int64)
    for e in range(indices.shape[0]):
        counts[indices[e] + 1] += 1
    out_ptr = np.cumsum(counts)
    fill = out_ptr[:-1].copy()
    out_idx = np.empty(indices.shape[0], dtype=np.int64)
    out_val = np.empty(indices.shape[0], dtype=data.dtype)
    for i in range(indptr.shape[0] - 1):
        for e in range(indptr[i], indptr[i + 1]):
            c = indices[e]
            out_idx[fill[c]], out_val[fill[c]] = i, data[e]
            fill[c] += 1
    return out_ptr, out_idx, out_val


@njit(parallel=True, cache=True)
def csr_times_csr_dense(indptr, indices, data, r_ptr, r_idx, r_val, n_cols):
    """The dense (N, n_cols) product of the CSR A = (indptr, indices, data) with
    the CSR R = (r_ptr, r_idx, r_val): each row in stored order."""
    n = indptr.shape[0] - 1
    out = np.zeros((n, n_cols))
    for i in prange(n):
        for e in range(indptr[i], indptr[i + 1]):
            j, w = indices[e], data[e]
            for f in range(r_ptr[j], r_ptr[j + 1]):
                out[i, r_idx[f]] += w * r_val[f]
    return out


@njit(cache=True)
def two_level_apply(inverse_diag, r_ptr, r_idx, r_val, t_ptr, t_idx, t_val, U, G):
    """D^-1 G + R (U^T U)^-1 R^T G for the two-level solve: R = (r_ptr, r_idx,
    r_val) (N, m), its transpose (t_ptr, t_idx, t_val), U the coarse factor
    (cholesky_solve's).  One serial pass each way: at 720 points the products
    are a few microseconds, less than a parallel region's start."""
    n, k = G.shape
    m = t_ptr.shape[0] - 1
    coarse = np.zeros((m, k))
    for a in range(m):
        for f in range(t_ptr[a], t_ptr[a + 1]):
            j, w = t_idx[f], t_val[f]
            for c in range(k):
                coarse[a, c] += w * G[j, c]
    Y = cholesky_solve(U, coarse)
    out = np.empty((n, k))
    for i in range(n):
        for c in range(k):
            total = inverse_diag[i] * G[i, c]
            for f in range(r_ptr[i], r_ptr[i + 1]):
                total += r_val[f] * Y[r_idx[f], c]
            out[i, c] = total
    return out


@njit(cache=True)
def degrees(indptr, indices, data):
    """Each row's sum of the CSR (indptr, indices, data) less its stored diagonal
    entries: SciPy's W.sum(axis=1) - W.diagonal() (to rounding: summed in stored
    order, SciPy's pairwise) without its two passes and temporaries (0.1-0.2 ms
    at 58,000 entries)."""
    n = indptr.shape[0] - 1
    out = np.empty(n)
    for i in range(n):
        total, own = 0.0, 0.0
        for e in range(indptr[i], indptr[i + 1]):
            total += data[e]
            if indices[e] == i:
                own += data[e]
        out[i] = total - own
    return out


@njit(cache=True)
def laplacian_rows(indptr, indices, data, scale, diag):
    """The CSR of scale (D - W) with its diagonal replaced by ``diag``, W = the
    CSR (indptr, indices, data) (each row's columns ascending), D its row sums:
    W's entries times -scale, each row's diagonal entry (a stored one of W
    merged into it) in column order; W's index types (SciPy's int32 up to 2^31
    entries: CG's products with B read its indices at every step)."""
    n = indptr.shape[0] - 1
    out_ptr = np.zeros(n + 1, dtype=indptr.dtype)
    out_idx = np.empty(indices.shape[0] + n, dtype=indices.dtype)
    out_val = np.empty(indices.shape[0] + n)
    count = 0
    for i in range(n):
        placed = False
        for e in range(indptr[i], indptr[i + 1]):
            j = indices[e]
            if j == i:
                continue
            if j > i and not placed:
                out_idx[count], out_val[count] = i, diag[i]
                count += 1
                placed = True
            out_idx[count], out_val[count] = j, -scale * data[e]
            count += 1
        if not placed:
            out_idx[count], out_val[count] = i, diag[i]
            count += 1
        out_ptr[i + 1] = count
    return out_ptr, out_idx[:count].copy(), out_val[:count].copy()


@njit(cache=True)
def component_split(G, labels, share, counts, curvature):
    """Spectral._split's array code in two passes over G (N, k): (G less each
    component's total spread over its points by ``share``, each component's
    translation -total / (count curvature), (components, k)), in G's dtype with
    the totals in float64.  Its dozen NumPy calls took 40 us of a 180-us SD
    direction at 720 points."""
    n, k = G.shape
    total = np.zeros((counts.shape[0], k))
    for i in range(n):
        for c in range(k):
            total[labels[i], c] += G[i, c]
    out = np.empty_like(G)
    for i in range(n):
        for c in range(k):
            out[i, c] = G[i, c] - share[i] * total[labels[i], c]
    translation = np.empty(total.shape, dtype=G.dtype)
    for a in range(counts.shape[0]):
        for c in range(k):
            translation[a, c] = -total[a, c] / (counts[a] * curvature[a])
    return out, translation


@njit(cache=True)
def component_join(P, labels, counts, translation):
    """Spectral._join's array code in two passes: P less each component's mean
    plus its ``translation`` (component_split's), in P's dtype."""
    n, k = P.shape
    mean = np.zeros((counts.shape[0], k))
    for i in range(n):
        for c in range(k):
            mean[labels[i], c] += P[i, c]
    for a in range(counts.shape[0]):
        for c in range(k):
            mean[a, c] = translation[a, c] - mean[a, c] / counts[a]
    out = np.empty_like(P)
    for i in range(n):
        for c in range(k):
            out[i, c] = P[i, c] + mean[labels[i], c]
    return out


@njit(cache=True)
def connected_components(indptr, indices):
    """(number, int32 labels) of the connected components of the graph whose CSR
    pattern is (indptr, indices), each stored entry an undirected link, numbered
    by their first points as SciPy's connected_components numbers them.  Union by
    the smaller root with path halving, so that each root is its component's first
    point.  At 720 points (58,124 entries) 0.22 ms against SciPy's 0.37-0.40
    (its checks and a CSC copy); at 70,000 (9.9M) 54-56 ms against 284-332."""
    n = indptr.shape[0] - 1
    parent = np.arange(n)
    for i in range(n):
        for e in range(indptr[i], indptr[i + 1]):
            a, b = _root(parent, i), _root(parent, indices[e])
            if a < b:
                parent[b] = a
            elif b < a:
                parent[a] = b
    labels = np.empty(n, dtype=np.int32)
    count = 0
    for i in range(n):
        root = _root(parent, i)
        if root == i:
            labels[i] = count
            count += 1
        else:                       # the root is a smaller point, labelled already
            labels[i] = labels[root]
    return count, labels


@njit(cache=True, inline="always")
def _root(parent, i):
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i
