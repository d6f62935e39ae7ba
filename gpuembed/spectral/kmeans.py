"""k-means (Lloyd's iterations, k-means++ seeding), vectorized over points.

X may be a scipy sparse matrix (the centers are dense, K x D)."""
from __future__ import annotations

import numpy as np
import scipy.sparse

from .._sparse import is_sparse, row_sqnorms
from ..nbody.exact import squared_distances


def kmeans(X, n_clusters, *, n_init=10, max_iter=300, tol=1e-9, init=None, random_state=None):
    """Best of ``n_init`` runs: (labels (N,), centers (K, D), inertia).

    ``init`` (K, D) starts one run from the given centers instead (warm start).
    """
    X = X.astype(np.float64) if is_sparse(X) else np.asarray(X, dtype=np.float64)
    rng = np.random.default_rng(random_state)
    best = None
    runs = [init] if init is not None else [None] * n_init
    for start in runs:
        centers = plusplus_seeds(X, n_clusters, rng) if start is None else np.array(start, float)
        result = _lloyd(X, centers, max_iter, tol)
        if best is None or result[2] < best[2]:
            best = result
    return best


def plusplus_seeds(X, k, rng):
    """k-means++ seeding: each new center drawn with probability proportional to the
    squared distance to the nearest center so far."""
    n = X.shape[0]
    chosen = [rng.integers(n)]
    sq = row_sqnorms(np, X)
    d2 = _sqdist_to_row(X, chosen[0], sq)
    for _ in range(1, k):
        total = d2.sum()
        idx = rng.integers(n) if total <= 0 else rng.choice(n, p=d2 / total)
        chosen.append(idx)
        d2 = np.minimum(d2, _sqdist_to_row(X, idx, sq))
    return X[chosen].toarray() if is_sparse(X) else X[chosen]


def _sqdist_to_row(X, i, sq):
    """Squared distances of X's rows to row i from the squared row norms ``sq``: one
    product with the row, where the differences made an (N, D) temporary at each
    of k-means++'s K steps (Fashion-MNIST, 10,000 x 784, K = 500: 9.8 s, now 0.6 s)."""
    product = (X @ X[i].T).toarray().ravel() if is_sparse(X) else X @ X[i]
    return np.maximum(sq + sq[i] - 2.0 * product, 0.0)


def _cluster_sums(X, labels, k):
    """(k, D) sums of each cluster's points: a product with the (k, N) membership
    matrix, which adds each cluster's points in index order as a bincount per
    column did (784 of them per Lloyd iteration on Fashion-MNIST: 1.3 s over 23
    iterations at 10,000 x 784, now 0.2 s)."""
    member = scipy.sparse.csr_matrix((np.ones(X.shape[0]), (labels, np.arange(X.shape[0]))),
                                     shape=(k, X.shape[0]))
    sums = member @ X
    return sums.toarray() if is_sparse(sums) else sums


def _lloyd(X, centers, max_iter, tol):
    previous = np.inf
    for _ in range(max_iter):
        D = squared_distances(np, X, centers)
        labels = D.argmin(axis=1)
        inertia = float(D[np.arange(X.shape[0]), labels].sum())
        counts = np.bincount(labels, minlength=len(centers))
        sums = _cluster_sums(X, labels, len(centers))
        empty = counts == 0
        centers = np.where(empty[:, None], centers, sums / np.maximum(counts, 1)[:, None])
        if previous - inertia <= tol * max(inertia, 1e-300):
            break
        previous = inertia
    D = squared_distances(np, X, centers)
    labels = D.argmin(axis=1)
    return labels, centers, float(D[np.arange(X.shape[0]), labels].sum())
