"""Estimators TSNE, SSNE, EE, SNE and MultiscaleSNE (scikit-learn style).

``fit`` computes entropic affinities (unless given), an initial embedding
(initialization.py), and minimizes the objective (objectives/) with the chosen
optimizer (optim/).  ``transform`` maps new points with the training embedding
fixed (out_of_sample.py): each new point minimizes the objective restricted to
its own terms, all new points together.
"""
from __future__ import annotations

import inspect
import math
import time
import types
from typing import NamedTuple

import numpy as np
import scipy.sparse

from ._checks import (check_bool, check_callbacks, check_choice, check_data, check_dtype,
                      check_features, check_fitted, check_float, check_int, check_random_state,
                      check_verbose, warn)
from ._params import Params, TransformerOutput, fill_doc
from .affinities import EntropicAffinities, entropic_affinities
from .affinities.entropic import conditional_affinities
from .backend import get_backend
from .initialization import (INIT_STD, INITS, check_graph_init, check_init, initial_layout,
                             warn_wide_classic_start)
from .nbody import check_accuracy, resolve_method
from .neighbors import METRICS, knn_query, metric_rows, search_metric
from .neighbors_ivf import SEARCHES, QuerySearch
from .objectives import OBJECTIVES, default_lambda, make_objective
from .optim import (DIRECTIONS, Monitor, Result, accuracy_schedule, homotopy, homotopy_path,
                    minimize, tsne_classic)
from .optim.directions import Spectral, check_refresh, connected_components
from .out_of_sample import TRANSFORM_MAX_ITER, MultiscaleOutOfSample, OutOfSample, rms_radius

__all__ = ["TSNE", "SSNE", "EE", "SNE", "MultiscaleSNE"]

# tol="auto": AUTO_TOL below AUTO_TOL_LARGE_FROM points, AUTO_TOL_LARGE from there on.
# The stopping test's tail costs little on small sets and can still improve them (10
# rotating objects, t-SNE: KL 0.697 and 10-NN accuracy 0.983 at 1e-5 in 0.3 s, 0.745
# and 0.967 at 1e-4), while on large ones it buys about 1% of KL for half or more of
# the time at the same accuracy (the default t-SNE of Fashion-MNIST, affinities given,
# 1e-5 against 1e-4: 10k 3.1 s against 1.8 s and 5.7 s against 1.9 s on two subsets,
# 20k 11.5 s against 3.9 s, 40k 20.1 s against 9.0 s, 70k 34.1 s and 403 iterations
# against 17.8 s and 230, KL 2.246 against 2.269, accuracy 0.8465 against 0.8468; EE
# at 20k 11.9 s against 7.7 s, E 26.09 against 26.23; AMD EPYC, 2 cores).
AUTO_TOL, AUTO_TOL_LARGE, AUTO_TOL_LARGE_FROM = 1e-5, 1e-4, 10_000
# Parameters the optimizers and affinities accept through **method_params.
METHOD_PARAMS = {"n_neighbors", "neighbors", "metric", "kappa", "sd_solver", "sd_refresh",
                 "sd_memory", "sd_memory_start", "lbfgs_memory",
                 "step_size", "learning_rate", "early_exaggeration", "exaggeration_iter",
                 "transform_max_iter", "accuracy", "accuracy_schedule"}
# The optimizers that read each optimizer-specific method parameter (step_size: the
# line-search ones).  Any other ignores it, so giving it there raises: openTSNE's
# learning_rate given to the default optimizer "sd" changed nothing, silently.
OPTIMIZER_PARAMS = {"kappa": ("sd", "sd-"), "sd_memory": ("sd", "sd-"),
                    "sd_memory_start": ("sd", "sd-"), "sd_solver": ("sd",), "sd_refresh": ("sd",),
                    "lbfgs_memory": ("lbfgs",), "learning_rate": ("tsne",),
                    "step_size": tuple(DIRECTIONS)}
# Those the directions take, as (keyword, default) of their constructors.
DIRECTION_KEYWORDS = {"kappa": ("kappa", None), "sd_memory": ("memory", 0),
                      "sd_memory_start": ("memory_start", 0), "sd_solver": ("solver", "auto"),
                      "sd_refresh": ("refresh", "auto"), "lbfgs_memory": ("m", 100)}
# The exaggerated stage's layout counts as collapsed below this fraction of the
# start's RMS radius.
COLLAPSED = 1e-3


