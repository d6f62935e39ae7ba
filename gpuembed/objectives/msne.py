"""Multi-scale SNE objective (../shared/papers/004_13864de36f3612a6.txt, sections 2.3,
2.9-2.11, eqs 2.3-2.7 and 2.10-2.11).

High-dimensional similarities sigma_ij are the average over the active scales of
the conditional entropic affinities (sparse, on the k-NN pattern); the
low-dimensional ones are s_ij = mean_h s_hij with
s_hij = exp(-p_h d_ij / 2) / Z_hi, Z_hi = sum_{k != i} exp(-p_h d_ik / 2), one
precision p_h per scale.  Costs: "kl" = sum_i KL(sigma_i || s_i) (eq. 2.3) and
"js" = the type-2 mixture of eq. 2.7, 1/(kappa (1 - kappa)) sum_i
[kappa KL(sigma_i || z_i) + (1 - kappa) KL(s_i || z_i)], z = kappa sigma + (1 - kappa) s.

With a_ij = dE/ds_ij, dE/dd_ik = (1/H) sum_h (-p_h / 2) s_hik (a_ik - sum_j a_ij s_hij).
For both costs a_ij is a constant off the sparse pattern (0 for KL, log(1/(1-kappa))
/ kappa for JS), so the gradient splits into a sparse attractive part and, per
scale, Gaussian N-body sums at width p_h: O(nnz H) plus 2 H engine passes.  With the
exact engine all of it is one compiled sweep on the CPU (msne_cpu.fused_exact) and
three CUDA launches on the GPU (msne_gpu.py, kernels/msne.cu).

Each row's kernels are shifted by its nearest-neighbour distance (exp(-(t - m))),
so the finest scales cannot underflow.  The exact engine takes the shift
directly; the FGT and Barnes-Hut sum unshifted kernels and rescale, which is
safe while m <= ISOLATED; rows (and, for the column sums, sources) beyond it
are summed exactly with their shift: on the GPU against every point (the
tiled CUDA kernel's shifted variant, kernels/nbody_exact.cu), on the CPU
over the points within their balls, where the shifted kernel exceeds e^-TAIL
(class _Balls, a k-d tree; the finest scale isolates most rows, whose
kernels reach only a few neighbours).
"""
from __future__ import annotations

import math

import numpy as np
from numba import get_num_threads

from ..affinities.multiscale import mean_on_pattern
from ..nbody import engine_sums, exact_sums
from ..nbody.exact import MAX_COMPILED_DIM
from ..neighbors import knn, knn_query
from . import msne_gpu
from .base import Objective
from .msne_cpu import ball_pairs, edge_terms, fused_exact, squaring_plan

COSTS = ("kl", "js")
# Shift (in kernel units) beyond which a row's sums go to the exact engine: e^m
# would amplify the fast engines' absolute error past their relative accuracy.
ISOLATED = 2.0
# nbody="auto" takes the exact engine below this N on the CPU: there one compiled
# sweep (fused_exact) evaluates every kernel once for all scales, edge terms
# included, so it beats the FGT path (2 H sums plus the edge sweep) to a larger N
# than one Gaussian sum does: with the default's 9 scales on Fashion-MNIST 5k,
# 0.21 s against 0.24 s per evaluation (msne_scaling.json's 6 scales cross near
# 4,000: 0.14 s against 0.11 s at 5,000, 0.54 s against 0.20 s at 10,000).
EXACT_BELOW = {"cpu": 6_000}
# An isolated row's shifted kernels are summed over the points with
# t - m < TAIL + log N: those beyond add less than e^-TAIL = 9e-17 of its largest
# term, 1.
TAIL = 37.0


