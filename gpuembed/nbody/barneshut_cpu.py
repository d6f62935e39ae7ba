"""Compiled CPU construction and traversal of the Barnes-Hut tree (barneshut.py).

``build_tree`` makes the arrays of barneshut.Tree in one pass per level over
the Morton-sorted points, where the array code (the GPU path and the reference)
spends some 20 NumPy passes per level: on t-SNE layouts of Fashion-MNIST 70k
(19 levels, 132,000 cells) 13 ms against 26-29 ms, and the Student-t pair's
Barnes-Hut sum 69-72 ms against 81-82 ms (best of 20, 2-core EPYC).

The vectorized traversal of barneshut.py (the reference) moves every
(target, cell) pair of a level through gathers, masks and bincounts.  Here,
as in kernels/barneshut.cu on the GPU, each target walks the tree depth first
with a small stack, keeping its sums in registers: a leaf is summed exactly
over its points, an inner cell that does not hold the target and passes the
opening test adds its mass and centre of mass, any other cell pushes its
children, the same decisions as the vectorized code.  Like exact_cpu.py the
loop is generated per (dimension, kernel code), compiled by numba on first use
(1.5 s) and cached on disk (gpuembed/_generated.py), without reassociation:
the walk's branching sums do not vectorize, and with it the Student-t pair on
a 20k t-SNE layout took the same 16 ms (the Gaussian 22 ms) to the same bits.
Targets are visited in the tree's Morton order so that neighbouring
iterations reuse the same cells.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import njit

from .._generated import compile_source
from .exact_cpu import kernel_lines, store_lines


def build_tree(X, weights, max_depth, spread):
    """Tree's arrays (name -> array) for points X (N, d), optional weights, on a
    2^max_depth grid; ``spread[d]`` the shift-and-mask steps of Morton bit
    interleaving.  Equal to the array code's for float64 X; in float32 the cell
    of a point within rounding of a grid line may differ (here in float64)."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    steps = np.array(spread.get(X.shape[1], ()), dtype=np.int64).reshape(-1, 2)
    code, size = _morton(X, max_depth, steps)
    order = np.argsort(code)         # NumPy's sort, as the array code's (ties alike)
    w = (np.ones(len(X)) if weights is None
         else np.ascontiguousarray(weights, dtype=np.float64))
    points, w, cw, cwx, rank = _sorted_sums(X, w, order)
    start, count, first, n_children, level, depth = _levels(code[order], X.shape[1], max_depth)
    mass, wx, com = _cell_sums(cw, cwx, start, count)
    return {"order": order, "points": points, "weights": w, "start": start, "count": count,
            "first_child": first, "n_children": n_children, "side": size / 2.0 ** level,
            "mass": mass, "wx": wx, "com": com, "depth": depth, "rank": rank}


@njit(cache=True)
def _morton(X, max_depth, steps):
    n, d = X.shape
    lo = X[0].copy()
    hi = X[0].copy()
    for i in range(n):
        for c in range(d):
            lo[c] = min(lo[c], X[i, c])
            hi[c] = max(hi[c], X[i, c])
    size = (hi - lo).max()
    size = size * (1.0 + 1e-12) if size > 0 else 1.0
    top = 2**max_depth - 1
    code = np.zeros(n, np.int64)
    for i in range(n):
        for c in range(d):
            v = min(np.int64((X[i, c] - lo[c]) / size * 2**max_depth), top)
            for k in range(steps.shape[0]):
                v = (v | (v << steps[k, 0])) & steps[k, 1]
            code[i] |= v << (d - 1 - c)
    return code, size


@njit(cache=True)
def _sorted_sums(X, w, order):
    """Points and weights in Morton order, their prefix sums of w and w x (a
    leading zero row), and each point's sorted position."""
    n, d = X.shape
    points = np.empty((n, d))
    ws = np.empty(n)
    cw = np.zeros(n + 1)
    cwx = np.zeros((n + 1, d))
    rank = np.empty(n, np.int64)
    for i in range(n):
        j = order[i]
        rank[j] = i
        ws[i] = w[j]
        cw[i + 1] = cw[i] + w[j]
        for c in range(d):
            points[i, c] = X[j, c]
            cwx[i + 1, c] = cwx[i, c] + w[j] * X[j, c]
    return points, ws, cw, cwx, rank


def _levels(code, d, max_depth):
    """Cells level by level: the root, then the runs of equal code prefixes inside
    each cell of more than one point (single-point cells are leaves).  Returns
    start, count, first_child, n_children and level of every cell, and the depth."""
    starts, counts = [np.zeros(1, np.int64)], [np.array([len(code)], np.int64)]
    firsts, n_children = [], []
    offset = 1                                    # index of the next level's first cell
    for depth in range(max_depth):
        start, count, first, n_child = _children(code, starts[-1], counts[-1],
                                                 d * (max_depth - depth - 1))
        if not len(start):                        # no cell split: the last level
            break
        firsts.append(np.where(n_child > 0, first + offset, 0))
        n_children.append(n_child)
        offset += len(start)
        starts.append(start)
        counts.append(count)
    firsts.append(np.zeros(len(starts[-1]), np.int64))
    n_children.append(np.zeros(len(starts[-1]), np.int64))
    level = np.repeat(np.arange(len(starts)), [len(x) for x in starts])
    return (np.concatenate(starts), np.concatenate(counts), np.concatenate(firsts),
            np.concatenate(n_children), level, len(starts) - 1)


