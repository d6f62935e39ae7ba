"""Multi-scale SNE's exact cost and gradient on the GPU in three CUDA launches
(kernels/msne.cu), the twin of msne_cpu.fused_exact.

The per-scale code of msne.py (two shifted exact sums per scale, the edge terms
as H arrays of nnz values, a sparse matrix per row sum, a k-NN for the shifts)
made 316 CuPy calls per L-BFGS iteration; on an H100, digits (1,797 points)
took 24 s against 12 s on two CPU cores, every kernel waiting on the host.
Here: the row sums (shifts found in the same pass), the edge sweep, the dense
gradient, then the transposed half of the pattern's Laplacian product and one
read of the cost.  The FGT path (msne.py) takes the edge sweep alone, in place
of H arrays of nnz values.
"""
from __future__ import annotations

import numpy as np

THREADS = 128


def _launch(be, name, n, rows_per_block, defines, args, shared=0):
    """Launch kernels/msne.cu's ``name`` (double) over n rows, THREADS per block."""
    kernel = be.kernel("msne.cu", name, np.float64, defines)
    kernel((-(-n // rows_per_block),), (THREADS,), args, shared_mem=shared)


def edge_terms(be, pairs, X, half_p, shifts, Z, js, kappa):
    """The pattern's part, one warp per row (msne_edges), for both engines:
    (its cost and the sum of s over it, summed on the device, shape (2,); per
    scale the dense part's row weights w_hi = c_h rs_hi / (H Z_hi), (H, N); the
    pattern's gradient sum_j 2 (g_ij + g_ji)(x_i - x_j)).  X (N, d), float64;
    shifts and Z (H, N): the row shifts m_hi and the shifted row sums."""
    xp = be.xp
    n, d = X.shape
    X = xp.ascontiguousarray(X, dtype=xp.float64)
    # CSR in cupyx's own int32 (as kernels/cg.cu takes it): no copy of the pattern.
    indptr, indices = (xp.ascontiguousarray(a, dtype=xp.int32)
                       for a in (pairs.P.indptr, pairs.P.indices))
    g_edge, W = xp.empty(pairs.p.size), xp.empty((len(half_p), n))
    lap, totals = xp.empty((n, d)), xp.empty((2, n))
    _launch(be, "msne_edges", n, THREADS // 32, {"MSNE_DIM": d, "MSNE_SCALES": len(half_p)},
            (indptr, indices, X, pairs._p64, np.int64(n), xp.asarray(half_p, dtype=xp.float64),
             xp.ascontiguousarray(shifts, dtype=xp.float64),
             xp.ascontiguousarray(Z, dtype=xp.float64), np.int32(js), np.float64(kappa),
             g_edge, W, lap, totals))
    lap += pairs.laplacian_times(g_edge, X, transpose=True)
    lap *= 2.0
    return totals.sum(axis=1), W, lap


def fused_exact(be, pairs, X, half_p, js, kappa):
    """(the pattern's part of the cost, sum of s over the pattern, gradient) as
    msne_cpu.fused_exact returns them; X (N, d) on the device."""
    xp = be.xp
    n, d = X.shape
    H = len(half_p)
    X = xp.ascontiguousarray(X, dtype=xp.float64)
    c = xp.asarray(half_p, dtype=xp.float64)
    defines = {"MSNE_DIM": d, "MSNE_SCALES": H}
    nearest, Z, DX = xp.empty(n), xp.empty((H, n)), xp.empty((H, n, d))
    _launch(be, "msne_row_sums", n, THREADS, defines, (X, np.int64(n), c, nearest, Z, DX),
            THREADS * d * 8)
    totals, W, grad = edge_terms(be, pairs, X, c, c[:, None] * nearest, Z, js, kappa)
    dense = xp.empty((n, d))
    _launch(be, "msne_gradient", n, THREADS, defines, (X, np.int64(n), c, nearest, W, DX, dense),
            THREADS * (d + 1 + H) * 8)
    grad -= 2.0 * dense
    part, mass = be.to_host(totals)
    return float(part), float(mass), grad
