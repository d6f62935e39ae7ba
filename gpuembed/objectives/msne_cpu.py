"""Compiled CPU sweeps for multi-scale SNE (objectives/msne.py).

For every edge (i, j) of the pattern and scale h, s_hij = exp(-(p_h d_ij / 2 - m_hi)) / Z_hi.
The array code of msne.py (the reference, and the GPU path) materializes H
arrays of nnz values, gathers m and Z per edge and builds a sparse matrix for
each row sum; on digits (all 1,797^2 pairs are in the pattern, 9 scales) that
was 90% of an evaluation.  ``edge_terms`` (beside the FGT and Barnes-Hut) does
the pattern's part in one parallel sweep over the rows, keeping each row's
values in small buffers, with loops over the row's edges that LLVM vectorizes:
about 1 ns per exp and core with ``fastexp.expneg``, whose argument
p_h d_ij / 2 - m_hi is never negative (m_hi: the row's nearest neighbour).
``fused_exact`` (the exact engine) computes the whole cost and gradient in one
sweep that evaluates each kernel once: 4x faster than the exact sums plus
``edge_terms`` on digits.  These two and transform's ``out_of_sample_rows`` and
``target_sums`` square one scale's kernels into the next where the precisions
allow it (``squaring_plan``).  ``ball_pairs`` finds the FGT path's isolated rows'
neighbours over a grid (msne._ball_kernels).
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import get_thread_id, njit, prange

from ..fastexp import expneg, logpos

# Of fastexp.py, whose functions this file's cached code holds (_generated.py).
FASTEXP_DIGEST = "0b1f32411deb462c"

TINY = np.finfo(np.float64).tiny
# fused_exact is cached on disk (its compilation took 6-7 s in every process, a
# 300-point fit 8 s), so it may fuse multiply-adds but not reassociate: with
# reassociation the parallel sweep compiled in a process and the same sweep
# loaded from numba's cache gave other last bits (tested), so a first run
# from a new checkout would differ from later ones.  Its sums go through
# LANES partial sums.  That cost it about 9% (Fashion-MNIST 5k, 9 scales:
# 0.218 s against 0.201 s per evaluation, alternating in one process).  With
# numba 0.68 the reassociated sweep gives the same bits either way, as the
# exact N-body loop does (nbody/exact_cpu.py), but it ran slower: 30
# iterations on Fashion-MNIST 3k 16.6-18.2 s against 11.9-13.5 s strict.
# edge_terms (the FGT path, from 6,000 points) keeps reassociation, 21% faster;
# it was compiled in each process (4.3 s each time) until numba 0.68 gave the
# same bits from its cache too (tested), and is cached since, with numba 0.68
# and later only: with numba 0.59 (.ci/oldest.txt) on an AMD Zen 4 VM its
# cached gradient differed from the one compiled in the process in the last
# bits, as the code before 0.68 had on the VMs of earlier sessions.
CACHE_REASSOCIATED = tuple(int(part) for part in numba.__version__.split(".")[:2]) >= (0, 68)
FLAGS = {"contract"}
LANES = 8
# The sweeps' rows go in this many slots of consecutive rows, each with its own
# transposed half of the gradient (``columns``), summed in slot order at the end:
# with a half per thread, as before, the gradient's last bits depended on the
# number of threads.  More threads than slots would idle.
COLUMN_SLOTS = 16
# The scales' kernels are powers of each other where their precisions differ by
# a power of two (ld_precisions' p_h ~ K_h^(-2U/P), K_h = 2^(h-1) K*: factors
# of 4 at U = 2 in 2-D, the usual case): exp(-2^m t) is exp(-t) squared m times.
# The sweeps square instead of computing an exp: fused_exact's evaluation on
# Fashion-MNIST 5k (9 scales, two exps and 14 squarings per pair) took 0.155 s
# against 0.225 s with 9 exps, alternating processes; edge_terms at 10k 0.11 s
# against 0.12-0.17 s.  A squaring doubles the relative error, so a chain
# starts again from an exp before its squarings pass this many: within 2^10
# times expneg's error, 5e-13 without reassociation (2 ulp), 5e-12 with it
# (edge_terms, beside the FGT's 1e-5).
# (One squaring loop per pass: squaring m times per element did not vectorize
# and was slower than the exps.)
CHAIN_SQUARINGS = 10
# target_sums takes the training points this many at a time: its per-thread
# buffers stay this size whatever N (at N = 70,000 it ran as fast or faster
# than over all N at once, 125 against 135-164 ms for 200 rows).
SOURCE_BLOCK = 1024


def squaring_plan(half_p, shifts=None):
    """Per scale h (precisions descending): m > 0 where its kernels are scale
    h + 1's squared m times (half_p[h] = 2^m half_p[h + 1] exactly, and the chain
    since the last exp has at most CHAIN_SQUARINGS squarings), else 0: an exp.
    The shift m_hi = half_p[h] nearest_i scales by the same power of two, so the
    arguments p_h d / 2 - m_hi are exactly 2^m times the next scale's; given
    ``shifts`` (H, N), a link needs them to, too."""
    plan = np.zeros(len(half_p), dtype=np.int64)
    run = 0
    for h in range(len(half_p) - 2, -1, -1):
        fraction, exponent = math.frexp(half_p[h] / half_p[h + 1])
        m = exponent - 1
        if (fraction == 0.5 and m >= 1 and run + m <= CHAIN_SQUARINGS
                and (shifts is None or np.array_equal(shifts[h], 2.0 ** m * shifts[h + 1]))):
            plan[h], run = m, run + m
        else:
            run = 0
    return plan


@njit(inline="always", fastmath=FLAGS)
def _scale_kernels(E, h, squarings, c, d, shift):
    """E[h] = exp(-(c d - shift)) over d, or scale h + 1's kernels E[h + 1]
    squared squarings[h] times (see squaring_plan): call for h descending."""
    Eh, m = E[h], squarings[h]
    if m == 0:
        for j in range(d.size):
            Eh[j] = expneg(c * d[j] - shift)
    else:
        prev = E[h + 1]
        for j in range(d.size):
            Eh[j] = prev[j] * prev[j]
        for _ in range(m - 1):
            for j in range(d.size):
                Eh[j] *= Eh[j]


@njit(inline="always", fastmath=FLAGS)
def _normalize_scales(S, Z, i, s):
    """Row i's kernels S[h] (h < H, Z (H, N)) divided by their sums Z[h, i], and s
    their sum over the scales."""
    s[:] = 0.0
    for h in range(Z.shape[0]):
        sh, inv = S[h], 1.0 / Z[h, i]
        for j in range(s.size):
            sh[j] *= inv
            s[j] += sh[j]


@njit(inline="always", fastmath=FLAGS)
def _lane_sum(a, b):
    """sum_j a_j (b is None) or sum_j a_j b_j, in LANES partial sums (see FLAGS);
    scalars, which LLVM keeps in registers (an array of them took twice as long)."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    full = a.size // LANES * LANES
    for j in range(0, full, LANES):
        if b is None:
            s0 += a[j]; s1 += a[j + 1]; s2 += a[j + 2]; s3 += a[j + 3]          # noqa: E702
            s4 += a[j + 4]; s5 += a[j + 5]; s6 += a[j + 6]; s7 += a[j + 7]      # noqa: E702
        else:
            s0 += a[j] * b[j]; s1 += a[j + 1] * b[j + 1]                        # noqa: E702
            s2 += a[j + 2] * b[j + 2]; s3 += a[j + 3] * b[j + 3]                # noqa: E702
            s4 += a[j + 4] * b[j + 4]; s5 += a[j + 5] * b[j + 5]                # noqa: E702
            s6 += a[j + 6] * b[j + 6]; s7 += a[j + 7] * b[j + 7]                # noqa: E702
    for j in range(full, a.size):
        s0 += a[j] if b is None else a[j] * b[j]
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@njit(inline="always")
def _edge_cost(sg, s, js, kappa, off):
    """One pattern edge's (cost term, r = -dE/ds up to a constant, floored s) at
    the HD similarity sg and the LD one s, floored at TINY: where the floor binds
    the cost is flat, so r = 0 (a far HD neighbour pulls no more).
    KL: (-sg log se, sg / se); JS: kappa sg log(sg / z) + (1 - kappa) se log(se / z),
    z = kappa sg + (1 - kappa) se, and r = -(log(se / z) - off) / kappa with
    off = log(1 / (1 - kappa))."""
    se = max(s, TINY)
    if js:
        z = kappa * sg + (1.0 - kappa) * se
        log_sz = logpos(se / z)
        cost = (1.0 - kappa) * se * log_sz
        if sg > 0:
            cost += kappa * sg * logpos(sg / z)
        r = -(log_sz - off) / kappa
    else:
        cost, r = -sg * logpos(se), sg / se
    return cost, (r if s >= TINY else 0.0), se