def ld_precisions(perplexities, X, U=1.0):
    """LD precisions p_h (Lee et al. 2015, as summarized by the thesis' section 2.9):
    proportional to K_h^(-2U/P), the largest scale at 2^(1 + 2/P) / mean variance
    of the current embedding's coordinates."""
    K = np.asarray(perplexities, dtype=np.float64)
    P = X.shape[1]
    variance = float(np.mean(np.var(np.asarray(X, dtype=np.float64), axis=0, ddof=1)))
    growth = K ** (2.0 * U / P)
    return 2.0 ** (1.0 + 2.0 / P) * growth.max() / (growth * max(variance, 1e-300))


def intrinsic_exponent(beta, n_components):
    """U in [1, 2] of Lee et al. 2015 from the HD precisions beta (N, H), scales
    increasing: D_h = (2 / N) sum_i 1 / (log2 tau_{h+1,i} - log2 tau_{h,i}) with
    tau = 1 / beta, an intrinsic-dimension estimate per pair of scales."""
    log_tau = -np.log2(np.asarray(beta, dtype=np.float64))
    # A row of duplicates has beta = inf at its small scales (inf - inf there):
    # such pairs of scales, like a flat one (diff 0), add nothing to the estimate.
    with np.errstate(invalid="ignore"):
        diff = np.diff(log_tau, axis=1)
    safe = np.where(np.isfinite(diff) & (diff != 0), diff, np.inf)
    D = 2.0 * (1.0 / safe).sum(axis=0) / beta.shape[0]
    return float(min(2.0, max(1.0, D.max() / n_components))) if D.size else 1.0


def js_value(on_pattern, rest, kappa):
    """JS cost from its pattern part and the mass ``rest`` of s off the pattern,
    where sigma = 0 and each unit of s costs (1 - kappa) log(1 / (1 - kappa))."""
    k = kappa
    return (on_pattern + (1.0 - k) * math.log(1.0 / (1.0 - k)) * rest) / (k * (1.0 - k))


def pattern_terms(xp, sigma, s_raw, cost, kappa):
    """On the pattern's entries, in array code: (cost terms, r, s floored at the
    smallest normal float).  KL's terms are -sigma log s (the cost less the
    constant sum sigma log sigma), JS's kappa sigma log(sigma / z) + (1 - kappa)
    s log(s / z), z = kappa sigma + (1 - kappa) s, before js_value.  r = c0 - dE/ds,
    c0 being dE/ds off the pattern (KL: r = sigma / s; JS: r = -(log(s / z)
    - log(1 / (1 - kappa))) / kappa), as msne_cpu._edge_cost."""
    # Floored: an HD neighbour that every LD scale has pushed out of reach (exp
    # underflow) costs ~700 nats instead of an infinite objective, and pulls no
    # more (the floored cost is flat: r = 0 there).
    tiny = np.finfo(np.float64).tiny
    s = xp.maximum(s_raw, tiny)
    if cost == "kl":
        terms, r = -sigma * xp.log(s), sigma / s
    else:
        k = kappa
        z = k * sigma + (1.0 - k) * s
        terms = (k * sigma * xp.log(xp.where(sigma > 0, sigma, 1.0) / z)
                 + (1.0 - k) * s * xp.log(s / z))
        r = -(xp.log(s / z) - math.log(1.0 / (1.0 - k))) / k
    return terms, xp.where(s_raw < tiny, 0.0, r), s


