"""The conventional baseline: a linear parametric embedding trained directly on
P(A) = E(F(Y)) with F(y) = A^T [y; 1] by chain-rule gradients (paper 001, eq. 3).

With X = [Y, 1] A, dP/dA = [Y, 1]^T G where G = dE/dX is the embedding's own
gradient: for EE, G_n = 4 sum_m (p_nm - lambda exp(-|x_n - x_m|^2)) (x_n - x_m),
so eq. (3)'s sum over pairs collapses to O(N^2 L) for G plus O(N D L) for the
product, never forming the N^2 D L outer products.  Any objective works (EE,
s-SNE, t-SNE); optimized by gradient descent with backtracking line search
(or any direction of optim/), exactly like a free embedding.
"""
from __future__ import annotations

from ..optim import Monitor, minimize
from .mappings import LinearMapping, _with_bias


class _LinearParametric:
    """P(A) and its gradient as an objective over the (D + 1, L) coefficients."""

    def __init__(self, objective, Y):
        self.objective = objective
        self.be = objective.be
        self.design = _with_bias(objective.be.xp, Y)

    def value_and_grad(self, coef):
        E, G = self.objective.value_and_grad(self.design @ coef)
        return E, self.design.T @ G


def linear_chain_rule(objective, Y, coef0, *, direction="gd", max_iter=100, tol=1e-7,
                      monitor=None):
    """Minimize P over linear mappings from coefficients ``coef0`` ((D + 1, L),
    e.g. a direct fit's ``coef_``).  Returns (LinearMapping, optim Result)."""
    problem = _LinearParametric(objective, Y.astype(coef0.dtype))
    result = minimize(problem, coef0, direction, max_iter=max_iter, tol=tol,
                      monitor=monitor or Monitor())
    mapping = LinearMapping()
    mapping.coef_ = result.X
    return mapping, result
