"""N-body engines (dissertation section 5.5, figs 5.6-5.7).

1. ``scaling``: seconds per kernel sum (S and SX) vs N for exact, fgt and bh on
   uniform 2-D points at constant density (2 per unit area, like an embedding
   whose spread grows as sqrt(N)), with fitted log-log slopes; Gaussian kernel
   for all engines, plus the t-SNE pair (student, student2) for exact and bh.
2. ``accuracy``: relative error and seconds vs FGT order p and BH theta at N = 20,000.
3. ``crossover``: exact against the engine nbody="auto" switches to (fgt p = 8 for
   the Gaussian, bh theta = 0.5 for the t-SNE pair) on clustered 2-D layouts
   (10 Gaussian blobs; the blob spread sets the extent, std 4 and 10 for the
   Gaussian like EE, 20 for Student-t like t-SNE), N = 2,500 to 40,000, and the
   first N where the fast engine wins (the AUTO_EXACT_BELOW thresholds).
4. ``tree``: seconds to build the Barnes-Hut tree of a t-SNE-like layout (10 blobs,
   spread 20) by the array code (the reference, level by level) and by the
   compiled build (numba on the CPU, kernels/bh_tree.cu on the GPU) side by side,
   N = 2,500 up to --max-n, and one Barnes-Hut sum of the t-SNE pair with the latter.
5. ``cutoff``: seconds per FGT sum (p = 8) with the dissertation's cutoff of 5
   points per box against ``fgt.box_cutoff`` (p^d / 5: 13 in 2-D, 102 in 3-D), on
   Fashion-MNIST PCA layouts (40,000 points in 2-D, 20,000 in 3-D) scaled over the
   widths an embedding's kernels pass through, from a few crowded boxes to
   isolated points.
6. ``ee``: EE on Fashion-MNIST (PCA to 50, perplexity 30, k = 90) with fixed-step
   FP iterations and the exact / fgt (p ramp 1 -> 10) / bh (theta ramp 2 -> 0.1)
   engines under one time budget each; the objective at log-spaced checkpoints
   is evaluated afterwards (not counted in the run's time) by the FGT at p = 12,
   whose error is below 1e-8 of the repulsion here (an exact pass would take
   ~50 s per checkpoint at N = 70,000 on 2 CPU cores).
7. ``large`` (only when named; sized for a GPU): EE of 1,000,000 points (Fashion-MNIST
   grown by shifted, noisy copies; 50-D) with the FGT under a 60 s budget (SD with
   the line search; with ``--large-fp`` also fixed-step FP, the path of the H100's
   run at b36ba14), one EE gradient there at p = 4, 6, 8, and
   the 10-NN accuracy, over all points and over the first 50,000, against an
   exact-engine SD run on those 50,000 under the same budget, at the point where
   the whole run from the data passes 60 s too (the issue's 50 ms and 60 s targets).

Writes results/nbody[_<suffix>].json after each part (and after each run of
``large``), so a cut run keeps what it finished, and results/nbody_scaling.png.
"""
from __future__ import annotations

import argparse
import traceback

import numpy as np

from common import (RESULTS, best_time, device_sync, fashion_mnist_knn, loglog_slope, pyplot,
                    write_result)
import gpuembed as ge
from gpuembed.backend import get_backend
from gpuembed.initialization import initial_layout
from gpuembed.nbody import engine_sums, fgt
from gpuembed.nbody.barneshut import Tree
from gpuembed.objectives import make_objective
from gpuembed.optim import Monitor, accuracy_schedule, minimize

DENSITY = 2.0


def points(n, seed=0):
    return np.random.default_rng(seed).uniform(0, np.sqrt(n / DENSITY), (n, 2))


def blobs(n, spread, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(10, 2)) * spread
    return centers[rng.integers(0, 10, n)] + rng.normal(size=(n, 2)) * spread / 4


