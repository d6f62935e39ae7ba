"""Optimization loops: line-search descent, the classic t-SNE optimizer, homotopy.

Source: seed 002 (backtracking line search whose first trial is the previously
accepted step; homotopy for EE) and, for ``tsne_classic``, the optimizer of
van der Maaten & Hinton as used by openTSNE and scikit-learn.
"""
from __future__ import annotations

import collections
import contextlib
import math
import time
from dataclasses import dataclass, field

import numpy as np

from .._checks import check_callbacks, check_float, check_int
from .directions import DIRECTIONS
from .loop_cpu import trust_extent

ARMIJO_C1 = 1e-4
MAX_BACKTRACKS = 40
# The stopping test averages the relative decrease over this many iterations: single
# iterations of slow progress (a short accepted step) stopped s-SNE with SD on
# rotating_objects at objective 0.544 where it goes on to 0.49.  Where the test fires,
# or the line search fails, the loop first asks the direction to renew its curvature
# model (Direction.renew) and, if it does, holds the test for a window of the new
# model's steps.  t-SNE's SD slows as its B, built from the attractive weights at an
# earlier layout, goes stale: on images 20,000-39,999 of Fashion-MNIST its accepted
# steps fell from 0.004 to 1e-8 in the last iterations before B's refresh at 150, and
# the test ended the fit at iteration 149 and KL 1.778, where the rebuilt B went on at
# 2e-4 per iteration, to 1.757 after 362.  A single step of a new B is no test:
# Fashion-MNIST 70k at tol 1e-4, renewed at iteration 149, stopped at 150 on one short
# step where a window of them went on to 236 (KL 2.282 against 2.258).
STOP_WINDOW = 10
# The line search fails at a trial that moves no point by more than this fraction of
# the layout's radius, a move that single precision cannot tell from no move.
# Barnes-Hut's approximate gradient stops being a descent direction of its approximate
# objective near the end of a fit: t-SNE's accepted steps halved at every iteration,
# on Fashion-MNIST 5k from moves of 1e-5 of the radius to 1e-13, and the last search
# halved 40 times, to 1e-24; on four 5k subsets 9-22% of the evaluations went to moves
# below 1e-7.  Failing there the loop asks for a renewal sooner (whose search starts
# afresh, Spectral.renew) or stops: those fits and two of three 20k ones reached their
# old final KL 5-15% sooner, 70k 5% sooner, and most went on to lower KL.  Default fits
# with exact sums took no step below 2e-5; fixed-length ones (tol=0) end at the floor
# once converged: EE on rotating_objects by SD, FP, L-BFGS, CG and GD after 146, 817,
# 101, 225 and 926 of 1,000 iterations, at their former final objectives to 10
# digits.  A first trial below the floor is replaced by step 1: where a direction
# shrinks by orders of magnitude, the step accepted along the last one says nothing
# (L-BFGS's first direction from pairs stopped multi-scale SNE that way, see
# Direction.restart); those EE fits, in which converged directions shrank below their
# last steps, now end after 157, 853, 114, 200 and 926 (1e-13 to 1e-10 lower).  The
# radius is the layout's own: floored at 1, as for TRUST_RADIUS, it failed the first
# search of GD and L-BFGS from a start of standard deviation 1e-6, whose gradient
# moves points by 1e-8 (1% of the radius) at a unit step, and t-SNE and s-SNE came
# back at the start.
MIN_MOVE = 1e-7
# The stopping test asks for a renewal only where the line search has been cutting the
# steps: the window's median accepted step (in units of the direction) below this.
# Where a stale B stalled the fit the medians were 2e-6 to 0.008 (Fashion-MNIST 5k
# subsets, 20 rotating objects), and the renewal went on to lower KL (20 objects:
# 0.668 against 0.772); where the fit had converged with its B they were 0.12 to 1.2,
# and the renewal cost a factorization and 10-58 iterations for KL 0.0001-0.0008
# lower (digits at perplexity 10, Fashion-MNIST 1,500 and 2,000: 0.85-1.51 s against
# 0.60-1.17 s).  A failed line search is the limit of such cuts: it always asks.
STALL_STEP = 0.03
# The line search tries a doubled step only after this many searches in a row
# accepted their first trial.  Doubling after every such search made every other
# search backtrack once: t-SNE with SD on Fashion-MNIST 5k took 1.63 objective
# evaluations per iteration (1.22 with 3) and 41.5 s instead of 20 s to reach the
# classic optimizer's 1000-iteration KL.
GROW_AFTER = 3
# Trust region of the layouts: no point moves farther in one iteration than this
# many times the layout's radius, its points' median distance from their
# coordinates' median (at least the kernel width, 1). A spectral
# direction has near-null modes where a small graph cut joins two clusters (the
# mode's Laplacian eigenvalue is the cut's weight), and the repulsion along them,
# divided by that curvature, flung the clusters apart in the first step: 5 clusters
# of 200 points, largest coordinate 0.2 -> 8,710 (EE), 288 (s-SNE), 8,767 (t-SNE),
# the Armijo test accepting it since the objective did decrease. EE then spent
# hundreds of iterations pulling them back, and the FGT's box count grows with the
# extent. With the limit the largest coordinate stays ~110 for EE. (t-SNE's KL does
# want such clusters far apart, at 1 + D^2 = 2 n1 n2 / (Z p_cut), but gets there
# over many iterations instead of one.) A limit of 3 radii cut the flings further
# but slowed the legitimate long steps (t-SNE's L-BFGS on rotating_objects: KL 0.727
# against 0.702 after 1,000 iterations); with 10 that run and t-SNE's SD are
# unchanged, EE's SD ends lower (11.94 against 11.98).  The RMS radius, as before,
# grows with the few points farthest out, and t-SNE's KL flattens as a component
# moves off (it decreases all the way): with curvature pairs, SD sent one of the 4
# components of 10 rotating objects at perplexity 3 from 1.3e5 units to 1e11 in
# 15 iterations at steps of 32 to 64, KL 0.29079 throughout.  The median grows with
# the bulk of the layout only: 6.9e4 units, KL 0.2909 (1.7e5 and 0.2907 since SD
# restarts its steps after dropping its pairs; same bits on connected graphs: t-SNE,
# EE, s-SNE, SNE with SD, L-BFGS, CG, FP and GD, Fashion-MNIST 5k, digits,
# rotating_objects).  But from another start the component of 432 of those 720
# points, the median point's, moved off and the median distance from the mean with
# it: 2.4e9 units, KL 0.323.  The coordinates' median lies inside a component that
# holds most points: 3.5e5 units, KL 0.2906.
TRUST_RADIUS = 10.0


