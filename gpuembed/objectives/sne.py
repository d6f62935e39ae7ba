"""SNE (Hinton & Roweis): per-point distributions P_n (row-stochastic conditional
affinities p_{m|n}) and Q_n with q_{m|n} = exp(-|x_n - x_m|^2) / Z_n,
Z_n = sum_{m != n} exp(-|x_n - x_m|^2):

    E = sum_n KL(P_n || Q_n) = sum p log p + sum_nm p_{m|n} |x_n - x_m|^2 + sum_n log Z_n,
    grad_n = 2 sum_m (p_{m|n} - q_{m|n} + p_{n|m} - q_{n|m}) (x_n - x_m).
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

from .base import Objective, PairSet


class SNEObjective(Objective):
    name = "sne"
    kernel = "gaussian"
    divergence = True

    def __init__(self, P, backend, dtype, nbody="exact"):
        super().__init__(P, backend, dtype, nbody)
        P = self.pairs.P
        self.sym = PairSet(backend, P + P.T, self.dtype)

    def value_and_grad(self, X):
        xp = self.be.xp
        # sum (P + P^T) d^2 counts every p_{m|n} d^2 twice.
        e_plus, grad = self.sym.attraction(X)
        grad *= 2.0
        (S, SX), = self.sums(X, ("gaussian",))
        # The FGT's error is absolute: an isolated point's Z_n (tiny) can come out
        # <= 0, and far enough from all others it underflows to 0 even exactly.
        # Then the value is +inf, which the line search rejects (it shortens the
        # step), instead of log giving -inf, which it accepted.
        valid = bool((S > 0).all())
        S = xp.maximum(S, np.finfo(S.dtype).tiny)
        # sum_m q_{n|m} (x_n - x_m): source weights 1 / Z_m (which overflow past an
        # invalid Z_n: quietly, the value is +inf anyway).
        with contextlib.nullcontext() if valid else np.errstate(over="ignore", invalid="ignore"):
            (Sw, SXw), = self.sums(X, ("gaussian",), weights=1.0 / S)
            grad -= 2.0 * ((S[:, None] * X - SX) / S[:, None] + Sw[:, None] * X - SXw)
        if not valid:
            return math.inf, grad
        e_plus, log_z = self.be.host_floats(e_plus, xp.log(S).sum())
        return self.constant + 0.5 * e_plus + log_z, grad

    def attractive_weights(self, X=None):
        # grad+ = 2 L(P + P^T) X = 4 L((P + P^T) / 2) X.
        return self.sym.P * 0.5