@njit(parallel=True, fastmath=True, cache=CACHE_REASSOCIATED)
def edge_terms(indptr, indices, XT, sigma, half_p, squarings, m, Z, js, kappa, rs, grad):
    """One sweep: fills ``rs`` (H, N) with sum_j r_ij s_hij, where r = dE/ds (KL:
    sigma / s; JS: eq. 2.7's), and ``grad`` (N, d) with the pattern's gradient
    sum_j 2 (g_ij + g_ji)(x_i - x_j), g_ij = sum_h (p_h / 2H) s_hij r_ij; returns
    (the pattern's part of the cost, sum of s over the pattern).
    KL part: -sum sigma log s.  JS part: sum [kappa sigma log(sigma / z)
    + (1 - kappa) s log(s / z)], z = kappa sigma + (1 - kappa) s.

    m (H, N): the rows' shifts; squarings: squaring_plan(half_p, m).
    XT: the layout transposed (d, N), contiguous.  Row i adds g_ij (x_j - x_i)
    to point j's transposed half in its slot's columns (COLUMN_SLOTS, d, N),
    summed at the end (as a transposed sparse product that was 10% of an evaluation on
    Fashion-MNIST 10k)."""
    dim, n = XT.shape
    H = half_p.size
    part = np.zeros(n)
    mass = np.zeros(n)
    columns = np.zeros((COLUMN_SLOTS, dim, n))
    off = math.log(1.0 / (1.0 - kappa)) if js else 0.0
    for slot in prange(COLUMN_SLOTS):
        col = columns[slot]
        for i in range(slot * n // COLUMN_SLOTS, (slot + 1) * n // COLUMN_SLOTS):
            # Row slices and 0-based local buffers: with them LLVM vectorizes the
            # loops over the edges (indexing the full arrays at e ran 6x slower).
            lo, hi = np.int64(indptr[i]), np.int64(indptr[i + 1])
            cols, sg = indices[lo:hi], sigma[lo:hi]
            d = np.zeros(hi - lo)
            for k in range(dim):
                xi, xk = XT[k, i], XT[k]
                for e in range(hi - lo):
                    diff = xi - xk[cols[e]]
                    d[e] += diff * diff
            # Each s_hij once, kept for the gradient pass below (computing it again
            # there cost a third of the sweep).
            s_h = np.empty((H, hi - lo))
            for h in range(H - 1, -1, -1):
                _scale_kernels(s_h, h, squarings, half_p[h], d, m[h, i])
            s = np.empty(hi - lo)
            _normalize_scales(s_h, Z, i, s)
            r = np.empty(hi - lo)
            acc = 0.0
            total = 0.0
            for e in range(hi - lo):
                cost, r[e], se = _edge_cost(sg[e], s[e] / H, js, kappa, off)
                acc += cost
                total += se
            g = np.zeros(hi - lo)
            for h in range(H):
                c, v = half_p[h], s_h[h]
                row = 0.0
                for e in range(hi - lo):
                    g[e] += c * v[e]
                    row += r[e] * v[e]
                rs[h, i] = row
            g = g * r / H
            for k in range(dim):
                xi, xk, colk = XT[k, i], XT[k], col[k]
                own = 0.0
                for e in range(hi - lo):
                    v = g[e] * (xi - xk[cols[e]])
                    own += v
                    colk[cols[e]] -= v
                grad[i, k] = own
            part[i] = acc
            mass[i] = total
    _add_columns(columns, grad, 2.0)
    return _lane_sum(part, None), _lane_sum(mass, None)


@njit(parallel=True, cache=True)
def _add_columns(columns, grad, factor):
    """grad = factor (grad + the slots' transposed halves ``columns``, in slot order)."""
    for j in prange(grad.shape[0]):
        for k in range(grad.shape[1]):
            v = grad[j, k]
            for t in range(columns.shape[0]):
                v += columns[t, k, j]
            grad[j, k] = factor * v


@njit(parallel=True, fastmath=FLAGS, cache=True)
def fused_exact(indptr, indices, XT, sigma, half_p, squarings, nearest, js, kappa, kernels,
                scratch, edges, grad):
    """The whole cost and gradient with every pair summed exactly, one sweep over
    the rows: each kernel exp(-(p_h d_ik / 2 - m_hi)) is computed once, at most
    H N^2 exps in all (fewer where ``squarings``, squaring_plan(half_p), chains
    scales), where the exact sums and the edge sweep above take 2H N^2 + 2H nnz
    (4H N^2 when the pattern is dense, as it is with all scales below ~4,000
    points).  Row i's kernels stay in its thread's ``kernels`` (T, H, N) buffer,
    their values on the pattern's edges gathered into ``edges``:
      Z_hi = sum_k E_hik; on the edges S_k = sum_h s_hik, V_k = sum_h (p_h / 2) s_hik
      and r_ik = -dE/ds_ik from S (0 off the pattern, so S and V are needed only
      there), rs_hi = sum_k r_ik s_hik, and
      G_ik = (1/H) sum_h (p_h / 2) s_hik (r_ik - rs_hi) = dE/dd_ik.
    Row i adds 2 G_ik (x_i - x_k) to its own gradient row and 2 G_ik (x_k - x_i) to
    point k's in its slot's columns (COLUMN_SLOTS, d, N), summed at the end.

    XT: the layout transposed (d, N), contiguous; nearest: each point's squared
    nearest-neighbour distance (m_hi = p_h nearest_i / 2); scratch (T, 2, N);
    edges (T, H + 4, the pattern's longest row); grad (N, d) is filled.  Returns
    (the pattern's part of the cost, sum of s over the pattern), as
    :func:`edge_terms`."""
    dim, n = XT.shape
    H = half_p.size
    part = np.zeros(n)
    mass = np.zeros(n)
    columns = np.zeros((COLUMN_SLOTS, dim, n))
    off = math.log(1.0 / (1.0 - kappa)) if js else 0.0
    for slot in prange(COLUMN_SLOTS):
        t, col = get_thread_id(), columns[slot]
        E, d, G = kernels[t], scratch[t, 0], scratch[t, 1]
        for i in range(slot * n // COLUMN_SLOTS, (slot + 1) * n // COLUMN_SLOTS):
            d[:] = 0.0
            for k in range(dim):
                xi, xk = XT[k, i], XT[k]
                for j in range(n):
                    diff = xi - xk[j]
                    d[j] += diff * diff
            d[i] = nearest[i]           # the self pair's kernel: exactly 1, then removed
            inv_z = np.empty(H)
            for h in range(H - 1, -1, -1):
                # Squared from the removed self kernel, a chained scale's is 0 already.
                _scale_kernels(E, h, squarings, half_p[h], d, half_p[h] * nearest[i])
                inv_z[h] = 1.0 / (_lane_sum(E[h], None) - E[h][i])
                E[h][i] = 0.0
            lo, hi = np.int64(indptr[i]), np.int64(indptr[i + 1])
            m = hi - lo
            cols, sg = indices[lo:hi], sigma[lo:hi]
            S, V = edges[t, H, :m], edges[t, H + 1, :m]
            r, cost = edges[t, H + 2, :m], edges[t, H + 3, :m]
            S[:] = 0.0
            V[:] = 0.0
            for h in range(H):
                Eh, Eg, iz, c = E[h], edges[t, h, :m], inv_z[h] / H, half_p[h] * inv_z[h] / H
                for e in range(m):
                    Eg[e] = Eh[cols[e]]
                for e in range(m):
                    S[e] += iz * Eg[e]
                    V[e] += c * Eg[e]
            for e in range(m):
                cost[e], r[e], S[e] = _edge_cost(sg[e], S[e], js, kappa, off)
            part[i] = _lane_sum(cost, None)
            mass[i] = _lane_sum(S, None)
            G[:] = 0.0                  # G_k = R_k V_k - sum_h b_h E_hk
            for h in range(H):
                b = half_p[h] * _lane_sum(r, edges[t, h, :m]) * inv_z[h] * inv_z[h] / H
                Eh = E[h]
                for j in range(n):
                    G[j] -= b * Eh[j]
            for e in range(m):
                G[cols[e]] += r[e] * V[e]
            for k in range(dim):        # the distances are spent: d holds the terms
                xi, xk, colk = XT[k, i], XT[k], col[k]
                for j in range(n):
                    d[j] = 2.0 * G[j] * (xi - xk[j])
                    colk[j] -= d[j]
                grad[i, k] = _lane_sum(d, None)
    _add_columns(columns, grad, 1.0)
    return _lane_sum(part, None), _lane_sum(mass, None)


@njit(parallel=True, fastmath=FLAGS, cache=True)
def out_of_sample_rows(X, Y, idx, sigma, half_p, squarings, nearest, Z, SX, js, kappa,
                       grad_needed, value, mass, grad, curvature, scratch):
    """The per-point terms of new points (out_of_sample.MultiscaleOutOfSample, whose
    array code is the reference): row i of X (M, d) against its training
    neighbours Y[idx[i]] (idx (M, k)) with HD affinities sigma (M, k); per scale
    h, Z (H, M) and SX (H, M, d) of the sums over all training points shifted by
    m_hi = half_p[h] nearest_i; squarings: squaring_plan(half_p).  Fills
    ``value`` with the pattern's part of the cost (KL: -sum sigma log s; JS: the
    terms before msne.js_value) and ``mass`` with sum_j s_j; with
    ``grad_needed`` also ``grad`` (M, d) and ``curvature`` (M,), sum_j max(G_j, 0).
    Each row is summed alone, in one order, so a point's terms do not depend on
    the rows evaluated with it.  scratch: (T, H + 3, k)."""
    M, k = idx.shape
    dim, H = X.shape[1], half_p.size
    off = math.log(1.0 / (1.0 - kappa)) if js else 0.0
    for i in prange(M):
        buf = scratch[get_thread_id()]
        d, s, r = buf[H], buf[H + 1], buf[H + 2]
        for j in range(k):
            acc = 0.0
            for c in range(dim):
                diff = X[i, c] - Y[idx[i, j], c]
                acc += diff * diff
            d[j] = acc
        for h in range(H - 1, -1, -1):
            _scale_kernels(buf, h, squarings, half_p[h], d, half_p[h] * nearest[i])
        _normalize_scales(buf, Z, i, s)
        cost = total = 0.0
        for j in range(k):
            term, r[j], se = _edge_cost(sigma[i, j], s[j] / H, js, kappa, off)
            cost += term
            total += se
        value[i], mass[i] = cost, total
        if not grad_needed:
            continue
        G = d                       # the distances are spent: d holds G
        G[:] = 0.0
        for c in range(dim):
            grad[i, c] = 0.0
        for h in range(H):
            w, sh = 2.0 * half_p[h] / H, buf[h]
            rs = _lane_sum(r, sh)
            for j in range(k):
                G[j] += w * sh[j] * r[j]
            for c in range(dim):
                grad[i, c] -= w * rs * (X[i, c] - SX[h, i, c] / Z[h, i])
        curv = 0.0
        for j in range(k):
            curv += max(G[j], 0.0)
        curvature[i] = curv
        for c in range(dim):
            acc = 0.0
            for j in range(k):
                acc += G[j] * (X[i, c] - Y[idx[i, j], c])
            grad[i, c] += acc


@njit(parallel=True, fastmath=FLAGS, cache=True)
def target_sums(X, YT, half_p, squarings, nearest, Z, SX, scratch):
    """Every scale's exact sums over all training points at new points
    (out_of_sample.MultiscaleOutOfSample, whose exact engine's sums, one scale
    per call, are the reference): for row i of X (M, d) and scale h,
    Z[h, i] = sum_n e_hin and SX[h, i] = sum_n e_hin y_n, e_hin =
    exp(-(half_p[h] |x_i - y_n|^2 - m_hi)), m_hi = half_p[h] nearest_i, over the
    columns y_n of YT (d, N).  One pass per row: each distance once, the
    scales' kernels squared into each other as squaring_plan(half_p) allows.
    scratch: (T, H + 1, B), the sources taken B at a time (SOURCE_BLOCK)."""
    M, dim = X.shape
    H, n, block = half_p.size, YT.shape[1], scratch.shape[2]
    for i in prange(M):
        E = scratch[get_thread_id()]
        for h in range(H):
            Z[h, i] = 0.0
            for c in range(dim):
                SX[h, i, c] = 0.0
        for lo in range(0, n, block):
            width = min(block, n - lo)
            d = E[H][:width]
            d[:] = 0.0
            for c in range(dim):
                xi, yc = X[i, c], YT[c][lo:lo + width]
                for j in range(width):
                    diff = xi - yc[j]
                    d[j] += diff * diff
            for h in range(H - 1, -1, -1):
                _scale_kernels(E, h, squarings, half_p[h], d, half_p[h] * nearest[i])
                Eh = E[h][:width]
                Z[h, i] += _lane_sum(Eh, None)
                for c in range(dim):
                    SX[h, i, c] += _lane_sum(Eh, YT[c][lo:lo + width])


@njit(inline="always")
def _cell(v, lo, inv_cell, size):
    """The grid cell of coordinate v along one dimension, clamped into [0, size)."""
    f = (v - lo) * inv_cell
    return 0 if f < 0.0 else (size - 1 if f >= size - 1 else np.int64(f))


@njit(parallel=True, cache=True)
def ball_pairs(points, order, starts, lo, inv_cell, shape, queries, own, shift, c2, tail,
               offsets, fill, pos, nbr, kernel):
    """The pairs of each query q (row of ``queries``) with the points in its ball
    c2 |x - q|^2 - shift_q < tail (msne._Balls), over a grid: ``points`` sorted
    by cell (row-major keys over ``shape``, cell of v: floor((v - lo) inv_cell)),
    their original indices ``order``, and ``starts[key]`` the first point of
    cell ``key`` (starts[-1] = N).  For each cell of the first d - 1 dimensions
    in the ball's box, the box's cells along the last one hold one contiguous
    run of points.  The point own[q] is left out (-1: none).
    fill=False: the counts in offsets[q + 1]; fill=True: from offsets[q] on,
    (q, the point's index, exp(shift_q - c2 |x - q|^2)) in pos, nbr and kernel."""
    n_q, d = queries.shape
    for q in prange(n_q):
        x = queries[q]
        r2 = (shift[q] + tail) / c2
        r = math.sqrt(r2)
        first, last = np.empty(d, np.int64), np.empty(d, np.int64)
        for k in range(d):
            first[k] = _cell(x[k] - r, lo[k], inv_cell, shape[k])
            last[k] = _cell(x[k] + r, lo[k], inv_cell, shape[k])
        cur = first.copy()
        at, count = offsets[q], 0
        while True:
            key = 0
            for k in range(d - 1):
                key = key * shape[k] + cur[k]
            key *= shape[d - 1]
            for s in range(starts[key + first[d - 1]], starts[key + last[d - 1] + 1]):
                d2 = 0.0
                for k in range(d):
                    diff = points[s, k] - x[k]
                    d2 += diff * diff
                if d2 < r2 and order[s] != own[q]:
                    if fill:
                        pos[at], nbr[at] = q, order[s]
                        kernel[at] = math.exp(shift[q] - c2 * d2)
                        at += 1
                    else:
                        count += 1
            k = d - 2                   # the next cell of the first d - 1 dimensions
            while k >= 0 and cur[k] == last[k]:
                cur[k] = first[k]
                k -= 1
            if k < 0:
                break
            cur[k] += 1
        if not fill:
            offsets[q + 1] = count
