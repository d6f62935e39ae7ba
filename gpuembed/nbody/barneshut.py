"""Barnes-Hut kernel sums (binary tree in 1-D, quadtree in 2-D, octree in 3-D).

The tree is built without per-point Python loops: points are sorted by their
Morton code on a 2^21 grid over the bounding cube, and the cells of level l
are the runs of equal code prefixes (d l bits), so every cell is a contiguous
range of sorted points and its children are the next level's cells inside that
range.  A cell stores its point count, its mass sum_m w_m, centre of mass and
side.  The array code below, level by level, is the reference.  The same
arrays come from compiled code on the CPU (barneshut_cpu.build_tree, 2.4-4x
faster: bench_nbody.py's tree part) and from kernels/bh_tree.cu on the GPU,
which numbers the cells of all levels at once: 41 CuPy calls, 3 kernel
launches and 1 host read for 20,000 points (16 levels) where the array code
made 557 calls and 18 reads (emulator counts); on an H200 1.19 ms against 14.5
ms, 3.5 against 22.9 ms at 1e6 points (results/nbody_gpu.json "tree").
Descent is breadth-first over
(target, cell) pairs for a chunk of targets at a time:

- a leaf (one point, or the deepest level) is summed exactly over its points;
- an inner cell that does not contain the target and satisfies
  side < theta |y - centre of mass| contributes mass K(|y - c|^2) to S and
  (sum_m w_m x_m) K(|y - c|^2) to SX (dissertation section 5.3);
- any other cell is replaced by its children.

theta = 0 opens every inner cell, so it equals the exact sums up to rounding.
Any kernel of exact.py works; several kernels share one traversal.  This
level-synchronous traversal is the reference.  The kernel sets of the compiled
exact loop walk the same tree depth first: on the GPU one target per thread in
kernels/barneshut.cu, one launch per sum where the array code made about 2,100
CuPy calls and 70 host reads per t-SNE iteration (benchmarks/gpu_call_counts.py);
on the CPU in numba, a group of the tree's nearby points per walk (new targets
one by one; barneshut_cpu.py: each group opens at least the cells its targets
would, so its sums are at least as fine; 2.7x faster than one target per walk
at 70,000 points, which was about 40x faster than the array code for the
Student-t pair at 40,000).
"""
from __future__ import annotations

import numpy as np

from .barneshut_cpu import build_tree, traverse_cpu
from .exact import KERNEL_CODES, compiled_results, kernel_values
from .segments import expand

MAX_DEPTH = 21                 # 3 x 21 bits of Morton code fit in an int64
DEFAULT_THETA = 0.5
BUDGET = 2**22                 # (target, cell) pairs per traversal chunk
GPU_THREADS = 128              # threads per block of kernels/barneshut.cu


# Shift-and-mask steps moving bit b of a 21-bit integer to bit d b (d = 2, 3).
_SPREAD = {2: ((16, 0x0000FFFF0000FFFF), (8, 0x00FF00FF00FF00FF), (4, 0x0F0F0F0F0F0F0F0F),
               (2, 0x3333333333333333), (1, 0x5555555555555555)),
           3: ((32, 0x001F00000000FFFF), (16, 0x001F0000FF0000FF), (8, 0x100F00F00F00F00F),
               (4, 0x10C30C30C30C30C3), (2, 0x1249249249249249))}


def _spread_bits(v, d):
    """The Morton interleaving of one coordinate: bit b of v moves to bit d b."""
    for shift, mask in _SPREAD.get(d, ()):
        v = (v | (v << shift)) & mask
    return v


def _morton_codes(xp, X):
    """(code, size): each point's Morton code on a 2^MAX_DEPTH grid over the
    bounding cube of X, whose side is size."""
    d = X.shape[1]
    lo = X.min(axis=0)
    size = float((X.max(axis=0) - lo).max())
    size = size * (1.0 + 1e-12) if size > 0 else 1.0
    cells = xp.minimum(((X - lo) / size * 2**MAX_DEPTH).astype(xp.int64), 2**MAX_DEPTH - 1)
    code = xp.zeros(X.shape[0], dtype=xp.int64)
    for i in range(d):
        code |= _spread_bits(cells[:, i], d) << (d - 1 - i)
    return code, size


