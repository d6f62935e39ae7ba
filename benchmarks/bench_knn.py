"""Exact k-NN on Fashion-MNIST (70,000 x 784, k = 90): gpuembed vs scikit-learn brute force.

Both run on the same float32 data, alternating, each timed ``repeat`` times; the
figure quoted is the ratio of the best times.  Alongside, gpuembed's query path
on the points themselves (``knn_query(X, X, k + 1)``: full rows of the distance
matrix, what ``knn`` did on the CPU before it took the upper triangle only).  On a
GPU, gpuembed's GPU path is timed too (after one warm-up call that compiles the
kernel), and where its time
goes for ``--stages-n`` random 50-D points (the selection kernel, the candidates'
finish, the rest: the GEMM blocks and their bookkeeping).

``--sparse``: synthetic TF-IDF documents (common.bag_of_words, 20,000 x 20,000
by default) given as a CSR matrix to both, written to knn_sparse.json.

``--float64``: the same images as float64, whose k-NN on the CPU comes from the
float32 search with float64 distances, checked (neighbors._mixed_precision_knn),
against the float64 search (that path turned off) and scikit-learn's brute
force on the float64 data, for k = 90 (t-SNE's) and 20 (the spectral methods'
graphs), written to knn_float64.json.

``--approx``: ``approx_knn`` (the inverted file of k-means lists) against the exact
search on the same images, for several probe counts and the default "auto" (the
fewest probes for a sampled recall of 0.95): seconds, alternating, and recall of
the exact 90-NN; then t-SNE (defaults) of the first ``--tsne-n`` images
on either search's neighbours: seconds from the data, 10-NN accuracy and KL under
the exact search's affinities; and Laplacian eigenmaps (d = 10) of all of them on
either search's 20-NN graph: seconds from the data, 10-NN accuracy and Procrustes
error against the exact graph's.  Written to knn_approx[_gpu].json (``--backend``).

``--approx-large N``: ``approx_knn`` (default probes) of N images (Fashion-MNIST and its
copies shifted by up to 2 pixels, as infinite MNIST grows MNIST), its recall on 1,000
random rows, and the exact search of the first 140,000 on the CPU, of all N on the GPU
(``--backend gpu``; written to knn_approx_large.json, knn_approx_large_gpu_n<N>.json).

``--approx-query N``: new points' 90-NN among N shifted images on the CPU: a
``ListIndex`` of them (its build timed apart) queried with the default probes
against the exact ``knn_query``, for 1,000 to 10,000 queries shifted by a shift
the N images lack, and the recall (written to knn_approx_query_nN.json).

``--offset C``: the float32 images moved C from the origin (1e4 by default: their
pixels in [0, 1] then round to 1/1024), exact 90-NN and ``approx_knn`` (default probes)
against the unmoved images, and with the searches' centre summed as NumPy sums
float32 rows (in float32, one row after another; the code before 6de4899), whose
offset from the mean the centred norms then carried: seconds, alternating, and the
neighbours' agreement (written to knn_offset.json).

``--split C [C ...]``: the float32 images with their halves moved C up and down
(two groups far apart; 0 3 10 30 300 by default), exact 90-NN with the rows the
GEMM's rounding leaves unsure searched again (the default, neighbors._settle),
searched again without their search about centres of their own first
(neighbors._recentred) and not searched again: seconds, rows searched again, and
rows wrong among 200 checked against float64 (written to knn_split.json).  With
``--split-queries`` every tenth image's 90-NN among the others
(knn_split_queries.json); with ``--split-dtype float64`` the first 5,000 images
as float64 (knn_split_float64.json); with ``--backend gpu`` on the GPU, whose
float32 rows re-centre where the CPU's self search goes to float64 (_gpu.json).

``--low-dim``: points of 2 to 10 coordinates (a layout, a point cloud, a few
principal components), where gpuembed's CPU path is a k-d tree: against its own
brute force and scikit-learn's KDTree (NearestNeighbors(algorithm="kd_tree")),
written to knn_lowdim.json.
"""
from __future__ import annotations

import argparse
import contextlib
import time
from unittest import mock

import numpy as np

from common import bag_of_words, best_time, device_sync, write_result
import gpuembed as ge
from gpuembed import neighbors, neighbors_ivf