def crossover(be, sizes):
    configs = [(("gaussian",), 4.0, "fgt", {"p": 8}), (("gaussian",), 10.0, "fgt", {"p": 8}),
               (("gaussian",), 10.0, "bh", {"theta": 0.5}),
               (("student", "student2"), 20.0, "bh", {"theta": 0.5})]
    rows, first_win = [], {}
    sync = device_sync(be)
    for kernels, spread, fast, accuracy in configs:
        name = f"{'+'.join(kernels)} spread {spread:g}: exact vs {fast} {accuracy}"
        for n in sizes:
            X = be.asarray(blobs(n, spread), be.default_float)
            seconds = {method: best_time(lambda: engine_sums(be, method, X, kernels, accuracy=acc),
                                         2, sync)[0]
                       for method, acc in (("exact", {}), (fast, accuracy))}
            rows.append({"config": name, "n": n, **seconds})
            print(rows[-1], flush=True)
            if seconds[fast] < seconds["exact"]:
                first_win.setdefault(name, n)
        first_win.setdefault(name, None)
    return {"rows": rows, "fast_engine_first_wins_at": first_win}


def tree_build(be, sizes):
    rows = []
    sync = device_sync(be)
    for n in sizes:
        X = be.asarray(blobs(n, 20.0), be.default_float)
        repeat = 3 if n <= 200_000 else 2          # the best of them: the first may compile
        row = {"n": n}
        for name, build in (("array code", lambda: Tree(be, X, reference=True)),
                            ("compiled", lambda: Tree(be, X))):
            row[name] = best_time(build, repeat, sync)[0]
        row["array code / compiled"] = row["array code"] / row["compiled"]
        row["bh sum, student pair"] = best_time(
            lambda: engine_sums(be, "bh", X, ("student", "student2")), repeat, sync)[0]
        rows.append(row)
        print(row, flush=True)
    return rows


def scaling(be, sizes, exact_max, fast_max):
    configs = [("exact", {}, ("gaussian",)), ("exact", {}, ("student", "student2")),
               ("fgt", {"p": 4}, ("gaussian",)), ("fgt", {"p": 8}, ("gaussian",)),
               ("bh", {"theta": 0.5}, ("gaussian",)), ("bh", {"theta": 1.0}, ("gaussian",)),
               ("bh", {"theta": 0.5}, ("student", "student2"))]
    rows = []
    sync = device_sync(be)
    for method, accuracy, kernels in configs:
        limit = exact_max if method == "exact" else fast_max
        for n in [n for n in sizes if n <= limit]:
            X = be.asarray(points(n), be.default_float)
            seconds, _ = best_time(lambda: engine_sums(be, method, X, kernels, accuracy=accuracy),
                                   repeat=3 if n <= 20000 else 1, sync=sync)
            rows.append({"method": method, "accuracy": accuracy, "kernels": list(kernels),
                         "n": n, "seconds": seconds, "pairs_per_second": n * n / seconds})
            print(rows[-1], flush=True)
    slopes = {}
    for method, accuracy, kernels in configs:
        sel = [r for r in rows if r["method"] == method and r["accuracy"] == accuracy
               and r["kernels"] == list(kernels) and r["n"] >= 10000]
        if len(sel) >= 2:
            slopes[f"{method} {accuracy} {'+'.join(kernels)}"] = loglog_slope(sel)
    print(slopes)
    return rows, slopes


def accuracy_sweep(be, n):
    X = be.asarray(points(n, seed=1), be.default_float)
    (S0, SX0), = engine_sums(be, "exact", X, ("gaussian",))
    rows = []
    thetas = (0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0)
    for method, name, values in (("fgt", "p", range(1, 13)), ("bh", "theta", thetas)):
        for value in values:
            seconds, ((S, SX),) = best_time(   # twice: the first call may compile
                lambda: engine_sums(be, method, X, ("gaussian",), accuracy={name: value}),
                2, device_sync(be))
            rows.append({"method": method, name: value, "seconds": seconds,
                         "rel_error_S": float(abs(S - S0).max() / abs(S0).max()),
                         "rel_error_SX": float(abs(SX - SX0).max() / abs(SX0).max())})
            print(rows[-1], flush=True)
    return rows


