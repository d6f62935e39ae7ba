"""Entropic affinities on Fashion-MNIST (70,000 points, k = 90, K = 30).

For every method x order: seconds, function evaluations per point and the
achieved max |H - log K|, solved in parallel waves (the library's path) and
in the paper's sequential order; side by side in one run with scikit-learn's
perplexity search (``sklearn.manifold._utils._binary_search_perplexity``, tol
1e-5) and openTSNE's (``openTSNE._tsne.compute_gaussian_perplexity``, tol 1e-8),
all on the same precomputed neighbours (the anchors on one thread; ours on all
cores, and its fastest row again on one thread).  On a GPU the same table is
measured there, plus 1,000,000 rows x 90 neighbours (Fashion-MNIST's rows tiled).

``--raster`` measures the orders on the pixels of an image instead (dissertation
section 2.3.4, fig. 2.15's Lena): scikit-learn's ``china.jpg`` at every second
pixel (214 x 320), each pixel the features (row, column, red, green, blue) in
pixels and grey levels, where the raster order (``raster_order``) is given
beside the library's orders; written to entropic_raster.json.
"""
from __future__ import annotations

import argparse
import time

import numba
import numpy as np

from common import best_time, device_sync, fashion_mnist_knn, write_result
import gpuembed as ge
from gpuembed.affinities import orders, rootfinding
from gpuembed.affinities.entropic import solve_rows

K = 30.0


def entropy_error(P):
    P = np.asarray(P)
    H = -(P * np.log(np.where(P > 0, P, 1.0))).sum(axis=1)
    return float(np.abs(H - np.log(K)).max())


def ours(be, sqdist, indices, method, order, parallel=True, sync=lambda: None, repeat=3,
         gpu_kernel=True, name=None):
    """Root finding only (the neighbours are given), as the anchors are timed;
    best of ``repeat`` runs (one for the slow sequential orders); on the GPU by
    kernels/entropic.cu or (``gpu_kernel=False``) the array code on CuPy.
    ``name``: the order's name in the result, for a given sequence."""
    xp = be.xp
    sq = be.asarray(sqdist, dtype=np.float64)
    shifted = sq - sq.min(axis=1, keepdims=True)
    Kn = np.full(sqdist.shape[0], K)
    seconds = np.inf
    for _ in range(repeat if parallel else 1):
        start = time.perf_counter()
        lo, hi = rootfinding.log_beta_bounds(xp, shifted, Kn)
        alpha, entropy, n_iter = solve_rows(be, shifted, Kn, lo, hi, method, order, 1e-10,
                                            (sqdist, indices), parallel=parallel,
                                            gpu_kernel=gpu_kernel)
        sync()
        seconds = min(seconds, time.perf_counter() - start)
    err = float(be.to_host(xp.abs(entropy - np.log(K)).max()))
    return {"method": method, "order": name or order,
            "mode": "parallel" if parallel else "sequential",
            "code": "kernel" if gpu_kernel or not be.is_gpu else "array code",
            "seconds": seconds, "evaluations_per_point": float(be.to_host(n_iter.mean())),
            "max_entropy_error": err}


def run(n=None, sequential=True):
    _, _, sqdist, indices = fashion_mnist_knn(90, n)
    figures = run_cpu(sqdist, indices, sequential)
    if ge.backend.gpu_available():
        figures.update(run_gpu(sqdist, indices))
    return figures


def run_cpu(sqdist, indices, sequential):
    rows = []
    cpu = ge.get_backend("cpu")
    for order in orders.ORDERS:
        for method in rootfinding.METHODS:
            rows.append(ours(cpu, sqdist, indices, method, order))
            print(rows[-1], flush=True)
    if sequential:
        for order in ("dk", "mst", "msp"):
            for method in ("newton", "halley", "euler"):
                rows.append(ours(cpu, sqdist, indices, method, order, parallel=False))
                print(rows[-1], flush=True)

    from sklearn.manifold._utils import _binary_search_perplexity

    sq32 = sqdist.astype(np.float32)
    t_sk, P = best_time(lambda: _binary_search_perplexity(sq32, K, 0), repeat=3)
    anchors = [{"library": "scikit-learn", "seconds": t_sk, "max_entropy_error": entropy_error(P)}]
    try:
        from openTSNE import _tsne

        dist = np.sqrt(sqdist).astype(np.float64)        # openTSNE squares them itself
        # One perplexity: a list of several is openTSNE's multiscale average.
        t_ot, P = best_time(lambda: _tsne.compute_gaussian_perplexity(
            dist, np.array([K]), perplexity_tol=1e-8, max_iter=200, num_threads=1))
        anchors.append({"library": "openTSNE", "seconds": t_ot,
                        "max_entropy_error": entropy_error(P)})
    except ImportError:
        pass
    for a in anchors:
        print(a)
    best = min((r for r in rows if r["mode"] == "parallel"), key=lambda r: r["seconds"])
    # scikit-learn's search runs on one thread: the same row on one thread as well.
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    one = ours(cpu, sqdist, indices, best["method"], best["order"])
    numba.set_num_threads(threads)
    print("one thread", one)
    figures = {"n": sqdist.shape[0], "k": sqdist.shape[1], "perplexity": K, "tol": 1e-10,
               "cpu_threads": threads, "cpu": rows, "anchors": anchors,
               "fastest_cpu": best, "fastest_cpu_one_thread": one,
               "speedup_vs_sklearn": t_sk / best["seconds"],
               "speedup_vs_sklearn_one_thread": t_sk / one["seconds"]}
    return figures


