"""Parametric embeddings by the method of auxiliary coordinates (paper 001).

A parametric embedding minimizes P(F) = E(F(Y)) over a family of mappings F.
MAC introduces auxiliary coordinates Z = F(Y) as a constraint, relaxes it by
a quadratic penalty and alternates

    Z step: min_Z E(Z) + (mu/2) |Z - F(Y)|^2   the embedding's own optimizer
            (spectral direction with curvature 4 L+ + mu I, N-body sums as
            configured), warm-started from the previous Z;
    F step: min_F |Z - F(Y)|^2                 a plain regression (mappings.py),

while mu grows along a schedule, by default with augmented-Lagrangian
multipliers that let Z and F(Y) meet at a finite mu.  The path starts at
mu -> 0+: the free embedding and its direct fit (history_[0]); as mu grows Z
and F(Y) come to agree at a minimizer of P.  Neither step needs the
chain-rule gradient of P, so any mapping with fit/predict works,
differentiable or not.
"""
from __future__ import annotations

import copy
import inspect
import math
import time

import numpy as np

from .._checks import (check_bool, check_data, check_features, check_fitted, check_float,
                       check_int, check_random_state, check_verbose, warn)
from .._params import Params, TransformerOutput
from ..backend import get_backend
from ..neighbors import metric_rows
from ..objectives.penalty import Penalized
from ..optim import DIRECTIONS, Monitor, minimize
from .mappings import make_mapping

__all__ = ["ParametricEmbedding"]


