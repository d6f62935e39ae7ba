"""The attractive term on the GPU by kernels/attraction.cu: sum_nm p_nm phi(d_nm^2)
and G_n = sum_m w_nm (x_n - x_m) in one launch, a warp per CSR row (see
attraction_cpu.py for the terms; base.PairSet.attraction_arrays is the reference).
In the default t-SNE fit of Fashion-MNIST 70k on an H100 (ad1c5e5's profile) the
array code took 1.8 ms per evaluation, 17% of the fit: it gathers both ends of
every edge, writes the distances and weights, builds a sparse matrix of them and
multiplies it by the layout."""
from __future__ import annotations

import numpy as np

THREADS = 256       # 8 rows per block


def attraction_gpu(be, P, p, X, student):
    """(value, G) for the CSR pattern of P with edge values p, at the layout X; the
    value a 0-d device array, for the objective's one host read (Backend.host_floats)."""
    xp = be.xp
    n, d = X.shape
    X = xp.ascontiguousarray(X)
    grad = xp.empty_like(X)
    part = xp.empty(n, dtype=xp.float64)
    kernel = be.kernel("attraction.cu", "attraction", X.dtype,
                       {"ATT_DIM": d, "ATT_STUDENT": int(student)})
    rows = THREADS // 32
    kernel((max(1, (n + rows - 1) // rows),), (THREADS,),
           (P.indptr, P.indices, xp.ascontiguousarray(p, dtype=X.dtype), X, np.int32(n), grad,
            part))
    return part.sum(), grad
