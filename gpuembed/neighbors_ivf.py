"""Approximate k nearest neighbours by an inverted file (IVF) of k-means lists.

The exact search (neighbors.py) computes all N^2 distances: Fashion-MNIST's
70,000 x 784 images take about 25 s on 2 cores, a quarter of a default t-SNE,
and 10^6 points would take hours.  Here a k-means on a sample of the points
(SAMPLE_PER_LIST per list, KMEANS_ITER Lloyd steps) splits them into
``n_lists`` lists (default sqrt(N)), kept centred, list after list, as a
:class:`ListIndex`; each point is searched exactly among the points of the
``n_probe`` lists whose centroids lie nearest it (more where those hold fewer
than k + 1 points).  The points that probe one list are one GEMM against its
points, about n_probe N^2 / n_lists products in all: n_lists / (2 n_probe)
times fewer than the exact search's half of the distance matrix.  Each point's
distances go to one row, and the exact search's selection and finish take its
k best.

What comes back has the exact search's form (each row's k best candidates by
(distance, index), self excluded); a true neighbour is missed when it lies in a
list that is not probed.  Recall of the 90-NN of Fashion-MNIST 70k (265 lists):
0.881 with 4 probes, 0.968 with 8 (benchmarks/results/knn_approx.json has the
timings).  It rests on the data's cluster and manifold structure, which the
lists follow, and falls as N grows at a fixed n_probe; i.i.d. Gaussian points
in 50-D, which have none, need most lists probed.  Hence the default
n_probe="auto": the exact k-NN of RECALL_SAMPLE random points tell, for every
probe count at once, which of their neighbours its search would find (a
neighbour in the list ranked r-th nearest its query is found with r + 1
probes), and the search probes the fewest lists whose sampled recall, less two
standard errors, reaches ``recall`` (0.95 by default): 7 for Fashion-MNIST 70k,
recall 0.957.  (Probing the lists nearest each point's own list's centroid, as
all points of a list then shared their candidates, took 16 probes for that
recall, 6.6 s against 5.5 s.)  The result is exact where the lists cannot save
time: with ``n_probe >= n_lists``, where every list is probed, or with "auto"
beyond AUTO_EXACT_FRACTION of them (the Gaussian points above); for fewer than
MIN_POINTS points with the default lists; for the CPU's points of at most
TREE_MAX_DIM features, which its k-d tree searches exactly and faster; and for
sparse rows.  Their lists' sparse products were slower than the exact search's
compiled one: synthetic TF-IDF documents (benchmarks/common.bag_of_words,
20,000 words), 20,000 documents 6.2 s against 2.3 s, 60,000 27.8 s against
13.5 s (recall 0.71: such documents have no cluster structure for the lists to
follow).

New points (an estimator's ``transform``) are searched the same way in a
ListIndex of the training points (:meth:`ListIndex.query`, :class:`QuerySearch`),
"auto" choosing n_probe from the exact search of RECALL_SAMPLE of them.
"""
from __future__ import annotations

import math

import numpy as np

from ._checks import check_data, check_float, check_int, make_rng
from ._sparse import BlockProducts, column_means, is_sparse, row_sqnorms
from .backend import get_backend
from .neighbors import (CANDIDATE_MARGIN, DEFAULT_BLOCK_BYTES, TREE_MAX_DIM, _finish_all,
                        _knn, _select_cpu, _select_gpu, _settle, knn, knn_query, metric_rows,
                        rounding, search_metric)

__all__ = ["approx_knn", "approx_knn_query", "ListIndex", "QuerySearch", "auto_knn",
           "SEARCHES"]