def cutoff_sweep(be, cases=((2, 40_000), (3, 20_000)), p=8):
    X_all, _ = ge.datasets.fashion_mnist()
    sync = device_sync(be)
    out = []
    for d, n in cases:
        layout = initial_layout("pca", X_all[:n].astype(np.float64), d, be, np.float64,
                                np.sqrt(n) / 2, 0)
        cutoffs = {"dissertation": fgt.CUTOFF, "default": fgt.box_cutoff(p, d)}
        rows = []
        for scale in np.geomspace(0.025, 3.0, 9):
            Y = layout * scale
            charges = be.xp.concatenate([be.xp.ones((n, 1)), Y], axis=1)
            row = {"scale": float(scale)}
            for name, cutoff in cutoffs.items():
                row[f"{name}_seconds"] = best_time(
                    lambda: fgt.fgt(be, Y, charges, p=p, cutoff=cutoff), 3, sync)[0]
            rows.append(row)
            print(d, row, flush=True)
        totals = {name: sum(r[f"{name}_seconds"] for r in rows) for name in cutoffs}
        out.append({"d": d, "n": n, "p": p, "cutoffs": cutoffs, "rows": rows,
                    "total_seconds": totals,
                    "total_ratio": totals["dissertation"] / totals["default"]})
    return out


def ee_optimize(be, P, X0, method, budget, step, keep=lambda iteration, seconds: False,
                direction="fp"):
    """EE along ``direction`` with ``method``'s engine for ``budget`` seconds: fixed
    steps of ``step`` with the engine's accuracy ramp, or (``step=None``) the line
    search at the engine's default accuracy, as a default fit runs it.  Returns the
    layouts where ``keep(iteration, seconds)`` and the last one, as (iteration,
    seconds, X); the run stops early where the line search finds no decrease."""
    objective = make_objective("ee", P, be, be.default_float, nbody=method)
    kept = []

    def record(iteration, elapsed, value, X):
        if keep(iteration, elapsed) or elapsed > budget:
            kept.append((iteration, elapsed, X.copy()))
        return elapsed > budget
    result = minimize(objective, X0, direction, max_iter=10**6, tol=0.0, step_size=step,
                      schedule=accuracy_schedule(method, 100) if step else None,
                      monitor=Monitor([record]))
    if not kept or kept[-1][0] != result.n_iter:
        kept.append((result.n_iter, result.history[-1]["time"], result.X))
    return kept


def first_past(marks):
    """``keep`` for ee_optimize: the first iteration past each of ``marks`` seconds."""
    pending = sorted(marks)

    def keep(iteration, seconds):
        passed = False
        while pending and seconds >= pending[0]:
            pending.pop(0)
            passed = True
        return passed
    return keep


def ee_fashion(be, n, budget, step):
    X, _, sqdist, indices = fashion_mnist_knn(90, n)
    P = ge.entropic_affinities(neighbors=(sqdist, indices), perplexity=30, backend=be).P
    X0 = initial_layout("pca", X.astype(np.float64), 2, be, be.default_float, 1.0, 0)
    reference = make_objective("ee", P, be, be.default_float, nbody="fgt")
    reference.accuracy = {"p": 12}
    checkpoints_at = {0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000}
    runs = {}
    for method in ("fgt", "bh", "exact"):
        kept = ee_optimize(be, P, X0, method, budget, step,
                           lambda iteration, seconds: iteration in checkpoints_at)
        runs[method] = [{"iter": i, "seconds": t, "objective": reference.value(Xc)}
                        for i, t, Xc in kept]
        print(method, runs[method], flush=True)
    return runs


