"""Fast Gauss transform (Greengard & Strain 1991; dissertation section 5.2.2, eqs 5.1-5.7).

Computes G_n = sum_m q_m exp(-|y_n - x_m|^2) for several charge columns q at
once (q = [w, w x_1, .., w x_d] gives the embedding sums S and SX), in d <= 3.

Space is cut into boxes of side sqrt(2) r (r = 1/2; the kernel width is the
embedding's unit).  Only occupied boxes exist: they are the unique keys of the
points' integer box coordinates, so an embedding spread over a large extent, or
in 3-D, costs memory in proportion to N.  Each source box B interacts with the
target boxes C within ``radius`` (sources farther away contribute less than the
expansion error), by one of four cases chosen by the counts N_B, M_C against
the cutoff c (dissertation fig. 5.2; c = 5 there, here ``box_cutoff``, which
grows with the expansion's p^d terms):

    N_B <  c, M_C <  c   direct sum                          (5.1)
    N_B >= c, M_C <  c   Hermite expansion about B's centre  (5.2)
    N_B <  c, M_C >= c   Taylor expansion about C's centre   (5.3)
    N_B >= c, M_C >= c   Hermite expansion shifted to Taylor (5.4)

Expansions have order p in each dimension (p^d terms).  The array code is
vectorized over box pairs and points (no Python loop over points), in chunks
of bounded memory, against ``xp``: the same code runs with NumPy and CuPy, and
all of it is the reference (``reference=True``).  Otherwise every pass runs
compiled, per box or per target: on the CPU in fgt_cpu.py (6-8x the array code
on 200,000 points at p = 8), on the GPU in kernels/fgt.cu.  The GPU ran the
Hermite coefficients and cases III and IV by the array code until b36ba14: on
an H100 one FGT sum of 200,000 clustered 2-D points took 0.11-0.25 s (the exact
kernel 0.018 s), and EE of 1e6 points 0.2 s to 4 s per iteration as its layout
spread; such layouts make 40-200 chunks of sparse one-hot and batched products
per sum.  With the kernels that replace them, an H200 (fac9faa) sums 1e6 points
at p = 8 in 4.3 ms and 200,000 clustered ones in 5-6 ms (results/nbody_gpu.json).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .fgt_cpu import (hermite_coefficients, hermite_to_taylor, small_targets, taylor_from_sources,
                      taylor_targets)
from .segments import expand

R = 0.5
SIDE = math.sqrt(2.0) * R
CUTOFF = 5
MAX_ORDER = 16
DEFAULT_ORDER = 8
# Floats per temporary array in one chunk (32 MiB in float64).
BUDGET = 2**22


def box_cutoff(p, d):
    """Points from which a box is "big" (expanded) rather than summed directly:
    the dissertation's 5 (chapter 5.2.2), raised to p^d / 5 where an expansion
    of p^d terms costs more.  On Fashion-MNIST PCA layouts over the widths an
    embedding passes through, p = 8 (nbody.json "cutoff"): in 2-D, 13 is 1.22x
    as fast as 5 summed over nine widths (0.79x to 1.9x per width); in 3-D, 102
    is 3.05x as fast (0.49x at the most crowded width, up to 10.6x)."""
    return max(CUTOFF, round(p**d / 5))


def _series(rho, p, d):
    return sum(math.comb(d, k) * (1.0 - rho**p) ** k
               * (rho**p / math.sqrt(math.factorial(p))) ** (d - k) for k in range(d))


def expansion_bound(p, d, r=R):
    """Bound of eq. (5.7) on |error| / sum_m |q_m| of the Hermite-to-Taylor case,
    the largest of the three expansion bounds (5.5)-(5.7)."""
    s = math.sqrt(2.0) * r
    return _series(r, p, d) / (1.0 - r) ** d + _series(s, p, d) ** 2 / (1.0 - s) ** (2 * d)


def interaction_radius(p, d):
    """Source-target distance beyond which boxes are skipped: exp(-radius^2)
    equals the expansion bound (at least exp(-4)), so truncation adds no more
    error than the series."""
    return math.sqrt(max(4.0, -math.log(min(expansion_bound(p, d), 1.0))))


def error_bound(p, d):
    """Bound on |G_fgt - G| / sum_m |q_m| at order p: expansions plus truncation."""
    return expansion_bound(p, d) + math.exp(-interaction_radius(p, d) ** 2)


def order_for_tolerance(tol, d):
    """Smallest order p whose :func:`error_bound` is at most ``tol``."""
    for p in range(1, MAX_ORDER + 1):
        if error_bound(p, d) <= tol:
            return p
    raise ValueError(f"tol={tol} is below what order {MAX_ORDER} guarantees in {d}-D "
                     f"({error_bound(MAX_ORDER, d):.2g}); use the exact engine")


def _hermite_functions(xp, x, n):
    """h_k(x) = exp(-x^2) H_k(x) for k < n, shape x.shape + (n,)."""
    h = xp.empty(x.shape + (n,), dtype=x.dtype)
    h[..., 0] = xp.exp(-x * x)
    if n > 1:
        h[..., 1] = 2.0 * x * h[..., 0]
    for k in range(1, n - 1):
        h[..., k + 1] = 2.0 * x * h[..., k] - 2.0 * k * h[..., k - 1]
    return h


def _powers(xp, x, n):
    """x^k for k < n, shape x.shape + (n,)."""
    out = xp.empty(x.shape + (n,), dtype=x.dtype)
    out[..., 0] = 1.0
    for k in range(1, n):
        out[..., k] = out[..., k - 1] * x
    return out


def _tensor(factors):
    """Outer products over dimensions: d arrays (n, p) -> (n, p^d), first
    dimension most significant (the flattening used for every coefficient)."""
    out = factors[0]
    for f in factors[1:]:
        out = (out[:, :, None] * f[:, None, :]).reshape(out.shape[0], -1)
    return out


def _group_sum(be, keys, values, n):
    """Rows of ``values`` summed by ``keys`` into (n, ...) (a one-hot sparse product)."""
    xp = be.xp
    flat = values.reshape(values.shape[0], -1)
    onehot = be.sparse.csr_matrix(
        (xp.ones(len(keys), dtype=values.dtype), (keys, xp.arange(len(keys)))),
        shape=(n, len(keys)))
    return (onehot @ flat).reshape((n,) + values.shape[1:])


def _group_outer(be, keys, h, q, n):
    """(n, K, Q): sum over rows r with keys[r] = g of the outer products h_r q_r^T,
    one sparse product per charge column (no (rows, K, Q) temporary)."""
    xp = be.xp
    cols = xp.arange(len(keys))
    return xp.stack([be.sparse.csr_matrix((q[:, j], (keys, cols)), shape=(n, len(keys))) @ h
                     for j in range(q.shape[1])], axis=2)


def _spans(n, cost):
    """Slices of range(n) with (items x cost) at most BUDGET floats."""
    step = max(1, BUDGET // max(1, cost))
    return [slice(a, min(n, a + step)) for a in range(0, n, step)]


class _Boxes:
    """The occupied boxes of a point set: points sorted by box; per box its
    key, integer coordinates, centre, first point and count."""

    def __init__(self, xp, points, origin, shape, cutoff):
        cell = xp.floor((points - origin) / SIDE).astype(xp.int64)
        key = _linear(xp, cell, shape)
        self.order = xp.argsort(key)
        key = key[self.order]
        self.points = points[self.order]
        new = xp.ones(len(key), dtype=bool)
        new[1:] = key[1:] != key[:-1]
        self.start = xp.flatnonzero(new)
        end = xp.full(1, len(key), dtype=self.start.dtype)
        self.count = xp.diff(xp.concatenate([self.start, end]))
        self.key = key[self.start]
        self.cell = cell[self.order][self.start]
        self.center = (origin + (self.cell + 0.5) * SIDE).astype(points.dtype)
        self.box_of = expand(xp, self.count)[0]
        self.cutoff = cutoff
        self.big = self.count >= cutoff
        self.big_index = xp.cumsum(self.big) - 1      # row in the expansion arrays
        self.n_big = int(self.big.sum())


def _linear(xp, cell, shape):
    key = cell[:, 0].copy()
    for i in range(1, cell.shape[1]):
        key = key * shape[i] + cell[:, i]
    return key


def _offsets(d, radius):
    """Integer box offsets whose boxes come within ``radius`` of each other (host
    array, last dimension fastest)."""
    k = int(math.ceil(radius / SIDE)) + 1
    grid = np.stack(np.meshgrid(*[np.arange(-k, k + 1)] * d, indexing="ij"), -1).reshape(-1, d)
    gap = np.maximum(np.abs(grid) - 1, 0) * SIDE
    return grid[(gap * gap).sum(axis=1) < radius * radius]


def _offset_rows(offsets):
    """The offsets as rows along the last dimension, (R, d + 1): the leading d - 1
    offsets, then the first and last offset of the row's contiguous run.  Box keys
    are linear with the last dimension least significant, so a row's boxes have
    consecutive keys: one binary search finds the first occupied one and a walk
    the rest (97 searches per target become 13 at order 8 in 2-D)."""
    lead = offsets[:, :-1]
    rows = []
    for prefix in np.unique(lead, axis=0):
        last = offsets[(lead == prefix).all(axis=1), -1]
        assert last.max() - last.min() + 1 == last.size     # contiguous by construction
        rows.append([*prefix, last.min(), last.max()])
    return np.asarray(rows, dtype=np.int64)


@functools.lru_cache(maxsize=None)
def _neighbourhood(p, d, xp=np):
    """(offsets, offset rows) of the interaction radius at order p in d dimensions,
    as ``xp`` arrays: cached per array module, so the GPU uploads them once, not
    at every FGT call."""
    offsets = _offsets(d, interaction_radius(p, d))
    return xp.asarray(offsets), xp.asarray(_offset_rows(offsets))


def fgt(be, X, charges, Y=None, p=DEFAULT_ORDER, reference=False, cutoff=None):
    """G (M, Q): G_n = sum_m charges_m exp(-|y_n - x_m|^2) over sources X (N, d)
    and targets Y (M, d) (default: X, self pair included), d <= 3, by the FGT of
    order p, boxes of ``cutoff`` points or more expanded (default :func:`box_cutoff`).

    Every pass runs compiled (fgt_cpu.py on the CPU, kernels/fgt.cu on the GPU);
    ``reference=True`` runs everything by the array code (the NumPy reference
    of both)."""
    xp = be.xp
    targets = X if Y is None else Y
    d = X.shape[1]
    n_q = charges.shape[1]
    both = X if Y is None else xp.concatenate([X, Y])
    origin = both.min(axis=0)
    last_box = xp.floor((both.max(axis=0) - origin) / SIDE)
    shape = [int(v) + 1 for v in be.to_host(last_box)]
    if math.prod(shape) >= 2**62:
        raise ValueError("the points spread over too many FGT boxes (more than 2^62); "
                         "use nbody='bh' or 'exact'")
    # Device arrays made on the device: an upload waits for the queued work, as a read does.
    shape_arr = last_box.astype(xp.int64) + 1
    cutoff = box_cutoff(p, d) if cutoff is None else cutoff
    src = _Boxes(xp, X, origin, shape, cutoff)
    tgt = src if Y is None else _Boxes(xp, targets, origin, shape, cutoff)
    q = charges[src.order]
    pd = p**d
    inv_fact = _device_inverse_factorials(xp, p, X.dtype)
    out = xp.zeros((len(targets), n_q), dtype=X.dtype)          # in tgt's sorted order
    taylor = _coefficients(be, tgt.n_big, pd, n_q, X.dtype)
    hermite = (_hermite_coefficients if reference else _hermite_coefficients_compiled)(
        be, src, q, p, inv_fact)

    offsets, rows = _neighbourhood(p, d, xp)
    # Box pairs (b, c) from the target boxes' occupied neighbours (the offsets are
    # symmetric); when cases I and II run per target (compiled), only big target
    # boxes.
    boxes_c = xp.arange(len(tgt.key)) if reference else xp.flatnonzero(tgt.big)
    pairs = []
    for chunk in _spans(len(boxes_c), len(offsets)):
        cand = tgt.cell[boxes_c[chunk], None, :] + offsets[None, :, :]
        inside = ((cand >= 0) & (cand < shape_arr)).all(axis=2)
        keys = _linear(xp, cand.reshape(-1, d), shape).reshape(inside.shape)
        pos = xp.minimum(xp.searchsorted(src.key, keys), len(src.key) - 1)
        hit = inside & (src.key[pos] == keys)
        c = xp.broadcast_to(boxes_c[chunk, None], hit.shape)[hit]
        b = pos[hit]
        sb, tb = src.big[b], tgt.big[c]
        if not reference:           # the compiled cases take all pairs at once, below
            pairs.append((b, c, sb))
            continue
        for case, mask in ((_taylor_accumulate, ~sb & tb), (_hermite_to_taylor, sb & tb),
                           (_direct, ~sb & ~tb), (_hermite_eval, sb & ~tb)):
            if bool(mask.any()):
                case(be, src, tgt, q, b[mask], c[mask], p, inv_fact, hermite, taylor, out)
    if pairs:
        b, c, sb = (xp.concatenate(parts) for parts in zip(*pairs))
        for case, mask in ((_taylor_accumulate_compiled, ~sb), (_hermite_to_taylor_compiled, sb)):
            if bool(mask.any()):
                case(be, src, tgt, q, b[mask], c[mask], p, inv_fact, hermite, taylor, out)

    if reference:
        _taylor_eval(be, tgt, p, taylor, out)
    elif be.is_gpu:
        _targets_gpu(be, src, tgt, q, p, hermite, taylor, rows, shape_arr, out)
    else:
        in_big = tgt.big[tgt.box_of]
        small_targets(np.flatnonzero(~in_big), tgt.points, tgt.box_of, tgt.cell, src.key,
                      src.start, src.count, src.center, src.big_index, src.big,
                      np.ascontiguousarray(src.points.T), np.ascontiguousarray(q.T),
                      hermite.transpose(0, 2, 1), rows, shape_arr, p, src.cutoff, out)
        taylor_targets(np.flatnonzero(in_big), tgt.points, tgt.box_of, tgt.center,
                       tgt.big_index, taylor.transpose(0, 2, 1), p, out)
    result = xp.empty_like(out)
    result[tgt.order] = out
    return result


def _coefficients(be, boxes, pd, n_q, dtype):
    """Zeros for the expansions' coefficients, (boxes, p^d, Q).  On the CPU they
    are stored charge-major, a view of (boxes, Q, p^d) that the compiled loops
    (fgt_cpu.py) take transposed: their innermost loops then run along p^d
    contiguous coefficients, which LLVM vectorizes (with Q = 3 innermost, cases
    I and II took 2.4-2.8x as long on multi-scale SNE's layouts)."""
    if be.is_gpu:
        return be.xp.zeros((boxes, pd, n_q), dtype=dtype)
    return np.zeros((boxes, n_q, pd), dtype=dtype).transpose(0, 2, 1)


def _hermite_coefficients(be, src, q, p, inv_fact):
    """A_alpha = sum_{m in B} q_m ((x_m - s_B)^alpha / alpha!) for every big box B."""
    xp = be.xp
    d, n_q = src.points.shape[1], q.shape[1]
    A = xp.zeros((src.n_big, p**d, n_q), dtype=src.points.dtype)
    members = xp.flatnonzero(src.big[src.box_of])
    for span in _spans(len(members), p**d * n_q):
        m = members[span]
        box = src.box_of[m]
        u = src.points[m] - src.center[box]
        mono = _tensor([_powers(xp, u[:, i], p) * inv_fact for i in range(d)])
        A += _group_outer(be, src.big_index[box], mono, q[m], src.n_big)
    return A


def _hermite_coefficients_compiled(be, src, q, p, inv_fact):
    """:func:`_hermite_coefficients` compiled, one big box per thread (fgt_cpu.py)
    or per block (kernels/fgt.cu)."""
    xp = be.xp
    A = _coefficients(be, src.n_big, p**src.points.shape[1], q.shape[1], src.points.dtype)
    big = xp.flatnonzero(src.big)
    if not be.is_gpu:
        hermite_coefficients(big, src.start, src.count, src.points, src.center, q, inv_fact,
                             A.transpose(0, 2, 1))
    elif len(big):
        _launch_per_box(be, "fgt_hermite_coefficients", src.points.shape[1], p, A, len(big),
                        (big, src.start, src.count, src.points, src.center, q, inv_fact, A))
    return A


def _launch_per_box(be, name, d, p, coefficients, boxes, args):
    """kernels/fgt.cu's ``name``: one block per box, a thread per coefficient of
    ``coefficients`` (boxes, p^d, Q)."""
    pd, n_q = coefficients.shape[1], coefficients.shape[2]
    kernel = be.kernel("fgt.cu", name, coefficients.dtype,
                       {"FGT_DIM": d, "FGT_P": p, "FGT_Q": n_q})
    kernel((boxes,), (min(256, -(-pd // 32) * 32),), args)


def _direct(be, src, tgt, q, b, c, p, inv_fact, hermite, taylor, out):
    """Case I: every source of B against every target of C."""
    xp = be.xp
    for span in _spans(len(b), src.cutoff * tgt.cutoff * (src.points.shape[1] + q.shape[1])):
        bb, cc = b[span], c[span]
        nt = tgt.count[cc]
        pair, k = expand(xp, src.count[bb] * nt)
        s = src.start[bb][pair] + k // nt[pair]
        t = tgt.start[cc][pair] + k % nt[pair]
        diff = tgt.points[t] - src.points[s]
        K = xp.exp(-(diff * diff).sum(axis=1))
        out += _group_sum(be, t, K[:, None] * q[s], len(out))


def _members_against(be, members, owners, partners, centers, p, scale):
    """For box pairs (owner, partner): every point of the owner box with the
    tensor h_alpha(point - centre of partner) * scale_alpha, in chunks:
    yields (point, partner, H (points, p^d))."""
    xp = be.xp
    d = members.points.shape[1]
    for span in _spans(len(owners), members.cutoff * p**d * (d + 1)):
        own, other = owners[span], partners[span]
        pair, k = expand(xp, members.count[own])
        point = members.start[own][pair] + k
        box = other[pair]
        u = members.points[point] - centers[box]
        yield point, box, _tensor([_hermite_functions(xp, u[:, i], p) * scale for i in range(d)])


def _hermite_eval(be, src, tgt, q, b, c, p, inv_fact, hermite, taylor, out):
    """Case II: B's Hermite series evaluated at each target of C (eq. 5.2)."""
    for t, box, h in _members_against(be, tgt, c, b, src.center, p, 1.0):
        values = be.xp.einsum("nk,nkq->nq", h, hermite[src.big_index[box]])
        out += _group_sum(be, t, values, len(out))


def _taylor_accumulate(be, src, tgt, q, b, c, p, inv_fact, hermite, taylor, out):
    """Case III: each source of B adds to C's Taylor coefficients,
    C_beta += q_m h_beta(x_m - t_C) / beta! (eq. 5.3)."""
    for s, box, h in _members_against(be, src, b, c, tgt.center, p, inv_fact):
        taylor += _group_outer(be, tgt.big_index[box], h, q[s], tgt.n_big)


def _inverse_factorials(p):
    """1 / k! for k < p (NumPy, float64)."""
    return np.array([1.0 / math.factorial(k) for k in range(p)])


@functools.lru_cache(maxsize=None)
def _device_inverse_factorials(xp, p, dtype):
    """:func:`_inverse_factorials` as an ``xp`` array of ``dtype``, uploaded once
    (as :func:`_neighbourhood`)."""
    return xp.asarray(_inverse_factorials(p), dtype=dtype)


def _translation_matrices(xp, x, p, inv_fact):
    """M[n, beta, alpha] = (-1)^beta / beta! h_{alpha+beta}(x_n): case IV's 1-D
    factor for the centre offsets x along one dimension."""
    ab = xp.arange(p)[:, None] + xp.arange(p)[None, :]               # alpha + beta
    sign = xp.asarray([(-1.0) ** k for k in range(p)], dtype=inv_fact.dtype) * inv_fact
    return _hermite_functions(xp, x, 2 * p - 1)[:, ab] * sign[None, :, None]


def _hermite_to_taylor(be, src, tgt, q, b, c, p, inv_fact, hermite, taylor, out):
    """Case IV: B's Hermite series re-expanded about C's centre (eq. 5.4),
    C_beta += sum_alpha A_alpha (-1)^beta / beta! h_{alpha+beta}(t_C - s_B),
    applied one dimension at a time (the translation is a tensor product)."""
    xp = be.xp
    d, n_q = src.points.shape[1], q.shape[1]
    for span in _spans(len(b), 2 * p**d * n_q):
        bb, cc = b[span], c[span]
        n = len(bb)
        delta = tgt.center[cc] - src.center[bb]
        C = hermite[src.big_index[bb]]
        for i in range(d):
            # Contract the leading index (dimension i) by a batched matmul, then
            # rotate it behind the others: after d steps the order is restored.
            M = _translation_matrices(xp, delta[:, i], p, inv_fact)
            C = xp.matmul(M, C.reshape(n, p, -1))
            C = C.reshape(n, p, p ** (d - 1), n_q).transpose(0, 2, 1, 3)
        taylor += _group_sum(be, tgt.big_index[cc], C.reshape(n, p**d, n_q), tgt.n_big)


def _runs(xp, keys):
    """Start of every run of equal sorted ``keys``, and len(keys) at the end."""
    edge = xp.ones(len(keys) + 1, dtype=bool)
    edge[1:-1] = keys[1:] != keys[:-1]
    return xp.flatnonzero(edge)


def _taylor_accumulate_compiled(be, src, tgt, q, b, c, p, inv_fact, hermite, taylor, out):
    """Case III compiled: the pairs grouped by target box, each box's
    coefficients accumulated by one thread (fgt_cpu.py) or block (kernels/fgt.cu)."""
    xp = be.xp
    order = xp.argsort(c, kind="stable")
    b, c = b[order], c[order]
    first = _runs(xp, c)
    boxes = c[first[:-1]]
    args = (first, b, src.start, src.count, src.points, tgt.center[boxes], q, inv_fact,
            tgt.big_index[boxes])
    if be.is_gpu:
        _launch_per_box(be, "fgt_taylor_from_sources", src.points.shape[1], p, taylor,
                        len(boxes), (*args, taylor))
    else:
        taylor_from_sources(*args, taylor.transpose(0, 2, 1))


def _hermite_to_taylor_compiled(be, src, tgt, q, b, c, p, inv_fact, hermite, taylor, out):
    """Case IV compiled: the pairs grouped by target box, each box's coefficients
    accumulated by one thread (fgt_cpu.py) or block (kernels/fgt.cu).  Box
    centres differ by whole boxes, so the 1-D translation matrices come from a
    table over the offsets.  Multi-scale SNE on Fashion-MNIST 20k (p = 8) spent
    two thirds of its CPU FGT time in the array code of this case."""
    xp = be.xp
    offset = tgt.cell[c] - src.cell[b]
    order = xp.lexsort(xp.stack([offset[:, 0], c]))          # by box, then first offset
    b, c, offset = b[order], c[order], offset[order]
    first = _runs(xp, c)
    reach = int(xp.abs(offset).max())
    # A table of 2 reach + 1 rows: built on the host (on the GPU the recurrence
    # was some 20 CuPy calls per sum) in float64, one upload.
    M = be.asarray(np.ascontiguousarray(_translation_matrices(
        np, np.arange(-reach, reach + 1) * SIDE, p, _inverse_factorials(p)), dtype=hermite.dtype))
    boxes = tgt.big_index[c[first[:-1]]]
    if be.is_gpu:
        _launch_per_box(be, "fgt_hermite_to_taylor", src.points.shape[1], p, taylor,
                        len(boxes), (first, src.big_index[b], offset + reach, hermite, M,
                                     boxes, taylor))
        return
    hermite_to_taylor(first, src.big_index[b], offset + reach, hermite.transpose(0, 2, 1), M,
                      boxes, taylor.transpose(0, 2, 1))


def _taylor_eval(be, tgt, p, taylor, out):
    """Every target in a big box: sum_beta C_beta (y - t_C)^beta."""
    xp = be.xp
    d = tgt.points.shape[1]
    members = xp.flatnonzero(tgt.big[tgt.box_of])
    for span in _spans(len(members), p**d * taylor.shape[2]):
        t = members[span]
        box = tgt.box_of[t]
        u = tgt.points[t] - tgt.center[box]
        mono = _tensor([_powers(xp, u[:, i], p) for i in range(d)])
        out[t] += xp.einsum("nk,nkq->nq", mono, taylor[tgt.big_index[box]])


def _targets_gpu(be, src, tgt, q, p, hermite, taylor, rows, shape, out):
    """Cases I and II for targets in small boxes, and the Taylor series of big
    boxes at their targets, by the per-target kernels of kernels/fgt.cu."""
    xp = be.xp
    d, n_q = src.points.shape[1], q.shape[1]
    defines = {"FGT_DIM": d, "FGT_P": p, "FGT_Q": n_q}
    threads = 128
    small = xp.flatnonzero(~tgt.big[tgt.box_of])
    if len(small):
        kernel = be.kernel("fgt.cu", "fgt_small_targets", out.dtype, defines)
        kernel(((len(small) + threads - 1) // threads,), (threads,),
               (small, np.int64(len(small)), tgt.points, tgt.box_of, tgt.cell, src.key,
                np.int64(len(src.key)), src.start, src.count, src.center, src.big_index, src.big,
                src.points, q, hermite, rows, np.int64(len(rows)), shape, out))
    big = xp.flatnonzero(tgt.big[tgt.box_of])
    if len(big):
        kernel = be.kernel("fgt.cu", "fgt_taylor_targets", out.dtype, defines)
        kernel(((len(big) + threads - 1) // threads,), (threads,),
               (big, np.int64(len(big)), tgt.points, tgt.box_of, tgt.center, tgt.big_index,
                taylor, out))


def fgt_sums(be, X, kernels, Y=None, weights=None, p=DEFAULT_ORDER):
    """[(S, SX)] for kernels == ("gaussian",): the exact engine's contract by the FGT."""
    xp = be.xp
    if tuple(kernels) != ("gaussian",):
        raise ValueError(f"the FGT sums the Gaussian kernel only, got kernels {kernels}")
    w = xp.ones(X.shape[0], dtype=X.dtype) if weights is None else weights.astype(X.dtype)
    charges = xp.concatenate([w[:, None], w[:, None] * X], axis=1)
    G = fgt(be, X, charges, Y=Y, p=p)
    if Y is None:
        G -= charges                     # the self pair, K(0) = 1
    return [(G[:, 0].copy(), G[:, 1:].copy())]
