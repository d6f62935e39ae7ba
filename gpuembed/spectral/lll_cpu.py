"""Compiled search of each point's nearest landmarks along the affinity graph
(spectral/lll.py, ``z_neighbors="graph"``).

A point's candidates are the landmarks within 2 or 3 hops of a graph point (its
own for a training point, its nearest training point for a new one), each
scored by its best path's product of affinities; the kz best are kept and only
their distances computed.  Rows are taken in blocks, each with its own marks of
the landmarks met (one array of L entries per block, not per row).  On
Fashion-MNIST 70k (a 20-NN graph, 32 neighbours per point after symmetrizing;
3,000 landmarks, float64) the earlier rule, the kz nearest of those candidates
by their distances in 784-D, took 0.12-0.14 s, most of it those distances; a
breadth-first walk over the points 2 hops away took 0.59 s.

``spread_points`` draws landmarks="spread": points none of whose nearest graph
neighbours is a landmark yet.

``landmark_pair_sqdist`` serves the local Gram systems of either search: the
distances between the landmarks that share a point, not all L^2 of them;
``local_weights`` builds and solves those systems, a point per task.

``select_columns`` takes the graph's strict upper triangle or its landmark
columns in one pass; ``reduced_dense`` (with ``dense_to_csr``) sums the reduced
matrices Z^T (D - W) Z and Z^T D Z landmark row by row where kz is small.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

BLOCK_ROWS = 256


# Reassociation lets LLVM vectorize the sums of squares; no flag about infinities,
# which the unset entries of ``sqdist`` hold.
@njit(parallel=True, fastmath={"reassoc", "contract"}, cache=True)
def graph_landmarks(indptr, indices, data, near_ptr, near, near_data, position, Q, queries,
                    seeds, landmark_rows, kz, hops, idx2, score2, found2):
    """(sqdist, idx, score, found): for each row r the ``kz`` landmarks closest
    along the graph (indptr, indices, data: N points, affinities) to the graph
    point ``seeds[r]`` by paths of at most ``hops`` (2 or 3) edges, a path's
    score the product of its affinities (the seed itself, when a landmark,
    scores 1, the empty path's, and comes first: affinities are at most 1);
    ``sqdist``: their squared distances to row ``queries[r]`` of Q (M, D),
    ascending, with ``idx`` their positions among the landmarks, whose
    coordinates are ``landmark_rows``, and ``score`` their scores; ``position``:
    each point's index among the landmarks (-1 for the others); (near_ptr, near,
    near_data): the graph's columns of the landmarks (CSR, N x L).  Ties keep
    their order: equal scores the order met, equal distances that of the scores.
    ``found[r]``: how many of row r's kz entries are set (fewer where fewer
    landmarks lie that close).

    The landmarks 2 hops away are the seed's neighbouring landmarks and those of
    each of its neighbours: a pass over the seed's row and its neighbours' short
    lists, not over the points 2 hops away (32 neighbours per point: about 1,000
    of them); 3 hops, those of its neighbours' neighbours too.  Given every
    point's result for 2 hops (idx2, score2, found2; empty: none), 3 hops take
    them instead: a path of 3 edges is an edge to a neighbour v and one of at
    most 2 from v, so a seed's candidates are its own kz and each neighbour's
    with scores times the edge's.  A landmark among the seed's kz best through v
    is among v's kz best, or v's kz would all score above it through v: the kz
    best are exact (up to ties), from 32 kz candidates a row, not the points 3
    hops away (Fashion-MNIST 70k, 250 landmarks: LLL 0.52 s against 0.90 s)."""
    m_rows = seeds.shape[0]
    n_landmarks = landmark_rows.shape[0]
    from_lists = hops == 3 and idx2.shape[0] > 0
    sqdist = np.full((m_rows, kz), np.inf)
    idx = np.zeros((m_rows, kz), np.int64)
    score_out = np.zeros((m_rows, kz))
    found = np.zeros(m_rows, np.int64)
    n_blocks = (m_rows + BLOCK_ROWS - 1) // BLOCK_ROWS
    for b in prange(n_blocks):
        seen = np.full(n_landmarks, -1, np.int64)      # the row that last met each landmark
        met = np.empty(n_landmarks, np.int64)
        score = np.empty(n_landmarks)                  # the best path's, for this row
        best = np.empty(kz, np.int64)
        best_score = np.empty(kz)
        for r in range(b * BLOCK_ROWS, min(m_rows, (b + 1) * BLOCK_ROWS)):
            i = seeds[r]
            count = 0
            if position[i] >= 0 and not from_lists:     # the seed itself, first
                lm = position[i]
                seen[lm], met[0], score[lm] = r, lm, 1.0
                count = 1
            for e in range(indptr[i], indptr[i + 1] + 1):
                # The neighbours, then i (a path's first edge, of affinity 1).
                v, w = (i, 1.0) if e == indptr[i + 1] else (indices[e], data[e])
                if from_lists:
                    count = _meet(idx2[v], score2[v], 0, found2[v], w, r, seen, met, score,
                                  count)
                    continue
                count = _meet(near, near_data, near_ptr[v], near_ptr[v + 1], w, r, seen, met,
                              score, count)
                if hops == 3 and v != i:
                    for e2 in range(indptr[v], indptr[v + 1]):
                        u = indices[e2]
                        if near_ptr[u] < near_ptr[u + 1]:       # most points hold none
                            count = _meet(near, near_data, near_ptr[u], near_ptr[u + 1],
                                          w * data[e2], r, seen, met, score, count)
            found[r] = _keep(r, queries[r], met, score, count, best, best_score, Q,
                             landmark_rows, sqdist, idx, score_out)
    return sqdist, idx, score_out, found


@njit(inline="always", cache=True)
def _meet(landmarks, scores, start, stop, w, r, seen, met, score, count):
    """Meets the landmarks[start:stop] that a point v reaches with ``scores``, by
    paths of score ``w`` to v: each that row r has not met is appended to ``met``
    (its first ``count`` entries set) with the path's score through v, each met
    before keeps the better score; returns the new count."""
    for f in range(start, stop):
        lm, s = landmarks[f], w * scores[f]
        if seen[lm] != r:
            seen[lm] = r
            met[count] = lm
            score[lm] = s
            count += 1
        elif s > score[lm]:
            score[lm] = s
    return count


@njit(inline="always", fastmath={"reassoc", "contract"}, cache=True)
def _keep(r, q, met, score, count, best, best_score, Q, landmark_rows, sqdist, idx, score_out):
    """Row r's kz best scores of the ``count`` landmarks ``met``, into sqdist[r],
    idx[r] and score_out[r] by ascending squared distance to row q of Q; returns
    how many are set."""
    kz = best.shape[0]
    for c in range(count):                          # the kz best scores
        lm = met[c]
        if c >= kz and score[lm] <= best_score[kz - 1]:
            continue
        k = min(c, kz - 1)
        while k > 0 and best_score[k - 1] < score[lm]:
            best_score[k], best[k] = best_score[k - 1], best[k - 1]
            k -= 1
        best_score[k], best[k] = score[lm], lm
    m = min(count, kz)
    for c in range(m):                              # their distances, ascending
        lm = best[c]
        s = 0.0
        for j in range(Q.shape[1]):
            t = Q[q, j] - landmark_rows[lm, j]
            s += t * t
        k = c
        while k > 0 and sqdist[r, k - 1] > s:
            sqdist[r, k], idx[r, k], score_out[r, k] = (sqdist[r, k - 1], idx[r, k - 1],
                                                         score_out[r, k - 1])
            k -= 1
        sqdist[r, k], idx[r, k], score_out[r, k] = s, lm, best_score[c]
    return m


@njit(parallel=True, cache=True)
def by_affinity(indptr, indices, data):
    """The column indices of each row of the CSR matrix (indptr, indices, data),
    the largest entries first (ties in their stored order).  By insertion, a row
    per task: k-NN graphs have a few dozen entries per row (Fashion-MNIST 70k,
    20-NN, 32 entries per row: 28 ms, against 60 ms for a stable argsort of each
    row)."""
    out = indices.copy()
    value = data.copy()
    for i in prange(indptr.shape[0] - 1):
        for e in range(indptr[i] + 1, indptr[i + 1]):
            v, j, k = value[e], out[e], e
            while k > indptr[i] and value[k - 1] < v:
                value[k], out[k] = value[k - 1], out[k - 1]
                k -= 1
            value[k], out[k] = v, j
    return out


@njit(cache=True)
def spread_points(indptr, ranked, order, count, m):
    """(``count`` of the points 0..N-1, how many came from the first pass): taken in
    ``order`` (a permutation), first each point not among the ``m`` nearest
    neighbours of one taken before (``ranked``: each row's graph neighbours,
    nearest first, as :func:`by_affinity` gives them, with the graph's indptr);
    where those are fewer, then the points not taken, in ``order``."""
    taken = np.zeros(order.shape[0], np.bool_)
    near = np.zeros(order.shape[0], np.bool_)          # taken, or a near neighbour of one
    out = np.empty(count, np.int64)
    c = 0
    for i in order:
        if c == count:
            break
        if not near[i]:
            out[c] = i
            c += 1
            taken[i] = near[i] = True
            for e in range(indptr[i], min(indptr[i] + m, indptr[i + 1])):
                near[ranked[e]] = True
    spread = c
    for i in order:
        if c == count:
            break
        if not taken[i]:
            out[c] = i
            c += 1
            taken[i] = True
    return out, spread


@njit(parallel=True, fastmath={"reassoc", "contract"}, cache=True)
def landmark_pair_sqdist(landmark_rows, neighbours):
    """(L, L) array whose entry (a, b) is |l_a - l_b|^2 for every two landmarks
    that are both among one point's nearest (a row of ``neighbours``, (N, kz)),
    and 0 on the diagonal; other entries are left unset.  The local Gram systems
    need only those: 105,000 of the 4.5 million pairs of 3,000 landmarks of
    Fashion-MNIST 70k (kz = 6), whose full distance matrix by GEMM took 0.13 s."""
    n_landmarks, d = landmark_rows.shape
    wanted = np.zeros((n_landmarks, n_landmarks), np.uint8)    # upper triangle
    for i in range(neighbours.shape[0]):
        for p in range(neighbours.shape[1]):
            for q in range(p + 1, neighbours.shape[1]):
                a, b = neighbours[i, p], neighbours[i, q]
                wanted[min(a, b), max(a, b)] = 1
    out = np.empty((n_landmarks, n_landmarks))
    # Row a has about L - a pairs to look at: task t takes rows t and L - 1 - t.
    for t in prange((n_landmarks + 1) // 2):
        _pair_row(landmark_rows, wanted, t, out)
        if n_landmarks - 1 - t != t:
            _pair_row(landmark_rows, wanted, n_landmarks - 1 - t, out)
    return out


@njit(inline="always", fastmath={"reassoc", "contract"}, cache=True)
def _pair_row(landmark_rows, wanted, a, out):
    """Row a's wanted pairs (a, b > a) of landmark_pair_sqdist, both ways."""
    out[a, a] = 0.0
    for b in range(a + 1, landmark_rows.shape[0]):
        if wanted[a, b]:
            s = 0.0
            for j in range(landmark_rows.shape[1]):
                u = landmark_rows[a, j] - landmark_rows[b, j]
                s += u * u
            out[a, b] = s
            out[b, a] = s


@njit(parallel=True, cache=True)
def local_weights(sqdist, neighbours, between, regularization):
    """(N, kz) reconstruction weights of each point from its kz landmarks
    (``neighbours``, at squared distances ``sqdist``), summing to one: the local
    Gram system G w = 1, G_ab = (|y - l_a|^2 + |y - l_b|^2 - |l_a - l_b|^2) / 2 with
    ``between`` the landmarks' squared distances, plus a ridge of
    ``regularization`` trace(G) / kz; one point per task, solved by Gaussian
    elimination with partial pivoting (NumPy's batched solve of Fashion-MNIST
    70k's 6 x 6 systems, with the gathers that build them, took 0.06 s)."""
    n, kz = sqdist.shape
    weights = np.empty((n, kz))
    for i in prange(n):
        G = np.empty((kz, kz))
        w = np.ones(kz)
        trace = 0.0
        for a in range(kz):
            for b in range(kz):
                G[a, b] = 0.5 * (sqdist[i, a] + sqdist[i, b]
                                 - between[neighbours[i, a], neighbours[i, b]])
            trace += G[a, a]
        ridge = regularization * trace / kz + 1e-300
        for a in range(kz):
            G[a, a] += ridge
        _solve_in_place(G, w)
        total = w.sum()
        for a in range(kz):
            weights[i, a] = w[a] / total
    return weights


@njit(inline="always", cache=True)
def _solve_in_place(G, w):
    """w <- G^-1 w for a small dense G (overwritten), partial pivoting."""
    m = w.shape[0]
    for c in range(m):
        p = c
        for r in range(c + 1, m):
            if abs(G[r, c]) > abs(G[p, c]):
                p = r
        if p != c:
            for j in range(m):
                G[c, j], G[p, j] = G[p, j], G[c, j]
            w[c], w[p] = w[p], w[c]
        for r in range(c + 1, m):
            f = G[r, c] / G[c, c]
            for j in range(c, m):
                G[r, j] -= f * G[c, j]
            w[r] -= f * w[c]
    for c in range(m - 1, -1, -1):
        s = w[c]
        for j in range(c + 1, m):
            s -= G[c, j] * w[j]
        w[c] = s / G[c, c]


@njit(parallel=True, cache=True)
def select_columns(indptr, indices, data, new_column, above_row):
    """(indptr, indices, data) of the CSR matrix of the entries (i, j) of the given
    one with new_column[j] >= 0, and j > i where ``above_row``, in their order,
    their columns renumbered new_column[j]: the affinity graph's strict upper
    triangle (laplacian_reduced) or its columns of the landmarks (the graph
    search), a pass over the rows each, where SciPy's triu and column indexing
    took 21 ms and 5-10 ms of Fashion-MNIST 70k's 20-NN graph."""
    n = indptr.shape[0] - 1
    counts = np.zeros(n + 1, np.int64)
    for i in prange(n):
        for e in range(indptr[i], indptr[i + 1]):
            j = indices[e]
            if new_column[j] >= 0 and (j > i or not above_row):
                counts[i + 1] += 1
    out_ptr = np.cumsum(counts)
    out_indices = np.empty(out_ptr[n], indices.dtype)
    out_data = np.empty(out_ptr[n], data.dtype)
    for i in prange(n):
        k = out_ptr[i]
        for e in range(indptr[i], indptr[i + 1]):
            j = indices[e]
            if new_column[j] >= 0 and (j > i or not above_row):
                out_indices[k] = new_column[j]
                out_data[k] = data[e]
                k += 1
    return out_ptr, out_indices, out_data


@njit(parallel=True, cache=True)
def reduced_dense(zt_ptr, zt_idx, zt_val, z_idx, z_val, w_ptr, w_idx, w_val, degree):
    """Dense (L, L) Z^T (D - W) Z and Z^T D Z, a landmark's row per task: each
    point i that landmark a reconstructs (the CSR Z^T: zt_ptr, zt_idx, zt_val)
    adds z_ia (d_i z_i - sum_m w_im z_m), its row of W (w_ptr, w_idx, w_val)
    and the kz landmarks z_idx[m] with weights z_val[m] of each point m, and
    D = diag(``degree``).  A row's sums run in a fixed order, whatever the
    threads.  N kz^2 33 additions for Fashion-MNIST 70k's 20-NN graph (32
    neighbours a point), against SciPy's products' N kz (33 + ~25): at kz = 2
    and 3 (1,000 landmarks) 38 and 62 ms against 58 and 78 ms, at kz = 4 as
    fast, at kz = 6 185 ms against 134 ms (2 cores)."""
    n_landmarks, kz = zt_ptr.shape[0] - 1, z_idx.shape[1]
    A = np.zeros((n_landmarks, n_landmarks))
    B = np.zeros((n_landmarks, n_landmarks))
    for a in prange(n_landmarks):
        row_a, row_b = A[a], B[a]
        for e in range(zt_ptr[a], zt_ptr[a + 1]):
            i, s = zt_idx[e], zt_val[e]
            sd = s * degree[i]
            for p in range(kz):
                x = sd * z_val[i, p]
                row_a[z_idx[i, p]] += x
                row_b[z_idx[i, p]] += x
            for f in range(w_ptr[i], w_ptr[i + 1]):
                m, sw = w_idx[f], s * w_val[f]
                for p in range(kz):
                    row_a[z_idx[m, p]] -= sw * z_val[m, p]
    return A, B


@njit(parallel=True, cache=True)
def dense_to_csr(M):
    """(indptr, indices, data) of the square dense M's nonzero entries, a row
    per task: reduced_dense's matrices of 750 / 1,000 / 2,048 landmarks in 1.3 /
    1.7 / 5.2 ms each, where scipy.sparse.csr_matrix(M) took 4.6 / 7.3 / 27 ms."""
    n = M.shape[0]
    counts = np.zeros(n + 1, np.int64)
    for a in prange(n):
        for b in range(n):
            if M[a, b] != 0.0:
                counts[a + 1] += 1
    indptr = np.cumsum(counts)
    indices = np.empty(indptr[n], np.int32)
    data = np.empty(indptr[n])
    for a in prange(n):
        k = indptr[a]
        for b in range(n):
            if M[a, b] != 0.0:
                indices[k] = b
                data[k] = M[a, b]
                k += 1
    return indptr, indices, data