def run(n=None, k=90, repeat=2, gpu_only=False, stages_n=1_000_000):
    X, _ = ge.datasets.fashion_mnist()
    if n:
        X = X[:n]
    if gpu_only:
        figures = {"n": X.shape[0], "dim": X.shape[1], "k": k, "dtype": "float32"}
        figures.update(run_gpu(X, k, ge.knn(X, k, backend="cpu")[1]))
        figures["gpu_stages"] = gpu_stages(stages_n, 50, k)
        return figures
    from sklearn.neighbors import NearestNeighbors

    def ours():
        return ge.knn(X, k, backend="cpu")

    def sklearn():
        nn = NearestNeighbors(n_neighbors=k + 1, algorithm="brute").fit(X)
        return nn.kneighbors(X)

    def full_rows():
        return ge.neighbors.knn_query(X, X, k + 1, backend="cpu")

    t_ours, t_sk, t_full = np.inf, np.inf, np.inf
    for _ in range(repeat):            # alternate, so drifts in machine speed hit all
        t, (d_ours, i_ours) = best_time(ours)
        t_ours = min(t_ours, t)
        t, (d_sk, i_sk) = best_time(sklearn)
        t_sk = min(t_sk, t)
        t, (_, i_full) = best_time(full_rows)
        t_full = min(t_full, t)
    # scikit-learn returns each point first (distance 0) unless it has duplicates.
    agree = float((np.sort(i_sk[:, 1:], axis=1) == np.sort(i_ours, axis=1)).mean())
    figures = {
        "n": X.shape[0], "dim": X.shape[1], "k": k, "dtype": "float32",
        "gpuembed_cpu_seconds": t_ours,
        "sklearn_brute_seconds": t_sk,
        "speedup_vs_sklearn": t_sk / t_ours,
        "index_agreement_with_sklearn": agree,
        "gpuembed_cpu_full_rows_seconds": t_full,
        "speedup_vs_full_rows": t_full / t_ours,
        # Equal except where duplicates of a point tie with the point itself.
        "index_agreement_with_full_rows": float((i_full[:, 1:] == i_ours).mean()),
    }
    if ge.backend.gpu_available():
        figures.update(run_gpu(X, k, i_ours))
    for key, value in figures.items():
        print(f"{key:32s} {value}")
    return figures


def run_sparse(n=20_000, vocab=20_000, k=90, repeat=2, gpu_only=False):
    """gpuembed and scikit-learn's brute force on the same sparse rows."""
    X = bag_of_words(n, vocab)
    figures = {"n": n, "vocab": vocab, "nnz_per_row": X.nnz / n, "k": k, "dtype": "float32"}
    cpu_indices = ge.knn(X, k, backend="cpu")[1] if gpu_only else None
    if not gpu_only:
        from sklearn.neighbors import NearestNeighbors

        def sklearn():
            return NearestNeighbors(n_neighbors=k + 1, algorithm="brute").fit(X).kneighbors(X)

        t_ours = t_sk = np.inf
        for _ in range(repeat):
            t, (_, cpu_indices) = best_time(lambda: ge.knn(X, k, backend="cpu"))
            t_ours = min(t_ours, t)
            t, (_, i_sk) = best_time(sklearn)
            t_sk = min(t_sk, t)
        figures.update({
            "gpuembed_cpu_seconds": t_ours, "sklearn_brute_seconds": t_sk,
            "speedup_vs_sklearn": t_sk / t_ours,
            "index_agreement_with_sklearn": float(
                (np.sort(i_sk[:, 1:], axis=1) == np.sort(cpu_indices, axis=1)).mean())})
    if ge.backend.gpu_available():
        be = ge.get_backend("gpu")
        figures.update(run_gpu(be.sparse.csr_matrix(X), k, cpu_indices))
    for key, value in figures.items():
        print(f"{key:32s} {value}")
    return figures


# Query searches of --float64: (queries, points, k) as LLL's landmark search
# (every image against 4,000 random landmarks, 6 each) and an out-of-sample
# transform (the last 2,000 images against the other 68,000, k = 90).
FLOAT64_QUERIES = ((70_000, 4_000, 6), (2_000, 68_000, 90))


