"""Compiled sparse-matrix helpers of the spectral direction (optim/directions.py).

``largest_per_row`` sparsifies L+: the array code it replaces ranked all
entries with one ``np.lexsort`` over (row, -weight), 1.0 s for t-SNE's 2.7M
affinities on Fashion-MNIST 20k, paid again for every mu of a MAC run, each of
which builds its own direction.  ``csr_times`` is the CG's product with the
SD matrix on all cores (SciPy's runs on one), ``jacobi_pcg`` SD's whole CG.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(parallel=True, cache=True)
def largest_per_row(indptr, data, kappa):
    """Boolean mask over the entries: each row's ``kappa`` largest values (all of a
    row with fewer); among equal values the earlier stored ones.

    Each row streams through a descending buffer of its best ``kappa`` so far,
    which a value enters only if it beats the buffer's last: a few dozen
    insertions in a row of t-SNE's ~140 affinities, where a sort of the row
    (as before) cost 0.2 s per refresh of SD at Fashion-MNIST 70k."""
    keep = np.zeros(data.shape[0], dtype=np.bool_)
    for i in prange(indptr.shape[0] - 1):
        lo, hi = indptr[i], indptr[i + 1]
        if hi - lo <= kappa:
            keep[lo:hi] = True
            continue
        best = np.empty(kappa, dtype=data.dtype)
        where = np.empty(kappa, dtype=np.int64)
        m = 0
        for e in range(lo, hi):
            v = data[e]
            if m == kappa and v <= best[m - 1]:
                continue                   # ties go to the earlier entry already kept
            j = m if m < kappa else kappa - 1
            while j > 0 and best[j - 1] < v:
                best[j], where[j] = best[j - 1], where[j - 1]
                j -= 1
            best[j], where[j] = v, e
            m = min(m + 1, kappa)
        for j in range(kappa):
            keep[where[j]] = True
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


@njit(parallel=True, cache=True)
def jacobi_pcg(indptr, indices, data, diag, B, X0, rtol, maxiter, tiny):
    """directions.pcg for the CSR matrix A = (indptr, indices, data) with the
    Jacobi preconditioner 1 / ``diag``, compiled: the vector updates of a step
    and its two dot products are one pass per column on all cores (as array
    code they cost as much as the product with A at 20,000 points)."""
    n, k = B.shape
    X = X0.copy()
    R = B - csr_times(indptr, indices, data, X)
    Z = np.empty_like(R)
    rz, rr, target = np.zeros(k), np.zeros(k), np.zeros(k)
    for c in range(k):
        s_rz, s_rr, s_bb = 0.0, 0.0, 0.0
        for i in prange(n):
            Z[i, c] = R[i, c] / diag[i]
            s_rz += R[i, c] * Z[i, c]
            s_rr += R[i, c] * R[i, c]
            s_bb += B[i, c] * B[i, c]
        rz[c], rr[c], target[c] = s_rz, s_rr, rtol * np.sqrt(s_bb)
    P = Z.copy()
    for _ in range(maxiter):
        if np.all(np.sqrt(rr) <= target):
            break
        AP = csr_times(indptr, indices, data, P)
        for c in range(k):
            pap = 0.0
            for i in prange(n):
                pap += P[i, c] * AP[i, c]
            alpha = rz[c] / max(pap, tiny)
            s_rz, s_rr = 0.0, 0.0
            for i in prange(n):
                X[i, c] += alpha * P[i, c]
                r = R[i, c] - alpha * AP[i, c]
                R[i, c] = r
                z = r / diag[i]
                Z[i, c] = z
                s_rz += r * z
                s_rr += r * r
            beta = s_rz / max(rz[c], tiny)
            for i in prange(n):
                P[i, c] = Z[i, c] + beta * P[i, c]
            rz[c], rr[c] = s_rz, s_rr
    return X