class Tree:
    """Cells of all levels in one set of arrays (level by level, each level
    sorted by its first point).  Built by kernels on the GPU, in compiled code
    on the CPU (barneshut_cpu.build_tree), by array code with ``reference=True``."""

    def __init__(self, be, X, weights=None, reference=False):
        self.be, self.d = be, X.shape[1]
        if reference:
            self._build(be.xp, X, weights)
        elif be.is_gpu:
            self._build_gpu(X, weights)
        else:
            for name, value in build_tree(X, weights, MAX_DEPTH, _SPREAD).items():
                setattr(self, name, value)

    def walk_order(self, targets, self_pairs):
        """(visit, rank) for the GPU's walk: the order of the targets (the tree's
        Morton order for its own points, their own Morton order for other
        targets) and each target's sorted position, or -1 for targets that are
        not the tree's points.  Ordered targets walk nearly the same cells side
        by side (a warp) and one after another (the cache: on the CPU's
        per-target walk before its groups, 10,000 new points in random order
        against a 60,000-point tree of clustered points, Student-t pair, median
        27 ms against 32 ms in input order)."""
        if self_pairs:
            return self.order, self.rank
        xp = self.be.xp
        return (xp.argsort(_morton_gpu(self.be, targets)[0]),
                xp.full(targets.shape[0], -1, dtype=xp.int64))

    def _build(self, xp, X, weights):
        n, d = X.shape
        code, size = _morton_codes(xp, X)
        self.order = xp.argsort(code)
        code = code[self.order]
        cw, cwx = self._sort_points(X, weights)

        # A point stays active while its cell holds others: a single-point cell is a
        # leaf, so its copies at deeper levels would never be visited (uniform
        # points at 200,000 made ~12 levels of such copies, 2.4M cells).
        starts, counts, first, n_children = [], [], [], []
        active = xp.ones(n, dtype=bool)
        offset = 0                          # index of the level's first cell
        for level in range(MAX_DEPTH + 1):
            prefix = code >> (d * (MAX_DEPTH - level))
            new = active.copy()
            new[1:] &= prefix[1:] != prefix[:-1]
            cell_of = xp.cumsum(new) - 1    # each active sorted point's cell at this level
            start = xp.flatnonzero(new)
            count = xp.bincount(cell_of[active], minlength=len(start))
            offset += len(start)
            if starts:
                # Children of the previous level's cells: the cells of its first and
                # last point here, and all between.
                s, c = starts[-1], counts[-1]
                split = c > 1
                first[-1] = xp.where(split, cell_of[s] + (offset - len(start)), 0)
                n_children[-1] = xp.where(split, cell_of[s + c - 1] - cell_of[s] + 1, 0)
            starts.append(start)
            counts.append(count)
            first.append(xp.zeros(len(start), dtype=xp.int64))
            n_children.append(xp.zeros(len(start), dtype=xp.int64))
            active &= count[xp.maximum(cell_of, 0)] > 1
            if not bool(active.any()):
                break
        levels = range(len(starts))
        self.start = xp.concatenate(starts)
        self.count = xp.concatenate(counts)
        self.first_child = xp.concatenate(first)
        self.n_children = xp.concatenate(n_children)
        self.side = xp.concatenate([xp.full(len(s), size / 2.0**lv)
                                    for s, lv in zip(starts, levels)])
        self.mass = cw[self.start + self.count] - cw[self.start]
        self.wx = cwx[self.start + self.count] - cwx[self.start]
        self.com = self.wx / xp.maximum(self.mass, np.finfo(self.mass.dtype).tiny)[:, None]
        self.depth = len(starts) - 1

    def _sort_points(self, X, weights):
        """Points and weights (float64) in the order ``self.order``, each point's
        sorted position (rank: the self-pair tests), and the prefix sums of the
        weights and weighted points, a zero row first, whose differences are the
        cells' sums."""
        xp, n, d = self.be.xp, X.shape[0], X.shape[1]
        self.points = X[self.order].astype(xp.float64)
        w = xp.ones(n) if weights is None else weights[self.order].astype(xp.float64)
        self.weights = w
        self.rank = xp.empty(n, dtype=xp.int64)
        self.rank[self.order] = xp.arange(n)
        cw = xp.concatenate([xp.zeros(1), xp.cumsum(w)])
        cwx = xp.concatenate([xp.zeros((1, d)), xp.cumsum(w[:, None] * self.points, axis=0)])
        return cw, cwx

    def _build_gpu(self, X, weights):
        """_build's arrays (from the float64 values of X) by kernels/bh_tree.cu:
        about 40 CuPy calls, 3 kernel launches and 1 host read whatever the
        depth, where _build makes some 30 calls and a host read per level."""
        be, xp = self.be, self.be.xp
        n, d = X.shape
        code, lo, hi = _morton_gpu(be, X)
        self.order = xp.argsort(code)
        code = code[self.order]
        cw, cwx = self._sort_points(X, weights)
        defines = {"BH_DIM": d, "BH_DEPTH": MAX_DEPTH}
        lcp, top = xp.empty(n, dtype=xp.int32), xp.empty(n, dtype=xp.int32)
        cells = xp.empty(n, dtype=xp.int64)
        be.kernel("bh_tree.cu", "bh_levels", X.dtype, defines)(
            _blocks(n), (GPU_THREADS,), (code, np.int64(n), lcp, top, cells))
        depth, n_cells = be.to_host(xp.stack([top.max().astype(xp.int64), cells.sum()])).tolist()
        if n_cells >= 2**31:            # the walk's stack holds int cell indices
            raise ValueError(f"Barnes-Hut tree of {n_cells} cells: more than 2^31 - 1")
        # Which points start a cell of each level, numbered level by level.
        level = xp.arange(depth + 1, dtype=xp.int32)[:, None]
        number = xp.cumsum((level > lcp) & (level <= top), dtype=xp.int32)
        index = lambda: xp.empty(n_cells, dtype=xp.int64)
        self.start, self.count, self.first_child, self.n_children = (index() for _ in range(4))
        self.side, self.mass = xp.empty(n_cells), xp.empty(n_cells)
        self.wx, self.com = xp.empty((n_cells, d)), xp.empty((n_cells, d))
        be.kernel("bh_tree.cu", "bh_cells", X.dtype, defines)(
            _blocks((depth + 1) * n), (GPU_THREADS,),
            (code, lcp, top, number, cw, cwx, lo, hi, np.int64(n), np.int32(depth), self.start,
             self.count, self.first_child, self.n_children, self.side, self.mass, self.wx,
             self.com))
        self.depth = depth


