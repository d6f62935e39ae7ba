"""Out-of-sample mapping of the estimators' ``transform``: each new point
minimizes the objective restricted to its own terms with the training embedding
fixed (dissertation eq. 5.9 for EE; for the SNE family, KL between its
affinities to the training points and the kernel distribution around it; for
multi-scale SNE its cost over the scales), all new points together, each by
its own quasi-Newton steps.
"""
import math

import numpy as np

from .nbody import engine_sums
from .optim.loop import TRUST_RADIUS

# Iterations of the out-of-sample mappings (TSNE & co.: method_params
# ``transform_max_iter``).
TRANSFORM_MAX_ITER = 200


def rms_radius(X):
    """The root mean square distance of X's rows from their centroid."""
    return float(((X - X.mean(axis=0)) ** 2).sum(axis=1).mean()) ** 0.5


class OutOfSample:
    """Per-point objective of new points x against the fixed training embedding:

    EE:         sum_j (w_j / N) |x - y_j|^2 + lambda sum_n exp(-|x - y_n|^2)
    SSNE, SNE:  sum_j w_j |x - y_j|^2 + log sum_n exp(-|x - y_n|^2)
    t-SNE:      sum_j w_j log(1 + |x - y_j|^2) + (N + 1)/2 log(1 + 2 S(x) / Z),
                S(x) = sum_n 1 / (1 + |x - y_n|^2), Z = sum_{n != m} 1 / (1 + |y_n - y_m|^2)

    w: the new point's entropic affinities to its training neighbours j.

    t-SNE's term is KL(P || Q) of the N + 1 points as a function of x alone
    (dissertation eq. 5.9's construction), Q normalized over all pairs, the new
    point's joint affinities w_j / (N + 1) (the row sum of a training point's):
    its repulsion gradient scales by (N + 1) / (Z + 2 S), about 1 / S where S is
    the layout's mean row sum Z / N.  With x's own normalization, log S(x), as
    before 2026-11-27, the objective tends to log N far from the layout, below
    its value near neighbours that the layout set apart: 1 of 500 held-out
    Fashion-MNIST images walked off to 1.5e5 units from a 265-unit layout.
    """

    def __init__(self, name, Y_train, idx, W, objective, be):
        self.name, self.Y, self.idx, self.W, self.be = name, Y_train, idx, W, be
        self.lambda_ = getattr(objective, "lambda_", None)
        self.n = Y_train.shape[0]
        self.student = name == "tsne"
        self.nbody, self.accuracy = objective.nbody, objective.accuracy
        self.sources = {}           # the engine's structures of the fixed training layout
        self.compiled = True        # attraction_cpu.out_of_sample_attraction; False: the array code
        if self.student:            # Z of the training layout (the class docstring)
            (S, _), = engine_sums(be, self.nbody, Y_train, ("student",), accuracy=self.accuracy)
            self.Z = float(S.sum())

    # The FGT expands all N training points at every call however few the targets
    # (Barnes-Hut keeps its tree in ``sources``): calls for fewer new points than
    # this, the line search's later trials, take the exact sums.  EE on
    # Fashion-MNIST 10k: 1.4 ms per such call by the FGT, 0.07 ms exactly.
    FGT_MIN_ROWS = 256

    def sums(self, X, kernels):
        """Sums over the training points at the new points X: O(M + N) with fgt / bh."""
        nbody = "exact" if self.nbody == "fgt" and X.shape[0] < self.FGT_MIN_ROWS else self.nbody
        return engine_sums(self.be, nbody, self.Y, kernels, Y=X, accuracy=self.accuracy,
                           sources=self.sources)

    def evaluate(self, X, rows, grad=True):
        """Per-point objective (M,) of the new points ``rows`` at X (M, d); with
        ``grad`` also the gradient (M, d) and the attractive curvature (M,) that
        scales it (FP).  The line search's trials take the objective alone (t-SNE:
        one Student-t sum instead of the pair)."""
        xp = self.be.xp
        terms = (self._compiled_attraction if self.compiled and not self.be.is_gpu
                 else self._array_attraction)
        attract, g_att, curvature = terms(X, rows, grad)
        if self.student:
            if not grad:
                (S1, _), = self.sums(X, ("student",))
                return attract + 0.5 * (self.n + 1) * xp.log1p(2.0 * S1 / self.Z)
            (S1, _), (S2, SX2) = self.sums(X, ("student", "student2"))
            scale = (self.n + 1) / (self.Z + 2.0 * S1)
            return (attract + 0.5 * (self.n + 1) * xp.log1p(2.0 * S1 / self.Z),
                    g_att - 2.0 * scale[:, None] * (S2[:, None] * X - SX2), curvature)
        (S, SX), = self.sums(X, ("gaussian",))
        ee = self.name == "ee"
        value = attract / self.n + self.lambda_ * S if ee else attract + xp.log(S)
        if not grad:
            return value
        if ee:
            return (value, g_att / self.n - 2.0 * self.lambda_ * (S[:, None] * X - SX),
                    curvature / self.n)
        return value, g_att - 2.0 * (S[:, None] * X - SX) / S[:, None], curvature

    def _array_attraction(self, X, rows, grad):
        """(sum_j w_j phi(d_j^2), 2 sum_j w'_j (x - y_j), 2 sum_j w'_j) of ``rows`` at
        X, phi = log(1 + d^2) and w' = w / (1 + d^2) for t-SNE, else d^2 and w: the
        GPU path and the CPU's reference (no gradient without ``grad``)."""
        xp = self.be.xp
        W = self.W[rows]
        diff = X[:, None, :] - self.Y[self.idx[rows]]          # (M, k, d)
        d2 = (diff * diff).sum(axis=2)
        if self.student:
            attract = (W * xp.log1p(d2)).sum(axis=1)
            if grad:
                W = W / (1.0 + d2)
        else:
            attract = (W * d2).sum(axis=1)
        if not grad:
            return attract, None, None
        return attract, 2.0 * (W[:, :, None] * diff).sum(axis=1), 2.0 * W.sum(axis=1)

    def _compiled_attraction(self, X, rows, grad):
        """:meth:`_array_attraction` by attraction_cpu.out_of_sample_attraction: one
        compiled pass per row, where the array code's (M, k, d) temporaries took
        most of a transform."""
        from .objectives.attraction_cpu import out_of_sample_attraction

        M, d = X.shape
        attract, g, curvature = (np.empty(shape, X.dtype) for shape in (M, (M, d), M))
        out_of_sample_attraction(np.ascontiguousarray(X), self.Y,
                                 np.ascontiguousarray(self.idx[rows]),
                                 np.ascontiguousarray(self.W[rows]), self.student, grad,
                                 attract, g, curvature)
        return (attract, g, curvature) if grad else (attract, None, None)

    def minimize(self, X, max_iter, tol=1e-10, first=0):
        """Quasi-Newton steps with a per-point Armijo backtracking line search:
        each point keeps its own d x d BFGS inverse Hessian, started at the
        inverse of its attractive curvature (FP's scaled gradient), and moves at
        most the fit's trust radius (optim.loop.TRUST_RADIUS times the training
        layout's RMS radius, at least 1) per iteration.  Each point
        stops on its own relative change, so where it lands does not depend on
        the other points transformed with it (one stopping test over all of them
        moved the converged points on while the slowest converged).
        The first trial of each search takes the gradient too, which the next
        iteration then starts from (most first trials are accepted); later
        trials take the objective alone, and a point accepted at one of them
        gets its gradient at the next iteration's start.
        X: the starts of new points ``first``, ``first + 1``, ..."""
        xp = self.be.xp
        X = X.copy()
        n, d = X.shape
        step = xp.ones(n, dtype=X.dtype)
        grow = xp.ones(n, dtype=bool)
        X_old, G_old = xp.zeros_like(X), xp.zeros_like(X)
        rows = xp.arange(n)
        floor = np.finfo(X.dtype).tiny              # 1e-300 would be 0 in float32
        reach = TRUST_RADIUS * max(rms_radius(self.Y), 1.0)
        # Each point's objective and gradient at X; ``stale``: the gradient is not.
        E_at, G_at, curvature = self.evaluate(X, rows + first)
        inverse = (xp.eye(d, dtype=X.dtype) / curvature[:, None, None]).astype(X.dtype)
        stale = xp.zeros(n, dtype=bool)
        for it in range(max_iter):
            if rows.size == 0:
                break
            redo = rows[stale[rows]]
            if redo.size:
                E_at[redo], G_at[redo], _ = self.evaluate(X[redo], redo + first)
                stale[redo] = False
            Xa, E, G = X[rows], E_at[rows], G_at[rows]
            if it > 0:
                inverse[rows] = bfgs_update(xp, inverse[rows], Xa - X_old[rows], G - G_old[rows])
            X_old[rows], G_old[rows] = Xa, G
            P = -_batched_times(inverse[rows], G)
            # At most ``reach`` long; written so that a zero step cannot overflow.
            P *= (reach / xp.maximum(xp.sqrt((P * P).sum(axis=1)), reach))[:, None]
            slope = (G * P).sum(axis=1)
            # The last accepted step, doubled (up to 1) after a first trial that was
            # accepted: always doubling made most points backtrack every iteration.
            trial = xp.where(grow[rows], xp.minimum(2.0 * step[rows], 1.0), step[rows])
            grow[rows] = False
            X_new, E_new = Xa.copy(), E.copy()
            # Each trial evaluates only the points still searching: one point's
            # backtracks no longer cost an evaluation of all (4.5x fewer per point).
            pending = xp.arange(rows.size)
            for attempt in range(30):
                t = trial[pending]
                cand = Xa[pending] + t[:, None] * P[pending]
                if attempt == 0:
                    E_c, G_c, _ = self.evaluate(cand, rows[pending] + first)
                else:
                    E_c = self.evaluate(cand, rows[pending] + first, grad=False)
                ok = E_c <= E[pending] + 1e-4 * t * slope[pending]
                done = pending[ok]
                X_new[done], E_new[done], step[rows[done]] = cand[ok], E_c[ok], t[ok]
                if attempt == 0:
                    grow[rows[done]] = True
                    G_at[rows[done]] = G_c[ok]
                else:
                    stale[rows[done]] = True
                pending = pending[~ok]
                if pending.size == 0:
                    break
                trial[pending] *= 0.5
            X[rows], E_at[rows] = X_new, E_new
            rows = rows[xp.abs(E - E_new) / xp.maximum(xp.abs(E), floor) >= tol]
        return X