def run_gpu(sqdist, indices):
    be = ge.get_backend("gpu")
    sync = device_sync(be)
    for gpu_kernel in (True, False):                                                # compile
        ours(be, sqdist[:1000], indices[:1000] % 1000, "newton", "bounds", sync=sync,
             gpu_kernel=gpu_kernel)
    table = []
    for order in orders.ORDERS:
        for method in rootfinding.METHODS:
            table.append(ours(be, sqdist, indices, method, order, sync=sync))
            print("gpu", table[-1], flush=True)
    # The choice between the kernel and the same steps as CuPy array code.
    array_code = [ours(be, sqdist, indices, method, order, sync=sync, gpu_kernel=False)
                  for order in ("bounds", "dk") for method in rootfinding.METHODS]
    for r in array_code:
        print("gpu array code", r, flush=True)
    # 1,000,000 rows: Fashion-MNIST's rows tiled, indices offset per copy.
    n, copies = sqdist.shape[0], -(-1_000_000 // sqdist.shape[0])
    big_sq = np.tile(sqdist, (copies, 1))[:1_000_000]
    big_ix = (indices[None] + n * np.arange(copies)[:, None, None]).reshape(-1, indices.shape[1])
    big = [ours(be, big_sq, big_ix[:1_000_000], method, order, sync=sync)
           for order in ("bounds", "dk") for method in ("newton", "euler")]
    for r in big:
        print("gpu 1M", r)
    return {"n": sqdist.shape[0], "k": sqdist.shape[1], "gpu": table,
            "gpu_array_code": array_code, "gpu_1M_rows": big}


def raster(step=2):
    """The orders on an image's pixels (module doc), the raster order among them."""
    from sklearn.datasets import load_sample_image

    image = load_sample_image("china.jpg")[::step, ::step].astype(np.float64)
    height, width = image.shape[:2]
    rows, cols = np.indices((height, width))
    X = np.column_stack([rows.ravel(), cols.ravel(), image.reshape(-1, 3)])
    sqdist, indices = ge.knn(X, 90, backend="cpu")
    cpu = ge.get_backend("cpu")
    given = {"raster": orders.raster_order(height, width)}
    table = []
    for name in ("raster",) + orders.ORDERS:
        for method in rootfinding.METHODS:
            table.append(ours(cpu, sqdist, indices, method, given.get(name, name), name=name))
            print(table[-1], flush=True)
    for name in ("raster", "mst"):
        for method in ("newton", "euler"):
            table.append(ours(cpu, sqdist, indices, method, given.get(name, name),
                              parallel=False, name=name))
            print(table[-1], flush=True)
    return {"image": "china.jpg", "shape": [height, width], "n": X.shape[0],
            "features": "row, column (pixels), red, green, blue (0-255)",
            "k": 90, "perplexity": K, "tol": 1e-10, "cpu": table}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=None, help="use the first n points")
    parser.add_argument("--no-sequential", action="store_true")
    parser.add_argument("--raster", action="store_true",
                        help="only the orders on an image's pixels (entropic_raster.json)")
    parser.add_argument("--gpu-only", action="store_true",
                        help="only the GPU part, written to entropic_gpu.json")
    args = parser.parse_args(argv)
    suffix = "" if args.n is None else f"_n{args.n}"
    if args.raster:
        write_result("entropic", raster(), "_raster")
    elif args.gpu_only:
        write_result("entropic", run_gpu(*fashion_mnist_knn(90, args.n)[2:]), suffix + "_gpu")
    else:
        write_result("entropic", run(n=args.n, sequential=not args.no_sequential), suffix)


if __name__ == "__main__":
    main()
