"""What the GPU code paths ask of the device per optimizer iteration, counted on
the CUDA emulator (no GPU needed; the counts are the same on any machine):

- cupy calls: functions, operators, advanced indexing, assignments; most launch
  one kernel or more, and CuPy spends roughly 5-10 us of host time on each;
- RawKernel launches (kernels/*.cu);
- host reads of device values (float(), int(), bool(), .get()): each waits for
  every queued kernel, so the host cannot run ahead of the device.

Host time per iteration is at least calls x (5-10 us): the floor under each
iteration's time that no kernel speed removes, to compare with the GPU's
measured times.  Counts per iteration are the difference between fits of
FIRST and LAST iterations (setup excluded); the affinities and k-NN are
counted per call, the MLP mapping (MAC's F step) per minibatch, with and without
its CUDA graphs (a graph's launch is one call of the host's, whatever it replays).

    python benchmarks/gpu_call_counts.py      # writes results/gpu_call_counts.json
"""
from __future__ import annotations

import argparse
import sys
from unittest import mock
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path[:0] = [str(here), str(here.parent / "tests"), str(here.parent)]

from common import write_result  # noqa: E402
from emulated_cuda import install  # noqa: E402
from emulated_cupy import counting  # noqa: E402

import gpuembed as ge  # noqa: E402

FIRST, LAST = 5, 25
TOP_SITES = 6
ESTIMATORS = {
    "t-SNE classic, exact": (ge.TSNE, {"optimizer": "tsne", "nbody": "exact"}),
    "t-SNE sd (CG), exact": (ge.TSNE, {"optimizer": "sd", "nbody": "exact"}),
    "t-SNE sd (CG), bh": (ge.TSNE, {"optimizer": "sd", "nbody": "bh"}),
    "t-SNE lbfgs, exact": (ge.TSNE, {"optimizer": "lbfgs", "nbody": "exact"}),
    "EE sd (CG), exact": (ge.EE, {"optimizer": "sd", "nbody": "exact"}),
    "EE sd (CG), fgt": (ge.EE, {"optimizer": "sd", "nbody": "fgt"}),
    "multi-scale SNE lbfgs, exact": (ge.MultiscaleSNE, {"nbody": "exact"}),
}


def counted(fn):
    with counting(sites=True) as (counts, sites):
        result = fn()
    return result, dict(counts), sites


def top(sites, kind, per=1.0):
    rows = sorted(((n, site) for (k, site), n in sites.items() if k == kind), reverse=True)
    return [[site, round(n / per, 2)] for n, site in rows[:TOP_SITES]]


def per_iteration(cls, params, X, affinities, be):
    runs = {}
    for n_iter in (FIRST, LAST):
        # Multi-scale SNE builds its own affinities (counted too; max_iter is per stage).
        shared = {} if cls is ge.MultiscaleSNE else {"affinities": affinities}
        model, counts, sites = counted(lambda: cls(
            backend=be, max_iter=n_iter, tol=0, random_state=0, **shared, **params).fit(X))
        runs[n_iter] = (model.n_iter_, counts, sites)
    (it0, c0, s0), (it1, c1, s1) = runs[FIRST], runs[LAST]
    span = it1 - it0
    row = {kind: (c1.get(kind, 0) - c0.get(kind, 0)) / span
           for kind in ("calls", "kernels", "reads", "uploads")}
    s1.subtract(s0)
    row["top_call_sites"] = top(s1, "calls", span)
    row["top_read_sites"] = top(s1, "reads", span)
    return row


def mlp_minibatch(be, X, graphs):
    """One minibatch step of MAC's F step with an MLP (3-256-256-2, batch 100):
    the counts of one warm-started epoch over its minibatches, its segments
    replayed from CUDA graphs (``graphs``; the cold fit's epoch runs the calls
    once) or made as calls."""
    from gpuembed.parametric import MLPMapping

    Z = X[:, :2]
    with mock.patch.object(type(be), "can_capture", graphs):
        mlp = MLPMapping(hidden=(256, 256), initial_epochs=1, epochs=1,
                         random_state=0).fit(X, Z)
        _, counts, sites = counted(lambda: mlp.fit(X, Z, warm_start=True))
    batches = -(-X.shape[0] // mlp.batch_size)
    return {**{k: v / batches for k, v in counts.items()},
            "top_call_sites": top(sites, "calls", batches)}


def run(n):
    be = install()
    X, _ = ge.datasets.swiss_roll(n, random_state=0)
    X = be.asarray(X)
    figures = {"n": n, "data": "swiss_roll", "iterations": [FIRST, LAST],
               "per_iteration": {}, "per_call": {}}
    for order in ("bounds", "dk", "mst"):
        _, counts, sites = counted(lambda: ge.entropic_affinities(X, 30.0, order=order,
                                                                   backend=be))
        figures["per_call"][f"entropic_affinities order={order}"] = {
            **counts, "top_call_sites": top(sites, "calls")}
    _, counts, _ = counted(lambda: ge.knn(X, 90, backend=be))
    figures["per_call"]["knn k=90"] = counts
    figures["per_call"]["MLP mapping minibatch"] = mlp_minibatch(be, X, graphs=True)
    figures["per_call"]["MLP mapping minibatch, no graphs"] = mlp_minibatch(be, X, graphs=False)
    affinities = ge.entropic_affinities(X, 30.0, backend=be)
    for label, (cls, params) in ESTIMATORS.items():
        figures["per_iteration"][label] = row = per_iteration(cls, params, X, affinities, be)
        print(label, {k: round(v, 1) for k, v in row.items() if not k.startswith("top")},
              flush=True)
    return figures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args(argv)
    write_result("gpu_call_counts", run(args.n))


if __name__ == "__main__":
    main()
