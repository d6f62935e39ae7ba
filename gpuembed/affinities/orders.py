"""Warm-start orders for the entropic-affinity root finding, as schedules of waves.

Source: section 2.2 of ../shared/papers/003_e1371111a5435f8e.txt and section 2.3.4
(Algorithm 2) of 000_7551f45b306cd904.txt.  A point's log beta is started from
the solution of points solved before it:

- "dk": points sorted by the distance to their K-th neighbour (a density order);
- "mst": breadth-first traversal of the minimum spanning tree (forest) of the
  kappa-NN graph, each point started from its parent;
- "msp": the greedy minimum spanning path of Algorithm 2;
- "bounds": every point starts at the middle of its Theorem 1.1 bracket;
- "none": every point starts at beta = 1, as scikit-learn and openTSNE do;
- a sequence of the N points given by the user (any permutation of their
  indices), e.g. :func:`raster_order` for the pixels of an image: section 2.3.4's
  raster order, local at no cost, which needed as few evaluations as "mst" and
  "msp" on the pixels of an image (benchmarks/bench_entropic.py --raster).

A sequential order does not parallelize as is.  A *schedule* is a list of
waves ``(rows, sources)``: all rows of a wave are solved together, each started
from the mean log beta of its (already solved) ``sources`` (-1: no source, use
the bracket midpoint; ``sources`` None: none for the whole wave).  ``parallel=True``
builds few large waves:

- sequences (dk, msp, a given sequence): a coarse subsample of the sequence
  first, then the midpoints between solved positions, halving the spacing each
  wave, each point started from the mean of its two solved sequence neighbours
  (log2 N waves);
- trees (mst): one wave per tree level, each point started from its parent.

``parallel=False`` gives the paper's sequential orders (one point per wave).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse
import scipy.sparse.csgraph

from .._checks import check_int
from . import rootfinding

ORDERS = ("dk", "mst", "msp", "bounds", "none")
KAPPA = 10          # neighbours kept in the graph for mst/msp (paper: kappa = 10)
FIRST_WAVE = 64     # points in the first wave of a parallel sequence schedule


def check_order(order, n, to_host=np.asarray):
    """``order`` checked against N points: one of ORDERS, or a sequence (list,
    NumPy or CuPy array) of all N point indices, each once, returned as int64 on
    the host (``n`` None: a name only)."""
    expected = f"one of {ORDERS} or a sequence of all point indices, each once"
    if isinstance(order, str):
        if order not in ORDERS:
            raise ValueError(f"order must be {expected}, got {order!r}")
        return order
    sequence = np.asarray(to_host(order))
    if sequence.shape != (n,) or not np.issubdtype(sequence.dtype, np.integer):
        raise ValueError(f"order must be {expected} ({n} here), got an array of shape "
                         f"{sequence.shape} and dtype {sequence.dtype}")
    sequence = sequence.astype(np.int64)
    if not ((sequence >= 0) & (sequence < n)).all():
        raise ValueError(f"order must be {expected}: the given sequence has indices "
                         f"outside [0, {n})")
    if (np.bincount(sequence, minlength=n) != 1).any():
        raise ValueError(f"order must be {expected}: the given sequence repeats some "
                         f"points and misses others")
    return sequence


def raster_order(height, width):
    """The raster order of an image's pixels, numbered row by row (as
    ``np.indices((height, width))`` flattens them): left to right along the first
    row, right to left along the second, and so on (dissertation section 2.3.4),
    so consecutive pixels are always adjacent."""
    height, width = check_int(height, "height", 1), check_int(width, "width", 1)
    grid = np.arange(height * width).reshape(height, width)
    grid[1::2] = grid[1::2, ::-1]
    return grid.ravel()


def schedule(order, sqdist, indices, perplexity, parallel=True, xp=np, to_host=np.asarray):
    """Waves ``[(rows, sources), ...]`` for ``order`` (see module doc; a sequence
    as :func:`check_order` returns it).

    The neighbours may live on the GPU (``xp``: its module): "dk" sorts its one
    column there and builds its waves there; "mst" and "msp" copy (``to_host``)
    KAPPA columns to build their graph on the host; all columns would be 1.4 GB
    for 1e6 rows x 90.  "bounds" and "none" read nothing."""
    n = sqdist.shape[0]
    if not isinstance(order, str):
        return _sequence_waves(xp, xp.asarray(order)) if parallel else _sequential(order, None)
    if order in ("bounds", "none"):
        return [(xp.arange(n), None)]
    if order == "dk":
        K = rootfinding.common_value(perplexity)
        kth = int(np.clip(round(float(np.median(K))), 1, sqdist.shape[1]))
        sequence = xp.argsort(xp.asarray(sqdist[:, kth - 1]), kind="stable")
        return (_sequence_waves(xp, sequence) if parallel
                else _sequential(to_host(sequence), None))
    graph = _knn_graph(to_host(sqdist[:, :KAPPA]), to_host(indices[:, :KAPPA]))
    if order == "msp":
        sequence = minimum_spanning_path(graph)
        return _sequence_waves(np, sequence) if parallel else _sequential(sequence, None)
    if order == "mst":
        bfs, parent, depth = _mst_bfs(graph)
        if not parallel:
            return _sequential(bfs, parent)
        waves = []
        by_depth = np.argsort(depth, kind="stable")
        bounds = np.searchsorted(depth[by_depth], np.arange(depth.max() + 2))
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            rows = by_depth[lo:hi]
            waves.append((rows, parent[rows][:, None]))
        return waves
    raise ValueError(f"order must be one of {ORDERS}, got {order!r}")


def _sequential(sequence, parent):
    """One point per wave: started from its parent, else from the previous point."""
    previous = np.concatenate(([-1], sequence[:-1]))
    source = previous if parent is None else parent[sequence]
    return [(np.array([row]), np.array([[src]])) for row, src in zip(sequence, source)]


def _sequence_waves(xp, sequence):
    """Coarse-to-fine waves over a sequence (see module doc), on its device."""
    n = len(sequence)
    spacing = 1
    while spacing * FIRST_WAVE < n:
        spacing *= 2
    waves = [(sequence[::spacing], None)]
    while spacing > 1:
        half = spacing // 2
        pos = xp.arange(half, n, spacing)
        left = pos - half
        right = xp.where(pos + half < n, pos + half, left)   # past the end: left only
        waves.append((sequence[pos], xp.stack([sequence[left], sequence[right]], axis=1)))
        spacing = half
    return waves


def _knn_graph(sqdist, indices, kappa=KAPPA):
    """Symmetric kappa-NN graph with positive edge weights.

    A constant is added to every weight: explicit zeros (duplicate points) would
    otherwise vanish from the sparse graph, and a constant shift changes no
    spanning tree's rank since all have N - 1 edges.
    """
    n, k = sqdist.shape
    kappa = min(kappa, k)
    w = sqdist[:, :kappa]
    w = w + max(float(w.mean()), 1.0) * 1e-9 + np.finfo(np.float64).tiny
    rows = np.repeat(np.arange(n), kappa)
    graph = scipy.sparse.csr_matrix((w.ravel(), (rows, indices[:, :kappa].ravel())), shape=(n, n))
    return graph.maximum(graph.T).tocsr()


def _mst_bfs(graph):
    """BFS order, parent (-1 for roots) and depth in the minimum spanning forest."""
    n = graph.shape[0]
    tree = scipy.sparse.csgraph.minimum_spanning_tree(graph)
    tree = tree.maximum(tree.T).tocsr()
    n_comp, comp = scipy.sparse.csgraph.connected_components(tree, directed=False)
    roots = np.unique(comp, return_index=True)[1]
    parent = np.full(n, -1)
    order = []
    for root in roots:
        bfs, pred = scipy.sparse.csgraph.breadth_first_order(tree, root, directed=False,
                                                             return_predecessors=True)
        parent[bfs[1:]] = pred[bfs[1:]]
        order.append(bfs)
    return np.concatenate(order), parent, _depths(parent)


def _depths(parent):
    """Depth of every node of a forest by pointer jumping (O(n log depth))."""
    depth = (parent >= 0).astype(np.int64)
    anc = parent.copy()
    while True:
        has = anc >= 0
        if not has.any():
            return depth
        idx = np.flatnonzero(has)
        up = anc[idx]
        depth[idx] += depth[up]
        anc[idx] = anc[up]


def minimum_spanning_path(graph, root=0, random_state=0):
    """Algorithm 2 (dissertation section 2.3.4): greedy walk to the nearest
    unvisited neighbour; when none is left, jump to a random unvisited point."""
    n = graph.shape[0]
    indptr, nbrs, weights = graph.indptr, graph.indices, graph.data
    # Neighbours of each node sorted by weight once, so each step scans in order.
    order = np.lexsort((weights, np.repeat(np.arange(n), np.diff(indptr))))
    nbrs = nbrs[order].tolist()
    indptr = indptr.tolist()
    visited = bytearray(n)
    jumps = np.random.default_rng(random_state).permutation(n).tolist()
    path = []
    i = root
    while True:
        visited[i] = 1
        path.append(i)
        nxt = -1
        for j in nbrs[indptr[i]:indptr[i + 1]]:
            if not visited[j]:
                nxt = j
                break
        if nxt < 0:
            while jumps and visited[jumps[-1]]:
                jumps.pop()
            if not jumps:
                return np.asarray(path)
            nxt = jumps.pop()
        i = nxt
