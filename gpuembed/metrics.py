"""Embedding quality metrics."""
from __future__ import annotations

import numpy as np

from ._checks import check_int
from .neighbors import knn


def knn_accuracy(X_low, labels, k=10, *, backend="cpu"):
    """Leave-one-out k-NN classification accuracy of the embedding.

    Each point's label is predicted by majority vote of its k nearest
    neighbours in ``X_low`` (itself excluded; ties go to the smallest label).
    """
    labels = np.asarray(labels)
    n = labels.shape[0]
    if getattr(X_low, "shape", (None,))[0] != n:
        raise ValueError(f"labels must have one entry per row of X_low, got {n}")
    k = check_int(k, "k", 1, n - 1)
    _, idx = knn(X_low, k, backend=backend)
    classes, codes = np.unique(labels, return_inverse=True)
    votes = np.zeros((n, classes.size), dtype=np.int64)
    np.add.at(votes, (np.repeat(np.arange(n), k), codes[np.asarray(idx).ravel()]), 1)
    return float((votes.argmax(axis=1) == codes).mean())