class ParametricEmbedding(TransformerOutput, Params):
    """Parametric embedding by MAC: a mapping F fitted so that F(Y) minimizes the
    embedding's objective, P(F) = E(F(Y)), by alternating a Z step (E(Z) + (mu/2)
    |Z - F(Y)|^2 by the embedding's own optimizer, warm-started) and an F step (a
    regression of Z on Y) along an increasing penalty mu (seed 001, section 3).

    Parameters
    ----------
    embedding : an EE, SSNE, TSNE, SNE or MultiscaleSNE estimator, default EE()
        Its affinities, objective, optimizer and N-body engine define E and the Z
        step (the classic "tsne" optimizer has no use for a penalty: its Z steps
        use "sd").  MultiscaleSNE's E is its final stage's: every scale, at the
        low-dimensional precisions it ended with.
    mapping : "linear" | "rbf" | "mlp" | an object with fit(Y, Z) and predict(Y)
        ``fit`` may take ``warm_start``, and ``sample_weight`` as scikit-learn's
        regressors do (only when its signature names them: a ``fit(*args,
        **kwargs)`` gets neither, with a warning).  The network's first layer
        costs in proportion to the input's width, over at least 5,000 minibatch
        steps for the direct fit: 600 rows of 5,000 features took 100 s on 2
        cores, so wide rows go in through their leading principal components
        (the benchmarks give the network 50).
    mu : increasing positive penalties, or None
        None: the geometric schedule mu_k = mu_start c mu_factor^k, k < n_mu, with c
        E's curvature along the path's first direction, from the free embedding
        towards the direct fit, so that the first Z step moves Z about 1% of the
        way.
    mu_start, n_mu, mu_factor : float, int, float; default 0.01, 16, 2
        That schedule's start (relative to c), length and ratio.
    max_inner : int, default 10
        (Z, F) steps per mu at most; each mu ends when P(F) decreases by less than
        ``tol`` (relative) between consecutive steps, a rise included (the
        paper's rule).
    tol : float, default 1e-3
        That relative decrease (the paper's value for its neural net; it took
        1e-4 for linear EE).
    z_max_iter, z_tol : int, float; default 20, 1e-4
        Iterations and relative-decrease tolerance of each Z step.
    constraint_tol : float, default 1e-8
        Stop once |Z - F(Y)|^2 <= constraint_tol |F(Y) - mean|^2.
    augmented : bool, default True
        The augmented Lagrangian instead of the paper's quadratic penalty: scaled
        multipliers U (Lambda / mu) shift the Z step's target to F(Y) - U and the
        F step's to Z + U, and U += Z - F(Y) after every F step, so Z and F(Y)
        meet at a finite mu.
    mapping_params : dict or None
        Keyword arguments of a named mapping.
    random_state : None, int, numpy Generator or RandomState
        Seeds a named mapping (RBF centres, the network's weights and minibatches).
    verbose : bool or int, default False
        Print a line per F step (mu, P(F), |Z - F(Y)|^2, seconds).

    Attributes
    ----------
    mapping_ : the mapping with the lowest P(F) met on the path (inexact F steps,
        e.g. a few epochs of an MLP, can make P rise again late on the path).
    embedding_ : (N, L) numpy array
        Its F(Y).
    objective_ : float
        Its P(F) = E(F(Y)).
    free_embedding_, free_objective_ : the free embedding and its E.
    history_ : list of dicts with "objective" (P(F)), "constraint" (|Z - F(Y)|^2),
        "mu" and "time" (seconds since fit started), one per F step; the first is
        the direct fit of the free embedding (mu = 0).
    n_features_in_ : int

    Notes
    -----
    The path's F steps pass sample_weight = mu / mu_1 (a float), so a regularized
    regression (RBF ridge, MLP weight decay, a scikit-learn Ridge) solves min
    (mu/2)|Z - F(Y)|^2 + R(F) with a fixed R, R at the strength the direct fit
    gives it relative to mu_1, and the path ends at a minimizer of P(F) + R(F).
    Unweighted, the regularization grew with mu and drew F towards zero: an RBF
    with ridge 1e-6 for EE on 1,500 digits (quadratic penalty) took P(F) from
    16.61 (direct fit) to 16.32 and then up to 17.13; weighted it falls along the
    whole path to 15.60 in half the time, and with ridge 0 (the default) to
    15.61; 1,000 L-BFGS iterations on the chain-rule gradient reach 15.33.
    t-SNE: 2.35 -> 2.14 -> 2.30 before, 2.34 -> 1.90 with ridge 0, the chain
    rule's L-BFGS 1.91.

    The default mu's scale: the attractive curvature 4 mean(D+) at X = 0, the
    scale before, overstates t-SNE's (its curvature along that direction is
    0.03-0.09 of it on digits and Fashion-MNIST, EE's 1.4-1.8, s-SNE's 0.5-0.7),
    and t-SNE's path then left the free embedding too fast for a worse optimum
    (quadratic penalty): P(F) 2.548 against 2.112 now for a linear map on 1,500
    digits (the chain rule's L-BFGS 2.094 after 1,000 iterations), 2.506 against
    2.146 on Fashion-MNIST 3k (PCA 50), 1.904 against 1.723 with the RBF map, at
    1.6-1.8x the time; EE and s-SNE end within 0.05%, multi-scale SNE 0.2% higher
    (400.3 against 399.4, 300 points in 4 clusters).

    ``max_inner``: going on after a rise, as a test of |decrease| did, spent two
    of every three steps of t-SNE + MLP on Fashion-MNIST 20k (max_inner = 3) at
    a mu whose first step had made the gain: P(F) passed the chain rule's
    100-iteration 3.158 after 10 steps (18.4 s), now after 7 (13.1 s), all else
    equal.

    ``tol``: 1e-4 takes more steps per mu, and where the F steps are exact least
    squares the path ends lower: t-SNE + RBF network on Fashion-MNIST 5k (PCA
    50) P(F) 2.195 against 2.313 in 23 s against 15 s, linear EE on
    Fashion-MNIST 10k (mu_start 0.1, as in bench_mac.py) 27.846 against 27.979
    in 11.7 s against 7.0 s (the chain rule's gradient descent from the latter's
    map went on down, to 27.806 in 100 iterations: the path had stopped short,
    not at a minimum); the default fits of Fashion-MNIST 3k (t-SNE and EE;
    linear, RBF and MLP maps) ended 0.1-1% lower in 1.1-1.9x the time, and
    t-SNE + MLP at 20k (3 steps per mu) took the same steps.

    ``augmented``: the penalty path slows down as mu grows (the Z step barely
    moves away from F(Y)) and stops short.  With the multipliers P(F) ended
    lower in every case measured: linear EE on rotating_objects (PCA to 15)
    17.539 against 17.581 (mu_start = 1: 17.534; the chain rule 17.529), on
    Fashion-MNIST 5k (PCA to 50) 21.83 against 22.29; on 1,500 digits EE and
    s-SNE with the RBF network 15.23 and 1.496 against 15.61 and 1.520 (the chain
    rule's L-BFGS: 15.33 and 1.495), t-SNE with a linear map 2.097 against 2.112;
    t-SNE with the RBF network on Fashion-MNIST 5k 2.131 against 2.352; with an
    MLP (3 epochs per F step, Fashion-MNIST 2,000) t-SNE 1.069 against 1.331 and
    multi-scale SNE 1672 against 2286, where the multipliers could have
    accumulated the inexact F steps' error but did not.
    """

    takes_sparse = False

    def __init__(self, embedding=None, mapping="linear", *, mu=None, mu_start=0.01, n_mu=16,
                 mu_factor=2.0, max_inner=10, tol=1e-3, z_max_iter=20, z_tol=1e-4,
                 constraint_tol=1e-8, augmented=True, mapping_params=None, random_state=None,
                 verbose=False):
        self.embedding = embedding
        self.mapping = mapping
        self.mu = mu
        self.mu_start = mu_start
        self.n_mu = n_mu
        self.mu_factor = mu_factor
        self.max_inner = max_inner
        self.tol = tol
        self.z_max_iter = z_max_iter
        self.z_tol = z_tol
        self.constraint_tol = constraint_tol
        self.augmented = augmented
        self.mapping_params = mapping_params
        self.random_state = random_state
        self.verbose = verbose

    def _schedule(self):
        """(penalties, scaled): the user's mu as given, or the default mu_start
        factor^k, which fit multiplies by E's curvature along the path."""
        if self.mu is not None:
            try:
                mu = np.asarray(self.mu, dtype=np.float64).ravel()
            except (TypeError, ValueError):
                raise TypeError(f"mu must be a sequence of numbers, got {self.mu!r}") from None
            if mu.size == 0 or not np.all(np.isfinite(mu)) or np.any(mu <= 0):
                raise ValueError(f"mu must be positive and finite, got {self.mu!r}")
            if np.any(np.diff(mu) <= 0):
                raise ValueError(f"mu must be strictly increasing, got {self.mu!r}")
            return mu, False
        start = check_float(self.mu_start, "mu_start", 0.0, low_open=True)
        factor = check_float(self.mu_factor, "mu_factor", 1.0, low_open=True)
        n = check_int(self.n_mu, "n_mu", 1)
        return start * factor ** np.arange(n), True

    def fit(self, Y, y=None):
        from ..embedding import EE, MultiscaleSNE, _Embedding

        embedding = EE() if self.embedding is None else self.embedding
        if not isinstance(embedding, (_Embedding, MultiscaleSNE)):
            raise TypeError("embedding must be an EE, SSNE, TSNE, SNE or MultiscaleSNE "
                            f"estimator, got {type(embedding).__name__}")
        # Checked here under its own name (the free embedding's check calls it X);
        # dense only: the free embedding would take sparse rows, the mappings not.
        Y = check_data(Y, get_backend(embedding.backend), name="Y",
                       min_samples=embedding._min_samples)
        mapping = make_mapping(self.mapping, self.mapping_params,
                               check_random_state(self.random_state))
        max_inner = check_int(self.max_inner, "max_inner", 1)
        check_verbose(self.verbose)
        check_bool(self.augmented, "augmented")
        tol = check_float(self.tol, "tol", 0.0)
        z_max_iter = check_int(self.z_max_iter, "z_max_iter", 1)
        z_tol = check_float(self.z_tol, "z_tol", 0.0)
        constraint_tol = check_float(self.constraint_tol, "constraint_tol", 0.0)
        schedule, scaled = self._schedule()
        start = time.perf_counter()

        free = copy.copy(embedding)._free_fit(Y)              # the free embedding (mu -> 0+)
        be, Z, objective, optimizer = free.be, free.Z, free.objective, free.optimizer
        Y_dev = free.X.astype(Z.dtype)
        self._metric = free.metric              # F maps the rows as the metric scaled them
        direction_params = free.direction_params
        if optimizer == "sd" and direction_params.get("solver", "auto") == "auto":
            # mu changes the matrix 4 L+ + mu I at every stage, so a factorization would
            # be redone per mu (35 s for t-SNE on Fashion-MNIST 20k, against 0.1 s
            # for warm-started CG with solves of the same cost).
            direction_params = {**direction_params, "solver": "cg"}
        fit_params = inspect.signature(mapping.fit).parameters
        if "warm_start" not in fit_params and any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in fit_params.values()):
            # A wrapper's fit(*args, **kwargs) hides whether it takes warm_start; passing it
            # anyway would break fits that forward their keywords (scikit-learn's Pipeline).
            warn(f"{type(mapping).__name__}.fit takes **kwargs but names no warm_start, so "
                 "every F step fits the mapping from scratch; name warm_start in its "
                 "signature to continue from the previous fit")
        design = None

        def f_step(first, target, mu=None):
            nonlocal design
            options = {}
            if "warm_start" in fit_params:
                options["warm_start"] = not first
            if mu is not None and "sample_weight" in fit_params:
                # min (mu/2)|Z - F(Y)|^2 + R(F): the mapping's regularization R at its
                # direct-fit strength relative to mu_1, not growing with mu.
                options["sample_weight"] = float(mu / schedule[0])
            mapping.fit(Y_dev, target, **options)
            if getattr(mapping, "fixed_design", False):
                # The warm fits keep the direct fit's design (the RBF centres): F(Y)
                # from it, where predict made the features of Y again at every step.
                FY, design = mapping.forward(Y_dev, None if first else design)
            else:
                FY = mapping.predict(Y_dev)
            FY = be.asarray(FY, dtype=Z.dtype)
            if FY.shape != Z.shape:
                raise ValueError(f"mapping.predict returned shape {FY.shape}, expected {Z.shape}")
            return FY

        def record(FY, mu):
            P = objective.value(FY)
            D = Z - FY
            history.append({"objective": P, "constraint": float((D * D).sum()), "mu": float(mu),
                            "time": time.perf_counter() - start})
            if self.verbose:
                h = history[-1]
                print(f"mu {mu:.3g}  P(F) {P:.8g}  |Z - F(Y)|^2 {h['constraint']:.4g}  "
                      f"{h['time']:.2f} s", flush=True)
            return P

        history = []
        self.free_embedding_ = be.to_host(Z)
        self.free_objective_ = objective.value(Z)
        FY = f_step(True, Z)                                   # the direct fit
        P = record(FY, 0.0)
        if scaled:
            schedule = schedule * path_curvature(objective, Z, FY)
        spread = float(((FY - FY.mean(axis=0)) ** 2).sum())
        best = (P, FY, copy.deepcopy(mapping))
        U = be.xp.zeros_like(Z) if self.augmented else 0.0   # scaled multipliers Lambda / mu
        previous_mu = None
        # (Z, E, its gradient) where the last Z step ended: the next one starts there
        # with another target, and E's N-body sums need not be done again (one full
        # evaluation fewer per Z step).
        known = None
        for mu in map(float, schedule):     # NumPy scalars would promote float32 to float64
            if previous_mu is not None:
                U *= previous_mu / mu
            previous_mu = mu
            # One direction per mu: its curvature 4 L+ + mu I does not depend on the
            # target F(Y), so the factorization (or L-BFGS memory) carries over.
            direction = DIRECTIONS[optimizer](Penalized(objective, FY, mu), Z, **direction_params)
            for _ in range(max_inner):
                penalized = Penalized(objective, FY - U, mu)
                z_result = minimize(penalized, Z, direction, max_iter=z_max_iter, tol=z_tol,
                                    step_size=free.step_size, monitor=Monitor(),
                                    initial=None if known is None else penalized.at(*known))
                Z = z_result.X
                # The loop returns the array it evaluated last unless its line search
                # failed (then the start, evaluated before the failed trials).
                known = penalized.last if penalized.last[0] is Z else None
                FY = f_step(False, Z + U, mu)
                if self.augmented:
                    U = U + Z - FY
                P_new = record(FY, mu)
                if P_new < best[0]:
                    best = (P_new, FY, copy.deepcopy(mapping))
                decrease = (P - P_new) / max(abs(P), 1e-300)
                P = P_new
                if decrease < tol:
                    break
            if history[-1]["constraint"] <= constraint_tol * spread:
                break

        # The path need not decrease P(F) monotonically (inexact F steps): keep the best.
        P, FY, self.mapping_ = best
        self.embedding_ = be.to_host(FY)
        self.objective_ = float(P)
        self.history_ = history
        self.n_features_in_ = Y_dev.shape[1]
        self._backend = be
        self._dtype = Z.dtype
        return self

    def fit_transform(self, Y, y=None):
        """Fit to ``Y`` and return ``embedding_``."""
        return self.fit(Y).embedding_

    def transform(self, Y_new):
        """F(Y_new) as a numpy array."""
        check_fitted(self, hasattr(self, "mapping_"))
        be = self._backend
        Y_new = check_data(Y_new, be, name="Y_new", dtype=self._dtype, min_samples=1)
        check_features(Y_new, self, "Y_new")
        Y_new = metric_rows(be, Y_new, self._metric, "Y_new", square=False)
        return be.to_host(be.asarray(self.mapping_.predict(Y_new), dtype=self._dtype))


def path_curvature(objective, Z, FY, fraction=0.01):
    """The curvature v^T H v / v^T v of E along the path's first direction, from
    the free embedding Z towards the direct fit, v = Z - F(Y), by a central
    gradient difference over steps +-t v of ``fraction`` of the layout's spread
    (not of v: a direct fit that nearly reproduces Z leaves a v at rounding
    level); E's attractive curvature 4 mean(D+) at Z where that is not positive
    (F(Y) = Z, or E not convex along v)."""
    V = Z - FY
    vv = float((V * V).sum())
    spread = float(((Z - Z.mean(axis=0)) ** 2).sum())
    if vv > 0 and spread > 0:
        t = fraction * math.sqrt(spread / vv)       # a Python float keeps float32 layouts float32
        G_plus = objective.value_and_grad(Z + t * V)[1]
        G_minus = objective.value_and_grad(Z - t * V)[1]
        curvature = float((V * (G_plus - G_minus)).sum()) / (2.0 * t * vv)
        if np.isfinite(curvature) and curvature > 0:
            return curvature
    return 4.0 * float(objective.be.xp.asarray(objective.attractive_weights(Z).sum(axis=1)).mean())
