"""Compiled CPU traversal of the Barnes-Hut tree (barneshut.py), targets in parallel.

The vectorized traversal of barneshut.py (the GPU path and the reference)
moves every (target, cell) pair of a level through gathers, masks and
bincounts.  Here each target walks the tree depth first with a small stack,
keeping its sums in registers: a leaf is summed exactly over its points, an
inner cell that does not hold the target and passes the opening test adds
its mass and centre of mass, any other cell pushes its children, the same
decisions as the vectorized code.  Like exact_cpu.py the loop is generated
per (dimension, kernel code) and compiled by numba on first use; targets are
visited in the tree's Morton order so that neighbouring iterations reuse the
same cells.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import njit, prange

from ..fastexp import expneg
from .exact_cpu import kernel_lines, store_lines

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
    namespace = {"prange": prange, "expneg": expneg, "np": np}
    exec(source, namespace)
    return njit(parallel=True, fastmath=True)(namespace["sums"])


def traverse_cpu(tree, targets, code, theta, self_pairs):
    """(S, SX) with a leading axis of 1 (codes 0, 1) or 2 (code 2) for float64
    ``targets`` against the tree's points; the target's own point is skipped when
    ``self_pairs`` (targets are the tree's points, in their original order)."""
    n_t, d = targets.shape
    outs = 2 if code == 2 else 1
    S = np.empty((outs, n_t))
    SX = np.empty((outs, n_t, d))
    if self_pairs:
        visit, rank = tree.order, tree.rank
    else:
        visit, rank = np.arange(n_t), np.full(n_t, -1)
    c = np.ascontiguousarray
    _compiled(d, code)(
        c(tree.points.T), tree.weights, c(targets.T), visit, rank, tree.start, tree.count,
        tree.first_child, tree.n_children, tree.side ** 2, tree.mass, c(tree.com.T),
        float(theta) ** 2, (2**d - 1) * (tree.depth + 1) + 1, S, SX)
    return S, SX
