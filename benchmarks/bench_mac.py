"""Parametric embeddings: MAC against chain-rule gradients (paper 001, figs 2 and 3).

1. ``cost``: seconds per iteration vs N on a 3-D swiss roll (EE, perplexity 30):
   the chain-rule gradient of a linear PE with the exact engine (the paper's
   baseline) and with the FGT, one MAC Z-step iteration (spectral direction,
   FGT gradient), and the F steps (linear least squares, one MLP epoch);
   fitted log-log slopes.
2. ``linear``: learning curves P(F) vs seconds for linear EE on rotating_objects
   (PCA to 15 dimensions): MAC (augmented-Lagrangian multipliers, the default;
   and the paper's quadratic penalty) vs chain-rule gradient descent with
   backtracking, all from the same free embedding and direct fit.
3. ``linear-fmnist``: linear EE on Fashion-MNIST (first N points after PCA
   to 50), the paper's MNIST setting: MAC with FGT Z steps against the chain
   rule with the exact gradient (the paper's baseline) and with the FGT.
4. ``rbf``: t-SNE with the RBF network (200 centres, least squares) on
   Fashion-MNIST (first N points after PCA to 50): MAC and MAC with the
   penalty against the chain rule by L-BFGS.
5. ``mlp``: the same for t-SNE with an MLP (50-256-256-2, Adam on minibatches of
   1,000) on Fashion-MNIST
   (first N points after PCA to 50), Barnes-Hut sums for MAC's Z step and for
   the chain rule's gradient (``--mlp-chain-iter`` iterations, 100; a longer run
   also gives MAC's speedup to its P(F) at CHAIN_CHECKPOINTS iterations); MAC also
   with one iteration per Z step, with a mu schedule 8x higher and with both, and
   one more MAC fit of the first two timed by phase (``mac_phases``).
6. ``mlp-kernels`` (``--backend gpu``): the MLP's minibatch products on the mlp
   part's shapes (1,000 rows, 50-256-256-2): kernels/mlp.cu's GEMM with each
   operand as back-propagation reads it (stored or a transposed view), whole and
   split over K as the minibatch steps run it, against CuPy's matmul (cuBLAS,
   which a CUDA graph capture refuses), and its column sums against CuPy's;
   microseconds per call, the best of REPEATS runs of ``--kernel-calls`` calls;
   and a whole minibatch step replayed from the F step's CUDA graph, its
   products split and all whole.
7. ``msne``: parametric multi-scale SNE (``ParametricEmbedding(MultiscaleSNE(),
   "mlp")``) against parametric t-SNE with the same MLP, on Fashion-MNIST (the
   first N points after PCA to 50, the last fifth held out): P(F), log-K AUC
   of R_NX of the training layout and of the held-out points' F(Y), their
   10-NN accuracy, fit and transform seconds; beside them the free
   MultiscaleSNE and TSNE with their own (non-parametric) transform.

``--mlp-params`` (JSON) overrides the MLP's parameters in the mlp and msne parts,
e.g. '{"batch_size": 100, "learning_rate": 0.001, "initial_epochs": 30}' (the mlp
part's network before it took minibatches of 1,000, MLP_TSNE).

The time of the free embedding (shared by all) is excluded from the curves.
``--backend gpu`` runs all of it on the GPU in its default float32 (the CPU:
float64).
Writes results/mac[_<suffix>].json after each part (the parts run now replace their earlier
figures, the others are kept) and results/mac_<part>.png.
"""
from __future__ import annotations

import argparse
import collections
import copy
import functools
import json
import time
from unittest import mock

import numpy as np

from common import (RESULTS, best_time, device_sync, heldout_accuracy, loglog_slope, pyplot,
                    write_result)
import gpuembed as ge
from gpuembed._checks import check_dtype
from gpuembed.backend import get_backend
from gpuembed.objectives import make_objective
from gpuembed.objectives.penalty import Penalized
from gpuembed.optim import Monitor, minimize
from gpuembed.parametric import LinearMapping, MLPMapping, chain_rule
from gpuembed.parametric import mac as mac_module
from gpuembed.parametric.mappings import MAPPINGS