@njit(cache=True)
def _children(code, start, count, shift):
    """The runs of equal ``code >> shift`` inside each cell of more than one point:
    their starts and counts, each cell's first run (among them) and number of runs."""
    child_start = np.empty(code.shape[0], np.int64)
    child_count = np.empty(code.shape[0], np.int64)
    first = np.zeros(start.shape[0], np.int64)
    n_child = np.zeros(start.shape[0], np.int64)
    k = 0
    for cell in range(start.shape[0]):
        if count[cell] < 2:
            continue
        first[cell] = k
        run, end = start[cell], start[cell] + count[cell]
        prefix = code[run] >> shift
        for j in range(run + 1, end):
            following = code[j] >> shift
            if following != prefix:
                child_start[k], child_count[k] = run, j - run
                k += 1
                run, prefix = j, following
        child_start[k], child_count[k] = run, end - run
        k += 1
        n_child[cell] = k - first[cell]
    return child_start[:k], child_count[:k], first, n_child


@njit(cache=True)
def _cell_sums(cw, cwx, start, count):
    """Mass, sum w x and centre of mass of each cell from the prefix sums."""
    n_cells, d = start.shape[0], cwx.shape[1]
    mass = np.empty(n_cells)
    wx = np.empty((n_cells, d))
    com = np.empty((n_cells, d))
    tiny = np.finfo(np.float64).tiny
    for k in range(n_cells):
        a, b = start[k], start[k] + count[k]
        mass[k] = cw[b] - cw[a]
        for c in range(d):
            wx[k, c] = cwx[b, c] - cwx[a, c]
            com[k, c] = wx[k, c] / max(mass[k], tiny)
    return mass, wx, com


_TEMPLATE = """
def sums(PT, w, TT, visit, rank, start, count, first, n_children, side2, mass, comT, theta2,
         stack_size, S, SX):
    for v in prange(visit.shape[0]):
        i = visit[v]
{load}
        s = 0.0
        s2 = 0.0
{zero}
        r = rank[i]                       # the target's own sorted position, or -1
        stack = np.empty(stack_size, np.int64)
        stack[0] = 0
        top = 1
        while top > 0:
            top -= 1
            cell = stack[top]
            lo = start[cell]
            hi = lo + count[cell]
            if n_children[cell] == 0:
                for j in range(lo, hi):
                    if j != r:
                        t = {point_distance}
{point_kernel}
                continue
            t = {cell_distance}
            if (r < lo or r >= hi) and side2[cell] < theta2 * t:
{cell_kernel}
            else:
                for c in range(n_children[cell]):
                    stack[top] = first[cell] + c
                    top += 1
{store}
"""


@functools.lru_cache(maxsize=None)
def _compiled(dim, code):
    coords = range(dim)
    lines = lambda fmt: "".join(" " * 8 + fmt.format(c=c) + "\n" for c in coords)
    distance = lambda source: " + ".join(f"(y{c} - {source.format(c=c)}) ** 2" for c in coords)
    source = _TEMPLATE.format(
        load=lines("y{c} = TT[{c}, i]").rstrip("\n"),
        zero=(lines("a{c} = 0.0") + lines("b{c} = 0.0")).rstrip("\n"),
        point_distance=distance("PT[{c}, j]"),
        point_kernel=kernel_lines(code, dim, "w[j]", "PT[{c}, j]", 24).rstrip("\n"),
        cell_distance=distance("comT[{c}, cell]"),
        cell_kernel=kernel_lines(code, dim, "mass[cell]", "comT[{c}, cell]", 16).rstrip("\n"),
        store=store_lines(code, dim, 8).rstrip("\n"))
    return compile_source(source, "sums", parallel=True, fastmath={"contract"})


def traverse_cpu(tree, targets, code, theta, self_pairs):
    """(S, SX) with a leading axis of 1 (codes 0, 1) or 2 (code 2) for float64
    ``targets`` against the tree's points; the target's own point is skipped when
    ``self_pairs`` (targets are the tree's points, in their original order)."""
    n_t, d = targets.shape
    outs = 2 if code == 2 else 1
    S = np.empty((outs, n_t))
    SX = np.empty((outs, n_t, d))
    visit, rank = tree.walk_order(targets, self_pairs)
    c = np.ascontiguousarray
    _compiled(d, code)(
        c(tree.points.T), tree.weights, c(targets.T), visit, rank, tree.start, tree.count,
        tree.first_child, tree.n_children, tree.side ** 2, tree.mass, c(tree.com.T),
        float(theta) ** 2, (2**d - 1) * (tree.depth + 1) + 1, S, SX)
    return S, SX
