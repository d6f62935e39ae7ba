"""Embedding objectives E = E+ + lambda E- in Laplacian form (seed 002)."""
from __future__ import annotations

from .._checks import check_choice, check_data
from ..backend import get_backend
from .ee import ElasticEmbedding, default_lambda
from .sne import SNEObjective
from .ssne import SymmetricSNE
from .tsne import TSNEObjective

__all__ = ["OBJECTIVES", "make_objective", "value_and_grad", "default_lambda"]

OBJECTIVES = {"ee": ElasticEmbedding, "ssne": SymmetricSNE, "tsne": TSNEObjective,
              "sne": SNEObjective}


def make_objective(name, P, backend, dtype, nbody="exact", **params):
    """An objective instance; ``params``: lambda_ for "ee"."""
    check_choice(name, "name", tuple(OBJECTIVES))
    n = P.shape[0]
    if P.ndim != 2 or P.shape != (n, n):
        raise ValueError(f"P must be a square (N, N) matrix, got shape {P.shape}")
    return OBJECTIVES[name](P, backend, dtype, nbody=nbody, **params)


def value_and_grad(name, X, P, *, backend="cpu", **params):
    """Exact objective value and gradient (N, d) of ``name`` ("ee" | "ssne" | "tsne" | "sne").

    P: sparse or dense (N, N) affinities: symmetric joint (summing to 1) for ee,
    ssne and tsne; row-stochastic conditional for sne.  params: lambda_ (ee).
    """
    be = get_backend(backend)
    X = check_data(X, be)
    if P.shape != (X.shape[0], X.shape[0]):
        raise ValueError(f"P must be ({X.shape[0]}, {X.shape[0]}) to match X, got {P.shape}")
    objective = make_objective(name, P, be, X.dtype, **params)
    E, G = objective.value_and_grad(X)
    return E, G
