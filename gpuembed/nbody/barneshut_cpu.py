"""Compiled CPU construction and traversal of the Barnes-Hut tree (barneshut.py).

``build_tree`` makes the arrays of barneshut.Tree in one pass per level over
the Morton-sorted points, where the array code (the GPU path and the reference)
spends some 20 NumPy passes per level: on t-SNE layouts of Fashion-MNIST 70k
(19 levels, 132,000 cells) 13 ms against 26-29 ms, and the Student-t pair's
Barnes-Hut sum 69-72 ms against 81-82 ms (best of 20, 2-core EPYC).

The vectorized traversal of barneshut.py (the reference) moves every
(target, cell) pair of a level through gathers, masks and bincounts; the GPU's
kernels/barneshut.cu walks the tree depth first per target.  Here the tree's
own points go in groups, the largest cells of at most GROUP_SIZE points, as in
Barnes's 1990 modified tree code: a group walks the tree once, listing leaves'
points and the cells that pass the opening test at the distance from their
centre of mass to the group's bounding box (none that holds a target of the
group), and then each target sweeps that list in one loop, which LLVM
vectorizes as the exact loop's (exact_cpu.py).  That distance bounds each
target's own, so every target's cells pass its own opening test: the sums are
at least as fine as the per-target walk's, which groups of one target give
exactly (the tests compare those with the array code).  On the t-SNE layout of
Fashion-MNIST 70k and random subsets of it (theta = 0.5, the Student-t pair,
Xeon VM, best of 7): 70,000 points 20.1 ms against 55.9 ms per target, largest
error relative to the exact sums 0.65% against 1.37%; 20,000 points 4.6 against
12.5 ms (0.39% against 1.37%); 5,000 points 0.9 against 2.5 ms (0.14% against
1.39%).  Groups of 32, 64 and 256 took 27.1, 22.1 and 20.4 ms at 70,000.  A
group's walk fills arrays of LIST_CAPACITY entries, counting on past their end,
and only a list that overflowed walks again into arrays of its count: a
prototype whose arrays grew as the walk went (rebound inside its loop) took 100
ms for the walks alone at 70,000 (groups of 32, one thread), against 13 ms for
counting them.  Like exact_cpu.py the loop is generated per (dimension, kernel
code), compiled by numba on first use and cached on disk (gpuembed/_generated.py).

New targets (out-of-sample mappings) go one by one, in their Morton order, so
that a new point's sums do not depend on the others given with it; and mappings
end sooner.  In groups of the cells of their own tree holding about 512 sources,
10,000 shifted images mapped into the t-SNE layout of 140,000 took 5.3 s against
4.1 s, their median point 49 gradient evaluations against 23 (finer sums moved
points on longer at the per-point stopping test's 1e-10), though a call for
2,000 points in a 10,000-point layout took 0.79 ms against 3.3 ms (the Student-t
sum); in groups of up to 128 points, whose bounding box spans the layout when
few points are left, 11.0 s (these three with two walks per group, before
LIST_CAPACITY).
"""
from __future__ import annotations

import functools

import numpy as np
from numba import njit

from .._generated import compile_source
from .exact_cpu import kernel_lines, store_lines

GROUP_SIZE = 128
# Entries of a group's first list.  Walking twice always (counting, then filling
# a list of the count) took 23.4 ms for the Student-t pair of a t-SNE layout of
# Fashion-MNIST 70k, 3.2 ms for 2,000 new points in one of 10,000 (Xeon VM, best
# of 7); first lists of 256, 1,024, 4,096 and 16,384 entries 21.1, 19.5, 19.5 and
# 20.0 ms, 1.9 ms each.
LIST_CAPACITY = 2048


