"""The ``gpuembed`` command: info, demo, embed, bench."""
from __future__ import annotations

import argparse
import math
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from . import __version__, datasets
from ._checks import check_data, check_labels
from .backend import BackendUnavailable, get_backend, kernel_dirs
from .embedding import EE, SNE, SSNE, TSNE, MultiscaleSNE
from .metrics import auc_rnx, knn_accuracy, log_k_auc, rnx
from .neighbors import graph_depth, is_graph
from .optim import OPTIMIZERS
from .spectral.lll import LANDMARK_METHODS

DEMO_DATASETS = ("digits", "rotating_objects", "swiss_roll")
# Defaults of the options left unset, for every method but msne (which keeps
# MultiscaleSNE's own: perplexity 2, the smallest scale; L-BFGS; 100 iterations
# per scale; tol 1e-7).
DEFAULTS = {"perplexity": 30.0, "optimizer": "sd", "max_iter": 1000, "tol": "auto"}


def _option(args, name):
    value = getattr(args, name)
    return DEFAULTS[name] if value is None else value


def _perplexity(args, n):
    """--perplexity, lowered (with a note) where N is too small for its 3K neighbours."""
    largest = (n - 2) / 3.0
    perplexity = _option(args, "perplexity")
    if perplexity > largest:
        print(f"perplexity {perplexity:g} lowered to {largest:g} for {n} points "
              "(3 x perplexity neighbours per point)", file=sys.stderr)
        return largest
    return perplexity


def _embed_le(X, n_components, backend, args):
    """Laplacian eigenmaps of the entropic affinities (3 x perplexity neighbours),
    exactly or, with --n-landmarks, by Locally Linear Landmarks."""
    from .spectral import LaplacianEigenmaps

    perplexity = _perplexity(args, X.shape[0])
    model = LaplacianEigenmaps(n_components, n_neighbors=math.ceil(3 * perplexity),
                               perplexity=perplexity, neighbors=args.neighbors,
                               metric=args.metric, n_landmarks=args.n_landmarks,
                               z_neighbors=args.z_neighbors or "input",
                               landmarks=args.landmarks or "random", refine=args.refine or 0,
                               random_state=args.random_state, backend=backend)
    return model.fit_transform(X)


def _init(X, args, other):
    """The estimators' init="pca" (classical MDS of a dense distance matrix), or
    ``other`` for a sparse k-NN graph of distances, which MDS cannot take."""
    return other if is_graph(X, args.metric) else "pca"


def _estimator(cls):
    def embed(X, n_components, backend, args):
        model = cls(n_components, _perplexity(args, X.shape[0]),
                    optimizer=_option(args, "optimizer"), nbody=args.nbody,
                    max_iter=_option(args, "max_iter"), tol=_option(args, "tol"),
                    init=_init(X, args, "spectral"), random_state=args.random_state,
                    backend=backend, verbose=args.verbose, neighbors=args.neighbors,
                    metric=args.metric)
        return model.fit_transform(X)
    return embed


def _embed_msne(X, n_components, backend, args):
    """Multi-scale SNE; the options given replace its own defaults."""
    given = {name: getattr(args, name) for name in DEFAULTS if getattr(args, name) is not None}
    model = MultiscaleSNE(n_components, nbody=args.nbody, metric=args.metric,
                          init=_init(X, args, "random"), random_state=args.random_state,
                          backend=backend, verbose=args.verbose, **given)
    return model.fit_transform(X)


# Embedding methods the CLI offers: name -> function(X, n_components, backend, args).
METHODS = {"tsne": _estimator(TSNE), "ee": _estimator(EE), "ssne": _estimator(SSNE),
           "sne": _estimator(SNE), "le": _embed_le, "msne": _embed_msne}


def _run_method(X, n_components, backend, args):
    if args.n_landmarks is not None and args.method != "le":
        raise ValueError("--n-landmarks applies to --method le (Locally Linear Landmarks) only")
    for option in ("z_neighbors", "landmarks", "refine"):
        if getattr(args, option) is not None and args.n_landmarks is None:
            raise ValueError(f"--{option.replace('_', '-')} applies to --method le with "
                             "--n-landmarks only")
    if args.neighbors == "approx" and args.method == "msne":
        raise ValueError("--neighbors approx does not apply to --method msne (its scales reach "
                         "thousands of neighbours per point)")
    return METHODS[args.method](X, n_components, backend, args)


def _load_demo(name):
    """(name, X, labels) of a bundled dataset; digits fall back to rotating_objects."""
    if name == "digits":
        try:
            return (name,) + datasets.digits()
        except ImportError:
            print("scikit-learn not installed: using rotating_objects instead of digits")
            name = "rotating_objects"
    if name == "rotating_objects":
        return (name,) + datasets.rotating_objects()
    X, t = datasets.swiss_roll(2000, random_state=0)
    return name, X, np.digitize(t, np.linspace(t.min(), t.max(), 6)[1:-1])