def run_float64(n=None, ks=(90, 20), repeat=2):
    """The float64 k-NN with and without the float32 search (alternating, best of
    ``repeat``), the rows it searched again in float64, and scikit-learn's
    brute force (for the first k only: it takes minutes); then the same for the
    query searches of FLOAT64_QUERIES (on the full set only)."""
    from sklearn.neighbors import NearestNeighbors

    X, _ = ge.datasets.fashion_mnist()
    X = (X[:n] if n else X).astype(np.float64)
    again = []
    search_again = neighbors._rows_in_float64

    def counted(be, Y, rows, *args):
        again.append(len(rows))
        return search_again(be, Y, rows, *args)

    figures = {"n": X.shape[0], "dim": X.shape[1], "dtype": "float64", "runs": []}
    ge.knn(X[:2000], 5, backend="cpu")                  # load the compiled code of both paths
    with mock.patch.object(neighbors, "MIXED_MIN_RATIO", 0):
        ge.knn(X[:2000], 5, backend="cpu")

    def timed(search):
        """(best seconds, result) of ``search`` with and without the float32 search."""
        t_mixed = t_float64 = np.inf
        for _ in range(repeat):
            again.clear()
            with mock.patch.object(neighbors, "_rows_in_float64", counted):
                t, mixed = best_time(search)
            t_mixed = min(t_mixed, t)
            with mock.patch.object(neighbors, "MIXED_MIN_RATIO", np.inf):
                t, float64 = best_time(search)
            t_float64 = min(t_float64, t)
        return t_mixed, mixed, t_float64, float64

    for k in ks:
        t_mixed, (d_mixed, i_mixed), t_float64, (d_64, i_64) = timed(
            lambda: ge.knn(X, k, backend="cpu"))
        run = {"k": k, "gpuembed_cpu_seconds": t_mixed, "float64_search_seconds": t_float64,
               "speedup_vs_float64_search": t_float64 / t_mixed,
               "rows_searched_again": int(sum(again)),
               "index_agreement_with_float64_search": float((i_mixed == i_64).mean()),
               "largest_relative_distance_difference": float(
                   np.max(np.abs(d_mixed - d_64) / np.maximum(d_64, np.finfo(float).tiny)))}
        if k == ks[0]:
            t_sk, (_, i_sk) = best_time(lambda: NearestNeighbors(
                n_neighbors=k + 1, algorithm="brute").fit(X).kneighbors(X))
            run.update({"sklearn_brute_seconds": t_sk, "speedup_vs_sklearn": t_sk / t_mixed,
                        "index_agreement_with_sklearn": float(
                            (np.sort(i_sk[:, 1:], axis=1) == np.sort(i_mixed, axis=1)).mean())})
        print(run, flush=True)
        figures["runs"].append(run)
    if n is None:
        figures["queries"] = []
        rng = np.random.default_rng(0)
        for m, points, k in FLOAT64_QUERIES:
            if m == X.shape[0]:
                Q, P = X, X[rng.choice(X.shape[0], points, replace=False)]
            else:
                Q, P = X[points:points + m], X[:points]
            t_mixed, (_, i_mixed), t_float64, (_, i_64) = timed(
                lambda: neighbors.knn_query(Q, P, k, backend="cpu"))
            run = {"queries": m, "points": points, "k": k, "gpuembed_cpu_seconds": t_mixed,
                   "float64_search_seconds": t_float64,
                   "speedup_vs_float64_search": t_float64 / t_mixed,
                   "rows_searched_again": int(sum(again)),
                   "index_agreement_with_float64_search": float((i_mixed == i_64).mean())}
            print(run, flush=True)
            figures["queries"].append(run)
    return figures


def run_offset(n=None, offset=1e4, k=90, repeat=1):
    """Exact and approximate k-NN of the images moved ``offset`` from the origin,
    of the unmoved ones and of the moved ones centred on their float32 mean."""
    X, _ = ge.datasets.fashion_mnist()
    X = X[:n] if n else X
    moved = X + np.float32(offset)
    float32_mean = lambda xp, A: A.mean(axis=0)
    ge.knn(X[:3000], k, backend="cpu")                  # compile + warm up
    ge.approx_knn(X[:3000], k, backend="cpu")
    cases = {"unmoved": (X, None), "moved": (moved, None),
             "moved, float32 mean": (moved, float32_mean)}
    searches = {"exact": lambda Y: ge.knn(Y, k, backend="cpu"),
                "approx": lambda Y: ge.approx_knn(Y, k, backend="cpu")}
    seconds, found = {}, {}
    for _ in range(repeat):              # alternate, so drifts in machine speed hit all
        for search, fn in searches.items():
            for case, (Y, mean) in cases.items():
                with contextlib.ExitStack() as patches:
                    for module in (neighbors, neighbors_ivf) if mean else ():
                        patches.enter_context(mock.patch.object(module, "column_means", mean))
                    t, (_, idx) = best_time(lambda: fn(Y))
                seconds[search, case] = min(seconds.get((search, case), np.inf), t)
                found[search, case] = idx
    rows = [{"search": search, "data": case, "seconds": seconds[search, case],
             "slowdown_vs_unmoved": seconds[search, case] / seconds[search, "unmoved"],
             "index_agreement_with_unmoved": float(
                 (found[search, case] == found[search, "unmoved"]).mean()),
             "index_agreement_with_moved": float(
                 (found[search, case] == found[search, "moved"]).mean())}
            for search in searches for case in cases]
    for row in rows:
        print(row, flush=True)
    return {"n": X.shape[0], "dim": X.shape[1], "k": k, "offset": offset, "dtype": "float32",
            "runs": rows}


