"""Compiled CPU loop of the MLP mapping's minibatch training (mappings.py).

``adam_update`` is one Adam step in a single pass over the parameter vector,
the CPU's counterpart of kernels/adam.cu.  As NumPy array code the step was
eleven passes over the vector, 0.30 s of each 1.0-s F step of MAC (three
epochs of a 50-256-256-2 net on 20,000 points, 600 minibatch steps, 2-core
Xeon VM); the loop takes 0.15 s.  Divisions and the square root bound it, so
the bias corrections come folded into two scalars: lr (m / bias1) / (sqrt(v /
bias2) + eps) = (lr / bias1) m / (sqrt(v) / sqrt(bias2) + eps), one division
and one root per element where the formula as written has three divisions.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def adam_update(p, g, m, v, beta1, beta2, step, root, eps, decay):
    """In place on ``p``, ``m``, ``v``: g <- g + decay p; m <- beta1 m + (1 - beta1)
    g; v <- beta2 v + (1 - beta2) g^2; p <- p - step m / (sqrt(v) root + eps), with
    step = lr / bias1 and root = 1 / sqrt(bias2).  The scalars come in the
    arrays' dtype; 1 - beta is a float64, so a float32 moment's update is
    formed in float64 and rounded once as it is stored."""
    c1, c2 = 1.0 - beta1, 1.0 - beta2
    for i in range(p.shape[0]):
        gi = g[i] + decay * p[i]
        mi = beta1 * m[i] + c1 * gi
        vi = beta2 * v[i] + c2 * gi * gi
        m[i] = mi
        v[i] = vi
        p[i] -= step * mi / (np.sqrt(vi) * root + eps)