def fashion_grown(n, dim=50, seed=0):
    """Fashion-MNIST grown to n points (an infinite-MNIST-like set): each new image
    is an original shifted by up to 2 pixels each way plus noise of std 0.05,
    and every image is projected on the originals' top ``dim`` principal axes."""
    X, y = ge.datasets.fashion_mnist()
    mean = X.mean(axis=0)
    axes = np.linalg.svd(X[:20000] - mean, full_matrices=False)[2][:dim].T
    rng = np.random.default_rng(seed)
    pick = np.concatenate([np.arange(min(n, len(X))), rng.integers(0, len(X), max(n - len(X), 0))])
    out = np.empty((n, dim), np.float32)
    for start in range(0, n, 50000):
        part = pick[start:start + 50000]
        images = X[part].reshape(-1, 28, 28)
        if start >= len(X):
            shift = rng.integers(-2, 3, (2, len(part)))
            for dy, dx in {tuple(s) for s in shift.T}:
                sel = (shift[0] == dy) & (shift[1] == dx)
                images[sel] = np.roll(images[sel], (dy, dx), axis=(1, 2))
            images = images + rng.normal(0, 0.05, images.shape).astype(np.float32)
        out[start:start + len(part)] = (images.reshape(len(part), -1) - mean) @ axes
    return out, y[pick]


def ee_large(be, n, budget, step, subset, on_run):
    """The issue's large-N targets: EE of n points (Fashion-MNIST grown, 50-D) with
    the FGT, and with the exact engine on the first ``subset`` points, each
    optimized for ``budget`` seconds by SD with the line search (a default fit's
    path) and, for a ``step`` (not None), the large one also by fixed-step FP (the
    earlier runs' path).  ``on_run(figures so far)`` after each run.  After
    a warm-up on 2,000 points (compilation), the k-NN, affinities and PCA start
    are timed; layouts are kept when the whole run, from the data, passes
    ``budget`` seconds and when the optimization passes a quarter, half and all
    of it, each scored by 10-NN accuracy over all its points and over the first
    ``subset`` alone (the exact run's points); one EE gradient of the final SD
    layout at p = 4, 6, 8."""
    sync = device_sync(be)
    X, y = fashion_grown(n)
    out = {"n": n, "subset_size": subset, "budget_seconds": budget, "step_size": step}
    large_directions = (("sd", None),) + ((("fp", step),) if step else ())
    for name, count, method, directions in (("large", n, "fgt", large_directions),
                                             ("subset", subset, "exact", (("sd", None),))):
        Xd = be.asarray(X[:count])
        small = be.asarray(X[:2000])                # compile (numba, CuPy) before timing
        for direction, step_size in directions:
            ee_optimize(be, ge.entropic_affinities(small, 30, backend=be).P,
                        initial_layout("pca", X[:2000], 2, be, be.default_float, 1.0, 0),
                        method, 1.0, step_size, direction=direction)
        t_knn, (sqdist, indices) = best_time(lambda: ge.knn(Xd, 90, backend=be), sync=sync)
        t_aff, A = best_time(lambda: ge.entropic_affinities(
            neighbors=(sqdist, indices), perplexity=30, backend=be), sync=sync)
        t_init, X0 = best_time(lambda: initial_layout("pca", X[:count], 2, be,
                                                       be.default_float, 1.0, 0), sync=sync)
        setup = t_knn + t_aff + t_init
        labels = y[:count]
        row = out[name] = {"engine": method, "knn_seconds": t_knn, "affinity_seconds": t_aff,
                           "init_seconds": t_init, "runs": {}}
        for direction, step_size in directions:
            marks = [budget / 4, budget / 2] + ([budget - setup] if setup < budget else [])
            try:
                kept = ee_optimize(be, A.P, X0, method, budget, step_size, first_past(marks),
                                   direction)
            except Exception as error:    # a failed run must not cost the others' device time
                traceback.print_exc()
                row["runs"][direction] = {"error": f"{type(error).__name__}: {error}"}
                continue
            checkpoints = [{"iter": i, "seconds": t, "end_to_end_seconds": setup + t,
                            "knn_accuracy": ge.metrics.knn_accuracy(Y, labels, backend=be),
                            "knn_accuracy_first_subset": ge.metrics.knn_accuracy(
                                Y[:subset], labels[:subset], backend=be)}
                           for i, t, Y in kept]
            row["runs"][direction] = {"step_size": step_size, "iterations": kept[-1][0],
                                      "seconds": kept[-1][1], "checkpoints": checkpoints}
            if name == "large" and direction == "sd":
                objective = make_objective("ee", A.P, be, be.default_float, nbody="fgt")
                Y, gradient = kept[-1][2], {}
                for p in (4, 6, 8):
                    objective.accuracy = {"p": p}
                    objective.value_and_grad(Y)
                    gradient[f"p{p}"] = best_time(lambda: objective.value_and_grad(Y), 3, sync)[0]
                row["gradient_seconds"] = gradient
            print(name, direction, row["runs"][direction], flush=True)
            on_run(out)
    return out


