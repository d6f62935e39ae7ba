"""E(Z) + (mu/2) |Z - T|^2: an embedding objective tied to a target T.

The Z step of parametric embeddings by auxiliary coordinates (paper 001,
section 3) minimizes this with the embedding's own optimizer: the penalty
adds mu (Z - T) to the gradient and mu I to the curvature, which every
direction takes through ``curvature_shift`` (the spectral direction then
solves with 4 L+ + mu I, positive definite without the translation fix).
"""
from __future__ import annotations


class Penalized:
    """Wraps an objective; everything not overridden here is the wrapped one's."""

    def __init__(self, objective, target, mu):
        self.inner = objective
        self.target = target
        self.mu = float(mu)
        self.curvature_shift = objective.curvature_shift + self.mu
        self.last = (None, None, None)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def accuracy(self):
        return self.inner.accuracy

    @accuracy.setter
    def accuracy(self, value):
        self.inner.accuracy = value

    def value_and_grad(self, Z):
        E, G = self.inner.value_and_grad(Z)
        # The wrapped objective's terms at the last point evaluated: MAC's next Z step
        # starts where this one ended, with another target (see ``at``).
        self.last = (Z, E, G)
        return self.at(Z, E, G)

    def at(self, Z, E, G):
        """The value and gradient at Z from the wrapped objective's E and G there."""
        D = Z - self.target
        return E + 0.5 * self.mu * float((D * D).sum()), G + self.mu * D

    def value(self, Z):
        return self.value_and_grad(Z)[0]

    def hessian_diagonal(self, Z):
        return self.inner.hessian_diagonal(Z) + self.mu
