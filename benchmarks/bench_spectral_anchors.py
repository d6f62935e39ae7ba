"""Spectral methods against scikit-learn's, side by side in one run on the CPU:

1. ``le``: Laplacian eigenmaps of Fashion-MNIST (first ``--n`` images, d = 10 and
   50) on the Gaussian 20-NN graph of bench_lll.py: gpuembed's exact solver
   (Lanczos on D^-1/2 W D^-1/2) and LLL against ``sklearn.manifold.SpectralEmbedding``
   on the same graph (affinity="precomputed", its default ARPACK in shift-invert
   mode): seconds (graph excluded) and Procrustes error against gpuembed's exact LE.
2. ``segmentation``: spectral clustering of the pixels of bench_segmentation.py's
   image on its graph: gpuembed's exact (shift-invert, as SpectralClustering
   solves 3-D points) and LLL (Ng-Jordan-Weiss, 10 k-means
   restarts) against ``sklearn.cluster.SpectralClustering`` (affinity="precomputed",
   its defaults otherwise: k-means on the unnormalized rows, 10 restarts):
   seconds and adjusted Rand index against gpuembed's exact segmentation.

Writes results/spectral_anchors.json.
"""
from __future__ import annotations

import argparse

import numpy as np
from sklearn.cluster import SpectralClustering as SkSpectralClustering
from sklearn.manifold import SpectralEmbedding as SkSpectralEmbedding
from sklearn.metrics import adjusted_rand_score

import bench_lll
import bench_segmentation
from common import best_time, write_result
import gpuembed as ge
from gpuembed.metrics import procrustes_error
from gpuembed.spectral import affinity_graph, spectral_embedding
from gpuembed.spectral.embedding import points_suit_shift_invert
from gpuembed.spectral.laplacian import lll_spectral


def laplacian_eigenmaps(n, dims, landmarks):
    X, _ = ge.datasets.fashion_mnist()
    X = X[:n].astype(np.float64)
    sigma = bench_lll.gaussian_width(X)
    W_small = affinity_graph(X[:3000], bench_lll.N_NEIGHBORS, sigma, backend="cpu")
    for d in dims:          # warm-up: compilation, and SciPy's first ARPACK call
        spectral_embedding(W_small, d, backend="cpu")
        lll_spectral(X[:3000], W_small, d, 250, random_state=0, backend="cpu")
        SkSpectralEmbedding(d, affinity="precomputed", random_state=0).fit(W_small)
    t_graph, W = best_time(lambda: affinity_graph(X, bench_lll.N_NEIGHBORS, sigma,
                                                  backend="cpu"))
    print(f"{n} points: graph {t_graph:.1f} s", flush=True)
    out = {"n": n, "n_neighbors": bench_lll.N_NEIGHBORS, "sigma": sigma,
           "graph_seconds": t_graph, "dims": []}
    for d in dims:
        t_exact, exact = best_time(lambda: spectral_embedding(W, d, backend="cpu"))
        t_sk, Y_sk = best_time(lambda: SkSpectralEmbedding(
            d, affinity="precomputed", random_state=0).fit_transform(W))
        row = {"d": d, "gpuembed_exact_seconds": t_exact, "sklearn_seconds": t_sk,
               "sklearn_procrustes_error": procrustes_error(exact, Y_sk),
               "speedup_over_sklearn": t_sk / t_exact, "lll": []}
        for L in landmarks:
            t_lll, Y = best_time(lambda: lll_spectral(X, W, d, L, random_state=0,
                                                      backend="cpu")[0])
            row["lll"].append({"landmarks": L, "seconds": t_lll,
                               "procrustes_error": procrustes_error(exact, Y)})
        print(row, flush=True)
        out["dims"].append(row)
    return out


def segmentation(step, K, landmarks):
    _, X = bench_segmentation.pixel_features(step)
    graph = lambda Z: affinity_graph(Z, bench_segmentation.N_NEIGHBORS,
                                     sigma=bench_segmentation.SIGMA, backend="cpu")
    W_small = graph(X[:3000])        # warm-up
    spectral_embedding(W_small, K - 1, backend="cpu", shift_invert=True)
    SkSpectralClustering(K, affinity="precomputed", random_state=0).fit(W_small)
    W = graph(X)

    def ours(embed):
        return bench_segmentation.segment(embed(), K)

    # As SpectralClustering solves it for points of up to 3 coordinates.
    t_exact, exact = best_time(lambda: ours(lambda: spectral_embedding(
        W, K - 1, backend="cpu", shift_invert=points_suit_shift_invert(X))))
    t_sk, labels_sk = best_time(lambda: SkSpectralClustering(
        K, affinity="precomputed", random_state=0).fit(W).labels_)
    out = {"pixels": X.shape[0], "clusters": K, "gpuembed_exact_seconds": t_exact,
           "sklearn_seconds": t_sk, "sklearn_ari_vs_exact": adjusted_rand_score(exact, labels_sk),
           "speedup_over_sklearn": t_sk / t_exact, "lll": []}
    for L in landmarks:
        t_lll, labels = best_time(lambda: ours(lambda: lll_spectral(
            X, W, K - 1, L, random_state=0, backend="cpu")[0]))
        out["lll"].append({"landmarks": L, "seconds": t_lll,
                           "ari_vs_exact": adjusted_rand_score(exact, labels)})
    print(out, flush=True)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000, help="Fashion-MNIST images for LE")
    parser.add_argument("--d", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--landmarks", type=int, nargs="+", default=[500, 2000])
    parser.add_argument("--step", type=int, default=3, help="segmentation: every step-th pixel")
    parser.add_argument("--clusters", type=int, default=6)
    parser.add_argument("--parts", default="le,segmentation")
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    figures = {}
    if "le" in parts:
        figures["laplacian_eigenmaps"] = laplacian_eigenmaps(args.n, args.d, args.landmarks)
    if "segmentation" in parts:
        figures["segmentation"] = segmentation(args.step, args.clusters, args.landmarks)
    write_result("spectral_anchors", figures, merge=True)


if __name__ == "__main__":
    main()
