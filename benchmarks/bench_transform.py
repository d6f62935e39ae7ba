"""Out-of-sample mapping: embed held-out points into a fitted layout.

The first ``--n`` Fashion-MNIST images are embedded with each method's defaults,
then the next ``--m`` are mapped into that layout with the training embedding
fixed: gpuembed's TSNE, EE and MultiscaleSNE ``transform`` (each new point
minimizes its own terms of the objective), openTSNE's ``TSNEEmbedding.transform``
and umap-learn's ``UMAP.transform``, side by side in one run (two threads each).  Reported per
method: seconds to fit and to transform (the best of 3), and the held-out accuracy: a 10-NN
classifier trained on the training layout and its labels, scored on the mapped
points.  ``--backend gpu`` runs gpuembed's methods on the GPU (the anchors stay
on the CPU, where they are installed).

Writes results/transform.json (``--suffix`` for another name).

``--large N``: TSNE of N shifted images (CPU), then ``--m`` new ones mapped with
their neighbours from the training points' k-means lists (the default from 50,000
training points) and from the exact search (transform_large.json).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from common import heldout_accuracy, write_result
import gpuembed as ge

K = 10
WARM_UP = 5000
TRANSFORM_REPEATS = 3


def gpuembed_method(make, warm_up=None):
    """(fit, transform, warm-up fit); ``warm_up`` makes a cheaper model that
    takes the same compiled paths (multi-scale SNE: a few iterations per scale
    on the FGT path instead of a 2-minute fit)."""
    def fit_with(maker):
        def fit(X):
            model = maker()
            return model, model.fit_transform(X)
        return fit
    return fit_with(make), lambda model, X: model.transform(X), fit_with(warm_up or make)


def opentsne_method():
    import openTSNE

    def fit(X):
        model = openTSNE.TSNE(n_jobs=2, random_state=0).fit(X)
        return model, np.asarray(model)
    return fit, lambda model, X: np.asarray(model.transform(X)), fit


def umap_method():
    import umap

    def fit(X):
        model = umap.UMAP(n_jobs=2)
        return model, model.fit_transform(X)
    return fit, lambda model, X: model.transform(X), fit


# Each takes the backend of gpuembed's methods.
METHODS = {
    "gpuembed TSNE": lambda be: gpuembed_method(lambda: ge.TSNE(random_state=0, backend=be)),
    "gpuembed EE": lambda be: gpuembed_method(lambda: ge.EE(random_state=0, backend=be)),
    "gpuembed MultiscaleSNE": lambda be: gpuembed_method(
        lambda: ge.MultiscaleSNE(backend=be),
        lambda: ge.MultiscaleSNE(max_iter=2, nbody="fgt", backend=be)),
    "openTSNE": lambda be: opentsne_method(),
    "UMAP": lambda be: umap_method(),
}


def run(name, X, y, n, m, backend="cpu"):
    try:
        fit, transform, warm_fit = METHODS[name](backend)
    except ImportError:
        return {"method": name, "skipped": True}
    # Compiles (numba) outside the timings, at a size that takes the timed runs'
    # paths (umap-learn's NN-descent and search graph from 4,096 points on).
    warm = min(n, WARM_UP)
    model, _ = warm_fit(X[:warm])
    transform(model, X[warm:warm + 200])
    start = time.perf_counter()
    model, Y = fit(X[:n])
    fit_seconds = time.perf_counter() - start
    # The best of TRANSFORM_REPEATS: one transform takes well under a second, where
    # the machine's noise (a single run of TSNE.transform: 0.40-0.63 s) decides.
    seconds = []
    for _ in range(TRANSFORM_REPEATS):
        start = time.perf_counter()
        Z = transform(model, X[n:n + m])
        seconds.append(time.perf_counter() - start)
    row = {"method": name, "fit_seconds": fit_seconds, "transform_seconds": min(seconds),
           "transform_seconds_all": seconds,
           "heldout_knn_accuracy": heldout_accuracy(Y, y[:n], Z, y[n:n + m], K),
           "train_knn_accuracy": ge.metrics.knn_accuracy(Y, y[:n], k=K)}
    print(row, flush=True)
    return row


def run_large(n, m, repeat=2):
    """TSNE (defaults, CPU) of ``n`` shifted images (bench_knn.shifted_fashion_mnist;
    from 50,000 on its affinities take the approximate search), then ``m`` new
    images (the first, shifted by the next shift, one the training set lacks)
    mapped into it, their neighbours from the training points' lists
    (transform's default from 50,000 training points; the first call builds
    them, timed apart) and from the exact search, alternating, best of ``repeat``."""
    from bench_knn import shifted_fashion_mnist, shifted_images, shifted_labels, unseen_shift
    from gpuembed.neighbors_ivf import QuerySearch

    X, y = shifted_fashion_mnist(n), shifted_labels(n)
    images, labels = ge.datasets.fashion_mnist()
    Q, y_new = shifted_images(images[:m], *unseen_shift(n)), labels[:m]
    start = time.perf_counter()
    model = ge.TSNE(random_state=0, backend="cpu").fit(X)
    fit_seconds = time.perf_counter() - start
    # The fitted model's search of new points' neighbours, swapped to compare.
    searches = {"lists": model._queries, "exact": QuerySearch(X, "exact", model._queries.backend)}
    start = time.perf_counter()
    model.transform(Q)
    first_seconds = time.perf_counter() - start
    seconds, mapped = dict.fromkeys(searches, np.inf), {}
    for _ in range(repeat):
        for name, search in searches.items():
            model._queries = search
            start = time.perf_counter()
            mapped[name] = model.transform(Q)
            seconds[name] = min(seconds[name], time.perf_counter() - start)
    rows = [{"neighbors": name, "transform_seconds": seconds[name],
             "heldout_knn_accuracy": heldout_accuracy(model.embedding_, y, mapped[name], y_new, K)}
            for name in searches]
    figures = {"n_train": n, "n_new": m, "query_shift": unseen_shift(n), "k": K,
               "fit_seconds": fit_seconds,
               "n_probe": searches["lists"].probes, "first_transform_seconds": first_seconds,
               "runs": rows,
               "train_knn_accuracy": ge.metrics.knn_accuracy(model.embedding_, y, k=K),
               "largest_difference": float(np.abs(mapped["lists"] - mapped["exact"]).max())}
    print(figures, flush=True)
    return figures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=10000, help="training points")
    parser.add_argument("--m", type=int, default=2000, help="held-out points mapped")
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--backend", default="cpu", help="gpuembed's methods' backend")
    parser.add_argument("--suffix", default="")
    parser.add_argument("--large", type=int, metavar="N",
                        help="TSNE of N shifted images, then --m new ones mapped with their "
                             "neighbours from the lists and exactly (transform_large.json)")
    args = parser.parse_args(argv)
    if args.large:
        write_result("transform_large", run_large(args.large, args.m), args.suffix)
        return
    X, y = ge.datasets.fashion_mnist()
    rows = [run(name, X, y, args.n, args.m, args.backend) for name in args.methods]
    write_result("transform", {"dataset": "fashion_mnist", "n_train": args.n,
                               "n_heldout": args.m, "k": K, "backend": args.backend,
                               "runs": rows}, args.suffix)


if __name__ == "__main__":
    main()
