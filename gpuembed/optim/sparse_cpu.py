"""Compiled sparse-matrix helpers of the spectral direction (optim/directions.py).

``largest_per_row`` sparsifies L+: the array code it replaces ranked all
entries with one ``np.lexsort`` over (row, -weight), 1.0 s for t-SNE's 2.7M
affinities on Fashion-MNIST 20k, paid again for every mu of a MAC run, each of
which builds its own direction.  ``csr_times`` is the CG's product with the
SD matrix on all cores (SciPy's runs on one).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(parallel=True, cache=True)
def largest_per_row(indptr, data, kappa):
    """Boolean mask over the entries: each row's ``kappa`` largest values (all of a
    row with fewer); among equal values the earlier stored ones."""
    keep = np.zeros(data.shape[0], dtype=np.bool_)
    for i in prange(indptr.shape[0] - 1):
        lo, hi = indptr[i], indptr[i + 1]
        if hi - lo <= kappa:
            keep[lo:hi] = True
        else:
            order = np.argsort(-data[lo:hi], kind="mergesort")
            for j in order[:kappa]:
                keep[lo + j] = True
    return keep


@njit(parallel=True, cache=True)
def csr_times(indptr, indices, data, V):
    """The CSR matrix (indptr, indices, data) times the dense (N, k) V."""
    n, k = indptr.shape[0] - 1, V.shape[1]
    out = np.zeros((n, k), dtype=V.dtype)
    for i in prange(n):
        for e in range(indptr[i], indptr[i + 1]):
            j, w = indices[e], data[e]
            for c in range(k):
                out[i, c] += w * V[j, c]
    return out