def run_split(n=20_000, offsets=(0, 3, 10, 30, 300), k=90, repeat=1, checked=100,
              dtype="float32", queries=False, backend="cpu"):
    """Exact k-NN of the images (as ``dtype``) with their halves moved +-offset; with
    ``queries`` every tenth image's k-NN among the others.  Three variants: the unsure
    rows searched again (the default), searched again without the search about their
    own centres first (neighbors._recentred; the code before it) and not searched
    again (before 7bf7e85).  ``checked`` rows (queries) of each half against float64."""
    be = ge.get_backend(backend)
    X, _ = ge.datasets.fashion_mnist()
    X = X[:n].astype(dtype)
    half = X.shape[0] // 2
    is_query = np.arange(X.shape[0]) % 10 == 0 if queries else None
    ge.knn(be.asarray(X[:3000]), k, backend=be)         # compile + warm up
    unsure_rows, recentred = neighbors._unsure_rows, neighbors._recentred

    def kept(be, Q, X_, k_, exclude_self, block_bytes, sqdist, indices, mask):
        return sqdist, indices

    variants = {"searched again": (),
                "not re-centred": ((neighbors, "RECENTRED_GROUP_ROWS", 2**62),),
                "not searched again": ((neighbors, "_settle", kept),)}
    runs = []
    for offset in offsets:
        moved = X.copy()
        moved[:half] += moved.dtype.type(offset)
        moved[half:] -= moved.dtype.type(offset)
        exact = moved.astype(np.float64)
        if queries:
            Q, P, points = moved[is_query], moved[~is_query], exact[~is_query]
            first = int(is_query[:half].sum())          # the second half's first query
            each = min(checked, first, len(Q) - first)
            rows = np.r_[0:each, first:first + each]
            near = exact[is_query][rows]
        else:
            Q = P = moved
            points, rows = exact, np.r_[0:checked, half:half + checked]
            near = exact[rows]
        Q, P = be.asarray(Q), be.asarray(P)
        # From the coordinates' differences: a GEMM's rounding is what is measured.
        skip = int(not queries)                         # the row itself
        true = np.sqrt(np.sort([((points - q) ** 2).sum(axis=1) for q in near],
                               axis=1)[:, skip:k + skip])
        for variant, patches in variants.items():
            unsure, settled = [], []

            def counted(*args):
                mask = unsure_rows(*args)
                unsure.append(int(mask.sum()))
                return mask

            def counted_recentred(be, *args):
                left = recentred(be, *args)
                settled.append(int(args[2].size - left.size))
                return left

            def search():
                unsure.clear()                          # the last repeat's counts
                settled.clear()
                return (ge.neighbors.knn_query(Q, P, k, backend=be) if queries
                        else ge.knn(Q, k, backend=be))

            with contextlib.ExitStack() as stack:
                stack.enter_context(mock.patch.object(neighbors, "_unsure_rows", counted))
                stack.enter_context(mock.patch.object(neighbors, "_recentred",
                                                      counted_recentred))
                for target, name, value in patches:
                    stack.enter_context(mock.patch.object(target, name, value))
                t, (sqdist, _) = best_time(search, repeat, sync=device_sync(be))
            error = np.abs(np.sqrt(be.to_host(sqdist)[rows].astype(np.float64)) - true)
            positive = true > 0                         # not the duplicates' zeros
            # The first check is the search's own; any later ones, the searches again.
            runs.append({"offset": offset, "variant": variant, "seconds": t,
                         "rows_unsure": unsure[0], "rows_unsure_again": sum(unsure[1:]),
                         "rows_settled_recentred": sum(settled),
                         "checked_rows_wrong": int((error > 1e-3 * true).any(axis=1).sum()),
                         "checked_rows": len(rows),
                         "largest_relative_error": float((error[positive]
                                                          / true[positive]).max())})
            print(runs[-1], flush=True)
    return {"n": X.shape[0], "dim": X.shape[1], "k": k, "dtype": dtype, "backend": be.name,
            "queries": int(Q.shape[0]) if queries else None, "runs": runs}