# The numpydoc sections the estimators share (filled in by fill_doc).
_PARAMETERS = """
n_components : int, default 2
    Dimension of the embedding, 1 to N - 2 (at most 3 for the "fgt" and "bh"
    engines).
perplexity : float, default 30
    Effective number of neighbours in each point's entropic affinities
    (:func:`gpuembed.entropic_affinities`, over its min(N - 1, 3 perplexity)
    nearest neighbours); unused when ``affinities`` is given.
affinities : EntropicAffinities, (N, N) sparse or dense matrix, or None
    Affinities to embed instead of computing them from X: symmetric, and a
    joint distribution (summing to 1) for TSNE and SSNE; for SNE conditional
    rows, each summing to 1 (``entropic_affinities(..., symmetrize=False)``).
    With them X may be None (``fit(None)``, e.g. for a graph without
    coordinates), from ``init="spectral"``, ``"random"`` or an array.
optimizer : str, default "sd"
    The direction of the line-search loop: "sd" spectral direction (4 L+ + mu I
    by a cached Cholesky factor or warm-started CG), "sd-" (with the
    repulsion's positive block diagonal), "fp" (diagonal 4 D+), "diagh" (the
    Hessian's diagonal, floored at 0.4 D+), "lbfgs", "cg" (nonlinear,
    Polak-Ribiere+) or "gd";
    TSNE also takes "tsne", the classic optimizer.  SNE takes "gd", "fp",
    "sd", "lbfgs" and "cg".
nbody : {"auto", "exact", "fgt", "bh"}, default "auto"
    Engine of the repulsive N-body sums: "exact" (tiled, O(N^2)), "fgt" (fast
    Gauss transform, Gaussian kernels: EE, SSNE, SNE) or "bh" (Barnes-Hut).
    "auto": exact below 5,000 points on the CPU (on the GPU below 40,000 for
    t-SNE, 120,000 for the others) or in more than 3 dimensions, else "bh"
    for t-SNE and "fgt" for the others.
max_iter : int, default 1000
    Iterations at most (the classic optimizer runs all of them).
tol : float or "auto", default "auto"
    Stop when the objective's relative decrease per iteration, averaged over
    10 iterations, falls below it (0: run max_iter iterations).  "auto": 1e-5
    below 10,000 points, 1e-4 from there on, where the last 1% of the
    objective would take as long again.
init : {"pca", "random", "spectral"} or (N, n_components) array, default "pca"
    The start, scaled so its first coordinate has standard deviation 0.1
    (1e-4 for the classic optimizer); an array is taken as it is.
"""
_RUN_PARAMETERS = """
random_state : None, int, numpy Generator or RandomState
    Seeds the random start and the jitter that frees a start's tied points;
    the rest of a fit is deterministic, so one seed on one backend gives one
    embedding.
backend : {"auto", "cpu", "gpu"}, default "auto"
    "auto": the GPU when CuPy and a CUDA device are present, else the CPU.
dtype : None, float32 or float64
    Precision of the layout and its sums; None: float64 on the CPU, float32 on
    the GPU.
verbose : bool or int, default False
    Print a line per stage and every 10 iterations (objective, step, seconds).
callbacks : callable or list of callables, optional
    Called after every iteration as ``f(iteration, seconds, objective)``, or
    with a fourth parameter ``f(..., embedding)`` (the layout on the backend's
    device); one that returns True stops the fit.
"""
_METHOD_PARAMS = """
**method_params
    Keywords of the affinities, optimizers and engines (one the chosen
    optimizer would ignore raises TypeError):

    - ``n_neighbors``: the affinities' k (default min(N - 1, ceil(3
      perplexity))); ``neighbors``: the search for them and for transform's
      neighbours, "auto" (approximate from 50,000 points on the CPU), "exact"
      or "approx"; ``metric``, "euclidean" (the default), "cosine" (the rows,
      and transform's new rows, scaled to unit length first: for text) or
      "precomputed" (X an (N, N) matrix of distances, sorted for each point's
      neighbours, or a sparse k-NN graph of them, each row's stored entries;
      init="pca" is then classical MDS, the data's PCA scores for Euclidean
      distances, which a sparse graph refuses; transform takes the new points'
      (M, N) distances to the training points, dense or sparse).
    - "sd": ``kappa``, the affinities each point keeps in L+ (default all of
      them up to 2,000 points, 15 beyond, doubled until the kept graph is as
      connected as the whole); ``sd_solver``, "auto", "cholesky", "cg" or
      "twolevel" (CPU: an additive two-level approximation of B's inverse,
      refreshed every 25 iterations for t-SNE; "auto" takes it for t-SNE of up
      to 2,000 points whose affinities hold 50 or more entries per row, about
      perplexity 15 and up, on a connected graph);
      ``sd_refresh``, rebuild B from the current layout every R iterations
      ("auto": 50 for t-SNE, 25 with "twolevel", never for the others; None:
      never);
      ``sd_memory`` and ``sd_memory_start``, L-BFGS curvature pairs on top of
      B, gathered after that many iterations (defaults per estimator, see
      Notes).  "lbfgs": ``lbfgs_memory`` (default 100).
    - ``step_size``: fixed steps instead of the line search (for approximate
      gradients); not for "tsne".
    - TSNE: ``learning_rate`` ("auto", the default: N / 12),
      ``early_exaggeration`` (12 for the classic optimizer; for the others a
      first stage only where given) and ``exaggeration_iter`` (250).
    - ``accuracy``: the engine's, ``{"theta": 0.5}`` for "bh" (the default),
      ``{"p": 8}`` (the default) or ``{"tol": t}`` for "fgt"; or
      ``accuracy_schedule``, n: a ramp over the first n iterations (theta 2
      to 0.1, p 1 to 10).
    - ``transform_max_iter``: iterations of :meth:`transform` (default 200).
"""
_ATTRIBUTES = """
embedding_ : (N, n_components) numpy array
    The fitted layout.
objective_ : float
    Its objective, as the fit's N-body engine computes it.
n_iter_ : int
    Iterations run (all stages).
history_ : list of dict
    One per layout from the start (iteration 0): "iter", "time" (seconds),
    "objective", "step", and the stage's "exaggeration" (TSNE) or
    "smallest_perplexity" (MultiscaleSNE) where there are stages.  A stage
    counts on from the iteration where the last ended, with a record of its
    own objective at that layout; the last record's "iter" is n_iter_.
n_features_in_ : int
    Features of the training data.
"""
_DOCUMENTED = fill_doc(
    parameters=_PARAMETERS, run_parameters=_RUN_PARAMETERS, method_params=_METHOD_PARAMS,
    attributes=_ATTRIBUTES,
    sections="\n".join(["Parameters", "----------", *map(inspect.cleandoc, (
        _PARAMETERS, _RUN_PARAMETERS, _METHOD_PARAMS)), "", "Attributes", "----------",
        inspect.cleandoc(_ATTRIBUTES)]))


class FreeFit(NamedTuple):
    """A fitted free embedding as a parametric embedding's Z steps take it
    (``estimator._free_fit(X)``, parametric/mac.py)."""

    be: object                  # the backend
    X: object                   # the data and the layout, on its device
    Z: object
    objective: object
    optimizer: str              # the Z steps' direction, with its parameters
    direction_params: dict
    step_size: float | None     # fixed steps (approximate gradients), else None
    metric: str                 # X is the data's rows as the metric compares them