def _pyplot():
    """matplotlib's pyplot on a file backend, or None where matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _in_a_folder(path):
    """Path(path), checked before the fit: its folder exists."""
    path = Path(path)
    if not path.resolve().parent.is_dir():
        raise ValueError(f"no such directory for {path}")
    return path


def _plot_path(path, option):
    """The file a plot for ``path`` goes to, checked before the fit: a folder that
    exists and a format matplotlib writes (no suffix: PNG, which matplotlib would
    add to the name)."""
    path = _in_a_folder(path)
    if not path.suffix:
        return path.with_name(path.name + ".png")
    if _pyplot() is not None:
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
        if path.suffix[1:].lower() not in formats:
            raise ValueError(f"{option}: matplotlib cannot write {path.suffix} files; "
                             f"use one of {', '.join(sorted(formats))}")
    return path


def _save_plot(Y, labels, path, title):
    """A scatter plot of Y's first two coordinates, coloured by ``labels`` (any
    values: numbers or names, with a legend for up to 20 of them) or one colour."""
    plt = _pyplot()
    if plt is None:
        print(f"matplotlib is not installed, so no plot was written to {path} "
              "(pip install 'gpuembed[plot]')")
        return
    fig, ax = plt.subplots(figsize=(7, 7))
    if isinstance(labels, str):
        ax.scatter(Y[:, 0], Y[:, 1], c=labels, s=4)
    else:
        names, codes = np.unique(np.asarray(labels), return_inverse=True)
        # The qualitative maps' own colours in order (tab10: the first name blue, the
        # second orange...), a continuous map beyond 20 values.
        cmap, colours = (("tab10", 10) if len(names) <= 10 else ("tab20", 20)
                         if len(names) <= 20 else ("turbo", len(names)))
        points = ax.scatter(Y[:, 0], Y[:, 1], c=codes.ravel(), s=4, cmap=cmap, vmin=0,
                            vmax=colours - 1)
        if len(names) <= 20:
            ax.legend(points.legend_elements(num=None)[0], [str(n) for n in names],
                      loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    ax.set_title(title)
    ax.set_xticks([])
    ax.set_yticks([])
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {path}")


def _timed(fit):
    """(fit(), its seconds without compiling, seconds spent compiling CPU code).  numba compiles
    gpuembed's CPU code on its first use after an install (about 8 s for the
    demo's t-SNE on 2 cores) and later runs load it from its cache, so a first
    run's time would otherwise overstate every later one's tenfold."""
    from numba.core import event

    start = time.perf_counter()
    with event.install_timer("numba:compile", lambda _: None) as compiling:
        result = fit()
    compiled = compiling.duration if compiling.done else 0.0
    return result, time.perf_counter() - start - compiled, compiled


def _seconds_text(seconds, compiling):
    if compiling < 0.05:
        return f"{seconds:.2f} s"
    return (f"{seconds:.2f} s (+ {compiling:.1f} s compiling CPU code on first use, "
            "cached for later runs)")


def _print_auc(args, X, Y):
    """The log-K AUC of R_NX; of a sparse k-NN graph, up to the K that each of its
    rows gives (R_NX is exact there: metrics.rnx)."""
    if not args.auc:
        return
    start = time.perf_counter()
    if is_graph(X, args.metric):
        depth = min(graph_depth(get_backend("cpu"), X), X.shape[0] - 2)
        auc = log_k_auc(rnx(X, Y, depth, metric=args.metric))
        label = f"R_NX AUC (log K, K <= {depth}, the graph's depth)"
    else:
        auc, label = auc_rnx(X, Y, metric=args.metric), "R_NX AUC (log K)"
    print(f"{label} {auc:.4f} ({time.perf_counter() - start:.1f} s)")


def cmd_info(args):
    import numba
    import scipy

    from ._generated import cache_folder

    print(f"gpuembed {__version__}")
    print(f"python   {platform.python_version()} ({platform.machine()})")
    print(f"numpy    {np.__version__}")
    print(f"scipy    {scipy.__version__}")
    numba_cache = numba.config.CACHE_DIR or "the package's __pycache__"
    print(f"numba    {numba.__version__} ({numba.get_num_threads()} threads, "
          f"{_threading_layer()} layer; compiled code cached in {numba_cache} and "
          f"{cache_folder()})")
    try:
        import cupy

        print(f"cupy     {cupy.__version__}")
    except ImportError:
        print("cupy     not installed")
    try:
        gpu = get_backend("gpu")
        print(f"gpu      {gpu.device_name}")
    except BackendUnavailable as exc:
        print(f"gpu      unavailable: {exc}")
    print(f"backend  auto -> {get_backend('auto').name}")
    print(f"kernels  {', '.join(str(d) for d in kernel_dirs() if d.is_dir())}")
    return 0


def _threading_layer():
    """numba's threading layer, which its first parallel call chooses (one of the
    package's, cached on disk, on a 1 x 1 array): "workqueue" aborts the
    process where two Python threads run parallel code at once (README,
    "Install")."""
    import numba

    from .neighbors_cpu import select_rows

    select_rows(np.zeros((1, 1)), np.zeros(1), np.full(1, -1), 1)
    return numba.threading_layer()


def cmd_demo(args):
    if args.metric == "precomputed":
        raise ValueError("the demo's datasets are points, not distances: --metric precomputed "
                         "is for gpuembed embed with an N x N distance matrix")
    plot = _plot_path(args.output, "--output")
    name, X, labels = _load_demo(args.dataset)
    be = get_backend(args.backend)
    print(f"dataset {name}: {X.shape[0]} points x {X.shape[1]} dims, backend {be.name} "
          f"({be.device_name})")
    Y, seconds, compiling = _timed(lambda: _run_method(X, 2, be, args))
    acc = knn_accuracy(Y, labels, k=10)
    print(f"{args.method}: {_seconds_text(seconds, compiling)}, "
          f"10-NN accuracy {acc:.3f}")
    _print_auc(args, X, Y)
    _save_plot(Y, labels, plot, f"{name}: {args.method} ({seconds:.1f} s, 10-NN acc {acc:.3f})")
    return 0


def _load_csv(path):
    """Rows of numbers separated by commas, after an optional header line."""
    with open(path) as f:
        first = f.readline().split(",")
    header = not all(map(_is_number, first))
    with warnings.catch_warnings():
        # A file without rows: the check of INPUT says so, without NumPy's warning.
        warnings.filterwarnings("ignore", "loadtxt: input contained no data", UserWarning)
        return np.loadtxt(path, delimiter=",", ndmin=2, skiprows=int(header))


def _load_labels(path):
    """``--labels``: a .npy array, or a .csv / .txt file of one label per line (numbers
    or names) after an optional header line.  np.load had taken text files for
    pickles and answered with NumPy's advice on allow_pickle."""
    path = Path(path)
    if path.suffix == ".npy":
        return np.load(path)
    if path.suffix not in (".csv", ".txt"):
        raise ValueError(f"--labels must be a .npy, .csv or .txt file, got {path}")
    lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if any("," in line for line in lines):
        raise ValueError(f"--labels: {path} must hold one label per line, without commas")
    # A header: a first line that is no number above one that is.
    if len(lines) > 1 and not _is_number(lines[0]) and _is_number(lines[1]):
        lines = lines[1:]
    return np.array(lines, dtype=np.float64 if all(map(_is_number, lines)) else str)