class MultiscaleObjective(Objective):
    name = "msne"
    kernel = "gaussian"
    divergence = True

    def __init__(self, sigmas, backend, dtype, precisions, cost="kl", kappa=0.5,
                 nbody="exact"):
        """sigmas: per-scale conditional HD affinities (CSR, one pattern, as
        multiscale_affinities makes them);
        precisions: the LD p_h of the same scales."""
        if cost not in COSTS:
            raise ValueError(f"cost must be one of {COSTS}, got {cost!r}")
        if not 0.0 < kappa < 1.0:
            raise ValueError(f"kappa must be in (0, 1), got {kappa}")
        super().__init__(mean_on_pattern(backend, sigmas), backend, dtype, nbody, owned=True)
        self.p = np.asarray(precisions, dtype=np.float64)
        self.cost, self.kappa = cost, float(kappa)
        # The compiled sweeps (msne_cpu.py; with the exact engine, msne_gpu.py's
        # kernels on the GPU); False: array code, the reference.
        self.compiled = True

    def attractive_weights(self, X=None):
        """W+ of KL's attractive curvature 4 L+ at X = 0, whatever X: there every
        s_hij is 1 / (N - 1) and -sigma_ij log s_ij has the weight
        sigma_ij mean_h(p_h) / 2, symmetrized.  Elsewhere the weight,
        sigma_ij sum_h (p_h / 2) s_hij / sum_h s_hij, moves with the layout either
        way (a near pair's finest scale dominates, a far pair's coarsest), so this
        is a scale, not a bound (for JS too, whose curvature in s equals KL's
        where s = sigma)."""
        W = self.pairs.weights(self.pairs.p * (0.5 * float(self.p.mean())))
        return 0.5 * (W + W.T)

    def _scales(self, X, balls=None):
        """Per scale: (p_h, Z_h, SX_h, shift m_h).

        Kernels are shifted by each row's nearest-neighbour distance m_i (as the
        entropic affinities shift by the row minimum): Z_hi >= 1, so nothing
        underflows at the small scales' large precisions.  s_hij is unchanged."""
        nearest = _nearest_sqdist(X, self.be) if balls is None else balls.nearest_sqdist()
        out = []
        for p in self.p:
            c = math.sqrt(p / 2.0)
            m = 0.5 * p * nearest
            Z, SXs = self._row_sums(X * c, m, c, balls)
            out.append((p, Z, SXs / c, m))
        return out

    def _row_sums(self, Xs, m, c=None, balls=None):
        """sum_k exp(-(t_ik - m_i)) (1, x_k): each row in its own shifted units
        (``balls``: the CPU's sums of isolated rows, Xs = c X)."""
        return shifted_row_sums(self.be, self.nbody, self.accuracy, Xs, m, c, balls)

    def _column_sums(self, Xs, m, w, c=None, balls=None):
        """sum_k exp(-(t_ik - m_k)) w_k (1, x_k): each source in its own shifted units."""
        if self.nbody == "exact":
            return self.sums(Xs, ("gaussian",), weights=w, source_shift=m)[0]
        xp = self.be.xp
        far = m > ISOLATED
        (S, SX), = self.sums(Xs, ("gaussian",),
                             weights=xp.where(far, 0.0, w * xp.exp(xp.minimum(m, ISOLATED))))
        isolated = xp.flatnonzero(far)
        if isolated.size and balls is not None:
            Si, SXi = balls.column_sums(Xs, c, isolated, m[isolated], w[isolated])
            S, SX = S + Si, SX + SXi
        elif isolated.size:
            own = xp.full(Xs.shape[0], -1, dtype=xp.int64)
            own[isolated] = xp.arange(isolated.size)
            (Si, SXi), = exact_sums(self.be, Xs[isolated], ("gaussian",), Y=Xs,
                                    weights=w[isolated], source_shift=m[isolated], exclude=own)
            S, SX = S + Si, SX + SXi
        return S, SX

    def _edge_terms(self, X, scales):
        """The sparse part: (cost, per scale the dense part's row weights
        w_hi = (p_h / 2H) rs_hi / Z_hi with rs_hi = sum_j r_ij s_hij, and the
        pattern's gradient sum_j 2 (g_ij + g_ji)(x_i - x_j)), r = dE/ds and g = dE/dd
        summed over the scales.  Compiled: msne_cpu.edge_terms, on the GPU
        kernels/msne.cu's msne_edges."""
        H, n, pairs, js = len(scales), self.n, self.pairs, self.cost == "js"
        if not self.compiled:
            value, g_edge, rs = self._edge_terms_array(pairs.sqdist_arrays(X), scales)
            W = [(0.5 * p / H) * r / Z for (p, Z, *_), r in zip(scales, rs)]
            return value, W, 2.0 * (pairs.laplacian_times(g_edge, X)
                                    + pairs.laplacian_times(g_edge, X, transpose=True))
        xp = self.be.xp
        shifts, Z = xp.stack([sc[3] for sc in scales]), xp.stack([sc[1] for sc in scales])
        if self.be.is_gpu:
            totals, W, grad = msne_gpu.edge_terms(self.be, pairs, X, 0.5 * self.p, shifts, Z,
                                                  js, self.kappa)
            part, mass = self.be.to_host(totals)
        else:
            rs, grad, half_p = np.empty((H, n)), np.empty_like(X), 0.5 * self.p
            part, mass = edge_terms(pairs.P.indptr, pairs.P.indices, np.ascontiguousarray(X.T),
                                    pairs.p, half_p, squaring_plan(half_p, shifts), shifts, Z,
                                    js, self.kappa, rs, grad)
            W = (half_p / H)[:, None] * rs / Z
        value = (self.constant + part if self.cost == "kl"
                 else js_value(part, n - mass, self.kappa))
        return value, list(W), grad

    def _edge_terms_array(self, d_edge, scales):
        """:meth:`_edge_terms` in array code (the GPU path and the reference)."""
        xp, pairs = self.be.xp, self.pairs
        H = len(scales)
        s_all = [xp.exp(-0.5 * p * d_edge + m[pairs.rows]) / Z[pairs.rows]
                 for p, Z, _, m in scales]
        terms, r, s = pattern_terms(xp, pairs.p, sum(s_all) / H, self.cost, self.kappa)
        if self.cost == "kl":
            value = self.constant + float(terms.sum())
        else:
            rest = float((1.0 - pairs.row_sums(s)).sum())      # mass of s off the pattern
            value = js_value(float(terms.sum()), rest, self.kappa)
        g_edge = sum((0.5 * p / H) * s_h * r for (p, *_), s_h in zip(scales, s_all))
        return value, g_edge, [pairs.row_sums(r * s_h) for s_h in s_all]

    def value_and_grad(self, X_in):
        if self.nbody == "exact" and self.compiled and (
                not self.be.is_gpu or X_in.shape[1] <= MAX_COMPILED_DIM):
            return self._fused_value_and_grad(X_in)
        # In float64 whatever X's dtype (as the fused sweep): at a fine scale the
        # shifted exponent t - m is a difference of squared distances 10^6 kernel
        # widths large, which float32 resolves only to ~0.3 (27% kernel errors,
        # overflow; on the GPU the float32 gradient was off by 100%).
        X = X_in.astype(np.float64, copy=False)
        balls = None if self.be.is_gpu or self.nbody == "exact" else _Balls(X)
        scales = self._scales(X, balls)
        value, weights, grad = self._edge_terms(X, scales)
        for (p, Z, SX, m), w in zip(scales, weights):
            # Dense part of g_ik + g_ki = e_ik (w_i + w_k), e the kernel at width p,
            # with Z and w in row i's shifted units: the column term takes each
            # source's own shift (d_ik >= m_k, so it cannot overflow).
            cs = math.sqrt(p / 2.0)
            Sw, SXw = self._column_sums(X * cs, m, w, cs, balls)
            grad -= 2.0 * (w[:, None] * (Z[:, None] * X - SX) + Sw[:, None] * X - SXw / cs)
        return value, grad.astype(X_in.dtype, copy=False)

    def _fused_value_and_grad(self, X):
        """The exact engine's cost and gradient in one compiled sweep over the rows
        on the CPU (msne_cpu.fused_exact: a quarter of the exps of the exact sums
        plus the edge sweep when the pattern is dense), in three launches on the
        GPU (msne_gpu.fused_exact)."""
        n, d = X.shape
        js = self.cost == "js"
        if self.be.is_gpu:
            part, mass, grad = msne_gpu.fused_exact(self.be, self.pairs, X, 0.5 * self.p, js,
                                                    self.kappa)
        else:
            threads, H, P = get_num_threads(), self.p.size, self.pairs.P
            grad = np.empty((n, d))
            longest = int(np.diff(P.indptr).max())
            half_p = 0.5 * self.p
            part, mass = fused_exact(
                P.indptr, P.indices, np.ascontiguousarray(X.T, dtype=np.float64),
                self.pairs._p64, half_p, squaring_plan(half_p), _nearest_sqdist(X, self.be), js,
                self.kappa,
                np.empty((threads, H, n)), np.empty((threads, 2, n)),
                np.empty((threads, H + 4, longest)), grad)
        value = (self.constant + part if self.cost == "kl"
                 else js_value(part, n - mass, self.kappa))
        return value, grad.astype(X.dtype, copy=False)


