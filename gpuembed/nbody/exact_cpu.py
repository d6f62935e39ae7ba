"""Compiled CPU twin of kernels/nbody_exact.cu: exact kernel sums, targets in parallel.

The blocked NumPy code of exact.py (the reference) writes a block of distances
and a block of kernel values to memory and reads them back.  Here each target
sweeps the sources in one loop whose distance, kernel and sums stay in
registers, the coordinates separate scalars; so, like the CUDA kernel's
NBODY_DIM, the dimension is fixed at compile time: the loop is generated for
each (dimension, kernel code) and compiled by numba on first use (about 1 s),
its machine code cached on disk (gpuembed/_generated.py).
Kernel codes as in CUDA: 0 Gaussian, 1 Student-t, 2 the fused Student-t pass
giving both K and K^2 sums (t-SNE's normalization and forces in one sweep).
Unlike the CUDA kernel it also takes exact_sums' distance shifts and excluded
pairs (multi-scale SNE's finest scales).

The loop may fuse multiply-adds and reassociate the sums ("contract",
"reassoc"), so LLVM vectorizes it, each target's sums in partial sums over
vector lanes: t-SNE's Student-t pair 4.3x and the Gaussian 1.7x faster than
the strict loops before (see _compiled).  The order is fixed
by the machine code, and the code compiled in a process gives the same bits
as the same code loaded from numba's cache (tests/test_generated.py).  An
earlier form with two loops around the skipped source, compiled with all of
fastmath's flags, did not (f548cda), which kept reassociation out until this
one-loop form.  The Gaussian's exp is ``fastexp.expneg``, a polynomial
inlined into the loop where libm's exp would be a call per pair; with
reassociation it is within 2e-15 of exp (24 ulp near t = 708, fastexp.py).
"""
from __future__ import annotations

import functools

import numpy as np

from .._generated import compile_source


_TEMPLATE = """
def sums(XT, w, TT, skip, ts, ss, S, SX):
    n_s = XT.shape[1]
    for i in prange(TT.shape[1]):
{load}
        s = 0.0
        s2 = 0.0
{zero}
        cut = skip[i]
        for j in range(n_s):
            # The skipped source (the self pair, if any) at infinite distance, whose
            # kernels are 0: one loop, which LLVM vectorizes, where two were not.
            t = {distance}
            t = np.inf if j == cut else t
{kernel}
{store}
"""


def kernel_lines(code, dim, weight, coord, indent):
    """Source lines adding ``weight`` K(t) to s (and ``weight`` K(t)^2 to s2 for
    code 2) and the same times ``coord`` (a format string in {c}) to a{c} (b{c})."""
    pad = " " * indent
    scaled = lambda acc, k: "".join(f"{pad}{acc}{c} += {k} * {coord.format(c=c)}\n"
                                    for c in range(dim))
    if code == 2:
        body = ["k = 1.0 / (1.0 + t)", f"k2 = {weight} * k * k", f"k *= {weight}", "s += k",
                "s2 += k2"]
        return "".join(pad + line + "\n" for line in body) + scaled("a", "k") + scaled("b", "k2")
    kernel = f"{weight} * expneg(t)" if code == 0 else f"{weight} / (1.0 + t)"
    return f"{pad}k = {kernel}\n{pad}s += k\n" + scaled("a", "k")


def store_lines(code, dim, indent):
    """Source lines writing s, a{c} (and s2, b{c}) to S[:, i], SX[:, i]."""
    pad = " " * indent
    out = f"{pad}S[0, i] = s\n" + "".join(f"{pad}SX[0, i, {c}] = a{c}\n" for c in range(dim))
    if code == 2:
        out += f"{pad}S[1, i] = s2\n" + "".join(f"{pad}SX[1, i, {c}] = b{c}\n"
                                                for c in range(dim))
    return out


@functools.lru_cache(maxsize=None)
def _compiled(dim, code, target_shift, source_shift):
    """The target loop for ``dim`` coordinates and kernel ``code``, with or without
    the per-target and per-source shifts of the distance, compiled.

    With reassociation (module doc) LLVM vectorizes the sweep, sums and all:
    5,000 random 2-D points, the Student-t pair 5.4 ms against 23 ms without
    (14.9 ms with it around the skipped source in two loops), the Gaussian
    13 ms against 22 ms for its earlier two passes (kernel values stored,
    then added in 8 interleaved partial sums; a sweep into one accumulator
    without reassociation was 4x slower still)."""
    coords = range(dim)
    lines = lambda fmt, indent: "".join(" " * indent + fmt.format(c=c) + "\n" for c in coords)
    load = lines("y{c} = TT[{c}, i]", 8) + ("        m = ts[i]\n" if target_shift else "")
    distance = (" + ".join(f"(y{c} - XT[{c}, j]) ** 2" for c in coords)
                + " - m" * target_shift + " - ss[j]" * source_shift)
    source = _TEMPLATE.format(
        load=load, zero=lines("a{c} = 0.0", 8) + lines("b{c} = 0.0", 8), distance=distance,
        kernel=kernel_lines(code, dim, "w[j]", "XT[{c}, j]", 12).rstrip("\n"),
        store=store_lines(code, dim, 8).rstrip("\n"))
    return compile_source(source, "sums", parallel=True, fastmath={"contract", "reassoc"})


def exact_sums_cpu(X, code, Y=None, weights=None, target_shift=None, source_shift=None,
                   exclude=None):
    """(S, SX), each with a leading axis of 1 (codes 0, 1) or 2 (code 2: Student-t,
    then its square), over all pairs; the self pair is excluded when Y is None, and
    ``exclude[i]`` (a source index, or -1) for target i otherwise.  The shifts are
    subtracted from the squared distances as in exact.exact_sums; the Gaussian's
    exp assumes the shifted distances stay >= 0.  Computed and accumulated in
    float64 whatever X's dtype; returned in X's dtype."""
    XT = np.ascontiguousarray(X.T, dtype=np.float64)
    TT = XT if Y is None else np.ascontiguousarray(Y.T, dtype=np.float64)
    n_t = TT.shape[1]
    w = (np.ones(X.shape[0]) if weights is None
         else np.ascontiguousarray(weights, dtype=np.float64))
    if Y is None:
        skip = np.arange(n_t)
    elif exclude is None:
        skip = np.full(n_t, -1)
    else:
        skip = np.ascontiguousarray(exclude, dtype=np.int64)
    shift = lambda v: np.empty(0) if v is None else np.ascontiguousarray(v, dtype=np.float64)
    outs = 2 if code == 2 else 1
    S = np.empty((outs, n_t))
    SX = np.empty((outs, n_t, X.shape[1]))
    _compiled(X.shape[1], code, target_shift is not None, source_shift is not None)(
        XT, w, TT, skip, shift(target_shift), shift(source_shift), S, SX)
    return S.astype(X.dtype, copy=False), SX.astype(X.dtype, copy=False)
