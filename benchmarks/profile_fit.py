"""Where a default t-SNE fit's time goes: cProfile of TSNE().fit on the first
``--n`` Fashion-MNIST images from their affinities (computed first, not
profiled), after a warm-up fit that compiles what the timed one uses.

On the GPU the work is asynchronous, so a function's time there is what the
host waited in it: the host reads (the line search's values, the refreshes'
copies of W to the host) are where the device's queue drains, and cumulative
times of the functions above them hold it.  Per-call times of SD's refresh
(``Spectral._build``) and solve (``Spectral._solve``) are given apart.

Writes results/profile_<backend>_n<N>.json (``--suffix`` for another name): the
fit's seconds and iterations and the gpuembed functions with the largest
cumulative times.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from pathlib import Path

from common import warm_up_tsne, write_result

import gpuembed as ge

PACKAGE = Path(ge.__file__).resolve().parent


def profile_fit(n, backend, top):
    be = ge.get_backend(backend)
    X, _ = ge.datasets.fashion_mnist()
    X = X[:n]
    P = ge.entropic_affinities(X, 30.0, backend=be).P
    warm_up_tsne(be, X, n)
    model = ge.TSNE(affinities=P, random_state=0, backend=be)
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    model.fit(X)
    profiler.disable()
    seconds = time.perf_counter() - start
    functions = []
    for (path, line, name), (_, calls, tottime, cumtime, _) in pstats.Stats(profiler).stats.items():
        if Path(path).resolve().is_relative_to(PACKAGE):
            where = f"{Path(path).resolve().relative_to(PACKAGE.parent)}:{line}({name})"
            functions.append({"function": where, "calls": calls, "tottime": tottime,
                              "cumtime": cumtime, "per_call": cumtime / calls})
    functions.sort(key=lambda f: -f["cumtime"])
    for f in functions[:top]:
        print(f"{f['cumtime']:8.3f} s {f['calls']:6d} calls {1e3 * f['per_call']:9.3f} ms/call  "
              f"{f['function']}")
    # cProfile names functions without their class: SD's are directions.py's.
    sd = {name: max(({k: f[k] for k in ("calls", "cumtime", "per_call")} for f in functions
                     if f["function"].startswith("gpuembed/optim/directions.py")
                     and f["function"].endswith(f"({name})")),
                    key=lambda f: f["calls"], default=None)
          for name in ("_build", "_solve")}
    print(f"fit {seconds:.2f} s, {model.n_iter_} iterations; SD {sd}")
    return {"n": n, "seconds": seconds, "iterations": model.n_iter_,
            "objective": model.objective_, "sd": sd, "functions": functions[:top]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--suffix", default=None)
    args = parser.parse_args()
    figures = {"tsne_fit": profile_fit(args.n, args.backend, args.top)}
    write_result("profile", figures, args.suffix or f"_{args.backend}_n{args.n}")


if __name__ == "__main__":
    main()
