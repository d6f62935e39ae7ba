"""Exact N-body kernel sums, blocked so memory stays bounded.

For targets y_n and sources x_m (with optional source weights w_m)

    S_n  = sum_m w_m K(|y_n - x_m|^2)        SX_n = sum_m w_m K(|y_n - x_m|^2) x_m

excluding m = n when the targets are the sources.  Blocks of B targets hold a
B x N matrix of kernel values (``block_bytes``: 1 MiB on the CPU, spread over
threads, and 512 MiB on the GPU; at least 64 rows), so memory stays bounded.  Written once
against ``xp``: the reference for the compiled kernels and the path for the
cases they do not cover (more than 16 dimensions; on the GPU, distance shifts
and excluded pairs for the Student-t kernels).  The common kernel sets run
compiled: on the GPU in the tiled RawKernel of kernels/nbody_exact.cu (one
thread per two targets, sources through shared memory, no N x B block; the
Gaussian with multi-scale SNE's shifts too), on the CPU in its numba twin
(exact_cpu.py).
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from .._sparse import gram, is_sparse, product, row_sqnorms
from .exact_cpu import exact_sums_cpu

KERNELS = ("gaussian", "student", "student2")
# Small CPU blocks stay in cache (4x faster than 4 MiB ones, measured at N = 1797)
# and give each core work; the GPU wants big ones.  At least MIN_ROWS rows per
# block bounds the Python overhead per block for large N.
DEFAULT_BLOCK_BYTES = {"cpu": 2**20, "gpu": 512 * 2**20}
MIN_ROWS = 64
# Rows that centred() estimates the spread from (its order of magnitude is enough).
SPREAD_SAMPLE = 1000
# Kernel sets the compiled kernels compute (NBODY_KERNEL codes in
# kernels/nbody_exact.cu, the same in exact_cpu.py); "student2" alone comes from
# the fused pass.
KERNEL_CODES = {("gaussian",): 0, ("student",): 1, ("student", "student2"): 2,
                ("student2",): 2}
MAX_COMPILED_DIM = 16          # CUDA: register arrays of NBODY_DIM floats per target
GPU_THREADS = 128
GPU_TARGETS_PER_THREAD = 2     # NBODY_TPT


def kernel_values(xp, kernel, t):
    """K(t) for t = squared distance (in place on t)."""
    if kernel == "gaussian":
        return xp.exp(xp.negative(t, out=t), out=t)
    t += 1.0
    if kernel == "student":
        return xp.reciprocal(t, out=t)
    if kernel == "student2":
        xp.reciprocal(t, out=t)
        return xp.multiply(t, t, out=t)
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def squared_distances(xp, Y, X, sq_y=None, sq_x=None, Xt=None, products=None):
    """(len(Y), len(X)) squared Euclidean distances by GEMM.

    Their absolute rounding error, ~eps (|y|^2 + |x|^2), is negligible against
    the unit width of the embedding kernels, so no coordinate-wise pass is needed;
    data far from the origin goes in :func:`centred`.
    Y and X may both be sparse (high-dimensional data in the metrics); ``Xt``:
    _sparse.transposed(X), for callers that pass the same X block after block;
    ``products``: a _sparse.BlockProducts that makes the product with Xt (the same
    bits on any number of threads).
    """
    sq_y = row_sqnorms(xp, Y) if sq_y is None else sq_y
    sq_x = row_sqnorms(xp, X) if sq_x is None else sq_x
    D = gram(Y, X) if Xt is None else (products or product)(Y, Xt)
    D *= -2.0
    D += sq_y[:, None]
    D += sq_x[None, :]
    return xp.maximum(D, 0.0, out=D)


def centred(xp, X):
    """X less its column means, in X's dtype (a copy; sparse X as it is): the same
    distances, but :func:`squared_distances` then rounds to the rows' spread, not
    to their distance from the origin.  Float32 digits moved 1e4 from the origin
    had an R_NX AUC of 0.06 uncentred (0.54 centred), and kernel PCA and Nystrom
    embeddings came out 0.5-0.9 off in Procrustes error."""
    if is_sparse(X):
        return X
    return X - centring_shift(xp, X).astype(X.dtype)


def centring_shift(xp, X):
    """X's column means (float64, dense X), rounded to multiples of the power of
    two at or below the rows' spread, so that data on a grid that fine stays on
    it, exactly: integer pixels stay integers, and their equal distances equal
    (the rank metrics break such ties by index)."""
    mean = X.mean(axis=0, dtype=xp.float64)
    sample = X[::max(1, X.shape[0] // SPREAD_SAMPLE)]
    spread = float(xp.sqrt(((sample - mean) ** 2).mean()))
    if spread > 0:
        step = 2.0 ** math.floor(math.log2(spread))
        mean = xp.round(mean / step) * step
    return mean


def coordinate_squared_distances(xp, Y, X):
    """:func:`squared_distances` coordinate by coordinate, accurate however far
    apart the points are: multi-scale SNE's fine scales put them 10^3 kernel
    widths apart, where GEMM's error gives 2e-11 relative error in the sums
    (precision 5e4).  Slower than GEMM on the CPU (4x at d = 2)."""
    D = xp.subtract(Y[:, :1], X[:, 0])
    D *= D
    for i in range(1, Y.shape[1]):
        diff = xp.subtract(Y[:, i:i + 1], X[:, i])
        D += diff * diff
    return D


def _blocks(be, n_rows, n_cols, itemsize, block_bytes, fn):
    """Run fn(start, stop) over row blocks: on numba's number of threads on the CPU
    (NumPy releases the GIL in its loops; numba.set_num_threads bounds these as it
    does the compiled loops, where os.cpu_count() had not), in order on the GPU."""
    if block_bytes is None:
        block_bytes = DEFAULT_BLOCK_BYTES[be.name]
    rows = max(min(MIN_ROWS, n_rows), min(n_rows, block_bytes // max(1, n_cols * itemsize)))
    spans = [(a, min(n_rows, a + rows)) for a in range(0, n_rows, rows)]
    threads = 1 if be.is_gpu else numba.get_num_threads()
    if len(spans) == 1 or threads == 1:
        for a, b in spans:
            fn(a, b)
        return
    with ThreadPoolExecutor(max_workers=min(threads, len(spans))) as pool:
        list(pool.map(lambda span: fn(*span), spans))


def compiled_results(kernels, S, SX):
    """[(S, SX) for each kernel] from a compiled code's stacked outputs (code 2
    gives "student" then "student2"; "student2" alone keeps the second)."""
    results = list(zip(S, SX))
    return results[1:] if kernels == ("student2",) else results


def exact_sums(be, X, kernels, Y=None, weights=None, block_bytes=None, target_shift=None,
               source_shift=None, exclude=None):
    """[(S, SX) for each kernel in ``kernels``] over all pairs, in one pass.

    ``Y`` (targets) defaults to ``X`` with the self-pair excluded.  "student2"
    is derived from "student" when both are asked for (t-SNE's fused Z and
    forces).  ``target_shift`` / ``source_shift`` are subtracted from the squared
    distances first (per target row / per source column): exp(-(t - shift)) keeps
    Gaussian sums from underflowing when the shift is a nearest-neighbour distance.
    ``exclude`` (with ``Y``): per target, the source index of its self pair, or -1
    (targets and sources drawn from one point set).
    """
    kernels = tuple(kernels)
    plain = target_shift is None and source_shift is None and exclude is None
    if (kernels in KERNEL_CODES and X.shape[1] <= MAX_COMPILED_DIM
            and (plain or not be.is_gpu or kernels == ("gaussian",))):
        # The CUDA kernel takes shifts and exclusions for the Gaussian alone, the
        # compiled CPU loop for every kernel.
        code = KERNEL_CODES[kernels]
        if be.is_gpu:
            S, SX = _exact_gpu(be, X, code, Y, weights, target_shift, source_shift, exclude)
        else:
            S, SX = exact_sums_cpu(X, code, Y, weights, target_shift, source_shift, exclude)
        return compiled_results(kernels, S, SX)
    return blocked_sums(be, X, kernels, Y, weights, block_bytes, target_shift, source_shift,
                        exclude)


def blocked_sums(be, X, kernels, Y=None, weights=None, block_bytes=None, target_shift=None,
                 source_shift=None, exclude=None):
    """:func:`exact_sums` by blocks of NumPy/CuPy array code (the reference)."""
    xp = be.xp
    targets = X if Y is None else Y
    n_t, n_s = targets.shape[0], X.shape[0]
    sq_x = (X * X).sum(axis=1)
    sq_t = sq_x if Y is None else (targets * targets).sum(axis=1)
    out = [(xp.empty(n_t, dtype=X.dtype), xp.empty_like(targets)) for _ in kernels]
    derived = [k == "student2" and "student" in kernels[:i] for i, k in enumerate(kernels)]
    needs_raw = [any(not d for d in derived[i + 1:]) for i in range(len(kernels))]
    # Shifted sums are the fine scales' (multi-scale SNE), with points far apart.
    shifted = (target_shift is not None or source_shift is not None) and X.shape[1] <= 3

    def block(start, stop):
        D = (coordinate_squared_distances(xp, targets[start:stop], X) if shifted else
             squared_distances(xp, targets[start:stop], X, sq_t[start:stop], sq_x))
        if target_shift is not None:
            D -= target_shift[start:stop, None]
        if source_shift is not None:
            D -= source_shift[None, :]
        # Self pairs: an infinite distance gives K = 0 for every kernel.
        if Y is None:
            own = xp.arange(start, stop)
            D[own - start, own] = xp.inf
        elif exclude is not None:
            rows = xp.flatnonzero(exclude[start:stop] >= 0)
            D[rows, exclude[start:stop][rows]] = xp.inf
        values = {}
        for i, kernel in enumerate(kernels):
            if derived[i]:
                K = values["student"] * values["student"]
            else:
                # Kernels work in place on D: copy it only while a later one needs it.
                K = kernel_values(xp, kernel, D.copy() if needs_raw[i] else D)
            values[kernel] = K
        for (S, SX), kernel in zip(out, kernels):
            K = values[kernel]
            if weights is not None:
                K = K * weights[None, :]
            S[start:stop] = K.sum(axis=1)
            SX[start:stop] = K @ X

    _blocks(be, n_t, n_s, X.dtype.itemsize, block_bytes, block)
    return out


def _exact_gpu(be, X, code, Y, weights, target_shift=None, source_shift=None, exclude=None):
    """S (outs, N_t) and SX (outs, N_t, d) by the tiled RawKernel of kernels/nbody_exact.cu;
    with shifts or exclusions (Gaussian only) its NBODY_SHIFTED variant."""
    xp = be.xp
    targets = xp.ascontiguousarray(X if Y is None else Y)
    X = xp.ascontiguousarray(X)
    (n_s, d), n_t = X.shape, targets.shape[0]
    outs = 2 if code == 2 else 1
    S = xp.empty((outs, n_t), dtype=X.dtype)
    SX = xp.empty((outs, n_t, d), dtype=X.dtype)
    w = xp.ones(n_s, dtype=X.dtype) if weights is None else xp.ascontiguousarray(
        weights, dtype=X.dtype)
    shifted = not (target_shift is None and source_shift is None and exclude is None)
    shifts = ()
    if shifted:
        def per(values, n):
            return (xp.zeros(n, dtype=X.dtype) if values is None
                    else xp.ascontiguousarray(values, dtype=X.dtype))
        if exclude is None:
            exclude = xp.arange(n_t) if Y is None else xp.full(n_t, -1)
        shifts = (per(target_shift, n_t), per(source_shift, n_s),
                  xp.ascontiguousarray(exclude, dtype=xp.int64))
    fn = be.kernel("nbody_exact.cu", "nbody_exact", X.dtype,
                   defines={"NBODY_DIM": d, "NBODY_KERNEL": code,
                            "NBODY_SHIFTED": int(shifted)})
    per_block = GPU_THREADS * GPU_TARGETS_PER_THREAD
    fn(((n_t + per_block - 1) // per_block,), (GPU_THREADS,),
       (X, w, targets, np.int64(n_s), np.int64(n_t), np.int32(Y is None and not shifted),
        *shifts, S, SX),
       shared_mem=GPU_THREADS * (d + 1 + shifted) * X.dtype.itemsize)
    return S, SX


def xx_terms(be, X, coef_fn, V=None, block_bytes=None):
    """Products with the block-diagonal Laplacians L^xx_ii of seed 002 (SD-, DiagH).

    With pair weights ``c_nm (x_in - x_im)^2``, ``c = coef_fn(D)`` computed from a
    block of squared distances ``D`` (self pairs at D = inf), returns
    ``out[n, i] = sum_m c_nm (x_in - x_im)^2 (V_in - V_im)``, or the diagonal
    ``sum_m c_nm (x_in - x_im)^2`` when V is None.  Blocked like :func:`exact_sums`.
    """
    xp = be.xp
    n, d = X.shape
    sq = (X * X).sum(axis=1)
    out = xp.empty_like(X)

    def block(start, stop):
        D = squared_distances(xp, X[start:stop], X, sq[start:stop], sq)
        own = xp.arange(start, stop)
        D[own - start, own] = xp.inf
        C = coef_fn(D)
        for i in range(d):
            diff = X[start:stop, i, None] - X[None, :, i]
            W = C * diff * diff
            if V is None:
                out[start:stop, i] = W.sum(axis=1)
            else:
                out[start:stop, i] = W.sum(axis=1) * V[start:stop, i] - W @ V[:, i]

    _blocks(be, n, n, 2 * X.dtype.itemsize, block_bytes, block)
    return out
