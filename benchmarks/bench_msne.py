"""Multi-scale SNE against single-scale methods (thesis 004, fig. 5.5): log-K AUC of
R_NX and seconds on digits, rotating_objects and Fashion-MNIST subsets (``--n``, one
or more sizes: the first n images), for gpuembed's MultiscaleSNE (up to 2,000
points also with all of the thesis' scales), gpuembed's TSNE and openTSNE's t-SNE
with its multiscale affinities, side by side in one run, and each method's fitted
log-log slope of seconds vs N over the subsets.  Writes results/msne[_<suffix>].json
and R_NX(K) curves to results/msne_<dataset>[<suffix>].png.  The committed msne.json is
``--n 2000,5000,10000,20000`` (about 30 minutes on 2 cores, 10.5 of them MultiscaleSNE
at 20k).

``--scaling``: seconds of one MultiscaleSNE cost-and-gradient evaluation vs N on
Fashion-MNIST with a fixed number of scales (``--n-scales``), exact engine vs
FGT, and their fitted log-log slopes (results/msne_scaling[<suffix>].json).

``--metrics``: seconds of the full R_NX curve (``ge.metrics.rnx``, k_max = N - 2, as
every AUC above) of a PCA layout vs N on Fashion-MNIST, and its fitted slope
(results/msne_metrics[<suffix>].json).

``--backend gpu`` runs gpuembed's methods on the GPU (float32 layouts, the GPU's
default); openTSNE stays on the CPU with all its cores.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from common import RESULTS, best_time, device_sync, loglog_slope, pyplot, write_result
import gpuembed as ge
from gpuembed.initialization import initial_layout
from gpuembed.objectives.msne import MultiscaleObjective, ld_precisions


def datasets(sizes):
    yield ("digits",) + ge.datasets.digits()
    yield ("rotating_objects",) + ge.datasets.rotating_objects()
    X, y = ge.datasets.fashion_mnist()
    for n in sizes:
        yield (f"fashion_mnist_{n}", X[:n].astype(np.float64), y[:n])


N_JOBS = os.cpu_count()       # openTSNE's threads: all cores
# Up to this N the thesis' full set of scales (a dense k-NN graph) runs too, against
# the default that leaves out the two largest.
ALL_SCALES_MAX_N = 2000


def methods(n, backend):
    """(name, fit) pairs; fit(X) returns the layout and a dict of run details."""
    def msne(n_scales):
        def fit(X):
            model = ge.MultiscaleSNE(n_scales=n_scales, backend=backend).fit(X)
            return model.embedding_, {"perplexities": [float(k) for k in model.perplexities_],
                                      "iterations": model.n_iter_}
        return fit
    yield "gpuembed MultiscaleSNE", msne(None)
    if n <= ALL_SCALES_MAX_N:
        yield "gpuembed MultiscaleSNE n_scales=all", msne("all")
    yield "gpuembed TSNE", lambda X: (ge.TSNE(perplexity=30, optimizer="tsne",
                                              backend=backend).fit_transform(X), {})
    try:
        import openTSNE
        from openTSNE import affinity
    except ImportError:
        return

    def opentsne(X):
        A = affinity.Multiscale(X, perplexities=[5, 50], n_jobs=N_JOBS, random_state=0)
        init = openTSNE.initialization.pca(X, random_state=0)
        return np.asarray(openTSNE.TSNEEmbedding(init, A, n_jobs=N_JOBS, random_state=0)
                          .optimize(250, exaggeration=12).optimize(500)), {}
    yield "openTSNE multiscale", opentsne


def warm_up(backend):
    """Run every method once on a small set, and the engines the larger sets switch
    to, so that no timed run pays numba's compilation (about 8 s for
    MultiscaleSNE's sweeps) or the GPU's kernel compilation."""
    X = ge.datasets.digits()[0][:300]
    for _, fn in methods(X.shape[0], backend):
        fn(X)
    ge.MultiscaleSNE(nbody="fgt", max_iter=5, backend=backend).fit(X)
    ge.TSNE(optimizer="tsne", nbody="bh", max_iter=300, backend=backend).fit(X)


def run(sizes, backend, suffix=""):
    warm_up(backend)
    rows, curves = [], {}
    for name, X, y in datasets(sizes):
        for method, fn in methods(X.shape[0], backend):
            start = time.perf_counter()
            Y, details = fn(X)
            seconds = time.perf_counter() - start
            R = ge.metrics.rnx(X, Y, backend=backend)
            rows.append({"dataset": name, "n": X.shape[0], "method": method, "seconds": seconds,
                         "auc_rnx": ge.metrics.log_k_auc(R),
                         "knn_accuracy": ge.metrics.knn_accuracy(Y, y), **details})
            curves[(name, method)] = R
            print(rows[-1], flush=True)
    plot(curves, suffix)
    return {"runs": rows, "slopes": subset_slopes(rows)}


def subset_slopes(rows):
    """Per method, the log-log slope of seconds vs N over the Fashion-MNIST subsets
    (about 1.1 over 2k-20k would be N log N)."""
    slopes = {}
    for method in dict.fromkeys(r["method"] for r in rows):
        sel = [r for r in rows if r["method"] == method and r["dataset"].startswith("fashion")]
        if len(sel) >= 2:
            slopes[method] = loglog_slope(sel)
    print("slopes", slopes)
    return slopes


def plot(curves, suffix):
    plt = pyplot()
    if plt is None:
        return
    for dataset in sorted({d for d, _ in curves}):
        fig, ax = plt.subplots(figsize=(6, 4))
        for (d, method), R in curves.items():
            if d == dataset:
                ax.plot(np.arange(1, R.size + 1), R, label=method)
        ax.set_xscale("log")
        ax.set_xlabel("K")
        ax.set_ylabel("R_NX(K)")
        ax.set_title(dataset)
        ax.legend()
        fig.savefig(RESULTS / f"msne_{dataset}{suffix}.png", dpi=80, bbox_inches="tight")
        plt.close(fig)


def scaling(sizes, n_scales, exact_max, backend):
    """Seconds per cost-and-gradient evaluation at a PCA layout spread like an embedding."""
    be = ge.get_backend(backend)
    dtype, sync = be.default_float, device_sync(be)
    X_all, _ = ge.datasets.fashion_mnist()
    rows = []
    for n in sizes:
        X = X_all[:n].astype(np.float64)
        start = time.perf_counter()
        M = ge.multiscale_affinities(X, 2.0, n_scales=n_scales, symmetrize=False, backend=be)
        row = {"n": n, "scales": len(M.perplexities),
               "affinities_seconds": time.perf_counter() - start}
        Y = initial_layout("pca", X, 2, be, dtype, np.sqrt(n) / 2, 0)
        p = ld_precisions(M.perplexities, be.to_host(Y))
        for engine in ("fgt", "exact"):
            if engine == "exact" and n > exact_max:
                continue
            objective = MultiscaleObjective(M.conditionals, be, dtype, p, nbody=engine)
            # Best of 4: the second call still ran at half speed at 2,000 points.
            row[f"{engine}_seconds"] = best_time(lambda: objective.value_and_grad(Y), 4, sync)[0]
        rows.append(row)
        print(row, flush=True)
    slopes = {}
    for engine in ("fgt", "exact"):
        sel = [r for r in rows if f"{engine}_seconds" in r and r["n"] >= 5000]
        if len(sel) >= 2:
            slopes[engine] = loglog_slope(sel, f"{engine}_seconds")
    print("slopes", slopes)
    return {"n_scales": n_scales, "rows": rows, "slopes_from_5000": slopes}


def metrics_timing(sizes, backend):
    """Seconds of one full R_NX curve (both spaces ranked whole) per N."""
    be = ge.get_backend(backend)
    X_all, _ = ge.datasets.fashion_mnist()
    ge.metrics.rnx(X_all[:500], X_all[:500, :2], backend=be)    # compiles the CPU helpers
    rows = []
    for n in sizes:
        X = X_all[:n].astype(np.float64)
        Y = be.to_host(initial_layout("pca", X, 2, be, np.float64, 1.0, 0))
        start = time.perf_counter()
        R = ge.metrics.rnx(X, Y, backend=be)
        rows.append({"n": n, "seconds": time.perf_counter() - start,
                     "auc_rnx": ge.metrics.log_k_auc(R)})
        print(rows[-1], flush=True)
    return {"rows": rows, "slope": loglog_slope(rows)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", default="2000", help="Fashion-MNIST subset sizes, comma-separated")
    parser.add_argument("--suffix", default="")
    parser.add_argument("--scaling", action="store_true")
    parser.add_argument("--metrics", action="store_true")
    parser.add_argument("--n-scales", type=int, default=6)
    parser.add_argument("--max-n", type=int, default=70000)
    parser.add_argument("--exact-max-n", type=int, default=20000)
    parser.add_argument("--backend", default="cpu")
    args = parser.parse_args(argv)
    if args.metrics:
        sizes = [n for n in (2000, 5000, 10000, 20000) if n <= args.max_n]
        write_result("msne", metrics_timing(sizes, args.backend), "_metrics" + args.suffix)
    elif args.scaling:
        sizes = [n for n in (2000, 5000, 10000, 20000, 40000, 70000) if n <= args.max_n]
        write_result("msne", scaling(sizes, args.n_scales, args.exact_max_n, args.backend),
                     "_scaling" + args.suffix)
    else:
        write_result("msne", run([int(n) for n in args.n.split(",")], args.backend, args.suffix),
                     args.suffix)


if __name__ == "__main__":
    main()