# The free fits' stopping tolerance, fixed at the estimators' default before tol="auto"
# (1e-4 from 10,000 points): each part's figures stay comparable with its earlier runs.
FREE_TOL = 1e-5
# The mlp and msne parts' network (50-256-256-2, Adam) and MAC schedule.
MLP = {"hidden": (256, 256), "initial_epochs": 30, "epochs": 3, "random_state": 0}
# The mlp part's network trains on minibatches of 1,000 rows at rate 0.01 (100 epochs
# for the direct fit): 60 Adam steps per F step instead of 600 (on the GPU a step is
# the same few launches for 100 or 1,000 rows: not yet timed there), and on the CPU
# a lower P(F) at every second of the MAC path (Xeon VM, side runs: direct fit 3.164
# against 3.347, 2.973 at 8.1 s against 3.126 at 8.9 s, 2.683 at 15.9 s against
# 2.703 at 24.4 s).  Minibatches of 100 at rate 0.003 ended at 2.493 in 23.6 s, 5 or
# 10 epochs per F step of 1,000 at 2.540 and 2.308 in 24.6 and 39.3 s; with 30
# epochs the direct fit stayed at 3.485.  The msne part (2,000 training points)
# keeps minibatches of 100: with these its networks fitted the training points
# closer (parametric MultiscaleSNE P(F) 1426 against 1867) and the held-out ones
# worse (10-NN accuracy 0.592 against 0.606).
MLP_TSNE = {**MLP, "batch_size": 1000, "learning_rate": 0.01, "initial_epochs": 100}
MLP_MAC = {"n_mu": 8, "max_inner": 3, "z_max_iter": 10}
# The mlp part's t-SNE takes 3 Z-step iterations per F step: with an MLP the F
# steps set the pace.  There (CPU, minibatches of 100) P(F) passed the chain rule's
# final 3.110 at the 7th MAC step with 2, 3, 5 or 10 iterations per Z step (14, 21,
# 35 and 70 in all; with 1, at the 10th) and ended at 2.695, 2.679, 2.668 and 2.653;
# MAC reached that mark 4.3x (2), 4.4x (3) and 3.3x (10, at 3577492) sooner than the
# chain rule.  Multi-scale SNE's L-BFGS Z steps need more: with 3 the msne part's
# parametric MultiscaleSNE ended at P(F) 2061 against 1703, training AUC 0.495
# against 0.537.
MLP_MAC_TSNE = {**MLP_MAC, "z_max_iter": 3}
# Beside it the mlp part runs MAC with one iteration per Z step.  On the CPU the F
# steps set the pace and both pass the chain rule's final P(F) 2.956 level (side run
# at b813cae: the 13th MAC step at 10.6 s with 1, the 11th at 10.5 s with 3, 10.2 s
# with 2); on the H200 a Z-step iteration (a Barnes-Hut sum and a CG solve) cost
# about what a chain-rule iteration does, 4.2 ms, so 3 of them per step would cost
# more than the F step's 60 Adam steps are expected to.
MLP_MAC_TSNE_ONE_Z = {**MLP_MAC_TSNE, "z_max_iter": 1}
# And MAC with a schedule 8x higher: the default's first mu values move Z about 1% of
# the way and the path lingers there (with the multipliers every second step rises).
# On the CPU (side runs at b98d597, 20k, the chain rule's final 2.945) mu_start 0.01,
# 0.02, 0.04, 0.08 and 0.16 passed it at the 9th, 7th, 7th, 5th and 5th step and
# ended at 2.625, 2.601, 2.627, 2.638 and 2.669: sooner there, a little higher after.
# On the H200 a MAC step cost about 6 chain-rule iterations (a38b0f6), so the
# steps to the mark set the ratio there.  The estimator keeps 0.01: on 1,500 digits
# t-SNE's final P(F) rises with mu_start (linear map 2.095 at 0.01, 2.383 at 0.08;
# RBF network 1.643, 1.845), where EE's and s-SNE's stay within 0.5%.
MLP_MAC_TSNE_EARLY = {**MLP_MAC_TSNE, "mu_start": 0.08}
# Both at once: on the H200 at 4856c9f one Z-step iteration per step passed the mark
# at 0.246 s (1.85x) and mu_start 0.08 at 0.162 s (2.81x; the default 0.289 s).  Both
# at 1827a3e and 8f7b55f: the 8th step (0.197 s, 2.34x; 0.158 s, 3.84x), where the
# CPU's step count had said the 7th.
MLP_MAC_TSNE_ONE_Z_EARLY = {**MLP_MAC_TSNE_EARLY, **MLP_MAC_TSNE_ONE_Z}
# The chain rule's iterations at which the curves also give MAC's speedup, where a
# chain-rule run goes on past them (--mlp-chain-iter).
CHAIN_CHECKPOINTS = (100, 300)