DEFAULT_RECALL = 0.95
RECALL_SAMPLE = 256         # points whose exact k-NN choose n_probe="auto"
# n_probe="auto" searches exactly where it would probe more than this fraction of
# the lists, as the exact search is faster there: Fashion-MNIST 70k, 90-NN, 265
# lists, took about 3.2 s + 0.25 s per probe (4 to 64 probes: 4.3 to 19.1 s)
# against the exact search's 23.4 s.
AUTO_EXACT_FRACTION = 0.3
# With the default lists, fewer points than this are searched exactly: the lists
# save little there.  Fashion-MNIST, 90-NN, "auto", against the exact search
# (2-core Xeon VM): 10,000 points 0.62 s against 0.75 s (recall 0.967), 20,000
# 1.29 s against 2.31 s, 40,000 3.3 s against 8.1 s.
MIN_POINTS = 20_000
# The distances of a chunk of queries to their probed lists' points (padded to the
# largest list) take at most PROBE_BUFFER_BYTES, and chunks are no larger than
# needed for GEMMs of about PROBE_GEMM_ROWS queries per list.  280,000 shifted
# images, 90-NN, "auto" (10 probes with those that hold k): chunks of 256 MiB made
# GEMMs of about 90 rows at 168 GFLOP/s, 38.7 s in all; of 1 GiB about 360 rows,
# 258 GFLOP/s, 33.6 s.  At 70k, 1 GiB chunks (1,500 rows) took 7.5 s with 8 probes
# against 5.5 s with 256 MiB (380 rows).
PROBE_BUFFER_BYTES = 2**30
# A probed query whose GEMM rounding (neighbors.rounding, an estimate on the safe side)
# exceeds this share of its k-th distance had its candidates chosen by the rounding
# more than by the distances, and gets the exact search's answer (_probe).  Fashion-MNIST
# 20k as float32, halves moved C up and down (pixels in [0, 1]), 30-NN, default probes:
# recall 0.961 / 0.960 / 0.959 / 0.952 / 0.934 / 0.880 / 0.294 unchecked at C = 0 / 30 /
# 45 / 60 / 75 / 100 / 300; at this share no row goes again up to 30 (0.9 and 2.3 s against
# 0.7 and 1.8 s), some at 45 (6.0 s, 0.963) and all from 60 on (8-9 s, recall 1).  At
# 0.1 every row went again from 30 on (7.1 s, where recall was 0.960 anyway).
ROUNDING_SHARE = 1.0
PROBE_GEMM_ROWS = 384
SAMPLE_PER_LIST = 32        # k-means sample: this many points per list
KMEANS_ITER = 10
# neighbors="auto" searches approximately from this many points on (X's own k-NN,
# and new points' in QuerySearch).  On the CPU (Fashion-MNIST, 90-NN, "auto" against
# the exact search, 2-core Xeon VM): 20,000 points 1.19 s against 2.52 s, 35,000 2.41
# s against 6.55 s, 50,000 3.77 s against 13.0 s (recall 0.965-0.972), 70,000 5.2 s
# against 23.2 s (0.957; the t-SNE from them as accurate), 10^6 4 min against 82.
# Below 50,000 the exact search takes seconds and is kept.  On the GPU the exact
# 90-NN of 70k takes 0.22 s (H200), the lists 0.54 s ("auto", 7 probes;
# knn_approx_gpu.json): exact.
AUTO_APPROX_FROM = {"cpu": 50_000, "gpu": None}


def approx_knn(X, n_neighbors, *, n_lists=None, n_probe="auto", recall=DEFAULT_RECALL,
               metric="euclidean", random_state=0, backend="auto"):
    """Approximate k nearest neighbours of every row of ``X`` (self excluded).

    Parameters
    ----------
    X : array (N, D), numpy or cupy, finite, or a sparse matrix (scipy or cupyx;
        searched exactly, see the module doc).
    n_neighbors : int in [1, N - 1].
    n_lists : number of k-means lists, in [1, N]; default round(sqrt(N)), and for
        fewer than MIN_POINTS points none: the exact search, faster there.
    n_probe : lists searched for each point (those whose centroids lie nearest
        it), >= 1; more is slower and finds more of the true neighbours.  "auto":
        the fewest that find ``recall`` of the true neighbours of RECALL_SAMPLE
        random points (their exact search tells), which is the exact search where
        the lists do not follow the data (as for i.i.d. Gaussian points).
    recall : in (0, 1], the fraction of the true neighbours that ``n_probe="auto"``
        aims at.
    metric : "euclidean" | "cosine", as in :func:`gpuembed.knn` (lists need
        coordinates: a precomputed matrix is sorted by :func:`gpuembed.knn`).
    random_state : seed of the k-means sample, its initial centroids and the
        points that choose n_probe="auto"; the same seed gives the same result.
    backend : "auto" | "cpu" | "gpu" | Backend.

    Returns ``(sqdist, indices)`` as :func:`gpuembed.knn` does (ascending, ties in
    index order, on the backend's device).
    """
    be = get_backend(backend)
    X = metric_rows(be, check_data(X, be, sparse=True), _lists_metric(metric))
    k = check_int(n_neighbors, "n_neighbors", 1, X.shape[0] - 1)
    n_probe, recall = _check_probes(n_probe, recall)
    if n_probe is not None and n_probe >= _list_count(X.shape[0], n_lists):
        return _knn(be, X, X, k, True, None)           # every list probed: no lists needed
    rng = make_rng(random_state)
    index = ListIndex(X, n_lists, random_state=rng, backend=be)
    return index._search(X, k, n_probe, recall, rng, exclude_self=True)