def build_tree(X, weights, max_depth, spread):
    """Tree's arrays (name -> array) for points X (N, d), optional weights, on a
    2^max_depth grid; ``spread[d]`` the shift-and-mask steps of Morton bit
    interleaving.  Equal to the array code's for float64 X; in float32 the cell
    of a point within rounding of a grid line may differ (here in float64)."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    code, size, order = _morton_order(X, max_depth, spread)
    w = (np.ones(len(X)) if weights is None
         else np.ascontiguousarray(weights, dtype=np.float64))
    points, w, cw, cwx, rank = _sorted_sums(X, w, order)
    start, count, first, n_children, level, depth = _levels(code[order], X.shape[1], max_depth)
    mass, wx, com = _cell_sums(cw, cwx, start, count)
    side = np.ldexp(size, -level)      # size / 2^level exactly, without a pow per cell
    # The walk's layouts (traverse_cpu), made once per tree: a transform's ~1,200
    # calls on one 140,000-point tree took 0.9 ms each to make them (10,000 new
    # points mapped in 3.8 s against 2.9 s with them kept, Xeon VM).
    return {"order": order, "points": points, "weights": w, "start": start, "count": count,
            "first_child": first, "n_children": n_children, "side": side,
            "mass": mass, "wx": wx, "com": com, "depth": depth, "rank": rank,
            "points_t": np.ascontiguousarray(points.T), "com_t": np.ascontiguousarray(com.T),
            "side2": side * side}


def _morton_order(X, max_depth, spread):
    """(code, size, order): _morton's codes and cube side for float64 X, and the
    order that sorts the codes (NumPy's sort, as the array code's: ties alike)."""
    steps = np.array(spread.get(X.shape[1], ()), dtype=np.int64).reshape(-1, 2)
    code, size = _morton(X, max_depth, steps)
    return code, size, np.argsort(code)


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


@njit(cache=True)
def _groups(count, first, n_children, size):
    """Start cells of the target groups: the largest cells of at most ``size``
    points, and leaves (deepest-level cells of more points)."""
    groups = np.empty(count.shape[0], np.int64)
    stack = np.empty(count.shape[0], np.int64)
    stack[0], top, n = 0, 1, 0
    while top > 0:
        top -= 1
        cell = stack[top]
        if count[cell] <= size or n_children[cell] == 0:
            groups[n] = cell
            n += 1
        else:
            for c in range(n_children[cell]):
                stack[top] = first[cell] + c
                top += 1
    return groups[:n]


# One group of targets per iteration: a walk from the root lists what the group
# sums (again into a list of the count it reached, where that overflowed the
# first), then each target sweeps the list in one loop, which LLVM vectorizes as
# the exact loop's.
_TEMPLATE = """
def sums(PT, w, TT, gstart, gcount, self_pairs, start, count, first, n_children, side2, mass,
         comT, theta2, stack_size, capacity, S, SX):
    for g in prange(gstart.shape[0]):
        glo = gstart[g]
        ghi = glo + gcount[g]
{box}
        for i in range(glo + 1, ghi):
{grow}
        stack = np.empty(stack_size, np.int64)
        size = capacity
        for attempt in range(2):
            LT = np.empty(({dim} + 1, size))
            index = np.empty(size, np.int64)
            n = 0
            stack[0] = 0
            top = 1
            while top > 0:
                top -= 1
                cell = stack[top]
                lo = start[cell]
                hi = lo + count[cell]
                if n_children[cell] == 0:
                    if n + hi - lo <= size:
                        for j in range(lo, hi):
{copy_point}
                            LT[{dim}, n] = w[j]
                            index[n] = j if self_pairs else -1
                            n += 1
                    else:
                        n += hi - lo
                    continue
                if not self_pairs or hi <= glo or lo >= ghi:
{gap}
                    if side2[cell] < theta2 * ({gap2}):
                        if n < size:
{copy_cell}
                            LT[{dim}, n] = mass[cell]
                            index[n] = -1
                        n += 1
                        continue
                for c in range(n_children[cell]):
                    stack[top] = first[cell] + c
                    top += 1
            if n <= size:
                break
            size = n
        for i in range(glo, ghi):
{load}
            s = 0.0
            s2 = 0.0
{zero}
            for j in range(n):
                # The target's own point at infinite distance (its kernels 0), as
                # in the exact loop: one loop, which LLVM vectorizes.
                t = {distance}
                t = np.inf if index[j] == i else t
{kernel}
{store}
"""


@functools.lru_cache(maxsize=None)
def _compiled(dim, code):
    coords = range(dim)
    lines = lambda fmt, indent: "".join(" " * indent + fmt.format(c=c) + "\n"
                                        for c in coords).rstrip("\n")
    source = _TEMPLATE.format(
        dim=dim,
        box=lines("lo{c} = TT[{c}, glo]\n        hi{c} = lo{c}", 8),
        grow=lines("lo{c} = min(lo{c}, TT[{c}, i])\n            hi{c} = max(hi{c}, TT[{c}, i])",
                   12),
        copy_point=lines("LT[{c}, n] = PT[{c}, j]", 28),
        gap=lines("g{c} = max(lo{c} - comT[{c}, cell], comT[{c}, cell] - hi{c}, 0.0)", 20),
        gap2=" + ".join(f"g{c} * g{c}" for c in coords),
        copy_cell=lines("LT[{c}, n] = comT[{c}, cell]", 28),
        load=lines("y{c} = TT[{c}, i]", 12),
        zero=lines("a{c} = 0.0\n            b{c} = 0.0", 12),
        distance=" + ".join(f"(y{c} - LT[{c}, j]) ** 2" for c in coords),
        kernel=kernel_lines(code, dim, f"LT[{dim}, j]", "LT[{c}, j]", 16).rstrip("\n"),
        store=store_lines(code, dim, 12).rstrip("\n"))
    return compile_source(source, "sums", parallel=True, fastmath={"contract", "reassoc"})


def traverse_cpu(tree, code, theta, max_depth, spread, targets=None):
    """(S, SX) with a leading axis of 1 (codes 0, 1) or 2 (code 2) for ``targets``
    (N_t, d), in their order, against ``tree``'s points (barneshut.Tree); for
    targets None the tree's own points, each skipping itself, in groups (cells of
    the tree of at most GROUP_SIZE points).  Other targets go one by one, in the
    Morton order of the grid ``max_depth``, ``spread`` (as build_tree's)."""
    d = tree.points.shape[1]
    if targets is None:
        TT, rank = tree.points_t, tree.rank
        groups = _groups(tree.count, tree.first_child, tree.n_children, GROUP_SIZE)
        gstart, gcount = tree.start[groups], tree.count[groups]
    else:
        T = np.ascontiguousarray(targets, dtype=np.float64)
        order = _morton_order(T, max_depth, spread)[2]
        TT, rank = np.ascontiguousarray(T[order].T), np.argsort(order)
        gstart, gcount = np.arange(len(T)), np.ones(len(T), np.int64)
    outs = 2 if code == 2 else 1
    S = np.empty((outs, TT.shape[1]))
    SX = np.empty((outs, TT.shape[1], d))
    _compiled(d, code)(
        tree.points_t, tree.weights, TT, gstart, gcount, targets is None, tree.start,
        tree.count, tree.first_child, tree.n_children, tree.side2, tree.mass, tree.com_t,
        float(theta) ** 2, (2**d - 1) * (tree.depth + 1) + 1, LIST_CAPACITY, S, SX)
    return S[:, rank], SX[:, rank]