@dataclass
class Result:
    X: object
    objective: float
    n_iter: int
    history: list = field(default_factory=list)
    converged: bool = False


class Monitor:
    """History, callbacks and verbose progress shared by the loops."""

    def __init__(self, callbacks=None, verbose=False, report_every=10, extra=None):
        self.callbacks = check_callbacks(callbacks)
        self.verbose = int(verbose)
        self.report_every = report_every
        self.extra = extra or {}
        # Iterations of the stages before this one (a fit's exaggerated stage, the
        # lambdas of a homotopy), so that history and callbacks count on across them.
        self.offset = 0
        self.history = []
        self.start = time.perf_counter()

    def record(self, iteration, objective, step, X):
        """Returns True when a callback asks to stop."""
        iteration += self.offset
        elapsed = time.perf_counter() - self.start
        self.history.append({"iter": iteration, "time": elapsed, "objective": objective,
                             "step": step, **self.extra})
        if self.verbose and (iteration % self.report_every == 0 or iteration == 0):
            extra = "".join(f" {k}={v:.4g}" for k, v in self.extra.items())
            print(f"iter {iteration:5d}  objective {objective:.8g}  step {step:.3g}  "
                  f"{elapsed:8.2f} s{extra}", flush=True)
        stop = False
        for callback in self.callbacks:
            stop |= bool(callback(iteration, elapsed, objective, X))
        return stop


def _set_accuracy(objective, schedule, iteration):
    if schedule is not None:
        objective.accuracy = schedule(iteration)