def approx_knn_query(Q, X, n_neighbors, *, n_lists=None, n_probe="auto",
                     recall=DEFAULT_RECALL, metric="euclidean", random_state=0, backend="auto"):
    """Approximate k nearest neighbours in ``X`` of every row of ``Q`` (no self
    exclusion), by the lists of X: ``n_neighbors``, ``n_lists``, ``n_probe``,
    ``recall``, ``metric``, ``random_state`` and ``backend`` as in
    :func:`approx_knn`, and as ``ListIndex(X, ...).query(Q, ...)``, which keeps the
    lists for more queries."""
    index = ListIndex(X, n_lists, metric=metric, random_state=random_state, backend=backend)
    return index.query(Q, n_neighbors, n_probe=n_probe, recall=recall,
                       random_state=random_state)


class ListIndex:
    """The k-means lists of the rows of ``X`` (module doc), built once and
    searched for the nearest rows of X to new points (:meth:`query`).
    ``n_lists``, ``metric`` (queries are compared as X's rows are),
    ``random_state`` (the k-means' and the order within lists) and ``backend``
    as in :func:`approx_knn`.  It keeps X and a centred copy of its
    rows, list after list (the memory of X again).  Where the lists cannot save
    time (module doc: few points, the k-d tree's few features, sparse rows) none
    are built, nothing is copied, and queries are searched exactly.
    """

    def __init__(self, X, n_lists=None, *, metric="euclidean", random_state=0,
                 backend="auto"):
        be = get_backend(backend)
        X = metric_rows(be, check_data(X, be, sparse=True), _lists_metric(metric))
        self.metric = metric
        self.n_lists = _list_count(X.shape[0], n_lists)
        self.backend, self.X = be, X
        self.exact = ((n_lists is None and X.shape[0] < MIN_POINTS) or is_sparse(X)
                      or (not be.is_gpu and X.shape[1] <= TREE_MAX_DIM))
        if self.exact:
            return
        rng = make_rng(random_state)
        self.centroids = _centroids(be, X, self.n_lists, rng)
        self.lists = self._nearest_lists(X, 1, np.arange(self.n_lists))[:, 0]
        self.sizes = np.bincount(self.lists, minlength=self.n_lists)
        self.filled = np.flatnonzero(self.sizes)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)])
        # The rows centred (as the exact search keeps them), list after list, each
        # list's in a random order, which keeps the CPU's candidate heaps'
        # improvements few (as in the exact search): a list's candidates are then
        # slices of one array.  Gathered for each group of queries instead, they
        # cost more than their GEMM (10,000 queries into 10^5 images, grouped by
        # nearest list: 9.0 s against the exact search's 7.0 s).
        order = rng.permutation(X.shape[0])
        self.order = order[np.argsort(self.lists[order], kind="stable")]
        self.mean = column_means(be.xp, X)
        self.rows = X[be.asarray(self.order)]
        self.rows -= self.mean
        self.sq = row_sqnorms(be.xp, self.rows)

    def _nearest_lists(self, Q, width, among=None):
        """(M, width) host: for each row of Q the lists of ``among`` (default:
        those that hold points) whose centroids lie nearest it, nearest first."""
        be = self.backend
        among = self.filled if among is None else among
        nearest = _query(be, Q, self.centroids[be.asarray(among)], width)[1]
        return among[be.to_host(nearest)]

    def query(self, Q, n_neighbors, *, n_probe="auto", recall=DEFAULT_RECALL, random_state=0):
        """Approximate ``n_neighbors`` nearest rows of X to every row of ``Q`` (no
        self exclusion): each query searches the ``n_probe`` lists whose centroids
        lie nearest it, as :func:`approx_knn`'s points do; "auto" chooses n_probe
        to find ``recall`` of the true neighbours of RECALL_SAMPLE random queries
        (:meth:`auto_probes`: from X's own points, for any batch), drawn by
        ``random_state``.  Returns ``(sqdist, indices)`` as
        :func:`gpuembed.knn_query` does (on the backend's device)."""
        be = self.backend
        Q = check_data(Q, be, name="Q", dtype=self.X.dtype, min_samples=1, sparse=True)
        if Q.shape[1] != self.X.shape[1]:
            raise ValueError(f"Q has {Q.shape[1]} features but X has {self.X.shape[1]}")
        Q = metric_rows(be, Q, self.metric, "Q")
        k = check_int(n_neighbors, "n_neighbors", 1, self.X.shape[0])
        n_probe, recall = _check_probes(n_probe, recall)
        return self._search(Q, k, n_probe, recall, make_rng(random_state), exclude_self=False)

    def _search(self, Q, k, n_probe, recall, rng, exclude_self):
        """approx_knn (Q is X, ``exclude_self``) and query (n_probe None:
        "auto"), exact where the lists cannot save time."""
        if self.exact or is_sparse(Q) or (n_probe is not None and n_probe >= self.n_lists):
            return self._exact(Q, k, exclude_self)
        if n_probe is None:
            n_probe = self._auto_probes(Q, k, recall, rng, exclude_self)
            if n_probe is None:
                return self._exact(Q, k, exclude_self)
        return self._probe(Q, k, n_probe, exclude_self)

    def auto_probes(self, n_neighbors, *, recall=DEFAULT_RECALL, random_state=0):
        """n_probe="auto" of X's own ``n_neighbors``-NN at ``recall`` (from
        RECALL_SAMPLE random points of X, each left out of its own): a probe count
        for queries drawn as X's rows are, whatever the batch; None where the exact
        search is faster."""
        k = check_int(n_neighbors, "n_neighbors", 1, self.X.shape[0] - 1)
        recall = _check_recall(recall)
        if self.exact:
            return None
        return self._auto_probes(self.X, k, recall, make_rng(random_state), exclude_self=True)

    def _auto_probes(self, Q, k, recall, rng, exclude_self):
        """The fewest probes for ``recall`` of RECALL_SAMPLE random rows of Q
        (fewest_probes), or None beyond AUTO_EXACT_FRACTION of the lists."""
        be, X = self.backend, self.X
        sample = np.sort(rng.choice(Q.shape[0], min(Q.shape[0], RECALL_SAMPLE), replace=False))
        Q_sample = Q[be.asarray(sample)]
        points = (self.rows, be.asarray(self.order), self.sq, self.mean)
        true = (sampled_knn(be, X, sample, k, points) if exclude_self
                else be.to_host(_query(be, Q_sample, X, k, points)[1]))
        ranked = self._nearest_lists(Q_sample, len(self.filled))
        n_probe = fewest_probes(self._recall_by_probes(true, ranked, k + exclude_self), recall)
        return None if n_probe > AUTO_EXACT_FRACTION * len(self.filled) else n_probe

    def _exact(self, Q, k, exclude_self):
        if exclude_self:
            return _knn(self.backend, self.X, self.X, k, True, None)
        return knn_query(Q, self.X, k, backend=self.backend)

    def _probe(self, Q, k, n_probe, exclude_self):
        """Each row of Q searched exactly among the points of the n_probe lists
        whose centroids lie nearest it (more where those hold fewer than k
        points besides the query; ``exclude_self``: Q is X, each point left out).
        The queries of a chunk that probe one list are one GEMM against its
        points, whose distances go to the queries' rows of one (queries, probes x
        largest list) array, inf where no candidate is; one selection runs over
        each row.  (10,000 new points into 10^5 images grouped by their nearest
        list, each group one GEMM against its probed lists, made GEMMs of about
        30 rows at a third of the speed; a selection per query and list kept a
        third of each list: 9.0 and 6.4 s against this 2.1 s.)"""
        be, X, sizes, starts = self.backend, self.X, self.sizes, self.starts
        xp = be.xp
        held = k + exclude_self                 # candidates needed, the query among them
        # Enough lists for k candidates besides the query: any w hold at least the
        # w smallest.
        enough = int(np.searchsorted(np.cumsum(np.sort(sizes[self.filled])), held)) + 1
        ranked = self._nearest_lists(Q, min(len(self.filled), max(n_probe, enough)))
        n_probed = np.minimum(ranked.shape[1], np.maximum(
            n_probe, (np.cumsum(sizes[ranked], axis=1) < held).sum(axis=1) + 1))
        if exclude_self:
            where = np.empty(X.shape[0], dtype=np.int64)     # each point's row in self.rows
            where[self.order] = np.arange(X.shape[0])
        select = _select_gpu if be.is_gpu else _select_cpu
        sqdist = xp.empty((Q.shape[0], k), dtype=X.dtype)
        indices = xp.empty((Q.shape[0], k), dtype=xp.int64)
        unsure = xp.empty(Q.shape[0], dtype=bool)
        sq_max = float(self.sq.max())
        slot_width = int(sizes.max())
        width = int(n_probed.max()) * slot_width
        m = min(width, k + CANDIDATE_MARGIN)
        starts_dev, order_dev = be.asarray(starts), be.asarray(self.order)
        chunk = max(1, min(PROBE_BUFFER_BYTES // (width * X.dtype.itemsize),
                           PROBE_GEMM_ROWS * len(self.filled) // int(n_probed.mean())))
        # One buffer for all chunks: fresh pages for each took a quarter of the time.
        buffer = xp.empty(min(chunk, Q.shape[0]) * width, dtype=X.dtype)
        with BlockProducts(be) as products:
            for first in range(0, Q.shape[0], chunk):
                rows = slice(first, min(Q.shape[0], first + chunk))
                Qc = Q[rows]
                minus2 = Qc - self.mean
                sq_q = row_sqnorms(xp, minus2)
                minus2 *= -2                            # exact: the products are as if unscaled
                n_rows = Qc.shape[0]
                dist = buffer[:n_rows * width]
                dist.fill(xp.inf)                       # inf: no candidate there
                slots = dist.reshape(n_rows, -1, slot_width)
                probed = n_probed[rows]
                query = np.repeat(np.arange(n_rows), probed)
                slot = np.arange(query.size) - np.repeat(np.cumsum(probed) - probed, probed)
                lists = ranked[rows][query, slot]
                by_list = np.argsort(lists, kind="stable")
                bounds = np.concatenate([[0], np.cumsum(np.bincount(lists, minlength=len(sizes)))])
                # One GEMM per list, the lists on the threads: a list's queries fill
                # their own slots, which no other list's write.
                def fill(p):
                    pairs = by_list[bounds[p]:bounds[p + 1]]
                    s = slice(starts[p], starts[p + 1])
                    q = be.asarray(query[pairs])
                    slots[q, be.asarray(slot[pairs]), :sizes[p]] = (minus2[q] @ self.rows[s].T
                                                                    + self.sq[s])
                products.each(fill, np.flatnonzero(np.diff(bounds)))
                if exclude_self:                        # each point left out of its own list
                    own = np.arange(rows.start, rows.stop)
                    slot_own = np.argmax(ranked[rows] == self.lists[own][:, None], axis=1)
                    column = slot_own * slot_width + where[own] - starts[self.lists[own]]
                    dist[be.asarray(np.arange(n_rows) * width + column)] = xp.inf
                values, best = select(be, dist.reshape(n_rows, width), xp.zeros(width, X.dtype),
                                      xp.full(n_rows, -1, dtype=xp.int64), m)
                values += sq_q[:, None]
                best_list = xp.take_along_axis(be.asarray(ranked[rows]), best // slot_width, axis=1)
                # A column past its list's end is never among the k best (inf), but
                # must still name a point.
                cand = xp.minimum(starts_dev[best_list] + best % slot_width, X.shape[0] - 1)
                sqdist[rows], indices[rows] = _finish_all(xp, Qc, X, values, sq_q, self.sq,
                                                          order_dev, cand, k,
                                                          DEFAULT_BLOCK_BYTES[be.name])
                kth = sqdist[rows, -1].astype(np.float64)
                unsure[rows] = (rounding(xp, sq_q, sq_max, X.shape[1], X.dtype, kth)
                                > ROUNDING_SHARE * kth)
        # Rows whose candidates the GEMM's rounding chose blindly (groups far apart
        # against their spread) get the exact search's answer.
        return _settle(be, Q, X, k, exclude_self, DEFAULT_BLOCK_BYTES[be.name], sqdist,
                       indices, unsure)

    def _recall_by_probes(self, true, ranked, held):
        """found[i, p]: the fraction of ``true[i]`` (the true k-NN of a query)
        that a search with p probes finds, for p = 0 .. (lists that hold
        points); ``ranked[i]``: all those lists in the order the query probes
        them.  A true neighbour lying in the list ranked r-th is found with
        r + 1 probes, or with fewer where the query must probe more than r
        lists to hold ``held`` points (k, and the query where it is a point of X)."""
        sizes, filled = self.sizes, self.filled
        n, k = true.shape
        rank = np.empty((n, len(sizes)), dtype=np.int64)
        np.put_along_axis(rank, ranked, np.arange(len(filled)), axis=1)
        r = np.take_along_axis(rank, self.lists[true], axis=1)
        needed = (np.cumsum(sizes[ranked], axis=1) < held).sum(axis=1) + 1
        probes = np.where(r < needed[:, None], 1, r + 1)
        width = len(filled) + 1
        per_point = np.bincount((probes + width * np.arange(n)[:, None]).ravel(),
                                minlength=width * n).reshape(n, width)
        return np.cumsum(per_point, axis=1) / k


def auto_knn(X, n_neighbors, *, metric="euclidean", backend="auto"):
    """``neighbors="auto"``, the estimators' and affinities' default: :func:`approx_knn`
    from AUTO_APPROX_FROM points of the backend's device on, else :func:`gpuembed.knn`
    (always for a precomputed matrix, which is sorted)."""
    be = get_backend(backend)
    n = X.shape[0] if hasattr(X, "shape") else len(X)
    approximate = metric != "precomputed" and _auto_approximates(be, n)
    return (approx_knn if approximate else knn)(X, n_neighbors, metric=metric, backend=be)


def _lists_metric(metric):
    if metric == "precomputed":
        raise ValueError("metric='precomputed': the lists need coordinates; a distance "
                         "matrix is sorted exactly (neighbors='exact' or 'auto')")
    return metric


def _auto_approximates(be, n):
    """Whether "auto" searches ``n`` points of the backend's device approximately."""
    start = AUTO_APPROX_FROM[be.name]
    return start is not None and n >= start


# The neighbour searches that the estimators' and affinities' ``neighbors`` names.
SEARCHES = {"auto": auto_knn, "exact": knn, "approx": approx_knn}


class QuerySearch:
    """The k nearest of fixed points X (an estimator's training points) to new
    points, by the search that ``neighbors`` names: "exact"; "approx", a
    :class:`ListIndex` of X built at the first query and kept, probed as many
    lists as X's own points need for a recall of 0.95 (:meth:`ListIndex.auto_probes`,
    once per k); "auto" (or None) "approx" from AUTO_APPROX_FROM points of the
    device on, as :func:`auto_knn`, else "exact".  So a new point's neighbours do
    not depend on the other points searched with it, or before it.  The first
    approximate query pays for the lists: for 280,000 shifted images 5.1 s, the
    exact search of about 2,000 queries (knn_approx_query_n280000.json).  With
    ``metric="precomputed"`` X is the training points' distance matrix and the
    queries their distances to those points, sorted."""

    def __init__(self, X, neighbors, backend, metric="euclidean"):
        self.X, self.neighbors, self.backend = X, neighbors or "auto", backend
        self.metric = search_metric(metric)
        self.index = None
        self.probes = {}            # n_probe by k; None: the exact search

    def __call__(self, Q, n_neighbors):
        be, n = self.backend, self.X.shape[0]
        if self.metric == "precomputed":      # the fit refused neighbors="approx"
            return knn_query(Q, self.X, n_neighbors, metric="precomputed", backend=be)
        exact = self.neighbors == "exact" or n_neighbors >= n or (
            self.neighbors == "auto" and not _auto_approximates(be, n))
        if not exact:
            if self.index is None:
                self.index = ListIndex(self.X, backend=be)
            if n_neighbors not in self.probes:
                self.probes[n_neighbors] = self.index.auto_probes(n_neighbors)
            exact = self.probes[n_neighbors] is None
        if exact:
            return knn_query(Q, self.X, n_neighbors, backend=be)
        return self.index.query(Q, n_neighbors, n_probe=self.probes[n_neighbors])


def _query(be, Q, X, k, points=None):
    """knn_query of Q and X that this module checked (dense, one dtype), without
    its checks: each is a pass over X (0.18 s of approx_knn at 10^5 points);
    ``points``: X's centred rows in an order, as neighbors._knn takes them."""
    return _knn(be, Q, X, k, False, None, points=points)


def sampled_knn(be, X, rows, k, points=None):
    """The exact k-NN indices (host) of the points ``rows`` of X, each left out of
    its own (or, where copies of it tie at distance 0, the last of them);
    ``points``: as :func:`_query`'s."""
    true = be.to_host(_query(be, X[be.asarray(rows)], X, k + 1, points)[1])
    own = true == rows[:, None]
    own[:, -1] |= ~own.any(axis=1)
    return true[~own].reshape(len(rows), k)


def _list_count(n, n_lists):
    """The number of lists: ``n_lists`` checked, default round(sqrt(n))."""
    return round(math.sqrt(n)) if n_lists is None else check_int(n_lists, "n_lists", 1, n)


def _check_probes(n_probe, recall):
    """(n_probe, recall) checked; n_probe None for "auto"."""
    if isinstance(n_probe, str):
        if n_probe != "auto":
            raise ValueError(f'n_probe must be "auto" or an integer >= 1, got {n_probe!r}')
        n_probe = None
    else:
        n_probe = check_int(n_probe, "n_probe", 1)
    return n_probe, _check_recall(recall)


def _check_recall(recall):
    return check_float(recall, "recall", 0.0, 1.0, low_open=True)


def fewest_probes(found, recall):
    """The fewest probes p whose recall over the sampled points (``found[i, p]``,
    :meth:`ListIndex._recall_by_probes`), less two standard errors, reaches ``recall``."""
    bound = found.mean(axis=0) - 2 * found.std(axis=0) / math.sqrt(len(found))
    return int(np.argmax(bound >= recall))


def _centroids(be, X, n_lists, rng):
    """(n_lists, D) centroids of KMEANS_ITER Lloyd steps on a sample of X,
    started from sample points; a centroid that loses all its points stays."""
    xp = be.xp
    n = X.shape[0]
    sample = X[be.asarray(np.sort(rng.choice(n, min(n, SAMPLE_PER_LIST * n_lists),
                                             replace=False)))]
    m = sample.shape[0]
    centroids = sample[be.asarray(rng.choice(m, n_lists, replace=False))]
    for _ in range(KMEANS_ITER):
        nearest = _query(be, sample, centroids, 1)[1][:, 0]
        members = be.sparse.csr_matrix((xp.ones(m, dtype=X.dtype), (nearest, xp.arange(m))),
                                       shape=(n_lists, m))
        sums = members @ sample
        counts = xp.bincount(nearest, minlength=n_lists)
        filled = counts > 0
        centroids[filled] = sums[filled] / counts[filled][:, None].astype(X.dtype)
    return centroids
