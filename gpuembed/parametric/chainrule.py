"""The conventional baseline: a parametric embedding trained directly on
P(F) = E(F(Y)) by chain-rule gradients (paper 001, section 2 and eq. 3).

dP/dtheta = sum_n (dF(y_n)/dtheta)^T G_n with G = dE/dX at X = F(Y), the
embedding's own gradient, so the chain rule never forms eq. (3)'s per-pair
outer products: for a linear F(y) = A^T [y; 1] it is [Y, 1]^T G, O(N^2 L)
for G (or less with an N-body engine) plus O(N D L).  The mapping supplies
``parameters()`` (arrays updated in place) and ``backward(Y, G)``; the
parameters are optimized as one vector by any direction of optim/ (gradient
descent with backtracking line search by default).
"""
from __future__ import annotations

from ..optim import Monitor, minimize
from .mappings import array_module


class _ParametricObjective:
    """P and dP/dtheta over the flattened parameters of ``mapping``.

    A mapping of mappings.py (marked by its ``fixed_design``) gets one forward pass
    per evaluation, whose intermediates ``backward`` reuses, and a design that does
    not depend on the parameters (the linear map's, the RBF network's) is made
    once: before, predict and backward each made their own, which cost the MLP's
    gradient at Fashion-MNIST 20k a quarter more and the RBF network's 1.7x as much.
    Any other mapping with parameters() and backward() gets predict, then backward
    (its own ``forward``, if any, may mean something else: a PyTorch module's)."""

    def __init__(self, objective, Y, mapping):
        self.objective, self.Y, self.mapping = objective, Y, mapping
        self.be = objective.be
        self.params = mapping.parameters()
        self.fixed_design = getattr(mapping, "fixed_design", None)
        self.design = None

    def flat(self):
        xp = array_module(self.params[0])
        return xp.concatenate([p.ravel() for p in self.params])

    def assign(self, theta):
        start = 0
        for p in self.params:
            p[...] = theta[start:start + p.size].reshape(p.shape)
            start += p.size

    def value_and_grad(self, theta):
        xp = array_module(theta)
        self.assign(theta)
        if self.fixed_design is None:
            E, G = self.objective.value_and_grad(self.mapping.predict(self.Y))
            grads = self.mapping.backward(self.Y, G)
        else:
            if self.fixed_design:
                FY, self.design = self.mapping.forward(self.Y, self.design)
                saved = self.design
            else:
                FY, saved = self.mapping.forward(self.Y)
            E, G = self.objective.value_and_grad(FY)
            grads = self.mapping.backward(self.Y, G, saved)
        return E, xp.concatenate([g.ravel() for g in grads])


def chain_rule(objective, Y, mapping, *, direction="gd", max_iter=100, tol=1e-7,
               monitor=None):
    """Minimize P over ``mapping``'s parameters, starting from their current
    values (e.g. a direct fit).  Returns the optim Result (X: the parameter
    vector); ``mapping`` holds the final parameters."""
    problem = _ParametricObjective(objective, Y, mapping)
    # An MLP's products are BLAS: with one BLAS thread an evaluation took 20% longer.
    result = minimize(problem, problem.flat(), direction, max_iter=max_iter, tol=tol,
                      monitor=monitor or Monitor(), serial_blas=False)
    problem.assign(result.X)
    return result
