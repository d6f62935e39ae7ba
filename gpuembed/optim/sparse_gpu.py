"""The spectral direction's CG on the GPU (kernels/cg.cu), the twin of
sparse_cpu.jacobi_pcg; directions.pcg is the array-code reference of both.
And the refreshes' sparsification and connected components (kernels/graph.cu),
the twins of sparse_cpu.largest_per_row and SciPy's connected_components.

As array code (directions.pcg on CuPy) a CG step was about 19 CuPy calls and a
host read of the residual norms, and on an H100 SD's iterations on
Fashion-MNIST 70k took 13-66 ms against a 4 ms gradient (call-bound;
benchmarks/results/embedding_gpu.json).  The kernels run a step in three
launches and keep the CG's scalars on the device, so the host only reads them
every CHECK_EVERY steps to stop launching; from a system's second solve on, each
block of CHECK_EVERY steps is one CUDA graph launch (CGWorkspace).
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import GraphReplays

BLOCK = 256
CHECK_EVERY = 8
KERNELS = ("cg_start", "cg_product", "cg_update", "cg_direction")


def converged(sums, k, rtol):
    """The kernels' stopping test (cg.cu's cg_converged) on a host copy of sums."""
    return bool(np.all(np.sqrt(sums[k, 2]) <= rtol * np.sqrt(sums[0, 0])))


def jacobi_pcg_gpu(be, indptr, indices, data, diag, B, X0, rtol, maxiter, tiny):
    """directions.pcg for the CSR matrix A = (indptr, indices, data) with the
    Jacobi preconditioner 1 / ``diag``, as kernels: the same iterates (dot
    products summed in float64) and stopping test.  One solve; CGWorkspace keeps
    what the solves of one system share."""
    return CGWorkspace(be, indptr, indices, data, diag, B.shape[1], rtol, maxiter,
                       tiny).solve(B, X0)


class CGWorkspace:
    """The solves of one system (A, its diagonal, the column count, tolerance and
    step limit; SD makes a new one with each B): device buffers kept from solve
    to solve, and each block of CHECK_EVERY steps as a CUDA graph.  A block runs
    as launches at its first use (which loads the kernels), is captured at its
    second and replayed from then on (backend.GraphReplays): one host call
    where it made 3 x CHECK_EVERY launches, which bound SD's iterations on the
    H100 at 70,000 points (the CG's host time 1.2 ms per solve at ad1c5e5)."""

    def __init__(self, be, indptr, indices, data, diag, d, rtol, maxiter, tiny):
        xp, dtype = be.xp, data.dtype
        n = diag.shape[0]
        self.be, self.rtol, self.maxiter = be, rtol, maxiter
        self.kernels = {name: be.kernel("cg.cu", name, dtype, {"CG_D": d}) for name in KERNELS}
        # Kept here: a graph holds the pointers of what its launches took.
        self.system = (xp.ascontiguousarray(indptr, dtype=xp.int32),
                       xp.ascontiguousarray(indices, dtype=xp.int32),
                       xp.ascontiguousarray(data), xp.ascontiguousarray(diag, dtype=dtype))
        self.rhs, self.X, self.R, self.P, self.AP = (xp.empty((n, d), dtype=dtype)
                                                     for _ in range(5))
        self.sums = xp.zeros((maxiter + 1, 4, d), dtype=xp.float64)
        self.grid, self.block = (-(-n // BLOCK),), (BLOCK,)
        self.reduction = (self.sums, xp.empty(self.grid[0] * 3 * d, dtype=xp.float64),
                          xp.zeros(1, dtype=xp.uint32))
        self.scalars = (np.int32(n), np.float64(rtol), np.float64(tiny))
        self.graphs = GraphReplays(be, "the CG's steps")     # by a block's first step

    def solve(self, B, X0):
        """X with A X = B (each column to relative residual rtol, or maxiter steps),
        started from X0; B, X0 (n, d) in the system's dtype."""
        be = self.be
        indptr, indices, data, diag = self.system
        n, rtol, tiny = self.scalars
        self.rhs[...] = B
        self.X[...] = X0
        self.sums.fill(0)
        self.kernels["cg_start"](self.grid, self.block, (indptr, indices, data, diag, self.rhs,
                                                         self.X, self.R, self.P, n,
                                                         *self.reduction))
        for first in range(0, self.maxiter, CHECK_EVERY):
            # Steps launched past the converged one return at once.
            if converged(be.to_host(self.sums), first, self.rtol):
                break
            steps = range(first, min(self.maxiter, first + CHECK_EVERY))
            self.graphs.run(first, functools.partial(self._steps, steps))
        return self.X.copy()

    def _steps(self, steps):
        indptr, indices, data, diag = self.system
        n, rtol, tiny = self.scalars
        for k in steps:
            step = np.int32(k)
            self.kernels["cg_product"](self.grid, self.block, (indptr, indices, data, self.P,
                                                               self.AP, n, step, rtol,
                                                               *self.reduction))
            self.kernels["cg_update"](self.grid, self.block, (self.P, self.AP, diag, self.X,
                                                              self.R, n, step, rtol, tiny,
                                                              *self.reduction))
            self.kernels["cg_direction"](self.grid, self.block, (self.R, diag, self.P, n, step,
                                                                 rtol, tiny, self.sums))


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
