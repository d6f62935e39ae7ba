"""Entropic (perplexity-calibrated) affinities.

Source: ../shared/papers/003_e1371111a5435f8e.txt and chapter 2 of
000_7551f45b306cd904.txt.  Each point n gets the precision beta_n for which the
distribution p(m|n) proportional to exp(-beta_n |x_n - x_m|^2) over its k nearest
neighbours has entropy log K (perplexity K).  Root finding: rootfinding.py;
warm-start orders: orders.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._checks import check_bool, check_choice, check_data, check_float, check_int, warn
from ..backend import get_backend
from ..neighbors import METRICS
from ..neighbors_ivf import SEARCHES
from . import orders as _orders
from . import rootfinding, rootfinding_cpu

__all__ = ["EntropicAffinities", "entropic_affinities"]


@dataclass
class EntropicAffinities:
    """Result of :func:`entropic_affinities` (arrays live on the backend's device).

    P : sparse CSR (N, N): the symmetric joint (P + P^T) / (2N) summing to 1 if
        ``symmetrize``, else the row-stochastic conditional p(m|n).
    beta : (N,) precisions; 0 for rows whose distances are all equal, +inf for rows
        whose tied nearest neighbours already outnumber the perplexity.
    entropy : (N,) achieved entropy in nats.
    n_iter : (N,) function evaluations of the root finding per point.
    neighbors : (sqdist, indices) used.
    """

    P: Any
    beta: Any
    entropy: Any
    n_iter: Any
    neighbors: tuple


def entropic_affinities(X=None, perplexity=30.0, *, n_neighbors=None, neighbors=None,
                        metric="euclidean", method="newton", order="dk", tol=1e-10,
                        symmetrize=True, backend="auto"):
    """Perplexity-calibrated Gaussian affinities over the k nearest neighbours.

    Parameters
    ----------
    X : (N, D) data (dense, or a scipy / cupyx sparse matrix), or None when
        ``neighbors`` is given.
    perplexity : float in (1, n_neighbors), or an (N,) array of per-point values
        (NumPy, or CuPy on the GPU).
    n_neighbors : neighbours per point; default ``min(N - 1, ceil(3 * max perplexity))``,
        the anchors' choice (scikit-learn, openTSNE), so results are comparable:
        beyond 3K neighbours the Gaussian weights are negligible for the entropy.
    neighbors : precomputed ``(sqdist, indices)``, each (N, k), self excluded; or the
        search that finds them in X: "exact" (:func:`gpuembed.knn`), "approx"
        (:func:`gpuembed.approx_knn`, several times faster for large N, with some of
        the true neighbours missed) or "auto" (the default, None: "approx" from
        ``neighbors_ivf.AUTO_APPROX_FROM`` points on, 50,000 on the CPU; "exact"
        below and on the GPU).
    metric : "euclidean" | "cosine": how the search compares X's rows, or
        "precomputed": X an (N, N) distance matrix, each row sorted, or a sparse
        k-NN graph of distances, each row's stored entries (see
        :func:`gpuembed.knn`); given neighbours are distances already.
    method : "newton" | "halley" | "euler" | "bisection" (Algorithm 1).
    order : "dk" | "mst" | "msp" | "bounds" | "none" warm-start order, or a
        sequence of all N point indices (e.g. ``raster_order(h, w)`` for the
        pixels of an image), solved in parallel waves (see orders.py).
    tol : tolerance on |H - log K| in nats (default 1e-10; computed in float64).
    symmetrize : return the joint (P + P^T) / (2N) instead of the conditional.
    backend : "auto" | "cpu" | "gpu" | Backend, where the search and the
        calibration run (all rows in parallel).

    Degenerate rows are not solved but set to the limit the equation tends to, with
    a RuntimeWarning: if all k distances are equal the entropy is log k for every
    beta (beta = 0, uniform row); if m >= K neighbours tie at the minimum distance
    (duplicates) the entropy cannot fall below log m (beta = +inf, uniform over them).
    """
    be = get_backend(backend)
    xp = be.xp
    check_choice(method, "method", rootfinding.METHODS)
    if isinstance(neighbors, str):
        check_choice(neighbors, "neighbors", tuple(SEARCHES))
    if isinstance(order, str):           # before the k-NN; a sequence is checked after it
        _orders.check_order(order, None)
    tol = check_float(tol, "tol", 0.0, low_open=True)
    check_bool(symmetrize, "symmetrize")
    perplexity = _perplexity_values(be.to_host(perplexity))   # may live on the device
    sqdist, indices = _neighbors(X, neighbors, perplexity, n_neighbors, be, metric)
    n, k = sqdist.shape
    K = _perplexities(perplexity, n, k)
    if not isinstance(order, str):       # a name was checked above, before the k-NN
        order = _orders.check_order(order, n, be.to_host)

    sqdist = sqdist.astype(xp.float64)
    beta, entropy, n_iter, W = _calibrate(be, sqdist, indices, K, method, order, tol)
    P = be.sparse.csr_matrix((W.ravel(), indices.ravel().astype(xp.int32),
                              xp.arange(0, n * k + 1, k, dtype=xp.int32)), shape=(n, n))
    if symmetrize:
        P = joint(P)
    return EntropicAffinities(P=P, beta=beta, entropy=entropy, n_iter=n_iter,
                              neighbors=(sqdist, indices))


def joint(P):
    """The joint (P + P^T) / (2N) of conditional affinities P (N, N), scaled in
    place: the bits of scipy's ``/ (2N)`` (a product with 1 / (2N)) without its copy
    of the sum's values and indices.  10^6 points with 90 random neighbours each:
    peak memory above the inputs 3.4 GB against 4.4 GB."""
    P = (P + P.T).tocsr()
    P.data *= 1.0 / (2.0 * P.shape[0])
    return P


def conditional_affinities(sqdist, perplexity, *, backend="auto"):
    """Row-stochastic entropic weights (M, k) for given neighbour distances (M, k),
    e.g. of new points to training points (used by out-of-sample mappings)."""
    be = get_backend(backend)
    sqdist = check_data(sqdist, be, name="sqdist", dtype=np.float64, min_samples=1)
    K = _perplexity_values(be.to_host(perplexity))
    K = _perplexities(K, sqdist.shape[0], sqdist.shape[1])
    return _calibrate(be, sqdist, None, K, "newton", "bounds", 1e-10)[3]


def _calibrate(be, sqdist, indices, K, method, order, tol):
    """beta, entropy, evaluations and row weights p(m|n) (N, k) for float64 sqdist."""
    xp = be.xp
    n, k = sqdist.shape
    shifted = sqdist - sqdist.min(axis=1, keepdims=True)
    lo, hi = rootfinding.log_beta_bounds(xp, shifted, K)
    n_tied = (shifted == 0).sum(axis=1)
    flat = be.to_host(shifted.max(axis=1) == 0)
    saturated = be.to_host(n_tied >= be.asarray(K)) & ~flat
    solvable = ~(flat | saturated)
    _warn_degenerate(flat, saturated)
    alpha, entropy, n_iter = solve_rows(be, shifted, K, lo, hi, method, order, tol,
                                        (sqdist, indices),
                                        rows=None if solvable.all() else np.flatnonzero(solvable))
    beta = xp.exp(alpha)
    # Degenerate rows: the limits described in entropic_affinities' docstring.
    beta[be.asarray(flat)] = 0.0
    beta[be.asarray(saturated)] = xp.inf
    entropy[be.asarray(flat)] = math.log(k)
    entropy[be.asarray(saturated)] = xp.log(n_tied[be.asarray(saturated)].astype(xp.float64))
    n_iter[be.asarray(~solvable)] = 0
    return beta, entropy, n_iter, _row_weights(xp, shifted, beta)


def solve_rows(be, shifted, perplexity, lo, hi, method, order, tol, neighbors, rows=None,
               parallel=True, gpu_kernel=True):
    """log beta, entropy and evaluations per row, following ``order``'s waves
    (``neighbors``: the (sqdist, indices) the order is built from, on either device).

    Only ``rows`` (default all) are solved; the others come back as NaN / 0.
    ``parallel=False`` runs the paper's sequential order (one point per wave),
    for comparison only.  On the GPU each wave is one launch of
    kernels/entropic.cu (``gpu_kernel=False``: the array code of
    rootfinding.solve on CuPy, its reference); on the CPU one call of its
    compiled twin, rootfinding_cpu.solve.
    """
    xp = be.xp
    n = shifted.shape[0]
    log_k = be.asarray(np.log(perplexity))
    with np.errstate(divide="ignore"):
        log_scale = xp.log(shifted.mean(axis=1))
    alpha = xp.full(n, xp.nan)
    entropy = xp.full(n, xp.nan)
    n_iter = xp.zeros(n, dtype=xp.int64)
    waves = _orders.schedule(order, *neighbors, perplexity, parallel, xp=xp,
                             to_host=be.to_host)
    if rows is not None:
        keep = xp.zeros(n, dtype=bool)
        keep[be.asarray(rows)] = True
    for r, sources in waves:
        r = be.asarray(r)
        sources = None if sources is None else be.asarray(sources)
        if rows is not None:
            mask = keep[r]
            r, sources = r[mask], None if sources is None else sources[mask]
        if r.size == 0:
            continue
        alpha0 = _start(xp, sources, alpha + log_scale, log_scale[r], lo[r], hi[r], order)
        if be.is_gpu and gpu_kernel and shifted.shape[1] <= rootfinding.KERNEL_MAX_K:
            a, h, it = rootfinding.solve_kernel(be, shifted, r, log_k[r], alpha0, lo[r],
                                                hi[r], method, tol)
        elif be.is_gpu:
            a, h, it = rootfinding.solve(xp, shifted[r], log_k[r], alpha0, lo[r].copy(),
                                         hi[r].copy(), method, tol)
        else:
            a, h, it = rootfinding_cpu.solve(shifted, r, log_k[r], alpha0, lo[r], hi[r], method,
                                             tol)
        alpha[r], entropy[r], n_iter[r] = a, h, it
    return alpha, entropy, n_iter


def _start(xp, sources, scale_free, log_scale, lo, hi, order):
    """Initial log beta of a wave's rows.

    H depends on the distances only through their shape: scaling a row's
    distances by c moves its root by -log c.  So what is carried over from the
    solved sources is the scale-free part ``log beta + log(mean distance)``,
    averaged over the sources; rows without a source start mid-bracket, and
    order "none" starts every row at beta = 1 (the anchors' choice).
    """
    if isinstance(order, str) and order == "none":
        return xp.zeros(lo.shape)
    if sources is None:
        return 0.5 * (lo + hi)
    src = scale_free[xp.maximum(sources, 0)]
    valid = (sources >= 0) & xp.isfinite(src)
    count = valid.sum(axis=1)
    mean = xp.where(valid, src, 0.0).sum(axis=1) / xp.maximum(count, 1)
    return xp.where(count > 0, mean - log_scale, 0.5 * (lo + hi))


def _row_weights(xp, shifted, beta):
    """Rows of p(m|n); beta = +inf rows are uniform over their zero-distance neighbours.
    In place in one array of shifted's size: each fresh one of multi-scale SNE's 15M
    neighbours (Fashion-MNIST 10k) took up to 0.27 s of page faults on the 2-core VM."""
    with np.errstate(invalid="ignore"):
        w = xp.multiply(-beta[:, None], shifted)
        xp.exp(w, out=w)
    w[xp.isnan(w)] = 1.0                    # inf * 0: the tied neighbours of saturated rows
    w /= w.sum(axis=1, keepdims=True)
    return w


def checked_neighbors(neighbors, be):
    """A given k-NN ``(sqdist, indices)`` of N points on ``be``, checked: shapes,
    non-negative distances, indices in range, no point its own neighbour and none
    listed twice in a row (each listed pair becomes an affinity, so a repeated one
    would count twice); returns (sqdist as float64, indices as int64)."""
    xp = be.xp
    try:
        sqdist, indices = neighbors
    except (TypeError, ValueError):
        raise ValueError("neighbors must be a pair (sqdist, indices)") from None
    sqdist = check_data(sqdist, be, name="neighbors[0] (sqdist)", dtype=np.float64,
                        min_samples=3)
    indices = be.asarray(indices)
    n, k = sqdist.shape
    if indices.shape != (n, k):
        raise ValueError(f"neighbors: indices shape {indices.shape} != sqdist shape {(n, k)}")
    if indices.dtype.kind not in "iu":
        raise TypeError("neighbors: indices must be integers")
    if bool((sqdist < 0).any()):
        raise ValueError("neighbors: squared distances must be >= 0")
    if bool(((indices < 0) | (indices >= n)).any()):
        raise ValueError(f"neighbors: indices must be in [0, {n - 1}]")
    own = indices == xp.arange(n)[:, None]
    if bool(own.any()):
        first = int(xp.flatnonzero(own.any(axis=1))[0])
        raise ValueError(f"neighbors: a point must not be its own neighbour (row {first}); "
                         "a search of X among X that returns each point first (as "
                         "scikit-learn's kneighbors(X) does) needs its first column dropped")
    ordered = xp.sort(indices, axis=1)
    repeated = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)
    if bool(repeated.any()):
        raise ValueError(f"neighbors: row {int(xp.flatnonzero(repeated)[0])} lists a point "
                         "twice; each neighbour must appear once per row")
    if k < 2:
        raise ValueError("neighbors: need at least 2 neighbours per point")
    return sqdist, indices.astype(xp.int64)


def _neighbors(X, neighbors, perplexity, n_neighbors, be, metric):
    check_choice(metric, "metric", METRICS)
    if neighbors is not None and not isinstance(neighbors, str):
        if X is not None and n_neighbors is not None:
            raise ValueError("give either neighbors or n_neighbors, not both")
        if metric != "euclidean":
            raise ValueError(f"metric={metric!r} applies to the search in X; the given "
                             f"neighbors=(sqdist, indices) are distances already")
        sqdist, indices = checked_neighbors(neighbors, be)
        if X is not None and getattr(X, "shape", (sqdist.shape[0],))[0] != sqdist.shape[0]:
            raise ValueError(f"neighbors has {sqdist.shape[0]} rows but X has {X.shape[0]}")
        return sqdist, indices
    X = check_data(X, be, min_samples=3, sparse=True)
    n = X.shape[0]
    if n_neighbors is None:
        n_neighbors = min(n - 1, math.ceil(3 * float(np.max(perplexity))))
    n_neighbors = check_int(n_neighbors, "n_neighbors", 2, n - 1)
    return SEARCHES[neighbors or "auto"](X, n_neighbors, metric=metric, backend=be)


def _perplexity_values(perplexity):
    """The perplexity (a number or a 1-D array) as float64, each value finite and > 1;
    checked before the neighbours are searched."""
    K = np.asarray(perplexity)
    if isinstance(perplexity, bool) or K.dtype.kind not in "iuf" or K.ndim > 1:
        raise TypeError("perplexity must be a number or a 1-D array of numbers, got "
                        f"{type(perplexity).__name__} of dtype {K.dtype}")
    K = K.astype(np.float64)
    if K.size == 0 or not np.all(np.isfinite(K)) or np.any(K <= 1):
        raise ValueError("perplexity must be finite and > 1 for every point, got values in "
                         f"[{K.min() if K.size else None}, {K.max() if K.size else None}]")
    return K


def _perplexities(K, n, k):
    """Per-point perplexities (from _perplexity_values) as an (n,) array, each < k."""
    if K.ndim == 1 and K.shape[0] != n:
        raise ValueError(f"perplexity must be a number or an array of {n} values")
    if np.any(K >= k):
        limit = f" (N - 1 = {k}: {n} points have no more neighbours)" if k == n - 1 else ""
        raise ValueError(f"perplexity must be in (1, n_neighbors = {k}) for every point{limit}, "
                         f"got values in [{K.min()}, {K.max()}]")
    return np.broadcast_to(K, (n,)).copy()


def _warn_degenerate(flat, saturated):
    if flat.any():
        warn(f"{int(flat.sum())} point(s) have all neighbour distances equal: entropy is "
             "log(n_neighbors) for every beta; set beta = 0 (uniform row)")
    if saturated.any():
        warn(f"{int(saturated.sum())} point(s) have at least perplexity neighbours at their "
             "minimum distance (duplicates): entropy cannot reach log(perplexity); set beta = "
             "inf (uniform over the tied neighbours)")
