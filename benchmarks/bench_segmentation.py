"""Image segmentation by spectral clustering (dissertation section 4.7, fig. 4.12):
exact against Locally Linear Landmarks and the Nystrom extension.

LLL takes each point's landmarks from the input space and, as "LLL (graph Z)",
along the affinity graph (z_neighbors="graph").
The pixels of a grey-level image (scikit-learn's bundled ``china.jpg``,
downsampled) are points (row / SIGMA_XY, column / SIGMA_XY, intensity / SIGMA_I)
on a Gaussian k-NN graph (width SIGMA) shared by exact and LLL (Nystrom builds its own
cross-affinities to the landmarks).  Every method embeds with the K - 1
nontrivial trailing eigenvectors, normalizes the rows and runs k-means (10
restarts); reported per number of landmarks: seconds (graph excluded), the
adjusted Rand index of the segmentation against the exact one and the
Procrustes error of the embedding.  One run, one machine.

Writes results/segmentation<suffix>.json and results/segmentation<suffix>.png.
``--backend gpu``: the graph's k-NN, the exact eigensolver, LLL's landmark k-NN and
Nystrom's sums on the GPU (k-means and LLL's reduced problem on the host).
"""
from __future__ import annotations

import argparse

import numpy as np
import scipy.optimize
from sklearn.datasets import load_sample_image
from sklearn.metrics import adjusted_rand_score

from common import RESULTS, best_time, pyplot, write_result
import gpuembed as ge
from gpuembed.metrics import procrustes_error
from gpuembed.spectral import affinity_graph, kmeans, nystrom_le, spectral_embedding
from gpuembed.spectral.embedding import points_suit_shift_invert
from gpuembed.spectral.laplacian import lll_spectral

SIGMA_XY = 15.0       # pixels
SIGMA_I = 0.1         # grey levels in [0, 1]
SIGMA = 0.3           # Gaussian width on the scaled features: intensity steps of 0.1 cut
N_NEIGHBORS = 10


def pixel_features(step):
    grey = load_sample_image("china.jpg").mean(axis=2)[::step, ::step] / 255.0
    rows, cols = np.indices(grey.shape)
    X = np.column_stack([rows.ravel() / SIGMA_XY, cols.ravel() / SIGMA_XY,
                         grey.ravel() / SIGMA_I])
    return grey, X


def segment(embedding, K):
    unit = embedding / np.maximum(np.linalg.norm(embedding, axis=1, keepdims=True), 1e-300)
    return kmeans(unit, K, n_init=10, random_state=0)[0]


def run(step=3, K=6, landmarks=(100, 200, 500, 1000, 2000), backend="cpu", name="segmentation"):
    be = ge.get_backend(backend)
    grey, X = pixel_features(step)
    landmarks = [L for L in landmarks if L < X.shape[0]]
    # Warm-up (compilation, the GPU's handles) on a few rows of pixels.
    W_small = affinity_graph(X[:3000], N_NEIGHBORS, sigma=SIGMA, backend=be)
    spectral_embedding(W_small, K - 1, backend=be, shift_invert=True)
    lll_spectral(X[:3000], W_small, K - 1, landmarks[0], random_state=0, backend=be)
    t_graph, W = best_time(lambda: affinity_graph(X, N_NEIGHBORS, sigma=SIGMA, backend=be))
    d = K - 1

    def embed_and_segment(embed):
        Y = embed()
        return Y, segment(Y, K)

    def timed(embed):
        """Seconds of embedding plus k-means, the embedding and the labels."""
        seconds, (Y, labels) = best_time(lambda: embed_and_segment(embed))
        return seconds, Y, labels

    # As SpectralClustering solves it for points of up to 3 coordinates.
    t_exact, exact, exact_labels = timed(lambda: be.to_host(spectral_embedding(
        W, d, backend=be, shift_invert=points_suit_shift_invert(X))))
    print(f"{X.shape[0]} pixels: graph {t_graph:.1f} s, exact {t_exact:.1f} s", flush=True)
    runs, shown = [], {"exact": exact_labels}
    for L in landmarks:
        for method, embed in (
            ("LLL", lambda: lll_spectral(X, W, d, L, random_state=0, backend=be)[0]),
            ("LLL (graph Z)", lambda: lll_spectral(X, W, d, L, random_state=0, backend=be,
                                                   z_neighbors="graph")[0]),
            ("Nystrom", lambda: nystrom_le(X, d, n_landmarks=L, sigma=SIGMA,
                                           random_state=0, backend=be)),
        ):
            seconds, Y, labels = timed(embed)
            runs.append({"method": method, "landmarks": L, "seconds": seconds,
                         "ari_vs_exact": adjusted_rand_score(exact_labels, labels),
                         "procrustes_error": procrustes_error(exact, Y)})
            print(runs[-1], flush=True)
            if L == landmarks[1]:
                shown[f"{method}, L = {L}"] = labels
    plot(grey, shown, name)
    return {"image": "china.jpg", "shape": list(grey.shape), "pixels": X.shape[0],
            "clusters": K, "sigma_xy": SIGMA_XY, "sigma_i": SIGMA_I, "sigma": SIGMA,
            "n_neighbors": N_NEIGHBORS, "graph_seconds": t_graph, "exact_seconds": t_exact,
            "runs": runs}


def matched(labels, reference):
    """Relabel ``labels`` to agree best with ``reference`` (same colours in the plot)."""
    K = max(labels.max(), reference.max()) + 1
    overlap = np.zeros((K, K))
    np.add.at(overlap, (labels, reference), 1)
    rows, cols = scipy.optimize.linear_sum_assignment(-overlap)
    mapping = np.empty(K, dtype=int)
    mapping[rows] = cols
    return mapping[labels]


def plot(grey, shown, name):
    plt = pyplot()
    if plt is None:
        return
    reference = shown["exact"]
    fig, axes = plt.subplots(1, 1 + len(shown), figsize=(4 * (1 + len(shown)), 3.2))
    axes[0].imshow(grey, cmap="gray")
    axes[0].set_title("image")
    for ax, (title, labels) in zip(axes[1:], shown.items()):
        ax.imshow(matched(labels, reference).reshape(grey.shape), cmap="tab10", vmin=0, vmax=9)
        ax.set_title(title)
    for ax in axes:
        ax.axis("off")
    fig.savefig(RESULTS / f"{name}.png", dpi=80, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--step", type=int, default=3, help="keep every step-th pixel")
    parser.add_argument("--clusters", type=int, default=6)
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--suffix", default="")
    args = parser.parse_args(argv)
    write_result("segmentation", run(args.step, args.clusters, backend=args.backend,
                                     name="segmentation" + args.suffix), args.suffix)


if __name__ == "__main__":
    main()