def _batched_times(A, v):
    """A_i v_i for (M, d, d) and (M, d): elementwise products summed along the
    last axis, which adds each row's terms in one order however many rows come
    together (a stacked matmul promises no order), as batch independence needs."""
    return (A * v[:, None, :]).sum(axis=2)


def bfgs_update(xp, inverse, s, y):
    """BFGS updates of inverse Hessians (M, d, d) by steps s and gradient changes
    y (M, d); a pair without positive curvature (s.y <= 1e-10 |s| |y|) leaves
    its matrix as it is, so each stays positive definite."""
    sy = (s * y).sum(axis=1)
    ok = sy > 1e-10 * xp.sqrt((s * s).sum(axis=1) * (y * y).sum(axis=1))
    rho = xp.where(ok, 1.0 / xp.where(ok, sy, 1.0), 0.0)[:, None, None]
    Hy = _batched_times(inverse, y)
    yHy = (y * Hy).sum(axis=1)[:, None, None]
    ss = s[:, :, None] * s[:, None, :]
    cross = Hy[:, :, None] * s[:, None, :]
    return inverse + rho * (1.0 + rho * yHy) * ss - rho * (cross + cross.transpose(0, 2, 1))


class MultiscaleOutOfSample(OutOfSample):
    """Per-point multi-scale SNE cost of new points x against the fixed training
    embedding Y (see MultiscaleSNE.transform): for the new point's affinities
    sigma_j to its training neighbours j and s_j = (1/H) sum_h s_hj,
    s_hj = e_hj / Z_h, e_hj = exp(-(p_h |x - y_j|^2 / 2 - m_h)), Z_h = sum_n e_hn
    over all training points n (m_h: the shift by the nearest one),

        gradient = sum_j G_j (x - y_j) - sum_h (p_h / H) rs_h (x - SX_h / Z_h),
        G_j = sum_h (p_h / H) s_hj r_j,  rs_h = sum_j r_j s_hj,  SX_h = sum_n e_hn y_n,

    r as msne.pattern_terms (the cost's constant derivative off the pattern
    cancels); the scaling curvature is sum_j max(G_j, 0), for KL sum_j sigma_j
    times the responsibility-weighted precision, SNE's 2 sum_j w_j at p = 2
    (at least the coarsest precision)."""

    # Neighbour entries (rows x k) per chunk of transform: H arrays of them.
    CHUNK = 2**20
    # Evaluations of fewer rows sum exactly (see evaluate).
    FAST_ROWS = 1000

    def __init__(self, Y_train, idx, W, fitted, be):
        from numba import get_num_threads

        from .objectives.msne_cpu import SOURCE_BLOCK, squaring_plan

        # In float64 (the fit's sums are; msne.py), the gradient in Y's dtype.
        self.Y, self.dtype = Y_train.astype(np.float64), Y_train.dtype
        self.idx, self.W, self.be = idx, W, be
        self.p, self.cost, self.kappa = fitted.p, fitted.cost, fitted.kappa
        self.nbody, self.accuracy = fitted.nbody, fitted.accuracy
        self.n = Y_train.shape[0]
        xp = be.xp
        # KL's constant sum_j sigma_j log sigma_j, so that values are the cost itself.
        self.entropy = (W * xp.log(xp.where(W > 0, W, 1.0))).sum(axis=1)
        self.compiled = True    # msne_cpu's out_of_sample_rows, target_sums; False: array code
        self.half_p = 0.5 * self.p
        self.squarings = squaring_plan(self.half_p)     # the same for every evaluation
        self.tree = None
        if not be.is_gpu:       # msne_cpu.target_sums' sources and buffers
            self.YT = np.ascontiguousarray(self.Y.T)
            self.scratch = np.empty((get_num_threads(), len(self.p) + 1,
                                     min(self.n, SOURCE_BLOCK)))
            if Y_train.shape[1] <= 3:                   # msne._Balls' k-d tree of Y
                from scipy.spatial import cKDTree
                self.tree = cKDTree(self.Y)

    def evaluate(self, X, rows, grad=True):
        from .objectives.msne import _Balls, _nearest_sqdist, js_value, shifted_row_sums

        xp = self.be.xp
        X = X.astype(np.float64, copy=False)        # as the fit's sums (msne.py)
        # A fast engine pays O(N) per call however few the targets: the line
        # search's trials and the last points to converge take the exact sums.
        nbody = self.nbody if X.shape[0] >= self.FAST_ROWS else "exact"
        balls = None if self.tree is None else _Balls(self.Y, X, self.tree)
        nearest = (_nearest_sqdist(X, self.be, self.Y) if balls is None
                   else balls.nearest_sqdist())
        compiled = self.compiled and not self.be.is_gpu
        if compiled and nbody == "exact":
            scales = self._compiled_sums(X, nearest)
        else:
            scales = []
            for p in self.p:
                c, m = math.sqrt(p / 2.0), 0.5 * p * nearest
                Z, SX = shifted_row_sums(self.be, nbody, self.accuracy, self.Y * c, m, c,
                                         balls, targets=X * c)
                scales.append((p, Z, SX / c, m))
        if compiled:
            value, mass, g, curvature = self._compiled_terms(X, rows, nearest, scales, grad)
        else:
            value, mass, g, curvature = self._array_terms(X, rows, scales, grad)
        if self.cost == "kl":
            value = value + self.entropy[rows]
        else:
            value = js_value(value, 1.0 - mass, self.kappa)
        if not grad:
            return value
        # A point whose neighbours all sit on the floor (r = 0) has no attractive
        # curvature: the coarsest scale's, p_min sum_j sigma_j, bounds it below.
        curvature = xp.maximum(curvature, self.p.min())
        return value, g.astype(self.dtype, copy=False), curvature

    def _compiled_sums(self, X, nearest):
        """The scales' (p, Z, SX, m) by msne_cpu.target_sums: the exact engine's
        sums of all scales in one pass, each kernel squared from the next
        coarser one where the precisions allow (one call per scale took 62% of
        a transform of 2,000 images into a 10,000-image layout)."""
        from .objectives.msne_cpu import target_sums

        H, (M, d) = len(self.p), X.shape
        Z, SX = np.empty((H, M)), np.empty((H, M, d))
        target_sums(np.ascontiguousarray(X), self.YT, self.half_p, self.squarings, nearest,
                    Z, SX, self.scratch)
        return [(p, Z[h], SX[h], self.half_p[h] * nearest) for h, p in enumerate(self.p)]

    def _array_terms(self, X, rows, scales, grad):
        """(pattern part of the cost, sum_j s_j, gradient, sum_j max(G_j, 0)) of
        ``rows`` at X, in array code: the GPU path and the CPU's reference."""
        from .objectives.msne import pattern_terms

        xp, H = self.be.xp, len(self.p)
        diff = X[:, None, :] - self.Y[self.idx[rows]]          # (M, k, d)
        d2 = (diff * diff).sum(axis=2)
        s_all, s = [], xp.zeros_like(d2)
        for p, Z, _, m in scales:
            s_all.append(xp.exp(m[:, None] - 0.5 * p * d2) / Z[:, None])
            s += s_all[-1]
        terms, r, s = pattern_terms(xp, self.W[rows], s / H, self.cost, self.kappa)
        if not grad:
            return terms.sum(axis=1), s.sum(axis=1), None, None
        G, g = xp.zeros_like(d2), xp.zeros_like(X)
        for (p, Z, SX, _), s_h in zip(scales, s_all):
            G += (p / H) * s_h * r
            g -= (p / H) * (r * s_h).sum(axis=1)[:, None] * (X - SX / Z[:, None])
        g += (G[:, :, None] * diff).sum(axis=1)
        return terms.sum(axis=1), s.sum(axis=1), g, xp.maximum(G, 0.0).sum(axis=1)

    def _compiled_terms(self, X, rows, nearest, scales, grad):
        """:meth:`_array_terms` by msne_cpu.out_of_sample_rows: one compiled pass
        per row (the array code's temporaries took 65% of a transform)."""
        from numba import get_num_threads

        from .objectives.msne_cpu import out_of_sample_rows

        M, k, d = X.shape[0], self.idx.shape[1], X.shape[1]
        value, mass = np.empty(M), np.empty(M)
        g, curvature = np.empty((M, d)), np.empty(M)
        out_of_sample_rows(
            np.ascontiguousarray(X), self.Y, np.ascontiguousarray(self.idx[rows]),
            np.ascontiguousarray(self.W[rows]), self.half_p, self.squarings, nearest,
            np.stack([Z for _, Z, _, _ in scales]),
            np.stack([SX for _, _, SX, _ in scales]), self.cost != "kl", self.kappa, grad,
            value, mass, g, curvature, np.empty((get_num_threads(), len(scales) + 3, k)))
        return value, mass, g, curvature