def minimize(objective, X0, direction="sd", *, max_iter=1000, tol=1e-7, step_size=None,
             monitor=None, direction_params=None, schedule=None, serial_blas=True,
             initial=None):
    """Descent with ``direction`` (a name in DIRECTIONS, or a Direction built
    earlier for an objective with the same curvature, to reuse its factorization
    or memory) and an Armijo backtracking line search.

    ``step_size`` switches to fixed steps (no line search), as needed with
    approximate gradients, still within the layouts' trust region (TRUST_RADIUS:
    without it a fixed spectral step flung EE's clusters of Fashion-MNIST 70k
    past the FGT's box count in its first iterations); ``schedule(iteration)``
    sets the N-body accuracy of each iteration (optim/schedules.py).  Stops when
    the relative objective decrease per iteration, averaged over the last
    STOP_WINDOW iterations, falls below ``tol`` (unless the steps were cut, see
    STALL_STEP, and the direction renews its curvature model then, see
    STOP_WINDOW; not while the steps are still growing uncut from the first, nor
    after a step that lowered E by more than its slope predicted), or when the
    line search finds no decrease (unless the direction renews); after
    ``max_iter`` iterations; or when a callback returns True.

    ``serial_blas``: run NumPy's BLAS on one thread meanwhile (see
    Backend.serial_blas); False for objectives whose evaluation is mostly BLAS.
    ``initial``: the objective's (value, gradient) at X0, where the caller has
    them, in place of the first evaluation.
    """
    with objective.be.serial_blas() if serial_blas else contextlib.nullcontext():
        return _minimize(objective, X0, direction, max_iter, tol, step_size, monitor,
                         direction_params, schedule, initial)


def _minimize(objective, X0, direction, max_iter, tol, step_size, monitor, direction_params,
              schedule, initial):
    monitor = monitor or Monitor()
    X = X0.copy()
    _set_accuracy(objective, schedule, 0)
    E, G = objective.value_and_grad(X) if initial is None else initial
    d = (DIRECTIONS[direction](objective, X, **(direction_params or {}))
         if isinstance(direction, str) else direction)
    step, streak, hold = 1.0, 0, 0
    # Whether a search has cut a step or reached the direction's natural step or the
    # trust step: until then the steps are still growing from 1, and slow progress
    # says they are short, not that the fit converged.  GD, L-BFGS and CG from
    # init="random" (1,000 digits, t-SNE and s-SNE) lowered KL by less than tol of
    # itself in their first unit step and stopped at the start after one iteration.
    calibrated = step_size is not None
    is_layout = getattr(objective, "is_layout", False)
    recent = collections.deque([E], maxlen=STOP_WINDOW + 1)
    steps = collections.deque(maxlen=STOP_WINDOW)
    if monitor.record(0, E, 0.0, X):
        return Result(X, E, 0, monitor.history)
    it = 0
    while it < max_iter:
        it += 1
        _set_accuracy(objective, schedule, it)
        P = d(X, G)
        P, slope, trust, floor = _descent(objective.be, d, X, G, P, is_layout)
        if step_size is not None:
            alpha = min(step_size, trust)
            X_new = X + alpha * P
            E_new, G_new = objective.value_and_grad(X_new)
        else:
            grow = streak >= GROW_AFTER
            alpha, retry = min(d.initial_step(step, grow), trust), d.retry_step()
            retry = None if retry is None else min(retry, trust)
            streak = 0 if grow else streak
            if alpha < floor:
                # The direction shrank by orders of magnitude since the last step (a new
                # scale that did not set Direction.restart): its own unit step, not none.
                alpha = min(1.0, trust)
            for backtracks, alpha in zip(range(MAX_BACKTRACKS),
                                         _trial_steps(alpha, retry, floor)):
                X_new = X + alpha * P
                E_new, G_new = objective.value_and_grad(X_new)
                # A non-finite value is an approximation failing, never a decrease: the
                # FGT's absolute error made one point's normalizer of SNE <= 0, log gave
                # -inf, and the accepted step ended in NaN coordinates.  The test is
                # strict: once alpha * slope vanishes against E, "<=" accepted steps
                # that left E (and X) as they were, and t-SNE with Barnes-Hut sums
                # (Fashion-MNIST 20k, sd_refresh=50) spent 750 of 1,000 iterations at
                # steps of 1e-16, its approximate gradient no longer a descent
                # direction of its approximate objective.
                if math.isfinite(E_new) and E_new < E + ARMIJO_C1 * alpha * slope:
                    break
            else:
                if d.renew(STOP_WINDOW):          # the same iteration, with the new model
                    it, hold = it - 1, STOP_WINDOW
                    continue
                return Result(X, E, it - 1, monitor.history, converged=True)
            step, streak = alpha, (streak + 1 if backtracks == 0 else 0)
            calibrated = calibrated or backtracks > 0 or alpha >= min(d.natural_step, trust)
        d.update(X, X_new, G, G_new)
        recent.append(E_new)
        steps.append(alpha)
        change = abs(recent[0] - E_new) / ((len(recent) - 1) * max(abs(E_new), 1e-300))
        # A step that lowered E by more than its slope predicts met negative curvature:
        # a saddle's flat region, however little E changed, is no minimum.  s-SNE's and
        # SNE's FP from a start of 1e-3 (1,000 digits) lowered KL by 3e-6 of itself in
        # its first (natural) step near X = 0, where E changes as |X|^2, and stopped
        # there; the decreases grew 4-fold per iteration and left that region after 10.
        concave = E - E_new > -alpha * slope
        X, E, G = X_new, E_new, G_new
        if monitor.record(it, E, alpha, X):
            return Result(X, E, it, monitor.history)
        hold = max(hold - 1, 0)
        if change < tol and not hold and calibrated and not concave:
            if not (np.median(steps) < STALL_STEP and d.renew(STOP_WINDOW)):
                return Result(X, E, it, monitor.history, converged=True)
            hold = STOP_WINDOW
    return Result(X, E, max_iter, monitor.history)