class _Embedding(TransformerOutput, Params):
    objective_name = None
    extra_params = METHOD_PARAMS
    optimizers = tuple(DIRECTIONS)
    SD_MEMORY = {}          # SD's curvature pairs where sd_memory is not given (see EE, SSNE)
    _min_samples = 4        # the fewest points fit takes (ParametricEmbedding checks too)

    def __init__(self, n_components=2, perplexity=30.0, *, affinities=None, optimizer="sd",
                 nbody="auto", max_iter=1000, tol="auto", init="pca", random_state=None,
                 backend="auto", dtype=None, verbose=False, callbacks=None, **method_params):
        unknown = set(method_params) - METHOD_PARAMS
        if unknown:
            raise TypeError(f"unknown parameter(s) {sorted(unknown)}; method parameters are "
                            f"{sorted(METHOD_PARAMS)}")
        self.n_components = n_components
        self.perplexity = perplexity
        self.affinities = affinities
        self.optimizer = optimizer
        self.nbody = nbody
        self.max_iter = max_iter
        self.tol = tol
        self.init = init
        self.random_state = random_state
        self.backend = backend
        self.dtype = dtype
        self.verbose = verbose
        self.callbacks = callbacks
        self._method_params = method_params

    # -- fitting -----------------------------------------------------------
    def fit(self, X, y=None):
        """Embed X (N, D), dense or sparse; ``y`` is ignored (scikit-learn pipelines).

        With ``affinities`` given, X may be None: the layout then comes from the
        affinities alone (a graph without coordinates, or one built with another
        metric), from ``init="spectral"``, ``"random"`` or an array, and ``transform``,
        which needs the training points, is not available."""
        be = get_backend(self.backend)
        if X is None and self.affinities is not None:
            n = _given_matrix(self.affinities).shape[0]
            if n < 4:
                raise ValueError(f"affinities need at least 4 points, got {n}")
            metric = self._metric()
            if metric != "euclidean":
                raise ValueError(f"metric={metric!r} applies to the data X, and fit(None) "
                                 f"embeds the given affinities alone")
        elif X is None:
            raise ValueError("X is required, unless affinities are given (then fit(None) "
                             "embeds them alone)")
        else:
            X = metric_rows(be, check_data(X, be, min_samples=self._min_samples, sparse=True),
                            self._metric())
            n = X.shape[0]
        d = check_int(self.n_components, "n_components", 1, n - 2)
        max_iter = check_int(self.max_iter, "max_iter", 1)
        tol = check_tol(self.tol, n)
        check_choice(self.optimizer, "optimizer", self.optimizers)
        check_random_state(self.random_state)
        check_callbacks(self.callbacks)
        check_verbose(self.verbose)
        init = check_init(self.init, n, d, be, INITS)
        if self.optimizer == "tsne" and not isinstance(init, str):
            warn_wide_classic_start(init)
        if X is None and isinstance(init, str) and init == "pca":
            raise ValueError("init='pca' needs the data X; to embed affinities alone "
                             "(fit(None)) take init='spectral', 'random' or an (N, "
                             "n_components) array")
        check_graph_init(init, X, self._metric(), INITS)
        self._check_method_params()
        objective_params = self._objective_params(n)
        self._exaggeration_stage(max_iter, self._method_params)     # checked before the affinities
        dtype = check_dtype(self.dtype, be)
        nbody = resolve_method(self.nbody, n, d, OBJECTIVES[self.objective_name].kernel, be)
        accuracy = check_accuracy(nbody, self._method_params.get("accuracy"))
        start = time.perf_counter()
        P = self._affinity_matrix(X, be)
        start = _stage(self.verbose, start, f"affinities: {n} points, {int(P.nnz)} pairs"
                       + ("" if self.affinities is None else " (given)"))
        chosen = {k: v for k, v in self._graph_params(P, be).items()
                  if k not in self._method_params}
        self._fit_params = {**chosen, **self._method_params}
        self._exaggeration = self._exaggeration_stage(max_iter, self._fit_params)
        objective = make_objective(self.objective_name, P, be, dtype, nbody=nbody,
                                   **objective_params)
        objective.accuracy = accuracy
        X0 = self._initial(X, n, P, be, dtype, d, init)
        del P           # the objective holds its own copy (1.7 GB at 10^6 points)
        shown = "".join(f", {k}={v}" if isinstance(v, str) else f", {k}={v:g}"
                        for k, v in chosen.items())
        _stage(self.verbose, start, f"setup: initial layout {_init_name(self.init)}, optimizer "
                                    f"{self.optimizer}, N-body engine {nbody}{shown}")
        monitor = Monitor(self.callbacks, self.verbose)
        result = self._optimize(objective, X0, max_iter, tol, monitor)
        if result.n_iter == 0 and result.converged and self.optimizer != "tsne":
            warn(f"{type(self).__name__}: the first line search found no decrease, so the "
                 "start is returned as it is (n_iter_ = 0): to working precision it is a "
                 "stationary point of the objective (for t-SNE and s-SNE so is a start far "
                 "inside the kernel's width, e.g. of standard deviation 1e-8); start wider "
                 "or take optimizer='sd'")
        self.embedding_ = be.to_host(result.X)
        self.objective_ = float(result.objective)
        self.n_iter_ = int(result.n_iter)
        self.history_ = result.history
        self._fitted = (be, X, result.X, objective, n)
        if X is None:
            self.__dict__.pop("n_features_in_", None)
            self.__dict__.pop("_queries", None)
        else:
            self.n_features_in_ = X.shape[1]
            self._queries = QuerySearch(X, self._method_params.get("neighbors"), be,
                                        self._metric())
        return self

    def fit_transform(self, X, y=None):
        """Fit to ``X`` and return ``embedding_``."""
        return self.fit(X).embedding_

    def _free_fit(self, X):
        """Fit, and the problem a parametric embedding's Z steps solve
        (parametric/mac.py); the classic optimizer has no use for a penalty, so
        its Z steps take the spectral direction."""
        self.fit(X)
        be, X_dev, Z, objective, _ = self._fitted
        if self.optimizer == "tsne":
            return FreeFit(be, X_dev, Z, objective, "sd", {}, None, self._metric())
        # The user's parameters only: _graph_params chose the free fit's own.
        return FreeFit(be, X_dev, Z, objective, self.optimizer,
                       self._direction_params(self._method_params),
                       self._method_params.get("step_size"), self._metric())

    def __getstate__(self):
        # A pickled or copied model keeps what transform needs; the objective's
        # affinity pairs (about 100 bytes per edge) stay behind.
        state = dict(self.__dict__)
        if "_fitted" in state:
            be, X, Y, objective, n = state["_fitted"]
            kept = types.SimpleNamespace(lambda_=getattr(objective, "lambda_", None),
                                         nbody=objective.nbody, accuracy=objective.accuracy)
            state["_fitted"] = (be, X, Y, kept, n)
        return state

    def _objective_params(self, n):
        return {}

    def _metric(self):
        """The ``metric`` method parameter, checked (fit reads it before the others)."""
        return check_choice(self._method_params.get("metric") or "euclidean", "metric", METRICS)

    def _check_method_params(self):
        """The optimizers' and transform's parameters, checked before the
        affinities are computed (the directions check theirs only when built)."""
        checks = {
            "step_size": lambda v: check_float(v, "step_size", 0.0, low_open=True),
            "neighbors": _check_search,
            "kappa": lambda v: check_int(v, "kappa", 1),
            "sd_solver": lambda v: check_choice(v, "sd_solver", Spectral.SOLVERS),
            "sd_refresh": check_refresh,
            "sd_memory": lambda v: check_int(v, "sd_memory", 0),
            "sd_memory_start": lambda v: check_int(v, "sd_memory_start", 0),
            "lbfgs_memory": lambda v: check_int(v, "lbfgs_memory", 1),
            "learning_rate": lambda v: (check_choice(v, "learning_rate", ("auto",))
                                        if isinstance(v, str) else
                                        check_float(v, "learning_rate", 0.0, low_open=True)),
            "early_exaggeration": lambda v: check_float(v, "early_exaggeration", 1.0),
            "exaggeration_iter": lambda v: check_int(v, "exaggeration_iter", 0),
            "transform_max_iter": lambda v: check_int(v, "transform_max_iter", 1),
            "accuracy_schedule": lambda v: check_int(v, "accuracy_schedule", 1),
        }
        for name, value in self._method_params.items():
            if value is None:
                continue
            readers = OPTIMIZER_PARAMS.get(name)
            if readers is not None and self.optimizer not in readers:
                raise TypeError(f"{name} applies to optimizer "
                                f"{' or '.join(map(repr, readers))} only, not {self.optimizer!r}")
            if name in checks:
                checks[name](value)
        p = self._method_params
        if p.get("accuracy_schedule") is not None and p.get("accuracy"):
            raise TypeError("give either accuracy (fixed) or accuracy_schedule, not both")

    def _graph_params(self, P, be):
        """Method parameters chosen for the ones not given: SD's curvature pairs,
        SD_MEMORY (t-SNE's only where SD solves by the factor, and other ones where
        its affinity graph splits, see TSNE)."""
        if self.optimizer != "sd" or "sd_memory" in self._method_params:
            return {}
        return dict(self.SD_MEMORY)

    def _optimize(self, objective, X0, max_iter, tol, monitor):
        p = self._fit_params
        if self.optimizer == "tsne":
            # Like openTSNE, the classic optimizer runs all max_iter iterations: its
            # momentum phase has plateaus where a relative-change test stops it too
            # early (rotating_objects, perplexity 30: stopped near iteration 260 with
            # 10-NN accuracy 0.34 instead of 0.99).
            rate = p.get("learning_rate")
            return tsne_classic(objective, X0, max_iter=max_iter,
                                learning_rate=None if rate == "auto" else rate,
                                exaggeration=p.get("early_exaggeration", 12.0),
                                exaggeration_iter=p.get("exaggeration_iter", 250),
                                monitor=monitor, schedule=self._schedule(objective))
        run = lambda X, n_iter, run_tol: minimize(
            objective, X, self.optimizer, max_iter=n_iter, tol=run_tol,
            step_size=p.get("step_size"), monitor=monitor,
            direction_params=self._direction_params(p), schedule=self._schedule(objective))
        if self._exaggeration is None:
            return run(X0, max_iter, tol)
        # Opt-in for the line-search optimizers: a first stage on the exaggerated
        # objective, then the plain one, each with its own direction.
        alpha, stage = self._exaggeration
        objective.exaggeration = alpha
        monitor.extra = {"exaggeration": alpha}
        first = run(X0, stage, 0.0)
        start, end = rms_radius(X0), rms_radius(first.X)
        if end < COLLAPSED * start:
            # Past some exaggeration X = 0 becomes a minimum of the exaggerated
            # objective, which a line search finds (5,000 documents of 20 topics:
            # 2 and 4 spread the layout, 8 and 12 shrank it to 1e-8); the plain
            # objective's gradient vanishes there and its stage stopped at once.
            raise ValueError(
                f"early_exaggeration={alpha:g} collapsed the layout to a point (RMS radius "
                f"{start:.3g} -> {end:.3g}): with a line-search optimizer the exaggerated "
                f"attraction outweighs the repulsion at X = 0; use a smaller "
                f"early_exaggeration (2 to 4) or optimizer='tsne'")
        objective.exaggeration = 1.0
        monitor.extra = {"exaggeration": 1.0}
        # max_iter reached inside the stage, or a callback stopped it there
        if first.n_iter >= max_iter or (first.n_iter < stage and not first.converged):
            E, _ = objective.value_and_grad(first.X)
            return Result(first.X, E, first.n_iter, monitor.history)
        monitor.offset = first.n_iter
        second = run(first.X, max_iter - first.n_iter, tol)
        second.n_iter += first.n_iter
        return second

    def _exaggeration_stage(self, max_iter, p):
        """(factor, iterations) of the early exaggeration of the line-search
        optimizers in the parameters ``p``, or None; checked on the user's before
        the affinities are computed."""
        if "early_exaggeration" not in p or self.optimizer == "tsne":
            return None
        if self.objective_name != "tsne":
            raise TypeError(f"early_exaggeration applies to TSNE only, not {type(self).__name__}")
        alpha = check_float(p["early_exaggeration"], "early_exaggeration", 1.0)
        stage = check_int(p.get("exaggeration_iter", 250), "exaggeration_iter", 1)
        return None if alpha == 1.0 else (alpha, min(stage, max_iter))

    def _schedule(self, objective):
        """The accuracy ramp of method_params ``accuracy_schedule`` (its length in
        iterations; None: hold ``accuracy`` fixed)."""
        n_iter = self._method_params.get("accuracy_schedule")
        if n_iter is None:
            return None
        return accuracy_schedule(objective.nbody, n_iter)

    def _direction_params(self, p):
        return {keyword: p.get(name, default)
                for name, (keyword, default) in DIRECTION_KEYWORDS.items()
                if self.optimizer in OPTIMIZER_PARAMS[name]}

    def _affinity_matrix(self, X, be):
        A = self.affinities
        if A is None:
            p = self._method_params
            A = entropic_affinities(X, self.perplexity, n_neighbors=p.get("n_neighbors"),
                                    neighbors=p.get("neighbors"),
                                    metric=search_metric(self._metric()),
                                    symmetrize=self.objective_name != "sne", backend=be)
        P = _given_matrix(A)
        if X is not None and P.shape[0] != X.shape[0]:
            raise ValueError(f"affinities are {P.shape[0]} x {P.shape[0]} but X has "
                             f"{X.shape[0]} rows")
        # A canonical copy (sorted indices, no duplicates), the same whatever order
        # the caller's entries come in, so that the objective and a spectral
        # initialization see one matrix; the caller's stays as it is.  The fit's own
        # affinities need no copy.
        P = be.sparse.csr_matrix(P if hasattr(P, "tocsr") else be.asarray(P),
                                 copy=self.affinities is not None)
        P.sum_duplicates()         # its values are checked by make_objective (check_affinities)
        self._perplexity_used = self.perplexity
        return P

    def _initial(self, X, n, P, be, dtype, d, init):
        def spectral():
            from .spectral import spectral_embedding
            from .spectral.embedding import points_suit_shift_invert

            W = P if self.objective_name != "sne" else (P + P.T) * 0.5
            return be.to_host(spectral_embedding(W, d, backend=be,
                                                 shift_invert=points_suit_shift_invert(X)))

        std = INIT_STD["tsne" if self.optimizer == "tsne" else "default"]
        return initial_layout(init, X, d, be, dtype, std, self.random_state,
                              {"spectral": spectral}, n=n, metric=self._metric())

    # -- out-of-sample -----------------------------------------------------
    def transform(self, X_new):
        """Embed new points with the training embedding fixed (each point on its own,
        all of them in one batch: see OutOfSample.minimize)."""
        check_fitted(self, hasattr(self, "_fitted"))
        be, X_train, Y_train, objective, n = self._fitted
        if X_train is None:
            raise ValueError(f"transform needs the training points, and this "
                             f"{type(self).__name__} was fitted to affinities alone "
                             f"(fit(None)); fit it with X to map new points")
        X_new = check_data(X_new, be, name="X_new", dtype=X_train.dtype, min_samples=1,
                           sparse=True)
        check_features(X_new, self)
        X_new = metric_rows(be, X_new, self._metric(), "X_new", square=False)
        K = float(np.max(self._perplexity_used))
        k = min(n, max(math.ceil(3 * K), math.floor(K) + 1))
        sqdist, idx = self._queries(X_new, k)
        W = conditional_affinities(sqdist, min(K, k - 0.5), backend=be).astype(Y_train.dtype)
        Y = (W[:, :, None] * Y_train[idx]).sum(axis=1)        # affinity-weighted mean
        mapping = OutOfSample(self.objective_name, Y_train, idx, W, objective, be)
        return be.to_host(mapping.minimize(Y, self._method_params.get("transform_max_iter",
                                                                      TRANSFORM_MAX_ITER)))


