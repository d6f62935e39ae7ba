"""Compiled CPU twin of kernels/entropic.cu: Algorithm 1 row by row, rows in parallel.

The array code of rootfinding.solve (the reference, and the CuPy fallback) pays
for NumPy temporaries and per-iteration Python work: about 4 ns per distance per
evaluation.  Here numba compiles the kernel's per-row loop (the same steps,
bracket updates, bisection safeguards and evaluation count) and runs rows in
parallel over the cores, with each row's working set in L1.

exp() is the inner loop's cost: it comes from ``fastexp.negexp``, which LLVM
vectorizes (libm's exp it does not).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ..fastexp import negexp
from .rootfinding import MAX_EVALUATIONS, MAX_INNER, METHODS

# Of fastexp.py, whose functions this file's cached code holds (_generated.py).
FASTEXP_DIGEST = "0b1f32411deb462c"

_HALLEY, _EULER, _BISECTION = (METHODS.index(m) for m in ("halley", "euler", "bisection"))
_EPS = float(np.finfo(np.float64).eps)
ROWS_PER_TASK = 64                    # rows sharing one scratch allocation


# No fastmath: with reassociation the sums' order depended on the code's
# compilation path, and the affinities of a process that compiled _solve_rows
# differed in the last bits from those of one that loaded it from numba's cache
# (the same input, 20k Fashion-MNIST points: other P, another t-SNE stopping
# iteration).  Strict sums make the root finding about 1.5x slower (30k rows
# of 90: 29 ms against 18 ms), small beside the k-NN it follows.
@njit(cache=True)
def _entropy_terms(d, beta, w):
    """H, dH/dalpha, d2H/dalpha2 of one row (rootfinding.entropy_terms)."""
    negexp(beta, d, w)
    z = 0.0
    s1 = 0.0
    for j in range(d.size):
        z += w[j]
        s1 += w[j] * d[j]
    m1 = s1 / z
    s2 = 0.0
    s3 = 0.0
    for j in range(d.size):
        c = d[j] - m1
        s2 += w[j] * c * c
        s3 += w[j] * c * c * c
    dH = -beta * beta * s2 / z
    return beta * m1 + math.log(z), dH, 2.0 * dH + beta ** 3 * s3 / z


@njit(cache=True)
def _step(method, f, g, h2):
    newton = -f / g
    if method == _HALLEY:
        return -2.0 * f * g / (2.0 * g * g - f * h2)
    if method == _EULER:
        disc = g * g - 2.0 * h2 * f
        if disc < 0.0:
            return newton
        root = math.sqrt(disc)
        return -2.0 * f / (g + (root if g >= 0.0 else -root))
    return newton


@njit(cache=True)
def _solve_row(d, target, a, lo, hi, method, tol, w):
    """Algorithm 1 on one row; returns (alpha evaluated last, H there, evaluations)."""
    if not (lo < a < hi):
        a = 0.5 * (lo + hi)
    prev_f = math.inf
    inner = 0
    evals = 0
    a_eval = a
    H = 0.0
    while evals < MAX_EVALUATIONS:
        evals += 1
        a_eval = a
        H, dH, d2H = _entropy_terms(d, math.exp(a), w)
        f = H - target
        # Too high an entropy means beta is too small: the root lies right of a.
        if f > 0.0:
            lo = a
        if f < 0.0:
            hi = a
        if abs(f) <= tol or hi - lo <= 4.0 * _EPS * max(1.0, abs(a)):
            break
        mid = 0.5 * (lo + hi)
        if method == _BISECTION:
            a = mid
            continue
        nxt = a + _step(method, f, dH, d2H)
        bisect = (not math.isfinite(nxt) or nxt <= lo or nxt >= hi or inner >= MAX_INNER
                  or abs(f) > 0.5 * abs(prev_f))
        a = mid if bisect else nxt
        prev_f = math.inf if bisect else f
        inner = 0 if bisect else inner + 1
    return a_eval, H, evals


@njit(parallel=True, cache=True)
def _solve_rows(shifted, rows, log_k, alpha0, lo, hi, method, tol, alpha, entropy, n_eval):
    k = shifted.shape[1]
    m = rows.size
    for task in prange((m + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        w = np.empty(k)
        for i in range(task * ROWS_PER_TASK, min(m, (task + 1) * ROWS_PER_TASK)):
            alpha[i], entropy[i], n_eval[i] = _solve_row(
                shifted[rows[i]], log_k[i], alpha0[i], lo[i], hi[i], method, tol, w)


@njit(parallel=True, cache=True)
def row_extent(shifted):
    """rootfinding.row_extent for a float64 C-contiguous matrix."""
    n, k = shifted.shape
    spread = np.empty(n)
    gap = np.empty(n)
    for i in prange(n):
        top = 0.0
        low = math.inf
        for j in range(k):
            v = shifted[i, j]
            top = max(top, v)
            if v > 0.0:
                low = min(low, v)
        spread[i] = top
        gap[i] = low
    return spread, gap


def solve(shifted, rows, log_perplexity, alpha0, lo, hi, method="newton", tol=1e-10):
    """rootfinding.solve for ``shifted[rows]`` (float64, C-contiguous), compiled.

    ``log_perplexity``, ``alpha0``, ``lo``, ``hi`` are per selected row.
    Returns alpha, entropy and evaluations, as rootfinding.solve.
    """
    m = rows.size
    alpha, entropy = np.empty(m), np.empty(m)
    n_eval = np.empty(m, dtype=np.int64)
    f64 = (np.ascontiguousarray(v, dtype=np.float64) for v in (log_perplexity, alpha0, lo, hi))
    _solve_rows(np.ascontiguousarray(shifted, dtype=np.float64),
                np.ascontiguousarray(rows, dtype=np.int64), *f64, METHODS.index(method),
                float(tol), alpha, entropy, n_eval)
    return alpha, entropy, n_eval