def _blocks(n):
    """The grid of a launch with one thread per item, GPU_THREADS per block."""
    return (max(1, (n + GPU_THREADS - 1) // GPU_THREADS),)


def _morton_gpu(be, X):
    """(code, lo, hi) by kernels/bh_tree.cu: _morton_codes' codes computed in float64
    (as barneshut_cpu.build_tree), and the corners of the bounding box."""
    xp = be.xp
    X = xp.ascontiguousarray(X)
    lo, hi = X.min(axis=0).astype(xp.float64), X.max(axis=0).astype(xp.float64)
    code = xp.empty(X.shape[0], dtype=xp.int64)
    be.kernel("bh_tree.cu", "bh_morton", X.dtype, {"BH_DIM": X.shape[1], "BH_DEPTH": MAX_DEPTH})(
        _blocks(X.shape[0]), (GPU_THREADS,), (X, lo, hi, np.int64(X.shape[0]), code))
    return code, lo, hi


def bh_sums(be, X, kernels, Y=None, weights=None, theta=DEFAULT_THETA, sources=None):
    """[(S, SX) for each kernel] by Barnes-Hut; the exact engine's contract.

    The kernel sets of the compiled exact loop (KERNEL_CODES) use the compiled
    walks (barneshut_cpu.py on the CPU, the tree's own points by groups, its
    cells, and new targets Y one by one; kernels/barneshut.cu on the GPU), others
    the vectorized traversal.  ``sources``: a dict kept by a caller whose sources
    X (and weights) are the same at every call, where the tree is built once
    (the out-of-sample mapping: 750 builds of a 10,000-point tree were half of
    its time).
    """
    kernels = tuple(kernels)
    if kernels not in KERNEL_CODES:
        return vectorized_bh_sums(be, X, kernels, Y, weights, theta)
    if sources is None:
        tree = Tree(be, X, weights)
    elif "tree" in sources:
        tree = sources["tree"]
    else:
        tree = sources["tree"] = Tree(be, X, weights)
    code = KERNEL_CODES[kernels]
    if be.is_gpu:
        S, SX = _walk_gpu(tree, X if Y is None else Y, code, theta, Y is None)
    else:
        S, SX = traverse_cpu(tree, code, theta, MAX_DEPTH, _SPREAD, targets=Y)
    return compiled_results(kernels, S.astype(X.dtype), SX.astype(X.dtype))


def _walk_gpu(tree, targets, code, theta, self_pairs):
    """S (outs, N_t) and SX (outs, N_t, d) in the targets' dtype by
    kernels/barneshut.cu (the tree's float64 arrays cast to that dtype)."""
    be, xp = tree.be, tree.be.xp
    dtype = targets.dtype
    n_t, d = targets.shape
    outs = 2 if code == 2 else 1
    S = xp.empty((outs, n_t), dtype=dtype)
    SX = xp.empty((outs, n_t, d), dtype=dtype)
    visit, rank = tree.walk_order(targets, self_pairs)
    cast = lambda a: xp.ascontiguousarray(a, dtype=dtype)
    # Stack bound of a depth-first walk: at most 2^d - 1 siblings wait per level.
    defines = {"BH_DIM": d, "BH_KERNEL": code, "BH_STACK": (2**d - 1) * (MAX_DEPTH + 1) + 1}
    walk = be.kernel("barneshut.cu", "bh_walk", dtype, defines)
    walk(_blocks(n_t), (GPU_THREADS,),
         (cast(tree.points), cast(tree.weights), cast(targets), visit, rank, tree.start,
          tree.count, tree.first_child, tree.n_children, cast(tree.side ** 2), cast(tree.mass),
          cast(tree.com), dtype.type(theta * theta), np.int64(n_t), S, SX))
    return S, SX


def vectorized_bh_sums(be, X, kernels, Y=None, weights=None, theta=DEFAULT_THETA):
    """:func:`bh_sums` by level-synchronous array code (NumPy or CuPy): every
    (target, cell) pair of a chunk of targets descends one level per step."""
    xp = be.xp
    tree = Tree(be, X, weights)
    targets = (X if Y is None else Y).astype(xp.float64)
    n_t, d = targets.shape
    out = [(xp.zeros(n_t), xp.zeros((n_t, d))) for _ in kernels]
    per_target = min(X.shape[0], 16 * (1 + int((2.0 / max(theta, 1e-3)) ** d)) * (tree.depth + 1))
    step = max(1, BUDGET // per_target)
    for a in range(0, n_t, step):
        _traverse(tree, targets, a, min(n_t, a + step), kernels, theta, Y is None, out)
    return [(S.astype(X.dtype), SX.astype(X.dtype)) for S, SX in out]


def _traverse(tree, targets, a, b, kernels, theta, self_pairs, out):
    xp = tree.be.xp
    n_local = b - a
    tgt = xp.arange(a, b)
    cell = xp.zeros(n_local, dtype=xp.int64)          # everyone starts at the root
    theta2 = theta * theta
    while len(tgt):
        y = targets[tgt]
        leaf = tree.n_children[cell] == 0
        contains = xp.zeros(len(tgt), dtype=bool)
        if self_pairs:
            r = tree.rank[tgt]
            contains = (r >= tree.start[cell]) & (r < tree.start[cell] + tree.count[cell])
        diff = y - tree.com[cell]
        d2 = (diff * diff).sum(axis=1)
        far = ~leaf & ~contains & (tree.side[cell] ** 2 < theta2 * d2)
        if bool(far.any()):
            _accumulate(tree, kernels, tgt[far] - a, d2[far], tree.mass[cell[far]],
                        tree.wx[cell[far]], out, a, b)
        if bool(leaf.any()):
            t_leaf, c_leaf = tgt[leaf], cell[leaf]
            group, rank = expand(xp, tree.count[c_leaf])
            s = tree.start[c_leaf][group] + rank
            t = t_leaf[group]
            if self_pairs:
                keep = tree.rank[t] != s
                s, t = s[keep], t[keep]
            diff = targets[t] - tree.points[s]
            w = tree.weights[s]
            _accumulate(tree, kernels, t - a, (diff * diff).sum(axis=1), w,
                        w[:, None] * tree.points[s], out, a, b)
        opened = ~leaf & ~far
        tgt, cell = tgt[opened], cell[opened]
        n_child = tree.n_children[cell]
        group, rank = expand(xp, n_child)
        cell = tree.first_child[cell][group] + rank
        tgt = tgt[group]


def _accumulate(tree, kernels, local, d2, mass, wx, out, a, b):
    """Add mass K(d2) to S and wx K(d2) to SX of targets a + local."""
    xp = tree.be.xp
    n_local = b - a
    values = {}
    for kernel in kernels:
        if kernel == "student2" and "student" in values:
            values[kernel] = values["student"] * values["student"]
        else:
            values[kernel] = kernel_values(xp, kernel, d2.copy())
    for (S, SX), kernel in zip(out, kernels):
        K = values[kernel]
        S[a:b] += xp.bincount(local, weights=mass * K, minlength=n_local)
        for i in range(SX.shape[1]):
            SX[a:b, i] += xp.bincount(local, weights=wx[:, i] * K, minlength=n_local)