def shifted_row_sums(be, nbody, accuracy, Xs, m, c=None, balls=None, targets=None):
    """(Z, SX): Z_i = sum_k exp(-(t_ik - m_i)) and SX_i the same sum of xs_k, over
    the sources Xs at the targets (default: the sources, self pairs excluded),
    t the squared distance in the scale's units (Xs = c X, targets likewise),
    each target shifted by its m_i.  The fast engines sum unshifted kernels and
    rescale; targets with m_i > ISOLATED are summed exactly, over ``balls`` (the
    CPU's :class:`_Balls` of the same sources and targets) or all sources."""
    if nbody == "exact":
        return engine_sums(be, nbody, Xs, ("gaussian",), Y=targets, target_shift=m)[0]
    xp = be.xp
    (Z, SX), = engine_sums(be, nbody, Xs, ("gaussian",), Y=targets, accuracy=accuracy)
    scale = xp.exp(xp.minimum(m, ISOLATED))
    Z, SX = Z * scale, SX * scale[:, None]
    isolated = xp.flatnonzero(m > ISOLATED)
    if isolated.size and balls is not None:
        Z[isolated], SX[isolated] = balls.row_sums(Xs, c, isolated, m[isolated])
    elif isolated.size:
        own = targets is None
        (Z[isolated], SX[isolated]), = exact_sums(
            be, Xs, ("gaussian",), Y=(Xs if own else targets)[isolated],
            target_shift=m[isolated], exclude=isolated if own else None)
    return Z, SX