def pca(X, d):
    Xc = X - X.mean(0)
    _, _, Vt = np.linalg.svd(Xc[:: max(1, len(X) // 5000)], full_matrices=False)
    return Xc @ Vt[:d].T


def cost(be, sizes, exact_max):
    rows = []
    dtype, sync = be.default_float, device_sync(be)
    for n in sizes:
        Y, _ = ge.datasets.swiss_roll(n, random_state=0)
        Y = be.asarray(Y, dtype=dtype)
        P = ge.entropic_affinities(Y, 30, backend=be).P
        Z = ge.initialization.initial_layout("pca", Y, 2, be, dtype, 5.0, 0)
        lin = LinearMapping().fit(Y, Z)
        timings = {}
        for engine in ("exact", "fgt"):
            if engine == "exact" and n > exact_max:
                continue
            objective = make_objective("ee", P, be, dtype, nbody=engine)

            def gradient():
                E, G = objective.value_and_grad(lin.predict(Y))
                return lin.backward(Y, G)
            timings[f"chain-rule gradient ({engine})"] = best_time(gradient, 2, sync)[0]
        objective = make_objective("ee", P, be, dtype, nbody="fgt")
        penalized = Penalized(objective, lin.predict(Y), 1e-3)
        # Best of two throughout: a first call may compile (on a fresh GPU machine SD's
        # first sparsified L+, at 5,000 points, made the Z step 0.33 s per iteration
        # instead of about 0.011 s: numba's compilation of the row selection).
        timings["MAC Z step, per iteration (sd, fgt)"] = best_time(
            lambda: minimize(penalized, Z, "sd", max_iter=10, tol=0.0, step_size=0.1), 2,
            sync)[0] / 10
        timings["MAC F step (linear, warm)"] = best_time(
            lambda: lin.fit(Y, Z, warm_start=True), 3, sync)[0]
        # Best of three: on the GPU the first epoch runs as calls, the second is
        # captured as a CUDA graph, the third replays it.  Beside it the calls alone.
        for graphs in (True, False) if be.is_gpu else (True,):
            with mock.patch.object(type(be), "can_capture", graphs and be.can_capture):
                mlp = MLPMapping(hidden=(100, 500), initial_epochs=0, epochs=1,
                                 random_state=0).fit(Y, Z)
                name = "MAC F step (MLP 3-100-500-2, one epoch)"
                timings[name + ("" if graphs else ", no graphs")] = best_time(
                    lambda: mlp.fit(Y, Z, warm_start=True), 3, sync)[0]
        for name, seconds in timings.items():
            rows.append({"n": n, "what": name, "seconds": seconds})
            print(rows[-1], flush=True)
    slopes = {name: loglog_slope([r for r in rows if r["what"] == name and r["n"] >= 2000])
              for name in sorted({r["what"] for r in rows})}
    slopes = {name: s for name, s in slopes.items() if s is not None}
    print(slopes)
    return rows, slopes


def curves(Y, embedding, mapping, macs, chain_engines, chain_max_iter, chain_direction,
           repeats=1):
    """MAC (one curve per entry of ``macs``: name -> parameters) and chain-rule
    learning curves from one free embedding (the first MAC's).  The runs are
    deterministic, their times are not (the same code has passed the chain rule
    2.1x and 2.8x sooner on this VM): with ``repeats`` > 1 everything runs again
    and "speedup_repeats" lists each run's speedups (the curves are the first
    run's)."""
    runs = [_curves_once(Y, embedding, mapping, macs, chain_engines, chain_max_iter,
                         chain_direction) for _ in range(repeats)]
    out = runs[0]
    if repeats > 1:
        out["speedup_repeats"] = [run["speedup_to_chain_final"] for run in runs]
    return out


def _curves_once(Y, embedding, mapping, macs, chain_engines, chain_max_iter, chain_direction):
    out, fits = {}, {}
    for name, mac_params in macs.items():
        pe = fits[name] = ge.ParametricEmbedding(embedding, mapping, **mac_params).fit(Y)
        t0 = pe.history_[0]["time"]
        out.setdefault("free_objective", pe.free_objective_)
        out[name] = [{"seconds": h["time"] - t0, "objective": h["objective"], "mu": h["mu"]}
                     for h in pe.history_]
        print(name, pe.objective_, out[name][-1]["seconds"], flush=True)
    pe = next(iter(fits.values()))
    be = get_backend(embedding.backend)
    dtype = check_dtype(embedding.dtype, be)
    Y_dev = be.asarray(Y, dtype=dtype)
    A = copy.copy(embedding)._affinity_matrix(Y_dev, be)
    Z = be.asarray(pe.free_embedding_, dtype=dtype)
    for engine in chain_engines:
        objective = make_objective(embedding.objective_name, A, be, dtype, nbody=engine)
        # The direct fit again: a cold fit of a copy of MAC's mapping (same seed).
        direct = copy.deepcopy(pe.mapping_).fit(Y_dev, Z)
        # The GPU runs the fit's minibatch steps after fit returns: without the sync
        # the chain rule's clock ran on them (on the H200 at fac9faa its first value
        # came 0.34 s after the start, its 100 iterations then took 0.42 s).
        device_sync(be)()
        start = time.perf_counter()
        history = []

        def record(iteration, elapsed, value, theta):
            history.append({"seconds": time.perf_counter() - start, "objective": value})
        chain_rule(objective, Y_dev, direct, direction=chain_direction, max_iter=chain_max_iter,
                   monitor=Monitor([record]))
        out[f"chain rule ({engine})"] = history
        print("chain", engine, history[-1], flush=True)
    out["speedup_to_chain_final"] = _speedup(out)
    # Where a chain-rule run went past CHAIN_CHECKPOINTS iterations: the ratio
    # depends on where the chain rule is stopped.
    at = {k: _speedup(out, k) for k in CHAIN_CHECKPOINTS}
    out["speedup_to_chain_at"] = {k: ratios for k, ratios in at.items() if ratios}
    return out


def _speedup(out, iterations=None):
    """For each chain-rule run and MAC curve: the chain rule's time to its P(F)
    after ``iterations`` iterations (None: its last) over the MAC curve's time to
    reach it (None: never reached); chain-rule runs that stopped sooner are left out."""
    result = {}
    macs = [key for key in out if key.startswith("MAC")]
    for key, hist in out.items():
        if not key.startswith("chain rule"):
            continue
        if iterations is None:
            chain = hist[-1]
        elif iterations < len(hist):
            chain = hist[iterations]
        else:
            continue
        for name in macs:
            mac = next((h["seconds"] for h in out[name] if h["objective"] <= chain["objective"]),
                       None)
            speedup = None if mac is None else chain["seconds"] / max(mac, 1e-9)
            result[f"{name} vs {key}"] = speedup
    return result


def mac_phases(Y, embedding, mapping, mac_params):
    """Where one MAC fit's time goes: the free embedding, the mapping's direct fit,
    then per MAC step the Z step, the F step (the mapping's warm fit and predict),
    the directions' builds (one per mu) and the rest (P(F) of each step, the
    constraint, the best mapping's copies), the device synchronized at each
    phase's ends.  A fit of its own, so that the curves' clocks carry no extra
    synchronization."""
    be = get_backend(embedding.backend)
    sync, seconds, active = device_sync(be), collections.Counter(), []
    fitted = ["direct fit"]             # the phase of the mapping's last fit, for its predict

    def timed(phase, fn):
        @functools.wraps(fn)            # MAC reads fit's signature (warm_start)
        def run(*args, **kwargs):
            if active:                  # within another phase (the free fit's direction)
                return fn(*args, **kwargs)
            name = phase(kwargs) if callable(phase) else phase
            sync()
            active.append(name)
            start = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
                sync()
            finally:
                active.pop()
            seconds[name] += time.perf_counter() - start
            return out
        return run

    def fit_phase(kwargs):
        fitted[0] = "F steps" if kwargs.get("warm_start") else "direct fit"
        return fitted[0]

    cls, directions = MAPPINGS[mapping], mac_module.DIRECTIONS
    with mock.patch.object(type(embedding), "_free_fit",
                           timed("free embedding", type(embedding)._free_fit)), \
            mock.patch.object(mac_module, "minimize", timed("Z steps", mac_module.minimize)), \
            mock.patch.object(cls, "fit", timed(fit_phase, cls.fit)), \
            mock.patch.object(cls, "predict", timed(lambda kwargs: fitted[0], cls.predict)), \
            mock.patch.dict(directions, {key: timed("directions", make)
                                         for key, make in directions.items()}):
        start = time.perf_counter()
        pe = ge.ParametricEmbedding(embedding, mapping, **mac_params).fit(Y)
        sync()
        total = time.perf_counter() - start
    seconds["rest"] = total - sum(seconds.values())
    steps = len(pe.history_) - 1
    return {"steps": steps, "objective": pe.objective_, "seconds": dict(seconds),
            "ms_per_step": {k: 1e3 * v / steps for k, v in seconds.items()
                            if k not in ("free embedding", "direct fit")}}


def parametric_vs_free(X, labels, backend, mlp, mac_params):
    """The free embeddings and their transform against MAC with an MLP, for
    MultiscaleSNE and TSNE; the held-out rows are X's last fifth."""
    n_train = len(X) * 4 // 5
    train, held = X[:n_train], X[n_train:]

    def scores(Z_train, Z_held):
        return {"auc_train": ge.metrics.auc_rnx(train, Z_train),
                "auc_held_out": ge.metrics.auc_rnx(held, Z_held),
                "knn_accuracy_held_out": heldout_accuracy(Z_train, labels[:n_train], Z_held,
                                                          labels[n_train:])}

    rows = {}
    for name, make in (("MultiscaleSNE", lambda: ge.MultiscaleSNE(backend=backend,
                                                                  random_state=0)),
                       ("TSNE", lambda: ge.TSNE(backend=backend, random_state=0))):
        start = time.perf_counter()
        free = make().fit(train)
        fit = time.perf_counter() - start
        start = time.perf_counter()
        Z_held = free.transform(held)
        rows[name] = {"objective": free.objective_, "fit_seconds": fit,
                      "transform_seconds": time.perf_counter() - start,
                      **scores(free.embedding_, Z_held)}
        start = time.perf_counter()
        pe = ge.ParametricEmbedding(make(), "mlp", mapping_params=mlp, random_state=0,
                                    **mac_params).fit(train)
        fit = time.perf_counter() - start
        start = time.perf_counter()
        Z_held = pe.transform(held)
        rows[f"parametric {name}"] = {
            "free_objective": pe.free_objective_,
            "direct_fit_objective": pe.history_[0]["objective"],
            "objective": pe.objective_, "fit_seconds": fit,
            "transform_seconds": time.perf_counter() - start, **scores(pe.embedding_, Z_held)}
        for key in (name, f"parametric {name}"):
            print(key, rows[key], flush=True)
    return {"n_train": n_train, "n_held_out": len(held), "mlp": mlp, "mac": mac_params, **rows}


def plot(data, path, title):
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for key, hist in data.items():
        if key.startswith(("MAC", "chain rule")):
            ax.plot([max(h["seconds"], 1e-3) for h in hist], [h["objective"] for h in hist],
                    ".-", label=key)
    ax.axhline(data["free_objective"], color="gray", ls=":", label="free embedding E(X*)")
    ax.set_xscale("log")
    ax.set_xlabel("seconds (after the free embedding)")
    ax.set_ylabel("P(F) = E(F(Y))")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


REPEATS = 5


def minibatch_products(rows, sizes):
    """(label, M, K, N, which operands are transposed views) of each product of a
    minibatch step of ``rows`` rows through a net of layer ``sizes``: forward,
    then back-propagation's weight gradients A^T delta and deltas delta W^T."""
    last = len(sizes) - 2
    products = [(f"forward {i + 1}", rows, a, b, "") for i, (a, b) in
                enumerate(zip(sizes[:-1], sizes[1:]))]
    for i in range(last, -1, -1):
        products.append((f"dW{i + 1} = A^T delta", sizes[i], rows, sizes[i + 1], "A"))
        if i:
            products.append((f"delta{i} = delta W{i + 1}^T", rows, sizes[i + 1], sizes[i], "B"))
    return products


def mlp_kernels(be, rows, calls):
    """Microseconds per call of each product of the mlp part's minibatch step (its
    network on 50-D input) by kernels/mlp.cu, whole and as the minibatch step runs
    it (split over K where gemm_splits says so, with the second launch), and by
    CuPy's matmul, and of the bias gradients' column sums (float32)."""
    from gpuembed.parametric.mappings import GEMM_WORKSPACE, column_sums, gemm, gemm_splits
    xp, sync, rng = be.xp, device_sync(be), np.random.default_rng(0)
    workspace = xp.empty(GEMM_WORKSPACE, dtype=np.float32)
    sizes = (50,) + MLP["hidden"] + (2,)

    def per_call(fn):
        fn()
        seconds, _ = best_time(lambda: [fn() for _ in range(calls)], REPEATS, sync)
        return round(seconds / calls * 1e6, 2)

    def operand(m, n, transposed):
        # A transposed view reads the stored transpose, as back-propagation's A^T, W^T.
        A = rng.normal(size=(m, n)).astype(np.float32)
        return be.asarray(A.T.copy()).T if transposed else be.asarray(A)
    products = []
    for label, M, K, N, views in minibatch_products(rows, sizes):
        A, B = operand(M, K, "A" in views), operand(K, N, "B" in views)
        out = xp.empty((M, N), dtype=np.float32)
        products.append({"product": label, "M": M, "K": K, "N": N, "transposed": views,
                         "gemm_us": per_call(lambda: gemm(A, B, out)),
                         "splits": gemm_splits(M, N, K)[0],
                         "gemm_split_us": per_call(lambda: gemm(A, B, out, workspace)),
                         "cupy_matmul_us": per_call(lambda: xp.matmul(A, B, out=out))})
        print(products[-1], flush=True)
    sums = []
    for cols in sorted(set(sizes[1:])):
        D, out = operand(rows, cols, False), xp.empty(cols, dtype=np.float32)
        sums.append({"rows": rows, "cols": cols,
                     "column_sums_us": per_call(lambda: column_sums(D, out)),
                     "cupy_sum_us": per_call(lambda: D.sum(axis=0, out=out))})
        print(sums[-1], flush=True)
    # A minibatch step as the F step runs it: an epoch of 20 steps replayed from its
    # CUDA graph, with the products split where gemm_splits says and all whole.  The
    # calls above pay a host launch each (about 19 us on the H200), which hides what
    # the split saves or costs inside a graph.
    epoch_steps = 20
    Y = be.asarray(rng.normal(size=(epoch_steps * rows, sizes[0])).astype(np.float32))
    Z = be.asarray(rng.normal(size=(epoch_steps * rows, sizes[-1])).astype(np.float32))
    steps = {}
    for label, splits in (("split", gemm_splits), ("whole", lambda M, N, K: (1, K))):
        with mock.patch("gpuembed.parametric.mappings.gemm_splits", splits):
            mlp = MLPMapping(**{**MLP_TSNE, "initial_epochs": 0, "epochs": 1}).fit(Y, Z)
            seconds, _ = best_time(lambda: mlp.fit(Y, Z, warm_start=True), REPEATS, sync)
        steps[label] = round(seconds / epoch_steps * 1e6, 2)
    print("minibatch step (us)", steps, flush=True)
    return {"rows": rows, "sizes": sizes, "products": products, "column_sums": sums,
            "minibatch_step_us": steps,
            "gemm_total_us": round(sum(r["gemm_us"] for r in products), 2),
            "gemm_split_total_us": round(sum(r["gemm_split_us"] for r in products), 2),
            "cupy_matmul_total_us": round(sum(r["cupy_matmul_us"] for r in products), 2)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="cost,linear,mlp")
    parser.add_argument("--max-n", type=int, default=50000)
    parser.add_argument("--exact-max-n", type=int, default=20000)
    parser.add_argument("--mlp-n", type=int, default=20000)
    parser.add_argument("--linear-n", type=int, default=10000)
    parser.add_argument("--rbf-n", type=int, default=5000)
    parser.add_argument("--msne-n", type=int, default=2500)
    parser.add_argument("--chain-iter", type=int, default=100)
    parser.add_argument("--mlp-chain-iter", type=int, default=100,
                        help="the mlp part's chain-rule iterations")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run the mlp and rbf parts' curves this many times (timing noise)")
    parser.add_argument("--mlp-params", type=json.loads, default={},
                        help="JSON object of MLPMapping parameters over the mlp and msne "
                             "parts' network")
    parser.add_argument("--kernel-calls", type=int, default=100,
                        help="the mlp-kernels part's calls per timing")
    parser.add_argument("--suffix", default="")
    parser.add_argument("--backend", default="cpu")
    args = parser.parse_args()
    be = get_backend(args.backend)
    parts = args.parts.split(",")
    figures = {}

    def record(key, data):
        # Written after each part, so a device call cut by its limit keeps the parts done.
        figures[key] = data
        write_result("mac", figures, args.suffix, merge=True)

    if "cost" in parts:
        sizes = [n for n in (1000, 2000, 5000, 10000, 20000, 50000) if n <= args.max_n]
        rows, slopes = cost(be, sizes, args.exact_max_n)
        record("cost", {"rows": rows, "slopes": slopes})
    if "linear" in parts:
        X, _ = ge.datasets.rotating_objects()
        data = curves(pca(X, 15), ge.EE(backend=be, random_state=0), "linear",
                      {"MAC": {"mu_start": 1.0}, "MAC (penalty)": {"augmented": False}},
                      ("exact",), 300, "gd")
        record("linear_ee_rotating_objects", data)
        plot(data, RESULTS / f"mac_linear{args.suffix}.png", "linear EE, rotating_objects")
    if "linear-fmnist" in parts:
        X, _ = ge.datasets.fashion_mnist()
        Y = pca(X[: args.linear_n].astype(np.float64), 50)
        data = curves(Y, ge.EE(backend=be, nbody="fgt", random_state=0, tol=FREE_TOL), "linear",
                      {"MAC": {"mu_start": 0.1}, "MAC (penalty)": {"augmented": False}},
                      ("fgt", "exact"), args.chain_iter, "gd")
        record("linear_ee_fashion_mnist", {"n": args.linear_n, **data})
        plot(data, RESULTS / f"mac_linear_fmnist{args.suffix}.png",
             f"linear EE, Fashion-MNIST {args.linear_n}")
    if "rbf" in parts:
        X, _ = ge.datasets.fashion_mnist()
        Y = pca(X[: args.rbf_n].astype(np.float64), 50)
        mac = {"random_state": 0}
        data = curves(Y, ge.TSNE(backend=be, random_state=0), "rbf",
                      {"MAC": mac, "MAC (penalty)": {**mac, "augmented": False}},
                      ("bh",), args.chain_iter * 10, "lbfgs", args.repeats)
        record("tsne_rbf_fashion_mnist", {"n": args.rbf_n, **data})
        plot(data, RESULTS / f"mac_rbf{args.suffix}.png",
             f"t-SNE + RBF network, Fashion-MNIST {args.rbf_n}")
    if "mlp" in parts:
        X, _ = ge.datasets.fashion_mnist()
        Y = pca(X[: args.mlp_n].astype(np.float64), 50)
        mlp = {**MLP_TSNE, **args.mlp_params}
        mac = {"mapping_params": mlp, **MLP_MAC_TSNE}
        tsne = ge.TSNE(backend=be, nbody="bh", random_state=0, max_iter=200, tol=FREE_TOL)
        one_z = {**mac, **MLP_MAC_TSNE_ONE_Z}
        data = curves(Y, tsne, "mlp", {"MAC": mac, "MAC (penalty)": {**mac, "augmented": False},
                                       "MAC (1 Z iteration)": one_z,
                                       "MAC (mu_start 0.08)": {**mac, **MLP_MAC_TSNE_EARLY},
                                       "MAC (1 Z iteration, mu_start 0.08)":
                                           {**mac, **MLP_MAC_TSNE_ONE_Z_EARLY}},
                      ("bh",), args.mlp_chain_iter, "gd", args.repeats)
        phases = {key: mac_phases(Y, tsne, "mlp", params)
                  for key, params in (("MAC", mac), ("MAC (1 Z iteration)", one_z))}
        print("phases", phases, flush=True)
        record("tsne_mlp_fashion_mnist", {"n": args.mlp_n, "mlp": mlp, **data, "phases": phases})
        plot(data, RESULTS / f"mac_mlp{args.suffix}.png",
             f"t-SNE + MLP, Fashion-MNIST {args.mlp_n}")
    if "mlp-kernels" in parts:
        record("mlp_kernels", mlp_kernels(be, MLP_TSNE["batch_size"], args.kernel_calls))
    if "msne" in parts:
        X, labels = ge.datasets.fashion_mnist()
        Y = pca(X[: args.msne_n].astype(np.float64), 50)
        record("parametric_msne_fashion_mnist", {"n": args.msne_n, **parametric_vs_free(
            Y, labels[: args.msne_n], be, {**MLP, **args.mlp_params}, MLP_MAC)})


if __name__ == "__main__":
    main()
