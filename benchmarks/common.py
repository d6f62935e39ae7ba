"""Shared helpers for the benchmark scripts: environment record, timing, JSON output."""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# Benchmarks measure the checkout they live in, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# GPUEMBED_BENCH_OUTPUT=<folder>: the results and the neighbours' cache go to its
# results/ and .cache/ instead of benchmarks/ (tests/test_benchmarks.py's toy runs).
OUTPUT = Path(os.environ.get("GPUEMBED_BENCH_OUTPUT") or Path(__file__).resolve().parent)
RESULTS = OUTPUT / "results"
RESULTS.mkdir(parents=True, exist_ok=True)      # plots are saved before the JSON


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit():
    """HEAD, marked "-dirty" where tracked files outside benchmarks/results differ
    from it, or $GPUEMBED_COMMIT where set.  The device machine's copy of the
    repository keeps the git state its session began at under the latest files:
    unmarked, its results named that first commit."""
    if os.environ.get("GPUEMBED_COMMIT"):
        return os.environ["GPUEMBED_COMMIT"]
    root = Path(__file__).parent.parent

    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=root,
                              check=True).stdout.strip()

    try:
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                      ":(exclude)benchmarks/results")
        return git("rev-parse", "HEAD") + ("-dirty" if changed else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def environment():
    import scipy

    import gpuembed
    from gpuembed.backend import BackendUnavailable, get_backend

    versions = {"gpuembed": gpuembed.__version__, "numpy": np.__version__,
                "scipy": scipy.__version__, "python": platform.python_version()}
    for name in ("sklearn", "openTSNE", "cupy"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            pass
    try:
        gpu = get_backend("gpu").device_name
    except BackendUnavailable:
        gpu = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": platform.node(),
        "cpu": cpu_name(),
        "n_cpus": os.cpu_count(),
        "gpu": gpu,
        "versions": versions,
    }


def best_time(fn, repeat=1, sync=None):
    """Minimum wall time of ``repeat`` calls and the last result."""
    best, result = np.inf, None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        if sync is not None:
            sync()
        best = min(best, time.perf_counter() - start)
    return best, result


def heldout_accuracy(Y_train, y_train, Y_new, y_new, k=10):
    """Held-out points classified by the majority of their k nearest training
    points in the layout: the fraction right."""
    from sklearn.neighbors import KNeighborsClassifier

    return float(KNeighborsClassifier(k).fit(Y_train, y_train).score(Y_new, y_new))


def loglog_slope(rows, key="seconds"):
    """The fitted slope of log rows[key] against log rows["n"], None below two rows."""
    if len(rows) < 2:
        return None
    return float(np.polyfit(np.log([r["n"] for r in rows]), np.log([r[key] for r in rows]), 1)[0])


def warm_up_tsne(be, X, n, nbody="auto"):
    """Compile and load what a default t-SNE fit of n points uses, on X's first 2,000
    rows: the N-body engine ``nbody`` names or "auto" takes at n (not the one it
    takes at 2,000), SD's refresh (iteration 50) on the sparsified B solved by CG,
    as at large N, and the classic optimizer.  With a warm-up of 2 iterations on
    500 points by Barnes-Hut, the first timed default fit of Fashion-MNIST 70k on
    an H200 (fac9faa, exact sums) took 5.5 s, a profiled fit after this warm-up
    3.5 s along the same 348 iterations."""
    import gpuembed as ge

    nbody = ge.nbody.resolve_method(nbody, n, 2, "student", be)
    X = X[:2000]
    ge.TSNE(nbody=nbody, max_iter=60, kappa=5, sd_solver="cg", backend=be).fit(X)
    ge.TSNE(optimizer="tsne", nbody=nbody, max_iter=2, backend=be).fit(X)


def device_sync(be):
    """The ``sync`` for best_time: wait for the GPU's queued work (nothing to wait
    for with NumPy arrays, the CPU's and the CUDA emulator's)."""
    return be.xp.cuda.Device().synchronize if be.xp is not np else (lambda: None)


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def write_result(name, figures, suffix="", merge=False):
    """Write results/<name><suffix>.json.  With ``merge`` the figures of an earlier
    run that this one did not redo are kept, and "figure_runs" records the date,
    commit, CPU and GPU of the run that made each figure (the header is the last
    run's)."""
    env = environment()
    path = RESULTS / f"{name}{suffix}.json"
    record = {"benchmark": name, **env, "figures": figures}
    if merge:
        stamp = {key: env[key] for key in ("date", "commit", "cpu", "gpu")}
        old = json.loads(path.read_text()) if path.is_file() else {}
        old_runs = old.get("figure_runs") or {key: {"date": old["date"], "commit": old["commit"]}
                                              for key in old.get("figures", {})}
        # Runs stamped before the device was: the file's device made them.  Runs
        # stamped before session 80 name no CPU: the header names the last run's.
        old_runs = {key: {"gpu": old.get("gpu"), **run} for key, run in old_runs.items()}
        record["figures"] = {**old.get("figures", {}), **figures}
        record["figure_runs"] = {**old_runs, **{key: stamp for key in figures}}
    text = json.dumps(record, indent=2, default=_jsonable) + "\n"
    path.write_text(text)
    # A copy at once where GPUEMBED_RESULTS_COPY says (the device call's $OUT, set by
    # gpu_session.sh): what a script writes before its call is cut still comes back.
    mirror = os.environ.get("GPUEMBED_RESULTS_COPY")
    if mirror:
        Path(mirror, path.name).write_text(text)
    print(f"wrote {path}")
    return path


def _jsonable(obj):
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(type(obj))


CACHE = OUTPUT / ".cache"


def fashion_mnist_knn(k, n=None):
    """Fashion-MNIST (first n points) and its exact k-NN (computed on the GPU where
    there is one), cached in benchmarks/.cache/."""
    import gpuembed as ge

    X, y = ge.datasets.fashion_mnist()
    if n:
        X, y = X[:n], y[:n]
    path = CACHE / f"fmnist_n{X.shape[0]}_k{k}.npz"
    if path.is_file():
        data = np.load(path)
        return X, y, data["sqdist"], data["indices"]
    be = ge.get_backend("auto")
    sqdist, indices = (be.to_host(a) for a in ge.knn(X, k, backend=be))
    CACHE.mkdir(exist_ok=True)
    np.savez(path, sqdist=sqdist, indices=indices)
    return X, y, sqdist, indices


def bag_of_words(n, vocab=20_000, mean_length=80, zipf=1.1, seed=0):
    """Synthetic documents as TF-IDF rows (CSR float32, unit length): Poisson
    lengths, words drawn from a Zipf law over ``vocab`` words, so that the
    common words make the inner products of all pairs nonzero, as in real text."""
    return topic_documents(n, 1, vocab, mean_length, zipf, topic_share=0.0, seed=seed)[0]


def topic_documents(n, n_topics, vocab=20_000, mean_length=80, zipf=1.1, topic_share=0.1,
                    seed=0):
    """(TF-IDF rows as in bag_of_words, topic labels): each word is drawn from
    the shared Zipf law, or with probability ``topic_share`` from the document's
    topic's own Zipf law (the same law over a topic's shuffled vocabulary)."""
    import scipy.sparse

    rng = np.random.default_rng(seed)
    labels = rng.integers(n_topics, size=n)
    lengths = rng.poisson(mean_length, n) + 1
    p = 1.0 / np.arange(1, vocab + 1) ** zipf
    words = rng.choice(vocab, lengths.sum(), p=p / p.sum())
    doc = np.repeat(np.arange(n), lengths)
    own = rng.random(words.size) < topic_share
    topic_words = np.stack([rng.permutation(vocab) for _ in range(n_topics)])
    words[own] = topic_words[labels[doc[own]], words[own]]
    X = scipy.sparse.csr_matrix((np.ones(words.size), (doc, words)), shape=(n, vocab))
    X.sum_duplicates()
    document_frequency = np.bincount(X.indices, minlength=vocab)
    X.data *= np.log((1 + n) / (1 + document_frequency[X.indices])) + 1
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    return (scipy.sparse.diags(1 / norms) @ X).tocsr().astype(np.float32), labels