class _Balls:
    """Exact shifted Gaussian sums of a few rows (or sources) over their
    neighbourhoods, on the CPU: each isolated point's sums run over the points
    within its ball t - m < TAIL + log N, in kernel units of the scale's
    Xs = c X, found over a grid of the layout X per scale (_ball_kernels); a
    k-d tree of X (built once per evaluation) gives the nearest distances.  The
    row and column sums of a scale isolate the same points: their pairs and
    kernels are found once.  ``targets``: other points whose rows are summed
    over X (out-of-sample points; default X itself, self pairs excluded);
    ``tree``: X's k-d tree, when it is at hand."""

    def __init__(self, X, targets=None, tree=None):
        from scipy.spatial import cKDTree
        self.X, self.targets = X, targets
        self.tree = cKDTree(X) if tree is None else tree
        self.tail = TAIL + math.log(X.shape[0])
        self.kernels = {}

    def nearest_sqdist(self):
        if self.targets is None:
            return self.tree.query(self.X, k=2)[0][:, 1] ** 2
        return self.tree.query(self.targets, k=1)[0] ** 2

    def _kernels(self, rows, m, c):
        """(position in rows, neighbour j != row, exp(-(t - m_row))) for every
        point in each row's ball, t = |xs_row - xs_j|^2 (Xs = c X), by
        :func:`_ball_kernels`.  In place of k-NN queries of the k-d tree, which
        took a quarter of an evaluation on a trained Fashion-MNIST 10k layout."""
        if c not in self.kernels:
            own = self.targets is None
            self.kernels[c] = _ball_kernels(
                self.X, (self.X if own else self.targets)[rows],
                rows if own else np.full(rows.size, -1), m, c, self.tail)
        return self.kernels[c]

    def row_sums(self, Xs, c, rows, m):
        """(Z, SX) of ``rows``: sum_k exp(-(t_ik - m_i)) (1, xs_k), Xs = c X."""
        pos, nbr, e = self._kernels(rows, m, c)
        return _scatter(pos, e, Xs[nbr], rows.size)

    def column_sums(self, Xs, c, sources, m, w):
        """(S, SX) of every point i from ``sources`` alone:
        sum_k exp(-(t_ik - m_k)) w_k (1, xs_k), Xs = c X."""
        pos, nbr, e = self._kernels(sources, m, c)
        return _scatter(nbr, e * w[pos], Xs[sources[pos]], Xs.shape[0])


