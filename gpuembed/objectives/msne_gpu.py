"""Multi-scale SNE's exact cost and gradient on the GPU in three CUDA launches
(kernels/msne.cu), the twin of msne_cpu.fused_exact.

The per-scale code of msne.py (two shifted exact sums per scale, the edge terms
as H arrays of nnz values, a sparse matrix per row sum, a k-NN for the shifts)
made 316 CuPy calls per L-BFGS iteration; on an H100, digits (1,797 points)
took 24 s against 12 s on two CPU cores, every kernel waiting on the host.
Here: the row sums (shifts found in the same pass), the edge sweep, the dense
gradient, then the transposed half of the pattern's Laplacian product and one
read of the cost.
"""
from __future__ import annotations

import numpy as np

THREADS = 128


def fused_exact(be, pairs, X, half_p, js, kappa):
    """(the pattern's part of the cost, sum of s over the pattern, gradient) as
    msne_cpu.fused_exact returns them; X (N, d) on the device, float64."""
    xp = be.xp
    n, d = X.shape
    H = len(half_p)
    X = xp.ascontiguousarray(X, dtype=xp.float64)
    c = xp.asarray(half_p, dtype=xp.float64)
    indptr, indices = pairs._indices64
    defines = {"MSNE_DIM": d, "MSNE_SCALES": H}

    def launch(name, rows_per_block, args, shared=0):
        kernel = be.kernel("msne.cu", name, np.float64, defines)
        kernel((-(-n // rows_per_block),), (THREADS,), args, shared_mem=shared)

    nearest, Z, DX = xp.empty(n), xp.empty((H, n)), xp.empty((H, n, d))
    launch("msne_row_sums", THREADS, (X, np.int64(n), c, nearest, Z, DX), THREADS * d * 8)
    g_edge, W = xp.empty(pairs.p.size), xp.empty((H, n))
    lap, totals = xp.empty((n, d)), xp.empty((2, n))
    launch("msne_edges", THREADS // 32,
           (indptr, indices, X, pairs._p64, np.int64(n), c, nearest, Z, np.int32(js),
            np.float64(kappa), g_edge, W, lap, totals))
    dense = xp.empty((n, d))
    launch("msne_gradient", THREADS, (X, np.int64(n), c, nearest, W, DX, dense),
           THREADS * (d + 1 + H) * 8)
    grad = lap + pairs.laplacian_times(g_edge, X, transpose=True)
    grad -= dense
    grad *= 2.0
    part, mass = be.to_host(totals.sum(axis=1))
    return float(part), float(mass), grad
