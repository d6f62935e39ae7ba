"""Spectral embedding (normalized Laplacian eigenmaps) of a sparse affinity graph."""
from __future__ import annotations

import numpy as np

from .._checks import check_int
from ..backend import get_backend


def spectral_embedding(W, n_components, *, backend="auto", random_state=0, drop_first=True):
    """Coordinates from the normalized Laplacian of a symmetric affinity matrix.

    Solves L u = lambda D u (L = D - W) for the ``n_components`` smallest
    eigenvalues after the trivial one (all of them from the first if not
    ``drop_first``, as Ng-Jordan-Weiss clustering wants) through the equivalent
    largest eigenvectors of D^-1/2 W D^-1/2, and returns D^-1/2 times them,
    shape (N, n_components).
    A disconnected graph has several zero eigenvalues; the coordinates then
    separate components instead of spreading within them.
    """
    be = get_backend(backend)
    xp = be.xp
    W = be.sparse.csr_matrix(W)
    n = W.shape[0]
    if W.shape != (n, n):
        raise ValueError(f"W must be square, got shape {W.shape}")
    n_components = check_int(n_components, "n_components", 1, n - 2)
    degree = xp.asarray(W.sum(axis=1)).ravel()
    if bool((degree <= 0).any()):
        raise ValueError("W has a row without any affinity (isolated point)")
    d_isqrt = 1.0 / xp.sqrt(degree)
    scale = be.sparse.diags(d_isqrt)
    M = scale @ W @ scale
    v0 = be.asarray(np.random.default_rng(random_state).random(n), dtype=M.dtype)
    # Largest eigenvalues of M = smallest of the normalized Laplacian I - M.
    skip = 1 if drop_first else 0
    vals, vecs = be.sparse_linalg.eigsh(M, k=n_components + skip, which="LA", v0=v0)
    order = xp.argsort(-vals)
    vecs = vecs[:, order[skip:]]       # drop the trivial eigenvector D^1/2 1
    Y = vecs * d_isqrt[:, None]
    # Fix each eigenvector's sign so that the result is reproducible.
    signs = xp.sign(Y[xp.argmax(xp.abs(Y), axis=0), xp.arange(n_components)])
    return Y * signs
