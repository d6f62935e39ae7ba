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
    check_affinities(backend, name, P)
    return OBJECTIVES[name](P, backend, dtype, nbody=nbody, **params)


def check_affinities(be, name, P):
    """P has the structure objective ``name``'s formula assumes: symmetric for
    ee, ssne and tsne (their gradient 4 X L takes W+ symmetric), summing to 1 for
    the joint distributions of ssne and tsne (KL is only a divergence between
    distributions), row-stochastic for sne.  The tolerances pass float32 sums."""
    xp = be.xp
    S = be.sparse.csr_matrix(P if hasattr(P, "tocsr") else be.asarray(P))
    # The entries first: a NaN or a negative one would make the sums' messages wrong.
    if not bool(xp.isfinite(S.data).all()) or bool((S.data < 0).any()):
        raise ValueError("affinities must be finite and non-negative")
    total = float(S.sum())
    if S.nnz == 0 or not total > 0:
        raise ValueError("the affinities P have no positive entry")
    if name == "sne":
        rows = xp.asarray(S.sum(axis=1)).ravel()
        if bool((xp.abs(rows - 1.0) > 1e-3).any()):
            raise ValueError("the affinities P of sne must be row-stochastic (conditional "
                             "p(m|n), each row summing to 1), got row sums in "
                             f"[{float(rows.min()):.6g}, {float(rows.max()):.6g}]; "
                             "entropic_affinities(..., symmetrize=False) gives such P")
        return
    D = (S - S.T.tocsr()).tocsr()
    asymmetry = float(xp.abs(D.data).max()) if D.nnz else 0.0
    if asymmetry > 1e-5 * float(xp.abs(S.data).max()):
        raise ValueError(f"the affinities P of {name} must be symmetric (p_nm = p_mn), "
                         f"differ from their transpose by up to {asymmetry:.3g}; use (P + P.T) / 2")
    if name != "ee" and abs(total - 1.0) > 1e-3:
        raise ValueError(f"the affinities P of {name} must be a joint distribution "
                         f"summing to 1, got sum {total:.6g}; divide it by its sum")


def value_and_grad(name, X, P, *, backend="cpu", **params):
    """Exact objective value and gradient (N, d) of ``name`` ("ee" | "ssne" | "tsne" | "sne")
    at the layout ``X`` (N, d), computed on ``backend``.

    P: sparse or dense (N, N) affinities: symmetric joint (summing to 1) for ee,
    ssne and tsne; row-stochastic conditional for sne.  params: lambda_ (ee).
    """
    be = get_backend(backend)
    check_choice(name, "name", tuple(OBJECTIVES))
    takes = ("lambda_",) if name == "ee" else ()
    unknown = sorted(set(params) - set(takes))
    if unknown:         # the objective class's own message named its __init__
        raise TypeError(f"value_and_grad({name!r}) takes {list(takes) or 'no'} params, "
                        f"got {unknown}")
    X = check_data(X, be)
    if not hasattr(P, "shape"):
        raise TypeError(f"P must be an (N, N) sparse or dense matrix, got {type(P).__name__}")
    if P.shape != (X.shape[0], X.shape[0]):
        raise ValueError(f"P must be ({X.shape[0]}, {X.shape[0]}) to match X, got {P.shape}")
    objective = make_objective(name, P, be, X.dtype, **params)
    E, G = objective.value_and_grad(X)
    return E, G
