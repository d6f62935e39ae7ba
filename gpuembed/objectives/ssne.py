"""Symmetric SNE (seed 002 section 1): E = KL(P || Q) over all pairs, with
q_nm = exp(-|x_n - x_m|^2) / Z and Z = sum_{n != m} exp(-|x_n - x_m|^2):

    E = sum p log p + sum_nm p_nm |x_n - x_m|^2 + log Z,
    grad_n = 4 sum_m (p_nm - q_nm)(x_n - x_m).
"""
from __future__ import annotations

import math

from .base import Objective


class SymmetricSNE(Objective):
    name = "ssne"
    kernel = "gaussian"
    divergence = True

    def value_and_grad(self, X):
        e_plus, grad = self.pairs.attraction(X)
        grad *= 4.0
        (S, SX), = self.sums(X, ("gaussian",))
        e_plus, Z = self.be.host_floats(e_plus, S.sum())
        grad -= (4.0 / Z) * (S[:, None] * X - SX)
        return self.constant + e_plus + math.log(Z), grad

    def xx_coefficients(self, X):
        # w^xx = q_nm (x_in - x_im)(x_jn - x_jm): q = exp(-d^2) / Z.
        xp = self.be.xp
        (S, _), = self.sums(X, ("gaussian",))
        Z = float(S.sum())
        return lambda D: xp.exp(-D) / Z

    def hessian_diagonal(self, X):
        # 4 L_nn + 8 L^xx_{in,in} - 16 (X L^q)_in^2 with w = p - q, w^q = -q.
        (S, SX), = self.sums(X, ("gaussian",))
        Z = float(S.sum())
        degree = self.be.xp.asarray(self.pairs.P.sum(axis=1)).ravel()
        xlq = (S[:, None] * X - SX) / Z
        return (4.0 * (degree - S / Z)[:, None] + self.xx_times(X, self.xx_coefficients(X))
                - 16.0 * xlq * xlq)