def _check_search(neighbors):
    """The ``neighbors`` method parameter: a search's name.  Neighbours of one's own
    (entropic_affinities' ``neighbors``) go in through ``affinities``."""
    if isinstance(neighbors, tuple):
        raise ValueError("neighbors names the k-NN search, one of "
                         f"{tuple(SEARCHES)}; for (sqdist, indices) of your own pass "
                         "affinities=ge.entropic_affinities(neighbors=(sqdist, indices), "
                         "perplexity=...)")
    return check_choice(neighbors, "neighbors", tuple(SEARCHES))


def check_tol(tol, n):
    """The stopping tolerance of a fit of n points: ``tol``, or for "auto"
    AUTO_TOL below AUTO_TOL_LARGE_FROM points and AUTO_TOL_LARGE from there."""
    if isinstance(tol, str):
        check_choice(tol, "tol", ("auto",))
        return AUTO_TOL if n < AUTO_TOL_LARGE_FROM else AUTO_TOL_LARGE
    return check_float(tol, "tol", 0.0)


def _given_matrix(A):
    """The (N, N) matrix of an ``affinities`` parameter (an EntropicAffinities
    result or a matrix), its type and shape checked."""
    P = A.P if isinstance(A, EntropicAffinities) else A
    if not (scipy.sparse.issparse(P) or hasattr(P, "tocsr") or hasattr(P, "shape")):
        raise TypeError("affinities must be an EntropicAffinities result or an (N, N) matrix")
    if len(P.shape) != 2 or P.shape[0] != P.shape[1]:
        raise ValueError(f"affinities must be a square (N, N) matrix, got shape {P.shape}")
    return P


