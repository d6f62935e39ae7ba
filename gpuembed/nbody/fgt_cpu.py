"""Compiled CPU parts of the FGT (fgt.py): the Hermite coefficients, cases I and II
per target, cases III and IV, and the Taylor series at the targets.  The array
code of fgt.py stays the reference and the GPU's cases III and IV; these loops
do the same sums one box or one target per iteration, with every intermediate
in small buffers, and each point's p^d tensor terms built by expanding one
dimension at a time (digit arithmetic per term made case III slower than the
array code).

Case IV in the array code gathers each box pair's coefficients, contracts them
by batched matrix products with a transposing reshape after each dimension,
and sums the results into the target boxes through a sparse product: on the
CPU that was two thirds of an FGT (multi-scale SNE, Fashion-MNIST 20k, p = 8).
Here the pairs are grouped by target box, each box's Taylor coefficients are
accumulated in place by one thread, one dimension's p x p contraction at a
time; the 1-D translation matrices come from a table over the integer offsets
between box centres, and pairs that share the first dimension's offset share
its contraction.  On 200,000 uniform 2-D points at p = 8 (1.8M box pairs) the
case takes 0.9 s against 5.5 s.  Cases I and II are the twin of kernels/fgt.cu's
fgt_small_targets; at 2 points per unit area they were two thirds of the
array code's 3.2 s.  The whole transform: 0.5 s against 3-4 s at 2 points per
unit area, 1.2 s against 6.8-7 s at 20.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..fastexp import expneg

# Of fastexp.py, whose functions this file's cached code holds (_generated.py).
FASTEXP_DIGEST = "0b1f32411deb462c"


@njit(inline="always")
def _tensor_row(factors, out):
    """out[alpha] = prod_i factors[i, alpha_i] for every flat multi-index alpha
    (digits in base p, the first dimension most significant, as fgt._tensor),
    expanded one dimension at a time in place, from the back."""
    d, p = factors.shape
    size = 1
    out[0] = 1.0
    for i in range(d):
        for a in range(size - 1, -1, -1):
            v = out[a]
            for k in range(p):
                out[a * p + k] = v * factors[i, k]
        size *= p


@njit(inline="always")
def _hermite_factors(u, h):
    """h[i, k] = exp(-u_i^2) H_k(u_i) by the Hermite recurrence."""
    d, p = h.shape
    for i in range(d):
        h[i, 0] = np.exp(-u[i] * u[i])
        if p > 1:
            h[i, 1] = 2.0 * u[i] * h[i, 0]
        for k in range(1, p - 1):
            h[i, k + 1] = 2.0 * u[i] * h[i, k] - 2.0 * k * h[i, k - 1]


@njit(inline="always")
def _power_factors(u, scale, f):
    """f[i, k] = u_i^k scale_k."""
    d, p = f.shape
    for i in range(d):
        x = 1.0
        for k in range(p):
            f[i, k] = x * scale[k]
            x *= u[i]


@njit(inline="always", fastmath=True)
def _add_scaled(row, c, T):
    """row += c T (p^d contiguous coefficients of one charge column)."""
    for alpha in range(T.size):
        row[alpha] += c * T[alpha]


@njit(inline="always", fastmath=True)
def _contract(a, b, Mi, inner):
    """b = a contracted with Mi (p x p) along the axis of a viewed as (outer, p,
    inner): b[o, beta, c] = sum_alpha Mi[beta, alpha] a[o, alpha, c]."""
    p = Mi.shape[0]
    outer = a.size // (p * inner)
    if inner == 1:      # a dot product of p contiguous values per output
        for o in range(outer):
            row = a[o * p:(o + 1) * p]
            for beta in range(p):
                s = 0.0
                for alpha in range(p):
                    s += Mi[beta, alpha] * row[alpha]
                b[o * p + beta] = s
        return
    b[:] = 0.0
    for o in range(outer):
        for beta in range(p):
            base_out = (o * p + beta) * inner
            for alpha in range(p):
                coef = Mi[beta, alpha]
                base_in = (o * p + alpha) * inner
                for c in range(inner):
                    b[base_out + c] += coef * a[base_in + c]


@njit(parallel=True, fastmath=True, cache=True)
def hermite_to_taylor(first, source, offset, hermite, M, target, taylor):
    """taylor[target[g]] += the Hermite series hermite[source[k]] of every pair k
    in group g (pairs first[g] .. first[g + 1] - 1, all with target box
    target[g], sorted by their offset along the first dimension) re-expanded
    about that box's centre:
    C_beta += sum_alpha A_alpha prod_i M[offset_ki, beta_i, alpha_i], where
    M[o, beta, alpha] = (-1)^beta / beta! h_{alpha+beta}(o SIDE) for the integer box
    offset o (shifted to index 0 and up) between the two centres.

    The translation is a tensor product, so its factors commute: each pair is
    contracted along dimensions d-1 .. 1, the results are summed over the run of
    pairs that share the first dimension's offset, and that sum is contracted
    once along dimension 0 (in 2-D about 10 runs per box against ~100 pairs).

    hermite (boxes, Q, p^d) and taylor (boxes, Q, p^d): one row of p^d
    coefficients per charge column, flattened as fgt._tensor (first dimension
    most significant), so every contraction's innermost loop runs over at least
    p contiguous coefficients."""
    d = offset.shape[1]
    p = M.shape[1]
    n_q, pd = hermite.shape[1], hermite.shape[2]
    size = n_q * pd
    for g in prange(first.size - 1):
        C = np.zeros(size)
        run = np.zeros(size)
        a = np.empty(size)
        b = np.empty(size)
        for k in range(first[g], first[g + 1]):
            a[:] = hermite[source[k]].ravel()
            inner = 1
            for i in range(d - 1, 0, -1):
                _contract(a, b, M[offset[k, i]], inner)
                a, b = b, a
                inner *= p
            run += a
            if k + 1 == first[g + 1] or offset[k + 1, 0] != offset[k, 0]:
                _contract(run, b, M[offset[k, 0]], pd // p)
                C += b
                run[:] = 0.0
        taylor[target[g]] += C.reshape(n_q, pd)


@njit(inline="always", fastmath=True)
def _direct_run(y, srcT, qT, lo, hi, k, acc):
    """acc[j] += sum_{s in [lo, hi)} exp(-|y - x_s|^2) q[j, s] over sources and
    charges stored by coordinate (d, N) and by column (Q, N), in three
    contiguous loops that LLVM vectorizes (``k``: scratch of hi - lo values)."""
    n = hi - lo
    k = k[:n]
    k[:] = 0.0
    for i in range(srcT.shape[0]):
        yi, x = y[i], srcT[i, lo:hi]
        for s in range(n):
            diff = yi - x[s]
            k[s] += diff * diff
    for s in range(n):
        k[s] = expneg(k[s])
    for j in range(qT.shape[0]):
        q = qT[j, lo:hi]
        a = 0.0
        for s in range(n):
            a += k[s] * q[s]
        acc[j] += a


@njit(parallel=True, fastmath=True, cache=True)
def small_targets(members, points, box_of, cell, src_key, src_start, src_count, src_center,
                  src_big_index, src_big, srcT, qT, hermite, rows, shape, p, cutoff, out):
    """Cases I and II for every target ``members`` (indices into the sorted
    targets ``points``) in a small box, one target per iteration (the twin of
    kernels/fgt.cu's fgt_small_targets): for each row of neighbouring box
    offsets (fgt._offset_rows), the first occupied source box by binary search
    over the sorted keys and the row's others by walking on.

    Consecutive boxes hold consecutive sources, so each run of small boxes in a
    row is one direct sum over a contiguous range (at most cutoff - 1 points per
    box); a big box's Hermite series (eq. 5.2) is evaluated separably: for each
    prefix of the first d - 1 indices, a dot product of p coefficients with the
    last dimension's factors.  Sources srcT (d, N) and charges qT (Q, N) by
    coordinate, hermite (boxes, Q, p^d) charge-major: every inner loop is
    contiguous (with the coefficients (p^d, Q) and sources (N, d) these cases
    took 2.4-2.8x as long on multi-scale SNE layouts).
    """
    d = points.shape[1]
    n_q, pd = qT.shape[0], hermite.shape[2]
    run_cap = (cutoff - 1) * np.max(rows[:, d] - rows[:, d - 1] + 1)
    for idx in prange(members.size):
        t = members[idx]
        y = points[t]
        acc = np.zeros(n_q)
        h = np.empty((d, p))
        u = np.empty(d)
        W = np.empty(pd // p)
        k = np.empty(run_cap)
        for r in range(rows.shape[0]):
            key = 0
            inside = True
            for i in range(d - 1):
                c = cell[box_of[t], i] + rows[r, i]
                inside = inside and 0 <= c < shape[i]
                key = key * shape[i] + c
            lo = max(cell[box_of[t], d - 1] + rows[r, d - 1], 0)
            hi = min(cell[box_of[t], d - 1] + rows[r, d], shape[d - 1] - 1)
            if not inside or lo > hi:
                continue
            key *= shape[d - 1]
            b = np.searchsorted(src_key, key + lo)
            run = -1                        # first source of the pending run of small boxes
            while b < src_key.size and src_key[b] <= key + hi:
                if not src_big[b]:
                    if run < 0:
                        run = src_start[b]
                    b += 1
                    continue
                if run >= 0:
                    _direct_run(y, srcT, qT, run, src_start[b], k, acc)
                    run = -1
                for i in range(d):
                    u[i] = y[i] - src_center[b, i]
                _hermite_factors(u, h)
                _tensor_row(h[:d - 1], W)
                last = h[d - 1]
                A = hermite[src_big_index[b]]
                for j in range(n_q):
                    Aj = A[j]
                    total = 0.0
                    for pre in range(pd // p):
                        row = Aj[pre * p:(pre + 1) * p]
                        s = 0.0
                        for a in range(p):
                            s += last[a] * row[a]
                        total += W[pre] * s
                    acc[j] += total
                b += 1
            if run >= 0:
                _direct_run(y, srcT, qT, run, src_start[b - 1] + src_count[b - 1], k, acc)
        for j in range(n_q):
            out[t, j] += acc[j]


@njit(parallel=True, fastmath=True, cache=True)
def hermite_coefficients(big, start, count, points, center, charges, inv_fact, A):
    """A[g] += sum over the points m of big box big[g] of
    q_m (x_m - s_B)^alpha / alpha!, one box per iteration (A: (boxes, Q, p^d))."""
    d, p = points.shape[1], inv_fact.size
    n_q, pd = charges.shape[1], A.shape[2]
    for g in prange(big.size):
        b = big[g]
        f = np.empty((d, p))
        u = np.empty(d)
        T = np.empty(pd)
        for m in range(start[b], start[b] + count[b]):
            for i in range(d):
                u[i] = points[m, i] - center[b, i]
            _power_factors(u, inv_fact, f)
            _tensor_row(f, T)
            for j in range(n_q):
                _add_scaled(A[g, j], charges[m, j], T)


@njit(parallel=True, fastmath=True, cache=True)
def taylor_targets(members, points, box_of, center, big_index, taylor, p, out):
    """out[t] += sum_beta C_beta (y_t - t_C)^beta for every target ``members`` in a
    big box C (cases III and IV, accumulated beforehand; taylor (boxes, Q, p^d))."""
    d = points.shape[1]
    n_q, pd = taylor.shape[1], taylor.shape[2]
    ones = np.ones(p)
    for idx in prange(members.size):
        t = members[idx]
        b = box_of[t]
        f = np.empty((d, p))
        u = np.empty(d)
        T = np.empty(pd)
        for i in range(d):
            u[i] = points[t, i] - center[b, i]
        _power_factors(u, ones, f)
        _tensor_row(f, T)
        C = taylor[big_index[b]]
        for j in range(n_q):
            Cj = C[j]
            s = 0.0
            for alpha in range(pd):
                s += T[alpha] * Cj[alpha]
            out[t, j] += s


@njit(parallel=True, fastmath=True, cache=True)
def taylor_from_sources(first, source, start, count, points, centers, charges, inv_fact,
                        target, taylor):
    """Case III (eq. 5.3): taylor[target[g]] += q_m h_beta(x_m - t_g) / beta! for
    every point m of the small source boxes source[k], k in first[g] ..
    first[g + 1] - 1, about the target box centre centers[g]; one target box per
    iteration (taylor (boxes, Q, p^d), flattened as fgt._tensor)."""
    d, p = points.shape[1], inv_fact.size
    n_q, pd = charges.shape[1], taylor.shape[2]
    for g in prange(first.size - 1):
        C = taylor[target[g]]
        h = np.empty((d, p))
        u = np.empty(d)
        T = np.empty(pd)
        for k in range(first[g], first[g + 1]):
            b = source[k]
            for m in range(start[b], start[b] + count[b]):
                for i in range(d):
                    u[i] = points[m, i] - centers[g, i]
                _hermite_factors(u, h)
                for i in range(d):
                    for j in range(p):
                        h[i, j] *= inv_fact[j]
                _tensor_row(h, T)
                for j in range(n_q):
                    _add_scaled(C[j], charges[m, j], T)