def plot(rows, path):
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 4.5))
    keys = sorted({(r["method"], str(r["accuracy"]), "+".join(r["kernels"])) for r in rows})
    for method, acc, kernels in keys:
        sel = [r for r in rows if (r["method"], str(r["accuracy"]), "+".join(r["kernels"]))
               == (method, acc, kernels)]
        ax.loglog([r["n"] for r in sel], [r["seconds"] for r in sel], "o-",
                  label=f"{method} {acc} {kernels}")
    ax.set_xlabel("N")
    ax.set_ylabel("seconds per kernel sum")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--max-n", type=int, default=200_000)
    parser.add_argument("--exact-max-n", type=int, default=40_000)
    parser.add_argument("--ee-n", type=int, default=70_000)
    parser.add_argument("--ee-budget", type=float, default=300.0, help="seconds per engine")
    parser.add_argument("--ee-step", type=float, default=0.3)
    parser.add_argument("--large-n", type=int, default=1_000_000)
    parser.add_argument("--large-subset", type=int, default=50_000)
    parser.add_argument("--large-budget", type=float, default=60.0, help="seconds per run")
    parser.add_argument("--large-fp", action="store_true",
                        help="large: also fixed-step FP (step --ee-step) on all points")
    parser.add_argument("--parts", default="scaling,accuracy,crossover,tree,cutoff,ee",
                        help="comma-separated; 'large' (GPU-sized) only when named")
    parser.add_argument("--suffix", default="")
    args = parser.parse_args()
    be = get_backend(args.backend)
    parts = args.parts.split(",")
    sizes = [n for n in (2500, 5000, 10000, 20000, 40000, 100000, 200000, 500000, 1000000)
             if n <= args.max_n]
    figures = {"backend": be.name, "device": be.device_name, "density": DENSITY}

    def save(**new):
        figures.update(new)
        write_result("nbody", figures, args.suffix, merge=True)
    if "scaling" in parts:
        rows, slopes = scaling(be, sizes, args.exact_max_n, args.max_n)
        plot(rows, RESULTS / f"nbody_scaling{args.suffix}.png")
        save(scaling=rows, slopes=slopes)
    if "accuracy" in parts:
        save(accuracy=accuracy_sweep(be, 20000))
    if "crossover" in parts:
        save(crossover=crossover(be, [n for n in sizes if n <= args.exact_max_n]))
    if "tree" in parts:
        save(tree=tree_build(be, sizes))
    if "cutoff" in parts:
        save(cutoff=cutoff_sweep(be))
    if "ee" in parts:
        save(ee_fashion_mnist={"n": args.ee_n, "budget_seconds": args.ee_budget,
                               "optimizer": "fp", "step_size": args.ee_step,
                               "runs": ee_fashion(be, args.ee_n, args.ee_budget, args.ee_step)})
    if "large" in parts:
        ee_large(be, args.large_n, args.large_budget, args.ee_step if args.large_fp else None,
                 args.large_subset, on_run=lambda out: save(ee_large=out))


if __name__ == "__main__":
    main()
