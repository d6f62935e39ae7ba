"""t-SNE (seed 002 section 1): E = KL(P || Q) with the Student-t kernel
K = 1 / (1 + |x_n - x_m|^2), q_nm = K_nm / Z, Z = sum_{n != m} K_nm:

    E = sum p log p + sum_nm p_nm log(1 + |x_n - x_m|^2) + log Z,
    grad_n = 4 sum_m (p_nm - q_nm) K_nm (x_n - x_m).

``exaggeration`` multiplies the attractive term (early exaggeration of the
classic optimizer) without touching P.  Z and the forces come from one fused
N-body pass ("student" and "student2" sums).
"""
from __future__ import annotations

from .base import Objective


class TSNEObjective(Objective):
    name = "tsne"
    kernel = "student"
    divergence = True
    exaggeration = 1.0      # set per iteration by the classic optimizer
    attractive_curvature_is_bound = True

    def value_and_grad(self, X):
        xp, pairs = self.be.xp, self.pairs
        e_plus, grad = pairs.attraction(X, student=True)
        grad *= 4.0 * self.exaggeration
        (S1, _), (S2, SX2) = self.sums(X, ("student", "student2"))
        Z = float(S1.sum())
        grad -= (4.0 / Z) * (S2[:, None] * X - SX2)
        return self.constant + self.exaggeration * e_plus + float(xp.log(Z)), grad

    def attractive_weights(self, X=None):
        # The attractive term's Laplacian weights p K: P at X = 0, where K = 1.
        if X is None:
            return self.pairs.P
        w = self.pairs.sqdist(X)
        w += 1.0
        return self.pairs.weights(self.be.xp.divide(self.pairs.p, w, out=w))

    def xx_coefficients(self, X):
        # Psd part of w^xx = -(p - 2 q) K^2 (x_in - x_im)(x_jn - x_jm): 2 q K^2 = 2 K^3 / Z.
        (S1, _), = self.sums(X, ("student",))
        Z = float(S1.sum())

        def coef(D):
            K = 1.0 / (1.0 + D)
            return (2.0 / Z) * K * K * K
        return coef

    def hessian_diagonal(self, X):
        # 4 L_nn + 8 L^xx_{in,in} - 16 (X L^q)_in^2 with w = (p - q) K, w^q = -q K,
        # w^xx = -(p - 2q) K^2: the p part lives on the sparse edges.
        xp, pairs = self.be.xp, self.pairs
        K_edge = 1.0 / (1.0 + pairs.sqdist(X))
        (S1, _), (S2, SX2) = self.sums(X, ("student", "student2"))
        Z = float(S1.sum())
        attract = xp.zeros(self.n, dtype=X.dtype)
        self.be.scatter_add(attract, pairs.rows, pairs.p * K_edge)
        xlq = (S2[:, None] * X - SX2) / Z
        xx = self.xx_times(X, self.xx_coefficients(X)) - 8.0 * pairs.xx_diagonal(
            pairs.p * K_edge * K_edge, X)
        return 4.0 * (attract - S2 / Z)[:, None] + xx - 16.0 * xlq * xlq