def _stage(verbose, start, what):
    """With ``verbose``, one line saying what a stage of fit did and its seconds
    since ``start``; returns the time now (the next stage's start)."""
    now = time.perf_counter()
    if verbose:
        print(f"{what} ({now - start:.2f} s)", flush=True)
    return now


def _init_name(init):
    return init if isinstance(init, str) else "given array"


@_DOCUMENTED
class TSNE(_Embedding):
    """t-SNE: KL(P || Q) with the Student-t kernel, Q normalized over all pairs.

    By default minimized with the spectral direction and a line search (seed 002),
    without early exaggeration; ``optimizer="tsne"`` is the classic optimizer of
    openTSNE and scikit-learn (momentum 0.5 then 0.8, gains, early exaggeration 12
    for 250 iterations, learning rate N / 12).

    {sections}

    Notes
    -----
    The line-search optimizers use no exaggeration (seed 002) unless
    ``early_exaggeration=`` is given: then the first ``exaggeration_iter``
    iterations (default 250) minimize the objective with the attractive term
    multiplied by it (Fashion-MNIST 5k, SD, 2 for the first 200 of 1,000
    iterations: KL 1.223 and 10-NN accuracy 0.804 (best 0.809), against 1.239
    and 0.807 without; the classic optimizer 1.264 and 0.810,
    benchmarks/bench_embedding.py).  Except where the affinity graph splits
    into components (well-separated groups; a component of a k-NN graph holds
    at least k + 1 points): there SD
    takes SPLIT_GRAPH_PARAMS for those of them not given, exaggeration 2 for 200
    iterations and 10 curvature pairs (``early_exaggeration=1``: no exaggerated
    stage).  B has no curvature for the components' placement, which SD's FP
    translations only guess: the components hardly moved, grew in place and
    crowded the centre, and SD ended far above the classic optimizer.  The
    exaggeration forms compact groups before they spread, and the pairs move
    them; either alone fell short (pairs from the PCA start ran 10 rotating
    objects at perplexity 2, 10 loops, off to 1e10 units, KL 1.670 against
    0.744).  KL without them / with them / the classic optimizer
    (benchmarks/results/embedding_split.json): 30 Gaussian clusters, 3,000
    points in 5-D, perplexity 10: 1.381 / 0.993 / 0.854; perplexity 30: 0.666 /
    0.469 / 0.533; 20 clusters, 5,000 points in 10-D: 1.537 in 8.7 s / 1.221
    in 3.2 s / 1.267 in 5.2 s.  On connected graphs (Fashion-MNIST) SD reaches
    the classic's KL sooner without them.

    On connected graphs SD takes 3 curvature pairs from B's first refresh on
    (SD_MEMORY, for ``sd_memory`` not given; iteration 51, or 26 where B is
    refreshed every 25) where it solves by the Cholesky
    factor: the full L+ of up to 2,000 points on the CPU, or
    ``sd_solver="cholesky"``; and by the two-level solve
    (``sd_solver="twolevel"``, a fixed operator between refreshes as well).  On
    15 sets of up to 2,000 points (12 by the two-level solve) it ends lower than
    plain SD on 14 and reaches plain SD's final KL 2.2-5.3x sooner; on 10
    rotating objects at perplexity 5 (by the factor) it stopped at KL 0.267
    against plain SD's 0.206 after 1,000 iterations (0.205 against 0.207 on a
    Xeon VM at 1c20538; 0.206-0.244, mean 0.213, over five fits of the data with
    noise of 1e-6 of its spread in session 106): such sparse graphs end in other
    minima, by the sums' last bits (benchmarks/results/embedding_pairs.json,
    "tsne_curvature_pairs", at cf77c12, 2-core AMD EPYC VM).  With the two-level
    solve the pairs from iteration 26 on pass gradient descent's 1,000-iteration
    KL in up to a third fewer iterations than those from 51 on (rotating_objects
    at perplexity 20: 53 against 67) and end 1.6% lower to 0.4% higher (0.07%
    lower on geometric mean over the 12 sets), in the same time.  The pairs need
    a fixed initial inverse Hessian, which CG's truncated solves are not: with CG
    they took Fashion-MNIST 10k and 20k longer to plain SD's KL (5.9 s against
    5.6 s, 22.2 s against 16.6 s).

    On large sets the classic optimizer's layouts score slightly higher in 10-NN
    accuracy than SD's, though SD reaches a lower KL in less time (Fashion-MNIST
    20k: 0.27 points below on average over six paired fits, in 0.39 of the
    classic's time; 70k: 0.8448 against 0.8455, 40 s against 77 s from the data;
    benchmarks/results/embedding_n20000.json and embedding_n70000.json, 2-core
    AMD EPYC VM).  The line-search minimizers (SD, L-BFGS) settle in other local
    minima than the classic's momentum dynamics, with or without its early
    exaggeration; none of SD's starts, kappas or exaggerations tried closed the
    gap (benchmarks/README.md, session 104)."""

    objective_name = "tsne"
    optimizers = tuple(DIRECTIONS) + ("tsne",)
    SPLIT_GRAPH_PARAMS = {"early_exaggeration": 2.0, "exaggeration_iter": 200, "sd_memory": 10}
    # Where SD solves by the factor or the two-level solve; from B's first refresh on
    # (_first_refresh): sd_memory_start here where refreshes are off.
    SD_MEMORY = {"sd_memory": 3, "sd_memory_start": Spectral.REFRESH}

    def _graph_params(self, P, be):
        if self.optimizer != "sd":
            return {}
        p = self._method_params
        solver = p.get("sd_solver", "auto")
        if solver == "auto":
            solver = Spectral.auto_solver(P.shape[0], p.get("kappa"), True, be.is_gpu,
                                          P.nnz / P.shape[0])
        if not set(self.SPLIT_GRAPH_PARAMS) <= set(p):
            if connected_components(be, be.sparse.csr_matrix(P))[0] > 1:  # no host copy
                # The exact factor where "auto" takes the two-level solve: on six
                # separated clusters (600 points) that ended at KL 0.555 after 460
                # iterations, the factor at 0.535 after 220.
                return {**self.SPLIT_GRAPH_PARAMS,
                        **({"sd_solver": "cholesky"} if solver == "twolevel" else {})}
        if solver not in ("cholesky", "twolevel"):
            return {}
        chosen = super()._graph_params(P, be)
        if chosen:
            chosen["sd_memory_start"] = self._first_refresh(solver, p.get("sd_refresh", "auto"))
        return chosen

    @classmethod
    def _first_refresh(cls, solver, refresh):
        """The iteration of B's first refresh (``sd_refresh``; "auto": Spectral's
        for ``solver``), after which SD gathers its default pairs: pairs of B at the
        start layout, whose curvature the first steps outgrow fast, stopped fits
        higher (10 rotating objects at perplexity 5: KL 1.44 against 0.21,
        benchmarks/README.md).  SD_MEMORY's start where refreshes are off."""
        if refresh == "auto":
            refresh = Spectral.auto_refresh(solver, True)
        return refresh or cls.SD_MEMORY["sd_memory_start"]


