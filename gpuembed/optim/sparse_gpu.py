"""The spectral direction's CG on the GPU (kernels/cg.cu), the twin of
sparse_cpu.jacobi_pcg; directions.pcg is the array-code reference of both.
And the refreshes' sparsification and connected components (kernels/graph.cu),
the twins of sparse_cpu.largest_per_row and SciPy's connected_components.

As array code (directions.pcg on CuPy) a CG step was about 19 CuPy calls and a
host read of the residual norms, and on an H100 SD's iterations on
Fashion-MNIST 70k took 13-66 ms against a 4 ms gradient (call-bound;
benchmarks/results/embedding_gpu.json).  The kernels run a step in three
launches and keep the CG's scalars on the device, so the host only reads them
every CHECK_EVERY steps to stop launching.
"""
from __future__ import annotations

import numpy as np

BLOCK = 256
CHECK_EVERY = 8
KERNELS = ("cg_start", "cg_product", "cg_update", "cg_direction")


def converged(sums, k, rtol):
    """The kernels' stopping test (cg.cu's cg_converged) on a host copy of sums."""
    return bool(np.all(np.sqrt(sums[k, 2]) <= rtol * np.sqrt(sums[0, 0])))


def jacobi_pcg_gpu(be, indptr, indices, data, diag, B, X0, rtol, maxiter, tiny):
    """directions.pcg for the CSR matrix A = (indptr, indices, data) with the
    Jacobi preconditioner 1 / ``diag``, as kernels: the same iterates (dot
    products summed in float64) and stopping test."""
    xp = be.xp
    n, d = B.shape
    kernels = {name: be.kernel("cg.cu", name, B.dtype, {"CG_D": d}) for name in KERNELS}
    indptr, indices = (xp.ascontiguousarray(a, dtype=xp.int32) for a in (indptr, indices))
    data, diag, B = (xp.ascontiguousarray(a, dtype=B.dtype) for a in (data, diag, B))
    X = xp.array(X0, dtype=B.dtype, order="C")
    R, P, AP = (xp.empty_like(X) for _ in range(3))
    sums = xp.zeros((maxiter + 1, 4, d), dtype=xp.float64)
    grid, block = (-(-n // BLOCK),), (BLOCK,)
    reduction = (sums, xp.empty(grid[0] * 3 * d, dtype=xp.float64), xp.zeros(1, dtype=xp.uint32))
    n, rtol, tiny = np.int32(n), np.float64(rtol), np.float64(tiny)
    kernels["cg_start"](grid, block, (indptr, indices, data, diag, B, X, R, P, n, *reduction))
    for k in range(maxiter):
        # Steps launched past the converged one return at once.
        if k % CHECK_EVERY == 0 and converged(be.to_host(sums), k, rtol):
            break
        step = np.int32(k)
        kernels["cg_product"](grid, block, (indptr, indices, data, P, AP, n, step, rtol,
                                            *reduction))
        kernels["cg_update"](grid, block, (P, AP, diag, X, R, n, step, rtol, tiny, *reduction))
        kernels["cg_direction"](grid, block, (R, diag, P, n, step, rtol, tiny, sums))
    return X


def largest_per_row_gpu(be, indptr, data, kappa):
    """sparse_cpu.largest_per_row on the device: a boolean mask over the entries,
    each row's ``kappa`` largest values (all of a shorter row), among equal
    values the earlier stored ones."""
    xp = be.xp
    n = indptr.shape[0] - 1
    keep = xp.empty(data.shape[0], dtype=xp.bool_)
    kernel = be.kernel("graph.cu", "largest_per_row", data.dtype)
    kernel((-(-n // BLOCK),), (BLOCK,), (xp.ascontiguousarray(indptr, dtype=xp.int32),
                                         xp.ascontiguousarray(data), np.int32(kappa), keep,
                                         np.int32(n)))
    return keep


def connected_components_gpu(be, G):
    """(number of components, labels) of the symmetric sparse graph G, numbered as
    SciPy's connected_components numbers them (by each component's first point)."""
    xp = be.xp
    n = G.shape[0]
    indptr, indices = (xp.ascontiguousarray(a, dtype=xp.int32) for a in (G.indptr, G.indices))
    hook, compress = (be.kernel("graph.cu", name, G.dtype)
                      for name in ("hook_components", "compress_labels"))
    labels = xp.arange(n, dtype=xp.int32)
    changed = xp.zeros(1, dtype=xp.int32)
    grid, block, n = (-(-n // BLOCK),), (BLOCK,), np.int32(n)
    while True:
        changed.fill(0)
        hook(grid, block, (indptr, indices, labels, changed, n))
        compress(grid, block, (labels, n))
        if not int(changed[0]):
            break
    roots, labels = xp.unique(labels, return_inverse=True)
    return int(roots.size), labels.astype(xp.int32, copy=False)