LOW_DIM_CASES = ((70_000, 2, 10, "uniform"), (300_000, 3, 90, "uniform"),
                 (70_000, 5, 90, "uniform"), (70_000, 10, 90, "uniform"),
                 (70_000, 10, 90, "clusters"))


def run_low_dim(cases=LOW_DIM_CASES, repeat=2):
    """Uniform random points (the k-d tree's worst case: intrinsic dimension
    equal to the dimension) and 20 Gaussian clusters: gpuembed's k-d tree, its
    brute force (the tree turned off) up to 100,000 points, and scikit-learn's
    k-d tree, each best of ``repeat``, with their index agreement."""
    from sklearn.neighbors import NearestNeighbors

    rows = []
    for n, d, k, kind in cases:
        X = (np.random.default_rng(0).random((n, d)) if kind == "uniform"
             else ge.datasets.gaussian_clusters(n, 20, d, random_state=0)[0])
        t_tree, (_, i_tree) = best_time(lambda: ge.knn(X, k, backend="cpu"), repeat)
        t_sk, (_, i_sk) = best_time(lambda: NearestNeighbors(
            n_neighbors=k + 1, algorithm="kd_tree", n_jobs=-1).fit(X).kneighbors(X), repeat)
        row = {"n": n, "dim": d, "k": k, "data": kind, "gpuembed_tree_seconds": t_tree,
               "sklearn_kd_tree_seconds": t_sk, "speedup_vs_sklearn": t_sk / t_tree,
               "index_agreement_with_sklearn": float(
                   (np.sort(i_sk[:, 1:], axis=1) == np.sort(i_tree, axis=1)).mean())}
        if n <= 100_000:
            with mock.patch.object(neighbors, "TREE_MAX_DIM", 0):
                t_brute, (_, i_brute) = best_time(lambda: ge.knn(X, k, backend="cpu"))
            row.update(gpuembed_brute_seconds=t_brute, tree_speedup=t_brute / t_tree,
                       brute_indices_equal=bool((i_brute == i_tree).all()),
                       brute_index_agreement=float((i_brute == i_tree).mean()))
        print(row, flush=True)
        rows.append(row)
    return {"cases": rows}


def run_approx(n=None, k=90, probes=(8, 16, 32), repeat=2, backend="cpu", tsne_n=20_000):
    be = ge.get_backend(backend)
    X, y = ge.datasets.fashion_mnist()
    X = be.asarray(X[:n] if n else X)
    sync = device_sync(be)
    ge.approx_knn(X[:3000], k, backend=be)         # compile + warm up
    ge.knn(X[:3000], k, backend=be)
    searches = {"exact": lambda: ge.knn(X, k, backend=be)}
    searches.update({f"approx, {p} probes": (lambda p=p: ge.approx_knn(X, k, n_probe=p,
                                                                       backend=be))
                     for p in probes})
    chosen = []
    searches["approx, auto (recall 0.95)"] = lambda: auto_probes(
        lambda: ge.approx_knn(X, k, backend=be), chosen)
    seconds = dict.fromkeys(searches, np.inf)
    found = {}
    for _ in range(repeat):            # alternate, so drifts in machine speed hit all
        for name, search in searches.items():
            t, (_, idx) = best_time(search, sync=sync)
            seconds[name] = min(seconds[name], t)
            found[name] = be.to_host(idx)
    exact = found["exact"]
    rows = [{"search": name, "seconds": seconds[name],
             "speedup": seconds["exact"] / seconds[name],
             "recall": float((found[name][:, :, None] == exact[:, None, :]).any(axis=2).mean())}
            for name in searches]
    rows[-1]["n_probe_chosen"] = chosen[-1]
    for row in rows:
        print(row, flush=True)
    return {"n": X.shape[0], "dim": X.shape[1], "k": k, "dtype": "float32", "searches": rows,
            "tsne": tsne_on_approx(X[:tsne_n], y[:tsne_n], be, sync),
            "laplacian_eigenmaps": le_on_approx(X, y, be, sync)}


def auto_probes(search, chosen):
    """search(), appending to ``chosen`` the probes that n_probe="auto" chose in
    it (by its own rule, from its sampled recalls)."""
    real = neighbors_ivf.ListIndex._recall_by_probes

    def spy(*args):
        found = real(*args)
        chosen.append(neighbors_ivf.fewest_probes(found, neighbors_ivf.DEFAULT_RECALL))
        return found
    with mock.patch.object(neighbors_ivf.ListIndex, "_recall_by_probes", spy):
        return search()