@_DOCUMENTED
class SSNE(_Embedding):
    """s-SNE: KL(P || Q) with the Gaussian kernel, Q normalized over all pairs.

    {sections}

    Notes
    -----
    Its SD takes 3 curvature pairs (SD_MEMORY, for ``sd_memory`` not given): the
    pairs capture the repulsion's curvature, which B = 4 L+ leaves out.  Against
    plain SD (benchmarks/results/embedding_pairs.json at 76260ce, bench_embedding.py
    --pairs, 2-core Xeon VM) it ends at or below plain SD's objective on all 10 sets
    and reaches it 1.1-34x sooner: Fashion-MNIST 20k 3.8 s against 9.9 s, 5k 0.7 s
    against 2.8 s, swiss rolls of 4,000 points 0.246 / 0.263 / 0.270 against
    0.508 / 0.500 / 0.271 (10-NN accuracy of the position along the roll 0.90 /
    0.89 / 0.88 against 0.85 / 0.84 / 0.88), 30 Gaussian clusters 1.026 against
    1.188.  10 rotating objects at perplexity 5 end lower (1.135 against 1.198)
    with 10-NN accuracy 0.61 against 0.89, within the 0.56-0.89 that starts 1e-3
    apart give there.  In side runs on smaller swiss rolls two of five (800 and
    1,500 points) ended in other minima, 1.5% and 36% higher.  EE and SNE take
    their pairs later (see EE, SNE)."""

    objective_name = "ssne"
    SD_MEMORY = {"sd_memory": 3}


@_DOCUMENTED
class SNE(_Embedding):
    """SNE (Hinton & Roweis): the sum over points of KL(P_n || Q_n), each point's
    conditional distributions over the others, Gaussian kernel.

    {sections}

    Notes
    -----
    Its SD takes 3 curvature pairs from iteration 51 on, as EE's does (SD_MEMORY,
    for ``sd_memory`` not given).  Against plain SD (benchmarks/results/
    embedding_pairs.json at 76260ce, 2-core Xeon VM) it ends lower on 8 of the 10
    sets, level on one (rotating objects at perplexity 20, stopped after 21
    iterations) and reaches plain SD's final objective 1.1-12x sooner (swiss rolls
    of 4,000 points 3.5 and 3.6 s against 21.6 and 19.3 s, 30 clusters 1.3 s
    against 16.1 s, Fashion-MNIST 20k 7.9 s against 13.9 s); the third swiss roll
    ends 1.9% higher (828.8 against 813.6) in a fifth of the time.  Gathered from
    the start, the pairs stalled on 10 objects at perplexity 3 (crossing loops):
    363 against plain SD's 71.7, 10-NN accuracy 0.70 against 0.90, where from
    iteration 51 on they end at 51.6 (0.94)."""

    objective_name = "sne"
    optimizers = ("gd", "fp", "sd", "lbfgs", "cg")
    SD_MEMORY = {"sd_memory": 3, "sd_memory_start": 50}


