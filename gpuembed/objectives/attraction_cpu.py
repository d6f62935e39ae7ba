"""Compiled CPU sweep of the attractive term over the sparse affinities.

sum_nm p_nm phi(d_nm^2) and G_n = sum_m w_nm (x_n - x_m) for the quadratic
attraction of EE, s-SNE and SNE (phi = d^2, w = p) and t-SNE's
(phi = log(1 + d^2), w = p / (1 + d^2)), one parallel pass over the CSR rows.
The array code of base.PairSet (the reference; the GPU runs kernels/attraction.cu,
attraction_gpu.py) gathers both endpoints of every edge, writes the squared
distances and weights and goes through a sparse product: for t-SNE on
Fashion-MNIST 10k (1.3M edges) that was
22 ms of an evaluation, as much as the Barnes-Hut repulsion.  t-SNE's log uses
``fastexp.logpos``: with libm's log1p, which does not vectorize, the pass took
15 ms instead of EE's 3.4 ms.  Now 3.2 ms (EE) and 4.4 ms (t-SNE).

``edge_sqdist`` gives the edges' squared distances in one pass, for t-SNE's
refreshed spectral direction (weights p / (1 + d^2) at the current layout).
The array code's gathers and temporaries, six arrays of nnz values, took
0.5-1.1 s per refresh inside a t-SNE fit of Fashion-MNIST 70k (9.9M edges;
0.13 s when repeated at once: the temporaries' fresh pages are what costs).
"""
from __future__ import annotations

import numpy as np
from numba import get_thread_id, njit, prange

from ..fastexp import logpos

# Of fastexp.py, whose functions this file's cached code holds (_generated.py).
FASTEXP_DIGEST = "0b1f32411deb462c"


@njit(parallel=True, fastmath=True, cache=True)    # compiling takes ~3 s: cache it on disk
def attraction(indptr, indices, p, XT, student, grad, buffers):
    """Adds G to ``grad`` (zeros, (N, d)) and returns sum p phi; XT: the layout
    transposed, (d, N) contiguous.

    Each row's squared distances, weights and coordinate differences go through
    small 0-based buffers, one coordinate at a time: with them LLVM vectorizes
    the loops over the row's edges (gathers included).  Indexing the full arrays
    per edge, as before, ran 2-3x slower.  The buffers are the thread's rows of
    ``buffers`` (numba.get_num_threads(), 2 + d, the longest row): allocated per
    row, they cost 15% of the pass (t-SNE, Fashion-MNIST 20k: 5.55 ms against
    4.70 ms).  The differences kept from the distances' loop spare the
    gradient's loop a second gather per edge and coordinate: t-SNE on
    Fashion-MNIST 70k (9.9M edges, medians of 30 in alternating processes)
    22.0-23.6 ms against 24.6-25.5 ms, the same bits; in the default fit's
    profile (benchmarks/profile_fit.py) 23.4 against 27.3 ms per evaluation."""
    d, n = XT.shape
    part = np.zeros(n)
    for i in prange(n):
        lo, hi = np.int64(indptr[i]), np.int64(indptr[i + 1])
        cols, pe = indices[lo:hi], p[lo:hi]
        buffer = buffers[get_thread_id()]
        d2, w = buffer[0, :hi - lo], buffer[1, :hi - lo]
        d2[:] = 0.0
        for c in range(d):
            xi, xc, diff = XT[c, i], XT[c], buffer[2 + c, :hi - lo]
            for e in range(hi - lo):
                diff[e] = xi - xc[cols[e]]
                d2[e] += diff[e] * diff[e]
        acc = 0.0
        if student:
            for e in range(hi - lo):
                q = 1.0 + d2[e]
                w[e] = pe[e] / q
                acc += pe[e] * logpos(q)
        else:
            w = pe
            for e in range(hi - lo):
                acc += pe[e] * d2[e]
        for c in range(d):
            diff = buffer[2 + c, :hi - lo]
            g = 0.0
            for e in range(hi - lo):
                g += w[e] * diff[e]
            grad[i, c] += g
        part[i] = acc
    total = 0.0
    for i in range(n):      # in order: part.sum() here would add one partial sum per thread
        total += part[i]
    return total


@njit(parallel=True, cache=True)
def edge_sqdist(indptr, indices, XT):
    """|x_n - x_m|^2 for every stored edge (n, m), in CSR order and XT's dtype;
    XT: the layout transposed, (d, N) contiguous.  The same operations in the
    same order as the array code (PairSet.sqdist_arrays), so the same bits."""
    d, n = XT.shape
    out = np.zeros(indices.shape[0], dtype=XT.dtype)
    for i in prange(n):
        for c in range(d):
            xi, xc = XT[c, i], XT[c]
            for e in range(indptr[i], indptr[i + 1]):
                diff = xi - xc[indices[e]]
                out[e] += diff * diff
    return out


@njit(parallel=True, fastmath=True, cache=True)
def out_of_sample_attraction(X, Y, idx, W, student, grad_needed, value, grad, curvature):
    """The attractive terms of new points (out_of_sample.OutOfSample, whose array
    code is the reference and the GPU path): row i of X (M, d) against its
    training neighbours Y[idx[i]] (idx (M, k)) with affinities W (M, k).  Fills
    ``value`` with sum_j W_ij phi(d_ij^2) and, with ``grad_needed``, ``grad``
    with 2 sum_j w_ij (x_i - y_j) and ``curvature`` with 2 sum_j w_ij (phi and w
    as in :func:`attraction`).  Each row is summed alone, in one order, so a
    point's terms do not depend on the rows evaluated with it."""
    M, k = idx.shape
    dim = X.shape[1]
    for i in prange(M):
        acc = 0.0
        wsum = 0.0
        if grad_needed:
            grad[i, :] = 0.0
        for j in range(k):
            y = idx[i, j]
            d2 = 0.0
            for c in range(dim):
                diff = X[i, c] - Y[y, c]
                d2 += diff * diff
            if student:
                q = 1.0 + d2
                acc += W[i, j] * logpos(q)
                w = W[i, j] / q
            else:
                acc += W[i, j] * d2
                w = W[i, j]
            if grad_needed:
                wsum += w
                for c in range(dim):
                    grad[i, c] += 2.0 * w * (X[i, c] - Y[y, c])
        value[i] = acc
        if grad_needed:
            curvature[i] = 2.0 * wsum
