"""k-means (Lloyd's iterations, k-means++ seeding), vectorized over points."""
from __future__ import annotations

import numpy as np

from ..nbody.exact import squared_distances


def kmeans(X, n_clusters, *, n_init=10, max_iter=300, tol=1e-9, init=None, random_state=None):
    """Best of ``n_init`` runs: (labels (N,), centers (K, D), inertia).

    ``init`` (K, D) starts one run from the given centers instead (warm start).
    """
    X = np.asarray(X, dtype=np.float64)
    rng = np.random.default_rng(random_state)
    best = None
    runs = [init] if init is not None else [None] * n_init
    for start in runs:
        centers = _plusplus(X, n_clusters, rng) if start is None else np.array(start, float)
        result = _lloyd(X, centers, max_iter, tol)
        if best is None or result[2] < best[2]:
            best = result
    return best


def _plusplus(X, k, rng):
    """k-means++ seeding: each new center drawn with probability proportional to the
    squared distance to the nearest center so far."""
    centers = [X[rng.integers(len(X))]]
    d2 = ((X - centers[0]) ** 2).sum(axis=1)
    for _ in range(1, k):
        total = d2.sum()
        idx = rng.integers(len(X)) if total <= 0 else rng.choice(len(X), p=d2 / total)
        centers.append(X[idx])
        d2 = np.minimum(d2, ((X - X[idx]) ** 2).sum(axis=1))
    return np.array(centers)


def _lloyd(X, centers, max_iter, tol):
    previous = np.inf
    for _ in range(max_iter):
        D = squared_distances(np, X, centers)
        labels = D.argmin(axis=1)
        inertia = float(D[np.arange(len(X)), labels].sum())
        counts = np.bincount(labels, minlength=len(centers))
        sums = np.stack([np.bincount(labels, weights=X[:, j], minlength=len(centers))
                         for j in range(X.shape[1])], axis=1)
        empty = counts == 0
        centers = np.where(empty[:, None], centers, sums / np.maximum(counts, 1)[:, None])
        if previous - inertia <= tol * max(inertia, 1e-300):
            break
        previous = inertia
    D = squared_distances(np, X, centers)
    labels = D.argmin(axis=1)
    return labels, centers, float(D[np.arange(len(X)), labels].sum())