def _descent(be, d, X, G, P, layout):
    """(P, its slope <G, P>, its trust and floor steps; see _slope_and_trust) where P
    is a descent direction, else the same for the direction's retry
    (Direction.descent_retry) where that is one, else for -G (_steepest_descent)."""
    slope, trust, floor = _slope_and_trust(be, X, G, P, layout)
    if slope < 0:
        return P, slope, trust, floor
    retried = d.descent_retry(X, G)
    if retried is not None:
        slope, trust, floor = _slope_and_trust(be, X, G, retried, layout)
        if slope < 0:
            return retried, slope, trust, floor
    fallback = -G if d.gradient_units else _steepest_descent(be, G, P)
    return (fallback,) + _slope_and_trust(be, X, G, fallback, layout)


def _steepest_descent(be, G, P):
    """-G at the length of P, the direction it stands in for, so that the line
    search's steps keep their scale.  Unscaled, it moved t-SNE's points 1e-6 times
    as far as SD's direction at the same step (Fashion-MNIST 5k, exact sums, where
    the truncated CG's direction stopped being a descent direction 171 times), and
    the steps took 44 iterations of doubling to move the layout again.  Directions
    in the gradient's units keep -G as it is: nonlinear CG, whose direction is -G
    plus a multiple of the last one, ended higher in 7 of 10 fits of 400 iterations
    with it scaled (rotating_objects at perplexity 10, t-SNE: KL 0.894 against
    0.870)."""
    xp = be.xp
    length, norm = be.host_floats(xp.sqrt(xp.vdot(P, P)), xp.sqrt(xp.vdot(G, G)))
    scale = length / norm if math.isfinite(length) and length > 0 and norm > 0 else 1.0
    return -scale * G


def _trial_steps(first, retry=None, floor=0.0):
    """The line search's trial steps: ``first``, then ``retry`` when it is longer
    (once), then ``first`` halved again and again; none below ``floor``."""
    if first >= floor:
        yield first
    if retry is not None and retry > first:
        yield retry
    while first * 0.5 >= floor:
        first *= 0.5
        yield first


def _slope_and_trust(be, X, G, P, layout):
    """<G, P>, the longest step along P that keeps every point within the trust
    region (infinite unless X is a ``layout``) and the shortest that moves a point by
    MIN_MOVE of the layout's radius (0 unless a layout); on the GPU in one host read (a
    read waits for all the queued work)."""
    xp = be.xp
    if not layout:
        return float(xp.vdot(G, P)), math.inf, 0.0
    if xp is np:
        # be.median's partition copies; np.median(X, axis=0) of a 70k layout took
        # 1.3 ms, about 4% of a default t-SNE iteration there with the radii's.
        centre = [be.median(X[:, k]) for k in range(X.shape[1])]
        radii, longest = trust_extent(X, P, np.array(centre, dtype=X.dtype))
        slope, radius = float(np.vdot(G, P)), be.median(radii)
    else:
        centre = xp.median(X, axis=0)
        slope, radius, longest = be.host_floats(
            xp.vdot(G, P), xp.median(xp.sqrt(((X - centre) ** 2).sum(axis=1))),
            xp.sqrt((P * P).sum(axis=1)).max())
    if not longest > 0:
        return slope, math.inf, 0.0
    return slope, TRUST_RADIUS * max(radius, 1.0) / longest, MIN_MOVE * radius / longest