def _is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def _load_sparse(path):
    """A sparse matrix written by scipy.sparse.save_npz."""
    import scipy.sparse

    try:
        return scipy.sparse.load_npz(path)
    except ValueError as exc:       # e.g. numpy.savez's arrays, without a sparse format
        raise ValueError(f"{path} is not a sparse matrix from scipy.sparse.save_npz "
                         f"({exc})") from None


# The embedding's file by its suffix (np.save would add ".npy" to any other name).
OUTPUT_FORMATS = {".npy": np.save,
                  ".csv": lambda path, Y: np.savetxt(path, Y, delimiter=",", fmt="%.17g")}


def cmd_embed(args):
    path = Path(args.input)
    if path.suffix == ".npy":
        X = np.load(path)
    elif path.suffix == ".csv":
        X = _load_csv(path)
    elif path.suffix == ".npz":
        X = _load_sparse(path)
    else:
        raise ValueError(f"INPUT must be a .npy, .csv or .npz (sparse) file, got {path}")
    # The rows' shape and values before any note on the parameters N sets.
    X = check_data(X, get_backend("cpu"), name="INPUT", min_samples=1, sparse=True)
    # Everything that can fail after the fit is checked before it.
    labels = check_labels(_load_labels(args.labels), "--labels") if args.labels else None
    if labels is not None and len(labels) != X.shape[0]:
        raise ValueError(f"--labels must be a 1-D array of one entry per row of INPUT "
                         f"({X.shape[0]}), got shape {labels.shape}")
    save = OUTPUT_FORMATS.get(_in_a_folder(args.output).suffix)
    if save is None:
        raise ValueError(f"--output must end in .npy or .csv, got {args.output}")
    plot = args.plot and _plot_path(args.plot, "--plot")
    be = get_backend(args.backend)
    Y, seconds, compiling = _timed(lambda: _run_method(X, args.n_components, be, args))
    print(f"{args.method}: {X.shape[0]} points in {_seconds_text(seconds, compiling)}")
    save(args.output, Y)
    print(f"wrote {args.output}")
    if labels is not None:
        print(f"10-NN accuracy {knn_accuracy(Y, labels, k=10):.3f}")
    _print_auc(args, X, Y)
    if plot:
        _save_plot(Y, labels if labels is not None else "k", plot, path.name)
    return 0


