"""Compiled search of each point's nearest landmarks along the affinity graph
(spectral/lll.py, ``z_neighbors="graph"``).

A point's candidates are the landmarks within a few hops of a graph point (its
own for a training point, its nearest training point for a new one); their
distances are computed for those pairs alone, and the kz nearest kept.  Rows
are taken in blocks, each with its own marks of the points reached (one array
of N entries per block, not per row).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

BLOCK_ROWS = 256


@njit(parallel=True, cache=True)
def graph_landmarks(indptr, indices, position, Q, seeds, landmark_rows, kz, hops):
    """(sqdist, idx, found): for each row r of Q (M, D) the ``kz`` nearest to it
    of the landmarks within ``hops`` hops of the graph point ``seeds[r]`` on the
    graph (indptr, indices) of N points, a landmark being a point with
    ``position`` >= 0 (its index among the landmarks, whose coordinates are
    ``landmark_rows``); ascending, equal distances in the order the walk met
    them.  ``found[r]``: how many of row r's kz entries are set (fewer where
    fewer landmarks lie that close)."""
    n, d = indptr.shape[0] - 1, Q.shape[1]
    m_rows, n_landmarks = Q.shape[0], landmark_rows.shape[0]
    sqdist = np.full((m_rows, kz), np.inf)
    idx = np.zeros((m_rows, kz), np.int64)
    found = np.zeros(m_rows, np.int64)
    n_blocks = (m_rows + BLOCK_ROWS - 1) // BLOCK_ROWS
    for b in prange(n_blocks):
        visited = np.full(n, -1, np.int64)     # the row whose walk last reached each point
        met = np.empty(n_landmarks, np.int64)
        frontier = np.empty(n, np.int64)
        for r in range(b * BLOCK_ROWS, min(m_rows, (b + 1) * BLOCK_ROWS)):
            i = seeds[r]
            # Breadth-first to ``hops``: each point reached once, its landmark met once.
            count = 0
            frontier[0] = i
            visited[i] = r
            lo, hi = 0, 1
            for hop in range(hops + 1):
                for f in range(lo, hi):
                    lm = position[frontier[f]]
                    if lm >= 0:
                        met[count] = lm
                        count += 1
                if hop == hops:
                    break
                end = hi
                for f in range(lo, hi):
                    v = frontier[f]
                    for e in range(indptr[v], indptr[v + 1]):
                        u = indices[e]
                        if visited[u] != r:
                            visited[u] = r
                            frontier[end] = u
                            end += 1
                lo, hi = hi, end
            m = 0
            for c in range(count):
                lm = met[c]
                s = 0.0
                for j in range(d):
                    t = Q[r, j] - landmark_rows[lm, j]
                    s += t * t
                if m == kz and s >= sqdist[r, kz - 1]:
                    continue
                k = m if m < kz else kz - 1
                while k > 0 and sqdist[r, k - 1] > s:
                    sqdist[r, k], idx[r, k] = sqdist[r, k - 1], idx[r, k - 1]
                    k -= 1
                sqdist[r, k], idx[r, k] = s, lm
                m = min(m + 1, kz)
            found[r] = m
    return sqdist, idx, found
