"""Accuracy schedules for approximate N-body gradients (dissertation sections
5.4-5.5): start coarse, refine log-spaced over the first iterations, then hold.
Early iterations move points far, so a crude gradient costs little progress;
near the end the error sets the level the objective settles at (its mean
excess grows with the squared gradient error, eq. 5.10).
"""
from __future__ import annotations

import numpy as np

from .._checks import check_int

# Engine -> (parameter, start, stop): FGT order 1 -> 10, Barnes-Hut theta 2 -> 0.1.
RAMPS = {"fgt": ("p", 1, 10), "bh": ("theta", 2.0, 0.1)}


def accuracy_schedule(method, n_iter=100, start=None, stop=None):
    """``iteration -> accuracy dict`` for engine ``method`` (None for "exact"),
    log-spaced from ``start`` to ``stop`` over the first ``n_iter`` iterations."""
    if method == "exact":
        return None
    n_iter = check_int(n_iter, "accuracy_schedule", 1)
    name, first, last = RAMPS[method]
    values = np.geomspace(first if start is None else start, last if stop is None else stop,
                          n_iter)

    def schedule(iteration):
        value = values[min(iteration, n_iter - 1)]
        return {name: int(round(value)) if name == "p" else float(value)}
    return schedule
