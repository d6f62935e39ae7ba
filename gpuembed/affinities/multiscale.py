"""Multi-scale entropic affinities (../shared/papers/004_13864de36f3612a6.txt,
sections 2.9 and 2.11, eq. 2.11): the average of the conditional entropic
affinities at perplexities K_h = 2^(h-1) K*, h = 1 .. floor(log2(N / K*)).

All scales share one k-NN computation (k = N - 1 by default: the largest scale
reaches about N / 2 neighbours), and each scale's root finding reuses the same
shifted distances.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse

from .._checks import check_bool, check_float, check_int
from ..backend import get_backend
from .entropic import _calibrate, _neighbors, joint


@dataclass
class MultiscaleAffinities:
    """P: sparse (N, N), the joint (P + P^T) / (2N) if symmetrized, else the
    row-stochastic average of the scales' conditionals.  conditionals: the H
    per-scale conditional matrices (sparse, one pattern).  perplexities: (H,)
    the scales.  beta, entropy, n_iter: (N, H), one column per scale."""

    P: Any
    conditionals: list
    perplexities: np.ndarray
    beta: Any
    entropy: Any
    n_iter: Any
    neighbors: tuple


NEIGHBOR_BUDGET = 20_000_000   # default cap on N x k: 320 MB of distances and indices
MIN_LARGEST = 32.0             # ... unless the scales up to this perplexity need more
# The default leaves out the thesis' largest scales, K_H in (N / 8, N / 2]: near-uniform
# over a quarter of the data or more, they need a dense k-NN graph and cost most of
# the run below ~7,000 points, for no AUC (msne.json: digits 0.588 -> 0.589, 20.6 s ->
# 12.5 s; rotating_objects 0.612 -> 0.613; Fashion-MNIST 2k 0.583 -> 0.588, 21.9 s -> 15.1 s).
DROPPED_LARGEST = 2


def scale_perplexities(n, perplexity=2.0, n_scales=None):
    """K_h = 2^(h-1) K* for h = 1 .. floor(log2(N / K*)), the H smallest of them.

    ``n_scales``: H, or "all", or None: all but the ``DROPPED_LARGEST`` largest
    (K_H <= N / 8), and no more than keep the default k-NN graph (k = 3 K_H)
    within ``NEIGHBOR_BUDGET`` entries, but at least those up to perplexity
    ``MIN_LARGEST`` (t-SNE's usual graph): seven (K_H = 128) at 2,000 points,
    nine (512) at 10,000, six (64) at 70,000.  All of them make K_H about N / 2
    and the graph dense: O(N^2) memory and time, and one sparse matrix per scale.
    """
    K = check_float(perplexity, "perplexity", 1.0, low_open=True)
    H = int(math.floor(math.log2(n / K)))
    if H < 1:
        raise ValueError(f"perplexity must be at most N / 2 = {n / 2}, got {K}")
    if n_scales is None:
        H = max(1, H - DROPPED_LARGEST)
        while (K * 2.0 ** (H - 1) > MIN_LARGEST
               and n * _default_neighbors(n, K * 2.0 ** (H - 1)) > NEIGHBOR_BUDGET):
            H -= 1
    elif isinstance(n_scales, str):
        if n_scales != "all":
            raise ValueError(f"n_scales must be an integer, 'all' or None, got {n_scales!r}")
    else:       # more scales than N holds would be silently fewer
        H = check_int(n_scales, f"n_scales (N = {n}, perplexity {K:g})", 1, H)
    return K * 2.0 ** np.arange(H)


def mean_on_pattern(be, matrices):
    """The average of CSR matrices with one pattern (equal indices and indptr),
    by their data arrays: a sum of sparse matrices merges patterns (1.1 s for 9
    matrices of 1.5e7 entries against 0.1 s).  On the matrices' device: the
    host for SciPy matrices, else ``be``'s."""
    first = matrices[0]
    for M in matrices[1:]:
        for a, b in ((M.indptr, first.indptr), (M.indices, first.indices)):
            if a.shape != b.shape or bool((a != b).any()):
                raise ValueError("the matrices must share one sparsity pattern")
    data = first.data.copy()
    for M in matrices[1:]:
        data += M.data
    data /= len(matrices)           # in place: a fresh array of the pairs costs page faults
    sparse = scipy.sparse if scipy.sparse.issparse(first) else be.sparse
    return sparse.csr_matrix((data, first.indices, first.indptr), shape=first.shape)


def _default_neighbors(n, largest_perplexity):
    return min(n - 1, math.ceil(3 * largest_perplexity))


def multiscale_affinities(X=None, perplexity=2.0, *, n_scales=None, n_neighbors=None,
                          neighbors=None, metric="euclidean", symmetrize=True, tol=1e-10,
                          backend="auto"):
    """Average of entropic affinities over the perplexity scales of eq. 2.11.

    Parameters
    ----------
    X, n_neighbors, neighbors, metric, backend : as in :func:`gpuembed.entropic_affinities`
        (default n_neighbors: 3 times the largest scale's perplexity, within N - 1).
    perplexity : the smallest scale K* (> 1).
    n_scales : see :func:`scale_perplexities`.  Scales whose perplexity is not below
        the number of neighbours are an error (pass a larger n_neighbors or fewer
        n_scales).
    symmetrize : P is the joint (P + P^T) / (2N) of the average instead of the
        average of the conditionals.
    tol : the calibration's tolerance on |H - log K| in nats.

    Returns a :class:`MultiscaleAffinities`.
    """
    be = get_backend(backend)
    xp = be.xp
    check_bool(symmetrize, "symmetrize")
    n = (X if X is not None else neighbors[0]).shape[0]
    scales = scale_perplexities(n, perplexity, n_scales)
    if n_neighbors is None and neighbors is None:
        n_neighbors = _default_neighbors(n, scales[-1])
    sqdist, indices = _neighbors(X, neighbors, scales[-1], n_neighbors, be, metric)
    k = sqdist.shape[1]
    if scales[-1] >= k:
        raise ValueError(f"the largest scale's perplexity {scales[-1]} needs more than the "
                         f"{k} neighbours given; lower n_scales or raise n_neighbors")
    sqdist = sqdist.astype(xp.float64)
    # One canonical pattern (columns sorted in each row) shared by every scale:
    # the objectives take it without sorting it again at each stage (0.5 s at
    # 10,000 points and 9 scales), and the average is a sum of the data arrays.
    by_column = xp.argsort(indices, axis=1)
    cols = xp.take_along_axis(indices, by_column, axis=1).ravel().astype(xp.int32)
    indptr = xp.arange(0, n * k + 1, k, dtype=xp.int32)
    conditionals, columns = [], []
    for K in scales:
        beta, entropy, n_iter, W_h = _calibrate(be, sqdist, indices, np.full(n, K), "newton",
                                                "dk", tol)
        W_h = xp.take_along_axis(W_h, by_column, axis=1).ravel()
        conditionals.append(be.sparse.csr_matrix((W_h, cols, indptr), shape=(n, n)))
        columns.append((beta, entropy, n_iter))
    P = mean_on_pattern(be, conditionals)
    if symmetrize:
        P = joint(P)
    beta, entropy, n_iter = (xp.stack(c, axis=1) for c in zip(*columns))
    return MultiscaleAffinities(P=P, conditionals=conditionals, perplexities=scales, beta=beta,
                                entropy=entropy, n_iter=n_iter, neighbors=(sqdist, indices))