@_DOCUMENTED
class EE(_Embedding):
    """Elastic embedding: E = sum_nm p_nm |x_n - x_m|^2 + lambda sum_nm exp(-|x_n - x_m|^2).

    Parameters
    ----------
    {parameters}
    lambda_ : float or None, default None
        Weight of the repulsion, >= 0; None: 1 / N.
    homotopy : bool, default False
        Follow the minimizer along ``homotopy_steps`` log-spaced lambdas from
        1e-4 lambda_ up to lambda_, each stage warm-started and run for up to
        max_iter iterations.
    homotopy_steps : int, default 10
    {run_parameters}
    {method_params}

    Attributes
    ----------
    {attributes}

    Notes
    -----
    Its SD takes 3 curvature pairs from iteration 51 on (SD_MEMORY, for
    ``sd_memory`` not given): the pairs pick up the repulsion's curvature, which
    B = 4 L+ leaves out.  Against plain SD (benchmarks/results/embedding_pairs.json
    at 76260ce, bench_embedding.py --pairs, 2-core Xeon VM) it ends lower on all 10
    sets and reaches plain SD's final objective 1.2-17x sooner (swiss rolls of 4,000
    points 1.3-1.4 s against 6.8-8.1 s, 30 clusters 1.7 s against 8.6 s,
    Fashion-MNIST 20k 6.8 s against 16.9 s).  Gathered from the start, the pairs led EE into
    higher minima (digits 13.94 against plain SD's 13.52, swiss rolls 6.08 / 6.62
    / 6.03 against 5.95 / 5.95 / 6.01); after the first 50 iterations, once the
    layout's groups have formed, they end at 13.48 and 5.92 / 5.93 / 5.97."""

    objective_name = "ee"
    SD_MEMORY = {"sd_memory": 3, "sd_memory_start": 50}

    def __init__(self, n_components=2, perplexity=30.0, *, lambda_=None, homotopy=False,
                 homotopy_steps=10, **kwargs):
        super().__init__(n_components, perplexity, **kwargs)
        self.lambda_ = lambda_
        self.homotopy = homotopy
        self.homotopy_steps = homotopy_steps

    def _objective_params(self, n):
        if self.lambda_ is None:
            return {"lambda_": default_lambda(n)}
        return {"lambda_": check_float(self.lambda_, "lambda_", 0.0)}

    def _check_method_params(self):
        super()._check_method_params()
        check_bool(self.homotopy, "homotopy")
        check_int(self.homotopy_steps, "homotopy_steps", 1)

    def _optimize(self, objective, X0, max_iter, tol, monitor):
        if not self.homotopy:
            return super()._optimize(objective, X0, max_iter, tol, monitor)
        steps = int(self.homotopy_steps)            # checked in fit, before the affinities
        return homotopy(objective, X0, self.optimizer,
                        lambdas=homotopy_path(objective.lambda_, steps), max_iter=max_iter,
                        tol=tol, step_size=self._method_params.get("step_size"),
                        monitor=monitor, direction_params=self._direction_params(self._fit_params))


