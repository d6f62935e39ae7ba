"""Per-row root finding of the entropy equation H(log beta) = log K, all rows at once.

Source: ../shared/papers/003_e1371111a5435f8e.txt (Theorem 1.1, Algorithm 1) and
chapter 2.3 of 000_7551f45b306cd904.txt (log-beta derivatives, section 2.3.1).

For one row with squared distances d_1..d_k and alpha = log beta,

    p_j = exp(-beta d_j) / Z,        Z = sum_j exp(-beta d_j)
    H   = beta m1 + log Z            (m1 = sum_j p_j d_j)
    dH/dalpha   = -beta^2 var        (var = sum_j p_j (d_j - m1)^2)
    d2H/dalpha2 = -2 beta^2 var + beta^3 mu3   (mu3 = sum_j p_j (d_j - m1)^3)

which are the dissertation's e^{2a}(m1^2 - m2) and 2e^{2a}(m1^2 - m2) +
e^{3a}(m3 - 3 m1 m2 + 2 m1^3) written with central moments (no cancellation).
Distances are shifted by the row minimum before exponentiating, so Z >= 1 and
no underflow can create a false root.

Everything here is written against ``xp`` (numpy or cupy): rows are processed
together with convergence masks, never in a Python loop over rows.
"""
from __future__ import annotations

import math

import numpy as np

METHODS = ("newton", "halley", "euler", "bisection")
MAX_INNER = 20          # derivative steps before a forced bisection (dissertation: maxit = 20)
MAX_EVALUATIONS = 200   # hard cap; bisection alone needs ~60 from the theorem's bracket


def entropy_terms(xp, shifted, alpha, second=True):
    """H, dH/dalpha and (if ``second``) d2H/dalpha2 for rows of shifted distances."""
    beta = xp.exp(alpha)
    w = shifted * (-beta)[:, None]
    xp.exp(w, out=w)
    Z = w.sum(axis=1)
    m1 = xp.einsum("ij,ij->i", w, shifted) / Z
    c = shifted - m1[:, None]
    w *= c                                           # w c
    var = xp.einsum("ij,ij->i", w, c) / Z
    H = beta * m1 + xp.log(Z)
    dH = -beta * beta * var
    if not second:
        return H, dH, None
    w *= c                                           # w c^2
    mu3 = xp.einsum("ij,ij->i", w, c) / Z
    return H, dH, 2.0 * dH + beta ** 3 * mu3


def perplexity_p1(n, perplexity):
    """Solve eq. (9) of Theorem 1.1 for p1 in [3/4, 1), vectorized over ``perplexity``.

    With u = 2 (1 - p1), (9) reads g(u) = u log(n / u) = c, c = log(min(sqrt(2n), K)),
    for u in (0, 1/2]; g is increasing and concave there, so Newton from the left
    converges monotonically.
    """
    K = np.asarray(perplexity, dtype=np.float64)
    c = np.log(np.minimum(np.sqrt(2.0 * n), K))
    # A starting point left of the root: g(u) <= u (log n - log u) and u tiny.
    u = np.minimum(0.5, c / (2.0 * np.log(n) + 10.0))
    u = np.maximum(u, 1e-300)
    for _ in range(100):
        g = u * np.log(n / u) - c
        step = g / (np.log(n / u) - 1.0)
        u_new = np.clip(u - step, 1e-300, 0.5)
        if np.all(np.abs(u_new - u) <= 1e-15 * u_new):
            u = u_new
            break
        u = u_new
    return 1.0 - u / 2.0


def log_beta_bounds(xp, shifted, perplexity):
    """Bracket [log beta_L, log beta_U] of Theorem 1.1 (eqs 7-9) for each row
    (``perplexity``: a number or a host array, one value per row).

    Uses the sparse form of the theorem (N = k neighbours, sorted or not) on the
    row-shifted distances, for which d_1 = 0; the root is shift-invariant.
    Rows with all distances equal have no finite bracket (returned as +-inf).
    """
    n = shifted.shape[1]
    K = common_value(perplexity)
    p1 = perplexity_p1(n, K)
    if K.ndim:                   # one value per row: per-row terms on the device
        K, p1 = xp.asarray(K, dtype=shifted.dtype), xp.asarray(p1)
        log_ratio, log_odds = xp.log(n / K), xp.log(p1 / (1.0 - p1) * (n - 1))
    else:
        log_ratio, log_odds = math.log(n / K), math.log(p1 / (1.0 - p1) * (n - 1))
    spread, gap = row_extent(xp, shifted)
    with np.errstate(divide="ignore", invalid="ignore"):
        beta_l = xp.maximum(n * log_ratio / ((n - 1) * spread), log_ratio ** 0.5 / spread)
        return xp.log(beta_l), xp.log(log_odds / gap)


def common_value(perplexity):
    """A host perplexity array whose entries are all equal as a 0-d array, else the
    array: p1's Newton solve over 1e6 equal values cost 0.16 s, the GPU's whole
    root finding a tenth of that."""
    K = np.asarray(perplexity, dtype=np.float64)
    if K.ndim and K.size and (K == K.flat[0]).all():
        return np.asarray(K.flat[0])
    return K


def row_extent(xp, shifted):
    """Largest and smallest positive entry of each row (Delta_N^2 and Delta_2^2 of
    the theorem for row-shifted distances; +inf where a row has no positive entry)."""
    if xp is np:
        from .rootfinding_cpu import row_extent as compiled   # one pass, no temporaries
        return compiled(np.ascontiguousarray(shifted, dtype=np.float64))
    return shifted.max(axis=1), xp.where(shifted > 0, shifted, xp.inf).min(axis=1)