def tsne_on_approx(X, y, be, sync):
    """Default t-SNE on the exact and on approx_knn's neighbours (from the data)."""
    P_exact = ge.entropic_affinities(X, 30.0, backend=be).P
    rows = []
    for search in ("exact", "approx"):
        t, model = best_time(lambda: ge.TSNE(neighbors=search, random_state=0, backend=be).fit(X),
                             sync=sync)
        kl, _ = ge.objectives.value_and_grad("tsne", be.asarray(model.embedding_), P_exact,
                                             backend=be)
        rows.append({"neighbors": search, "seconds": t, "iterations": model.n_iter_,
                     "knn_accuracy": ge.metrics.knn_accuracy(model.embedding_, y),
                     "kl_exact_affinities": float(kl)})
        print(rows[-1], flush=True)
    return {"n": X.shape[0], "runs": rows}


# Shifts of up to 2 pixels, in order of length.
SHIFTS = sorted(((dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)),
                key=lambda s: (s[0] ** 2 + s[1] ** 2, s))


def shifted_fashion_mnist(n):
    """The first n of Fashion-MNIST's images and their copies shifted by up to 2
    pixels (zero fill; the shifts in order of length), as the dissertation's
    infinite MNIST grows MNIST: 25 x 70,000 images at most."""
    X, _ = ge.datasets.fashion_mnist()
    return np.concatenate([shifted_images(X, dy, dx) for dy, dx in SHIFTS[:-(-n // len(X))]])[:n]


def shifted_labels(n):
    """The classes of shifted_fashion_mnist(n)'s images."""
    labels = ge.datasets.fashion_mnist()[1]
    return np.tile(labels, -(-n // len(labels)))[:n]


def unseen_shift(n):
    """The first shift (dy, dx) that shifted_fashion_mnist(n) has none of."""
    return SHIFTS[-(-n // 70_000)]


def shifted_images(X, dy, dx):
    """The 28 x 28 images X (rows) shifted by (dy, dx) pixels, |dy|, |dx| <= 2, zero fill."""
    padded = np.pad(X.reshape(-1, 28, 28).astype(np.float32), ((0, 0), (2, 2), (2, 2)))
    return padded[:, 2 + dy:30 + dy, 2 + dx:30 + dx].reshape(-1, 784)


def run_approx_large(n, k=90, n_probe="auto", sampled=1000, exact_n=None, backend="cpu"):
    """approx_knn of n shifted images, its recall on ``sampled`` random rows (their
    exact k-NN by knn_query), and the exact search of the first ``exact_n`` (default:
    140,000 on the CPU, whose time grows as N^2, all n on the GPU)."""
    be = ge.get_backend(backend)
    sync = device_sync(be)
    exact_n = min(n, exact_n or (n if be.is_gpu else 140_000))
    X = be.asarray(shifted_fashion_mnist(n))
    ge.approx_knn(X[:30_000], k, backend=be)         # compile + warm up
    ge.knn(X[:3000], k, backend=be)
    chosen = []
    t_approx, (_, idx) = best_time(lambda: auto_probes(
        lambda: ge.approx_knn(X, k, n_probe=n_probe, backend=be), chosen), sync=sync)
    rows = np.random.default_rng(0).choice(n, sampled, replace=False)
    exact = neighbors_ivf.sampled_knn(be, X, rows, k)
    recall = float((be.to_host(idx)[rows][:, :, None] == exact[:, None, :]).any(axis=2).mean())
    t_exact, _ = best_time(lambda: ge.knn(X[:exact_n], k, backend=be), sync=sync)
    figures = {"n": n, "dim": 784, "k": k, "dtype": "float32", "n_probe": n_probe,
               "n_probe_chosen": chosen[-1] if chosen else None,
               "approx_seconds": t_approx, "recall_sampled_rows": sampled, "recall": recall,
               "exact_n": exact_n, "exact_seconds": t_exact,
               "exact_seconds_scaled_to_n": t_exact * (n / exact_n) ** 2}
    print(figures, flush=True)
    return figures


def run_approx_query(n, k=90, n_queries=(1000, 2000, 5000, 10_000), repeat=2):
    """New points' k-NN among n shifted images (CPU): the exact knn_query against
    a ListIndex of the images (its k-means lists timed apart) queried with the
    default n_probe="auto", for each number of queries; the queries are the
    first images shifted by the next shift (unseen_shift), one the training
    images lack.  Alternating, best of ``repeat``."""
    be = ge.get_backend("cpu")
    X = shifted_fashion_mnist(n)
    Q_all = shifted_images(ge.datasets.fashion_mnist()[0][:max(n_queries)], *unseen_shift(n))
    t_index, index = best_time(lambda: ge.ListIndex(X, backend=be))
    rows = []
    for m in n_queries:
        Q = Q_all[:m]
        chosen = []
        seconds = {"exact": np.inf, "approx": np.inf}
        for _ in range(repeat):
            t, (_, exact) = best_time(lambda: neighbors.knn_query(Q, X, k, backend=be))
            seconds["exact"] = min(seconds["exact"], t)
            t, (_, idx) = best_time(lambda: auto_probes(lambda: index.query(Q, k), chosen))
            seconds["approx"] = min(seconds["approx"], t)
        row = {"queries": m, "exact_seconds": seconds["exact"],
               "approx_query_seconds": seconds["approx"], "n_probe_chosen": chosen[-1],
               "speedup_with_index_built": seconds["exact"] / seconds["approx"],
               "speedup_with_index_building": seconds["exact"] / (seconds["approx"] + t_index),
               "recall": float((idx[:, :, None] == exact[:, None, :]).any(axis=2).mean())}
        print(row, flush=True)
        rows.append(row)
    return {"n": n, "dim": 784, "k": k, "dtype": "float32", "n_lists": index.n_lists,
            "query_shift": unseen_shift(n), "index_seconds": t_index, "queries": rows}


def le_on_approx(X, y, be, sync, d=10, n_neighbors=20):
    """Laplacian eigenmaps (bench_lll's graph: 20-NN, Gaussian width from the first
    2,000 points) on the exact and on approx_knn's neighbours, from the data; the
    approximate graph's Procrustes error against the exact graph's embedding."""
    sigma = float(np.sqrt(np.median(be.to_host(ge.knn(X[:2000], 10, backend=be)[0]))))
    rows, embeddings = [], {}
    for search in ("exact", "approx"):
        t, Y = best_time(lambda: ge.LaplacianEigenmaps(
            d, n_neighbors=n_neighbors, sigma=sigma, neighbors=search, backend=be).fit_transform(X),
            sync=sync)
        embeddings[search] = Y
        rows.append({"neighbors": search, "seconds": t,
                     "knn_accuracy": ge.metrics.knn_accuracy(Y, y[:len(Y)]),
                     "procrustes_error": ge.metrics.procrustes_error(embeddings["exact"], Y)})
        print(rows[-1], flush=True)
    return {"d": d, "n_neighbors": n_neighbors, "sigma": sigma, "runs": rows}


def run_gpu(X, k, cpu_indices):
    be = ge.get_backend("gpu")
    Xg = X if hasattr(X, "tocsr") else be.asarray(X)
    ge.knn(Xg, k, backend=be)                      # compile + warm up
    sync = device_sync(be)
    t_gpu, (_, ig) = best_time(lambda: ge.knn(Xg, k, backend=be), repeat=3, sync=sync)
    figures = {"gpuembed_gpu_seconds": t_gpu,
               "gpu_index_agreement_with_cpu": float((be.to_host(ig) == cpu_indices).mean())}
    print(figures)
    return figures


def gpu_stages(n, dim, k):
    """One GPU k-NN of n random points in dim-D, with the selection and the
    candidates' finish timed (the device synchronized around each call); the
    rest is the GEMM blocks and their bookkeeping."""
    be = ge.get_backend("gpu")
    sync = device_sync(be)
    X = be.asarray(np.random.default_rng(0).standard_normal((n, dim), dtype=np.float32))
    ge.knn(X[:20_000], k, backend=be)                # compile + warm up
    spent = {"select": 0.0, "finish": 0.0}

    def timed(name, fn):
        def call(*args):
            sync()
            start = time.perf_counter()
            out = fn(*args)
            sync()
            spent[name] += time.perf_counter() - start
            return out
        return call

    with mock.patch.object(neighbors, "_select_gpu", timed("select", neighbors._select_gpu)), \
            mock.patch.object(neighbors, "_finish", timed("finish", neighbors._finish)):
        total, _ = best_time(lambda: ge.knn(X, k, backend=be), sync=sync)
    rows = max(1, neighbors.DEFAULT_BLOCK_BYTES["gpu"] // (n * X.dtype.itemsize))
    figures = {"n": n, "dim": dim, "k": k, "blocks": -(-n // rows), "seconds": total,
               "select_seconds": spent["select"], "finish_seconds": spent["finish"],
               "other_seconds": total - spent["select"] - spent["finish"]}
    print("gpu stages", figures, flush=True)
    return figures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=None, help="use the first n points")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--gpu-only", action="store_true",
                        help="only the GPU timing (and its agreement), written to knn_gpu.json")
    parser.add_argument("--stages-n", type=int, default=1_000_000,
                        help="points of the GPU stage breakdown (with --gpu-only)")
    parser.add_argument("--sparse", action="store_true",
                        help="synthetic TF-IDF documents as a CSR matrix (knn_sparse.json)")
    parser.add_argument("--low-dim", action="store_true",
                        help="2-D to 10-D points: the k-d tree path (knn_lowdim.json)")
    parser.add_argument("--float64", action="store_true",
                        help="the images as float64: the checked float32 search against the "
                             "float64 one and scikit-learn (knn_float64.json)")
    parser.add_argument("--approx", action="store_true",
                        help="approx_knn against the exact search, and t-SNE on its "
                             "neighbours (knn_approx.json)")
    parser.add_argument("--approx-large", type=int, metavar="N",
                        help="approx_knn of N shifted Fashion-MNIST images, its recall on "
                             "1,000 rows, the exact search of 140,000 of them on the CPU, of "
                             "all on the GPU (knn_approx_large[_gpu_n<N>].json)")
    parser.add_argument("--approx-query", type=int, metavar="N",
                        help="new points' k-NN among N shifted images on the CPU: a ListIndex "
                             "against the exact knn_query (knn_approx_query.json)")
    parser.add_argument("--offset", type=float, nargs="?", const=1e4, default=None,
                        help="the images moved this far from the origin (default 1e4): "
                             "exact and approximate k-NN against the unmoved (knn_offset.json)")
    parser.add_argument("--split", type=float, nargs="*", default=None, metavar="C",
                        help="the images' halves moved C up and down (0 3 10 30 300 without "
                             "C): exact k-NN with and without the unsure rows searched "
                             "again (knn_split.json)")
    parser.add_argument("--split-dtype", default="float32", choices=("float32", "float64"),
                        help="with --split: the images' dtype (float64: the first 5,000)")
    parser.add_argument("--split-queries", action="store_true",
                        help="with --split: every tenth image's k-NN among the others")
    parser.add_argument("--backend", default="cpu",
                        help="with --approx, --approx-large and --split")
    parser.add_argument("--tsne-n", type=int, default=20_000, help="with --approx")
    args = parser.parse_args(argv)
    if args.offset is not None:
        write_result("knn_offset", run_offset(args.n, args.offset, repeat=args.repeat),
                     suffix="" if args.n is None else f"_n{args.n}")
        return
    if args.split is not None:
        offsets = tuple(args.split) or (0, 3, 10, 30, 300)
        n = args.n or (5_000 if args.split_dtype == "float64" else 20_000)
        suffix = ("_queries" if args.split_queries else "") + (
            "_float64" if args.split_dtype == "float64" else "") + (
            "" if args.n is None else f"_n{args.n}") + ("_gpu" if args.backend == "gpu" else "")
        write_result("knn_split", run_split(n, offsets, repeat=args.repeat,
                                            dtype=args.split_dtype, queries=args.split_queries,
                                            backend=args.backend), suffix=suffix)
        return
    if args.approx_query:
        write_result("knn_approx_query", run_approx_query(args.approx_query),
                     suffix=f"_n{args.approx_query}")
        return
    if args.approx_large:
        figures = run_approx_large(args.approx_large, backend=args.backend)
        write_result("knn_approx_large", figures,
                     suffix=f"_gpu_n{args.approx_large}" if args.backend == "gpu" else "")
        return
    if args.approx:
        suffix = ("" if args.n is None else f"_n{args.n}") + (
            "_gpu" if args.backend == "gpu" else "")
        write_result("knn_approx", run_approx(args.n, repeat=args.repeat, backend=args.backend,
                                              tsne_n=args.tsne_n), suffix=suffix)
        return
    if args.float64:
        write_result("knn_float64", run_float64(args.n, repeat=args.repeat),
                     suffix="" if args.n is None else f"_n{args.n}")
        return
    if args.low_dim:
        write_result("knn_lowdim", run_low_dim(repeat=args.repeat))
        return
    if args.sparse:
        figures = run_sparse(**({"n": args.n} if args.n else {}), repeat=args.repeat,
                             gpu_only=args.gpu_only)
        suffix = "_sparse"
    else:
        figures = run(n=args.n, repeat=args.repeat, gpu_only=args.gpu_only,
                      stages_n=args.stages_n)
        suffix = ""
    suffix += "" if args.n is None else f"_n{args.n}"
    write_result("knn", figures, suffix=suffix + ("_gpu" if args.gpu_only else ""))


if __name__ == "__main__":
    main()