def _ball_kernels(X, queries, own, m, c, tail):
    """(query position q, point index j, exp(m_q - c^2 |x_j - q|^2)) for the
    points of X (N, d) in each query's ball c^2 |x_j - q|^2 - m_q < tail, j !=
    own[q] (-1: none), in query order, by msne_cpu.ball_pairs over a grid of
    cells as wide as the smallest ball's radius, sqrt(tail) / c (wider where
    that would take more than 4 N cells): a ball's box spans a few cells per
    dimension whatever the scale, and the walk two passes, counting then
    filling."""
    n, d = X.shape
    lo = X.min(axis=0)
    extent = X.max(axis=0) - lo
    cell = math.sqrt(tail) / c
    while np.prod(np.floor(extent / cell) + 1) > 4 * n:
        cell *= 1.25
    inv_cell = 1.0 / cell
    shape = (extent * inv_cell).astype(np.int64) + 1
    key = np.ravel_multi_index(np.minimum(((X - lo) * inv_cell).astype(np.int64), shape - 1).T,
                               shape)
    order = np.argsort(key, kind="stable")
    starts = np.searchsorted(key[order], np.arange(int(shape.prod()) + 1))
    offsets = np.zeros(queries.shape[0] + 1, dtype=np.int64)
    walk = (X[order], order, starts, lo, inv_cell, shape, np.ascontiguousarray(queries),
            np.asarray(own, dtype=np.int64), np.asarray(m, dtype=np.float64), c * c, tail,
            offsets)
    none = np.empty(0, dtype=np.int64)
    ball_pairs(*walk, False, none, none, np.empty(0))
    np.cumsum(offsets, out=offsets)
    pos, nbr, kernel = (np.empty(offsets[-1], dtype=np.int64),
                        np.empty(offsets[-1], dtype=np.int64), np.empty(offsets[-1]))
    ball_pairs(*walk, True, pos, nbr, kernel)
    return pos, nbr, kernel


def _scatter(into, e, x, n):
    """(sum of e, sum of e x) grouped by ``into`` (n groups)."""
    S = np.bincount(into, e, minlength=n)
    SX = np.stack([np.bincount(into, e * x[:, k], minlength=n) for k in range(x.shape[1])],
                  axis=1)
    return S, SX


def _nearest_sqdist(X, be, sources=None):
    """Squared distance of every point of X to its nearest neighbour (in
    ``sources``, default X itself without the point): a k-d tree for a
    low-dimensional embedding on the CPU (O(N log N); other targets:
    :class:`_Balls` with ``targets``), else the exact k-NN."""
    if sources is None and not be.is_gpu and X.shape[1] <= 3:
        return _Balls(X).nearest_sqdist()
    # The distance again coordinate by coordinate, as the shifted sums take it:
    # k-NN's GEMM distances err by eps |x|^2, and the shift should make the
    # nearest kernel exactly 1.
    if sources is None:
        diff = X - X[knn(X, 1, backend=be)[1][:, 0]]
    else:
        diff = X - sources[knn_query(X, sources, 1, backend=be)[1][:, 0]]
    return (diff * diff).sum(axis=1)