def tsne_classic(objective, X0, *, max_iter=1000, learning_rate=None, exaggeration=12.0,
                 exaggeration_iter=250, momentum=(0.5, 0.8), monitor=None, schedule=None):
    """The classic t-SNE optimizer: gradient steps with momentum 0.5 -> 0.8 and
    per-coordinate gains (+0.2 / x0.8, floor 0.01), early exaggeration 12 for the
    first 250 iterations, learning rate N / 12 (openTSNE's and scikit-learn's).
    Exaggeration multiplies the attractive term; P itself is never modified.
    Runs all ``max_iter`` iterations unless a callback stops it.

    As ``minimize`` does, record ``it`` is the layout after ``it`` updates with
    its own objective (the exaggerated one, marked "exaggeration", during the
    first stage), from the start layout to the final one: max_iter + 1 records."""
    xp = objective.be.xp
    monitor = monitor or Monitor()
    n = X0.shape[0]
    lr = n / 12.0 if learning_rate is None else float(learning_rate)
    X = X0.copy()
    update = xp.zeros_like(X)
    gains = xp.ones_like(X)
    for it in range(max_iter):
        early = it < exaggeration_iter
        objective.exaggeration = exaggeration if early else 1.0
        monitor.extra = {"exaggeration": objective.exaggeration}
        _set_accuracy(objective, schedule, it)
        E, G = objective.value_and_grad(X)
        if monitor.record(it, E, lr, X):
            break
        same_sign = (G > 0) == (update > 0)
        gains = xp.maximum(xp.where(same_sign, gains * 0.8, gains + 0.2), 0.01)
        update = (momentum[0] if early else momentum[1]) * update - lr * gains * G
        X = X + update
        X -= X.mean(axis=0)
    else:                               # no callback stopped it: all max_iter updates made
        it = max_iter
    objective.exaggeration = 1.0
    monitor.extra = {"exaggeration": 1.0}
    E, _ = objective.value_and_grad(X)
    if it == max_iter:
        monitor.record(it, E, lr, X)
    return Result(X, E, it, monitor.history, converged=True)


def homotopy(objective, X0, direction="sd", *, lambdas, max_iter=1000, tol=1e-7,
             step_size=None, monitor=None, direction_params=None, schedule=None):
    """Follow the minimizer along ``lambdas`` (increasing), each stage started from
    the last one's solution (seed 002 section 3.1, homotopy training of EE).
    The iteration budget ``max_iter`` applies to each stage."""
    lambdas = [check_float(lam, "lambdas", 0.0) for lam in lambdas]
    if not lambdas or any(b <= a for a, b in zip(lambdas, lambdas[1:])):
        raise ValueError(f"lambdas must be a non-empty increasing sequence, got {lambdas}")
    monitor = monitor or Monitor()
    X = X0
    total = 0
    result = None
    for lam in lambdas:
        objective.lambda_ = float(lam)
        monitor.extra, monitor.offset = {"lambda": float(lam)}, total
        result = minimize(objective, X, direction, max_iter=max_iter, tol=tol,
                          step_size=step_size, monitor=monitor,
                          direction_params=direction_params, schedule=schedule)
        X = result.X
        total += result.n_iter
    return Result(X, result.objective, total, monitor.history, converged=result.converged)


def homotopy_path(lambda_, n_steps=10, start_ratio=1e-4):
    """Log-spaced lambdas from ``start_ratio * lambda_`` up to ``lambda_``."""
    lambda_ = check_float(lambda_, "lambda_", 0.0, low_open=True)
    n_steps = check_int(n_steps, "n_steps", 1)
    start_ratio = check_float(start_ratio, "start_ratio", 0.0, 1.0, low_open=True)
    return np.geomspace(start_ratio * lambda_, lambda_, n_steps)