def solve(xp, shifted, log_perplexity, alpha0, lo, hi, method="newton", tol=1e-10):
    """Algorithm 1 for every row: derivative steps safeguarded by bisection.

    Parameters
    ----------
    shifted : (n, k) row-shifted squared distances (row minimum 0).
    log_perplexity : (n,) targets log K.
    alpha0 : (n,) starting log beta (moved to the bracket midpoint if outside).
    lo, hi : (n,) bracket in log beta containing the root (updated in place).
    method : "newton" | "halley" | "euler" | "bisection".

    A bisection step replaces the derivative step when the step leaves the
    current bracket, is not finite, ``MAX_INNER`` derivative steps ran in a row,
    or the last derivative step did not at least halve |H - log K| (this stops
    Newton bouncing across the entropy's inflection point).

    Returns alpha (n,), entropy at alpha (n,), evaluations (n,).
    """
    n = shifted.shape[0]
    alpha = xp.where((alpha0 > lo) & (alpha0 < hi), alpha0, 0.5 * (lo + hi))
    entropy = xp.empty(n, dtype=shifted.dtype)
    n_eval = xp.zeros(n, dtype=xp.int64)
    second = method in ("halley", "euler")

    active = xp.arange(n)
    a, s, target = alpha, shifted, log_perplexity
    l, h = lo, hi
    prev_f = xp.full(n, xp.inf, dtype=shifted.dtype)
    inner = xp.zeros(n, dtype=xp.int64)
    for _ in range(MAX_EVALUATIONS):
        H, dH, d2H = entropy_terms(xp, s, a, second)
        f = H - target
        n_eval[active] += 1
        # Too high an entropy means beta is too small: the root lies right of a.
        l = xp.where(f > 0, a, l)
        h = xp.where(f < 0, a, h)
        resolution = 4 * np.finfo(a.dtype).eps * xp.maximum(1.0, xp.abs(a))
        done = (xp.abs(f) <= tol) | (h - l <= resolution)
        alpha[active], entropy[active], lo[active], hi[active] = a, H, l, h
        keep = ~done
        if not bool(keep.any()):
            break
        active, a, s, target, l, h, f, dH = (v[keep] for v in (active, a, s, target, l, h, f, dH))
        prev_f, inner = prev_f[keep], inner[keep]
        d2H = d2H[keep] if second else None

        mid = 0.5 * (l + h)
        if method == "bisection":
            a = mid
            continue
        step = _step(xp, method, f, dH, d2H)
        new = a + step
        bisect = (~xp.isfinite(new) | (new <= l) | (new >= h) | (inner >= MAX_INNER)
                  | (xp.abs(f) > 0.5 * xp.abs(prev_f)))
        a = xp.where(bisect, mid, new)
        # After a bisection the next point gets a fresh derivative step: compare
        # against +inf rather than the pre-bisection residual.
        prev_f = xp.where(bisect, xp.inf, f)
        inner = xp.where(bisect, 0, inner + 1)
    return alpha, entropy, n_eval


def _step(xp, method, f, g, h2):
    """Step in log beta from F, F' and F'' (Newton; Halley; Euler's smaller parabola root)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        newton = -f / g
        if method == "newton":
            return newton
        if method == "halley":
            return -2.0 * f * g / (2.0 * g * g - f * h2)
        # Euler: F + g p + h2 p^2 / 2 = 0; the root nearer 0 is -2F / (g + sign(g) sqrt(disc)).
        disc = g * g - 2.0 * h2 * f
        root = xp.sqrt(xp.maximum(disc, 0.0))
        euler = -2.0 * f / (g + xp.where(g >= 0, root, -root))
        return xp.where(disc >= 0, euler, newton)


KERNEL_MAX_K = 1024     # beyond this the per-lane register arrays would spill


def solve_kernel(be, shifted, rows, log_perplexity, alpha0, lo, hi, method="newton", tol=1e-10):
    """GPU version of :func:`solve` for ``shifted[rows]`` (kernels/entropic.cu).

    One warp per row with the row's distances in registers; the same steps,
    safeguards and evaluation count as :func:`solve`, its reference.
    Returns alpha, entropy and evaluations.
    """
    xp = be.xp
    m, k = rows.size, shifted.shape[1]
    kernel = be.kernel("entropic.cu", "entropic_solve", shifted.dtype,
                       defines={"EA_PER_LANE": max(1, -(-k // 32))})
    f64 = xp.float64
    alpha, entropy = xp.empty(m, dtype=f64), xp.empty(m, dtype=f64)
    n_eval = xp.empty(m, dtype=xp.int64)
    threads = 128
    blocks = (m * 32 + threads - 1) // threads
    args = (xp.ascontiguousarray(shifted), np.int64(k), xp.ascontiguousarray(rows, dtype=xp.int64),
            np.int64(m),
            *(xp.ascontiguousarray(v, dtype=f64) for v in (alpha0, lo, hi, log_perplexity)),
            np.int32(METHODS.index(method)), np.float64(tol), np.int32(MAX_INNER),
            np.int32(MAX_EVALUATIONS), alpha, entropy, n_eval)
    kernel((blocks,), (threads,), args)
    return alpha, entropy, n_eval