def cmd_bench(args):
    runner = Path(__file__).resolve().parent.parent / "benchmarks" / "run.py"
    if not runner.is_file():
        raise FileNotFoundError("gpuembed bench runs benchmarks/run.py from a source checkout; "
                                "none was found next to this installation")
    return subprocess.call([sys.executable, str(runner), *args.names])


def _method_options(parser):
    parser.add_argument("--method", choices=sorted(METHODS), default="tsne",
                        help="msne: multi-scale SNE, whose unset options keep its own defaults")
    parser.add_argument("--perplexity", type=float,
                        help="default 30 (msne: its smallest scale, default 2)")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, help="default sd (msne: lbfgs)")
    parser.add_argument("--max-iter", type=int,
                        help="at most this many iterations (default 1000; msne: per scale, 100)")
    parser.add_argument("--tol", type=float,
                        help="stop when the relative objective decrease is below this "
                             "(default 1e-5 below 10,000 points, 1e-4 from there; msne: "
                             "1e-7)")
    parser.add_argument("--n-landmarks", type=int,
                        help="le: solve by Locally Linear Landmarks with this many landmarks")
    parser.add_argument("--z-neighbors", choices=("input", "graph"),
                        help="le with --n-landmarks: each point's landmarks the nearest in the "
                             "input space (default) or along the affinity graph")
    parser.add_argument("--landmarks", choices=LANDMARK_METHODS,
                        help="le with --n-landmarks: how the landmarks are chosen (default "
                             "random; spread: no two near neighbours on the affinity graph, "
                             "less error with few landmarks)")
    parser.add_argument("--refine", type=int,
                        help="le with --n-landmarks: steps of the random walk over the affinity "
                             "graph that move the embedding toward the exact one (default 0; 1 "
                             "about halved the error on Fashion-MNIST 70k)")
    parser.add_argument("--neighbors", choices=("auto", "exact", "approx"), default="auto",
                        help="k-NN search of the affinities (approx: k-means lists, 2x faster "
                             "at 20,000 points, 4.5x at 70,000, more beyond, some neighbours "
                             "missed; auto: approx from 50,000 points on the CPU)")
    parser.add_argument("--metric", choices=("euclidean", "cosine", "precomputed"),
                        default="euclidean",
                        help="how rows are compared (cosine: scaled to unit length first; "
                             "for text; precomputed: INPUT is an N x N distance matrix, or "
                             "a sparse k-NN graph of distances (.npz), which starts t-SNE and "
                             "the others from its spectral embedding, msne from random)")
    parser.add_argument("--random-state", type=int, default=None,
                        help="seed of the random parts (init random, landmarks)")
    parser.add_argument("--nbody", choices=("auto", "exact", "fgt", "bh"), default="auto",
                        help="N-body engine of the repulsive sums (fgt: Gaussian kernels only)")
    parser.add_argument("--backend", choices=("auto", "cpu", "gpu"), default="auto")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--auc", action="store_true",
                        help="also print the log-K AUC of R_NX (rank-based quality, O(N^2 log N); "
                             "of a sparse k-NN graph INPUT, up to the K its rows give)")


def build_parser():
    parser = argparse.ArgumentParser(prog="gpuembed", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gpuembed {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("info", help="versions, backend and GPU").set_defaults(func=cmd_info)

    demo = sub.add_parser("demo", help="embed a bundled dataset and write a PNG")
    demo.add_argument("--dataset", choices=DEMO_DATASETS, default="digits")
    demo.add_argument("-o", "--output", default="gpuembed-demo.png")
    _method_options(demo)
    demo.set_defaults(func=cmd_demo)

    embed = sub.add_parser("embed", help="embed a .npy or .csv file, or a sparse matrix "
                                          "(.npz from scipy.sparse.save_npz)")
    embed.add_argument("input")
    embed.add_argument("-o", "--output", required=True,
                       help="the embedding, as .npy or .csv (rows of comma-separated numbers)")
    embed.add_argument("--n-components", type=int, default=2)
    embed.add_argument("--labels", help=".npy, .csv or .txt file of labels, one per row of "
                                        "INPUT (for the accuracy and the plot)")
    embed.add_argument("--plot", help="write a scatter plot here (PNG, or the format of the "
                                      "suffix: pdf, svg, ...)")
    _method_options(embed)
    embed.set_defaults(func=cmd_embed)

    bench = sub.add_parser("bench", help="run the benchmark suite (source checkout)")
    bench.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, OSError, ImportError, BackendUnavailable) as exc:
        parser.exit(1, f"gpuembed {args.command}: error: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
