"""exp of negative arguments, and log, for numba-compiled CPU loops, in forms LLVM vectorizes.

LLVM does not vectorize calls to libm's exp, so loops dominated by it run at
~4 ns per element.  ``expneg`` (one scalar, inlined into loops that LLVM
vectorizes: the Gaussian N-body sums, multi-scale SNE's sweeps) computes 2^n
p(r): range reduction with a split ln 2, a degree-12 polynomial p, and 2^n
built from its bits (``_as_int`` / ``_as_float`` below).  Compiled without
reassociation it is within 2 ulp of NumPy's exp (tests); with it (the FGT's
loops, multi-scale SNE's edge sweep) LLVM merges the split ln 2, which leaves
a relative error of 2e-15 for t < 40 and 2.4e-14 near t = 708.  ``negexp``
(arrays; the entropic root finding) is its loop.  Per element on one core:
0.72 ns with reassociation, 0.77 ns without, where the form before, exp(-t) =
q(-t / 1024)^1024 with a Taylor polynomial q, took 0.91 ns with a relative
error of 1e-13 for t < 40 and 5e-8 near 708; ``negexp`` 0.78 ns, 1.2 ns in
three passes over a scratch array of bits.

``logpos`` (one scalar; t-SNE's attractive sum p log(1 + d^2)) reads and writes
a double's bits through LLVM bitcasts (``_as_int`` / ``_as_float``), which
vectorize: y = 2^e m with m in [sqrt(2)/2, sqrt(2)), log m = 2 atanh(s) with
s = (m - 1) / (m + 1) by its odd series to s^19.  0.5 ns per element against
7 ns for libm's log1p (2 cores), within 1e-15 absolute of NumPy's log.
"""
from __future__ import annotations

import math

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

_LOG2E = 1.4426950408889634
_LN2_HI = 0.6931471803691238          # ln 2 split so n * _LN2_HI is exact for |n| < 2^21
_LN2_LO = 1.9082149292705877e-10
_ROUND = 6755399441055744.0           # 1.5 * 2^52: x + _ROUND holds round(x) in its low bits
_ROUND_BITS = 0x4338000000000000      # the bit pattern of _ROUND
_EXP_MIN = -708.0                     # exp(-708) is still a normal double


@intrinsic
def _as_int(typingctx, x):
    """The bits of a float64 as an int64."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return types.int64(types.float64), codegen


@intrinsic
def _as_float(typingctx, x):
    """The float64 with the bits of an int64."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


@njit(inline="always")
def expneg(t):
    """exp(-t) for one t >= 0, and 0 beyond t = 708 (a constant exp(-708) there
    once gave far pairs of multi-scale SNE a spurious pull): 2^n p(r), see the
    module doc.  Inlined, it compiles with its caller's fastmath flags."""
    return _exp_clamped(max(-t, _EXP_MIN)) if t <= -_EXP_MIN else 0.0


@njit(inline="always")
def _exp_clamped(v):
    """exp(v) for v in [-708, 0]."""
    # floor, not the rounding constant's add and subtract, which reassociation
    # folds away (n = v log2(e), r = 0: relative errors up to 0.41).
    n = math.floor(v * _LOG2E + 0.5)
    r = (v - n * _LN2_HI) - n * _LN2_LO              # |r| <= ln(2) / 2
    # The last coefficient a product, not a division: without reassociation a
    # division per element made the loop 15% slower.
    p = 1.0 + r * (1.0 + r * (1 / 2 + r * (1 / 6 + r * (1 / 24 + r * (
        1 / 120 + r * (1 / 720 + r * (1 / 5040 + r * (1 / 40320 + r * (
            1 / 362880 + r * (1 / 3628800 + r * (1 / 39916800 + r * (1 / 479001600))))))))))))
    return p * _as_float((_as_int(n + _ROUND) - _ROUND_BITS + 1023) << 52)   # p 2^n


@njit(fastmath={"contract"}, cache=True)
def negexp(beta, d, out):
    """out = exp(max(-beta d, -708)) for d >= 0 (the clamp keeps exp(-708), a
    normal double, where ``expneg`` gives 0)."""
    for j in range(d.size):
        out[j] = _exp_clamped(max(-beta * d[j], _EXP_MIN))


_LN2 = math.log(2.0)
_HALF_SQRT2_BITS = 0x3FE6A09E667F3BCD     # the bits of sqrt(2) / 2


@njit(inline="always", fastmath=True)
def logpos(y):
    """log(y) for one positive normal y."""
    bits = _as_int(y)
    e = (bits - _HALF_SQRT2_BITS) >> 52             # y / 2^e lands in [sqrt(2)/2, sqrt(2))
    m = _as_float(bits - (e << 52))
    s = (m - 1.0) / (m + 1.0)
    z = s * s
    return e * _LN2 + 2.0 * s * (1.0 + z * (1 / 3 + z * (1 / 5 + z * (1 / 7 + z * (1 / 9 + z * (
        1 / 11 + z * (1 / 13 + z * (1 / 15 + z * (1 / 17 + z / 19)))))))))
