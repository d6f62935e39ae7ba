"""Compiled CPU helper of the rank-based metrics (metrics.py).

NumPy's stable argsort of a row of 20,000 distances takes 1.6 ms and its
quicksort (SIMD) 0.75 ms; ``ties_by_index`` turns the quicksort's order into
the stable one, ties ordered by index, in one pass over the sorted rows.
"""
from __future__ import annotations

import numpy as np
from numba import get_thread_id, njit, prange


@njit(parallel=True, cache=True)
def ties_by_index(D, order):
    """Sort, in place, each run of equal values in a row of ``order`` (column
    indices of D's row, ascending by value) by index."""
    for b in prange(order.shape[0]):
        values, o = D[b], order[b]
        start = 0
        for r in range(1, o.shape[0] + 1):
            if r == o.shape[0] or values[o[r]] != values[o[start]]:
                if r - start > 1:
                    o[start:r] = np.sort(o[start:r])
                start = r


@njit(parallel=True, cache=True)
def max_rank_counts(order_h, order_l, n, k_max, threads):
    """metrics.rnx's histogram for a block of rows: counts[m] = #pairs whose larger
    rank max(rho_ij, r_ij) is m (m = k_max + 1: beyond k_max in low-D), from each
    row's k_max nearest in high-D and in low-D order (column indices).  One
    histogram per thread (``threads``: numba.get_num_threads())."""
    counts = np.zeros((threads, k_max + 2), dtype=np.int64)
    for b in prange(order_h.shape[0]):
        rank_l = np.full(n, k_max + 1, dtype=np.int64)
        for r in range(k_max):
            rank_l[order_l[b, r]] = r + 1
        local = counts[get_thread_id()]
        for r in range(k_max):
            local[max(r + 1, rank_l[order_h[b, r]])] += 1
    return counts.sum(axis=0)