@_DOCUMENTED
class MultiscaleSNE(TransformerOutput, Params):
    """Multi-scale SNE (thesis 004, sections 2.9-2.11): high-dimensional
    similarities averaged over perplexities K_h = 2^(h-1) K*, low-dimensional ones
    averaged over per-scale precisions p_h.

    Optimized from the largest scale alone, then adding the next smaller scale at
    each stage down to K* (``perplexity``), each stage warm-started; the
    low-dimensional precisions are recomputed from the embedding's spread at
    every stage.  ``transform`` maps new points into the fitted layout.

    Parameters
    ----------
    n_components : int, default 2
        Dimension of the embedding, 1 to N - 2.
    perplexity : float, default 2
        K*, the smallest scale's perplexity.
    cost : {"js", "kl"}, default "js"
        "js": eq. 2.7 with mixture ``kappa`` (Lee et al.'s Ms.JSE); "kl": eq. 2.3
        (Ms.SNE).
    kappa : float in (0, 1), default 0.5
        The Jensen-Shannon cost's mixture weight.
    fit_exponent : bool, default True
        Estimate Lee et al.'s exponent U from the high-dimensional precisions
        (else U = 1).
    optimizer : {"lbfgs", "cg", "gd"}, default "lbfgs"
    max_iter : int, default 100
        Iterations at most per stage.
    tol : float, default 1e-7
        A stage stops when the relative decrease per iteration, averaged over 10
        iterations, falls below it.
    init : {"pca", "random"} or (N, n_components) array, default "pca"
    n_scales : None, int or "all"
        H keeps the H smallest scales (more than N holds is an error); "all" takes
        all floor(log2(N / K*)); None (the default) drops the two largest and keeps
        no more than fit a k-NN graph of 2e7 entries.
    n_neighbors : int or None
        Neighbours per point of the affinities (None: 3 times the largest
        perplexity, within N - 1).
    metric : {"euclidean", "cosine", "precomputed"}, default "euclidean"
        "cosine": the rows, and transform's new rows, scaled to unit length first;
        "precomputed": X an (N, N) distance matrix (init="pca": classical MDS) or a
        sparse k-NN graph of distances (init="random"), and transform's rows the new
        points' distances to the training points.
    nbody : {"auto", "exact", "fgt", "bh"}, default "auto"
        Engine of the per-scale Gaussian sums; "auto": exact below 6,000 points on
        the CPU or in more than 3 dimensions, else "fgt".
    {run_parameters}

    Attributes
    ----------
    {attributes}
    perplexities_ : array
        The scales' perplexities, smallest first.
    exponent_ : float
        The exponent U used.

    Notes
    -----
    "js" is the default: with 100 iterations per stage its log-K AUC of R_NX beat
    "kl" at 30 on digits, rotating_objects and Fashion-MNIST 2k
    (benchmarks/bench_msne.py).  The exact engine's one compiled sweep computes
    every scale's kernel at once, which keeps it ahead below 6,000 points
    (``msne.EXACT_BELOW``); with the FGT or Barnes-Hut an iteration costs O(N H) =
    O(N log N) on top of the affinities' O(N k H).  All scales make the largest
    perplexity about N / 2 and the k-NN graph (3 x that) dense; the default's
    scales (perplexity up to N / 8) are 2.2-2.5x faster on digits,
    rotating_objects and Fashion-MNIST 2k for an AUC 0.003-0.036 lower (and a
    10-NN accuracy of 0.99 against 0.90 on rotating_objects), and its cap keeps
    large N sparse (seven scales, up to perplexity 128, at 2,000 points; six, up
    to 64, at 70,000).
    """

    optimizers = ("lbfgs", "cg", "gd")
    _min_samples = 5        # the fewest points fit takes (ParametricEmbedding checks too)

    def __init__(self, n_components=2, *, perplexity=2.0, cost="js", kappa=0.5,
                 fit_exponent=True, optimizer="lbfgs", max_iter=100, tol=1e-7, init="pca",
                 n_scales=None, n_neighbors=None, metric="euclidean", nbody="auto",
                 random_state=None, backend="auto", dtype=None, verbose=False, callbacks=None):
        self.n_components = n_components
        self.perplexity = perplexity
        self.cost = cost
        self.kappa = kappa
        self.fit_exponent = fit_exponent
        self.optimizer = optimizer
        self.max_iter = max_iter
        self.tol = tol
        self.init = init
        self.n_scales = n_scales
        self.n_neighbors = n_neighbors
        self.metric = metric
        self.nbody = nbody
        self.random_state = random_state
        self.backend = backend
        self.dtype = dtype
        self.verbose = verbose
        self.callbacks = callbacks

    def fit(self, X, y=None):
        """Embed X (N, D), dense or sparse; ``y`` is ignored (scikit-learn pipelines)."""
        self._fit(X)
        return self

    def _free_fit(self, X):
        """Fit, and the final stage's problem for a parametric embedding's Z steps
        (parametric/mac.py): every scale, at the final LD precisions."""
        objective = self._fit(X)
        be, X_dev, Y, _ = self._fitted
        return FreeFit(be, X_dev, Y, objective, self.optimizer, {}, None, self.metric)

    def _fit(self, X):
        """fit's work; returns the final stage's objective, which the model does not
        keep (its pattern holds up to 2e7 affinities)."""
        from .affinities import multiscale_affinities
        from .objectives.msne import (COSTS, EXACT_BELOW, MultiscaleObjective, intrinsic_exponent,
                                      ld_precisions)

        be = get_backend(self.backend)
        X = metric_rows(be, check_data(X, be, min_samples=self._min_samples, sparse=True),
                        self.metric)
        n = X.shape[0]
        d = check_int(self.n_components, "n_components", 1, n - 2)
        max_iter = check_int(self.max_iter, "max_iter", 1)
        tol = check_float(self.tol, "tol", 0.0)
        check_choice(self.optimizer, "optimizer", self.optimizers)
        check_choice(self.cost, "cost", COSTS)
        kappa = check_float(self.kappa, "kappa", 0.0, 1.0, low_open=True, high_open=True)
        check_random_state(self.random_state)
        check_callbacks(self.callbacks)
        check_verbose(self.verbose)
        check_bool(self.fit_exponent, "fit_exponent")
        init = check_init(self.init, n, d, be, INITS[:2])
        check_graph_init(init, X, self.metric, INITS[:2])
        dtype = check_dtype(self.dtype, be)
        nbody = resolve_method(self.nbody, n, d, "gaussian", be, EXACT_BELOW.get(be.name))
        start = time.perf_counter()
        M = multiscale_affinities(X, self.perplexity, n_scales=self.n_scales,
                                  n_neighbors=self.n_neighbors, metric=search_metric(self.metric),
                                  symmetrize=False, backend=be)
        start = _stage(self.verbose, start, f"multi-scale affinities: {n} points, perplexities "
                                            + ", ".join(f"{K:g}" for K in M.perplexities))
        U = intrinsic_exponent(be.to_host(M.beta), d) if self.fit_exponent else 1.0
        # Any scale works: the LD precisions follow the embedding's spread.
        Y = initial_layout(init, X, d, be, dtype, 1.0, self.random_state, metric=self.metric)
        _stage(self.verbose, start, f"setup: initial layout {_init_name(self.init)}, N-body "
                                    f"engine {nbody}")
        monitor = Monitor(self.callbacks, self.verbose)
        H = len(M.perplexities)
        total = 0
        for h in range(H - 1, -1, -1):               # largest scale first, then add smaller
            scales = M.perplexities[h:]
            monitor.extra, monitor.offset = {"smallest_perplexity": float(scales[0])}, total
            p = ld_precisions(scales, be.to_host(Y), U)
            objective = MultiscaleObjective(M.conditionals[h:], be, dtype, p, cost=self.cost,
                                            kappa=kappa, nbody=nbody)
            result = minimize(objective, Y, self.optimizer, max_iter=max_iter, tol=tol,
                              monitor=monitor)
            Y, total = result.X, total + result.n_iter
        self.embedding_ = be.to_host(Y)
        self.objective_ = float(result.objective)
        self.n_iter_ = total
        self.history_ = monitor.history
        self.perplexities_ = M.perplexities
        self.exponent_ = U
        self.n_features_in_ = X.shape[1]
        # What transform needs: the final stage's LD precisions and engine, and the
        # neighbour count of the HD affinities (not the affinities themselves).
        self._fitted = (be, X, Y, types.SimpleNamespace(
            p=objective.p, cost=objective.cost, kappa=objective.kappa, nbody=nbody,
            accuracy=objective.accuracy, n_neighbors=int(M.neighbors[0].shape[1])))
        return objective

    def fit_transform(self, X, y=None):
        """Fit to ``X`` and return ``embedding_``."""
        return self.fit(X).embedding_

    def transform(self, X_new):
        """Embed new points ``X_new`` with the training embedding fixed: each new point x
        minimizes its own row of the fitted cost (KL or JS) between its multi-scale
        affinities to its training neighbours (the fit's scales and neighbour
        count) and s_xj = (1/H) sum_h exp(-p_h |x - y_j|^2 / 2) / Z_h(x), Z_h over
        all training points, at the final stage's precisions p_h; started at the
        affinity-weighted mean of its neighbours, stopping on its own test (see
        OutOfSample.minimize), in chunks of rows that bound the memory."""
        check_fitted(self, hasattr(self, "_fitted"))
        be, X_train, Y_train, fitted = self._fitted
        X_new = check_data(X_new, be, name="X_new", dtype=X_train.dtype, min_samples=1,
                           sparse=True)
        check_features(X_new, self)
        X_new = metric_rows(be, X_new, self.metric, "X_new", square=False)
        k = min(X_train.shape[0], fitted.n_neighbors)
        sqdist, idx = knn_query(X_new, X_train, k, metric=search_metric(self.metric), backend=be)
        W = sum(conditional_affinities(sqdist, K, backend=be)
                for K in self.perplexities_) / len(self.perplexities_)
        Y = (W[:, :, None] * Y_train[idx]).sum(axis=1).astype(Y_train.dtype)   # weighted mean
        mapping = MultiscaleOutOfSample(Y_train, idx, W, fitted, be)
        step = max(1, MultiscaleOutOfSample.CHUNK // k)
        return be.to_host(be.xp.concatenate([
            mapping.minimize(Y[a:a + step], TRANSFORM_MAX_ITER, first=a)
            for a in range(0, Y.shape[0], step)]))
