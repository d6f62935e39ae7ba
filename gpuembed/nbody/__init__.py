"""N-body kernel sums behind one interface: "exact" (tiled), "fgt" (fast Gauss
transform, Gaussian kernel), "bh" (Barnes-Hut); the last two in d <= 3.

Every engine returns [(S, SX) for each kernel] with S_n = sum_m w_m K(|y_n - x_m|^2)
and SX_n = sum_m w_m K(...) x_m (self pair excluded when the targets are the
sources), so the objectives and the out-of-sample mapping call them alike.
"""
from __future__ import annotations

import collections.abc

from .._checks import check_choice, check_data, check_float, check_int
from ..backend import get_backend
from .barneshut import DEFAULT_THETA, bh_sums
from .exact import KERNELS, exact_sums
from .fgt import DEFAULT_ORDER, MAX_ORDER, error_bound, fgt_sums, order_for_tolerance

__all__ = ["kernel_sums", "engine_sums", "exact_sums", "fgt_sums", "bh_sums", "resolve_method",
           "check_accuracy", "error_bound", "KERNELS", "METHODS"]

METHODS = ("exact", "fgt", "bh")
ACCURACY_PARAMETERS = {"exact": (), "fgt": ("p", "tol"), "bh": ("theta",)}
MAX_DIM = 3
# nbody="auto" uses the exact engine below these sizes (per device and kernel).
# CPU: where the fast engine first beats one exact kernel sum (S, SX) with the
# compiled loop (benchmarks/bench_nbody.py --parts crossover; 2-core EPYC, 2-D
# layouts of 10 blobs; rerun at 3c877c5, after the exact loop vectorized): for
# blobs of extent std 4 the exact Gaussian sums are 2.1x faster than the compiled
# FGT (p = 8) at 2,500 points and 1.5x slower at 5,000; for std 10 (a Fashion-MNIST
# 5k EE embedding has std 12) the FGT is ahead from 2,500 (1.7x; 2.1x at 5,000).
# The compiled Barnes-Hut walk (theta = 0.5; in groups of targets since 289f309,
# when it was slower than the exact Student-t pair at 2,500 points, 1.8 against
# 1.4 ms) is 1.8x faster at 2,500 (0.92 against 1.64 ms), 3.7x at 5,000 and 7.3x
# at 10,000; below 5,000 the exact sums still take a few ms and keep line
# searches exact.  For the Gaussian its error at theta = 0.5 is 0.75% (20,000
# points; 3% per target), the FGT's 1e-5 at p = 8, so the FGT stays.  GPU (an H200 at
# fac9faa, results/nbody_gpu.json "crossover", the tree built by kernels/bh_tree.cu):
# Barnes-Hut takes 1.2-1.8 ms from 2,500 to 200,000 points (13-16 ms on an H100
# when array code built its tree), the exact Student-t pair 0.89 ms at 20,000,
# 2.2 ms at 40,000 and 6.5 ms at 100,000; the FGT (p = 8) 5-7 ms up to 200,000,
# the exact Gaussian sums 4.7 ms at 100,000 and 18 ms at 200,000 (std 4 and 10).
# A fit on approximate sums takes more iterations (the default t-SNE of
# Fashion-MNIST 70k: 394 against 348, 7.0 against 10.8 ms each, 2.77 s against
# 3.77 s), so a sum must win by more than it does at 30,000.
AUTO_EXACT_BELOW = {"cpu": {"gaussian": 5_000, "student": 5_000},
                    "gpu": {"gaussian": 120_000, "student": 40_000}}


def resolve_method(method, n, dim, kernel, backend, exact_below=None):
    """The engine for ``nbody=method`` ("auto" picks by N, kernel, dimension, device;
    ``exact_below`` overrides the N below which it takes the exact engine)."""
    check_choice(method, "nbody", ("auto",) + METHODS)
    if method == "auto":
        below = exact_below or AUTO_EXACT_BELOW[backend.name][
            "gaussian" if kernel == "gaussian" else "student"]
        if dim > MAX_DIM or n < below:
            return "exact"
        return "fgt" if kernel == "gaussian" else "bh"
    if method != "exact" and dim > MAX_DIM:
        raise ValueError(f"nbody={method!r} works in at most {MAX_DIM} dimensions "
                         f"(n_components <= 3), got {dim}")
    if method == "fgt" and kernel not in (None, "gaussian"):
        raise ValueError(f"nbody='fgt' sums the Gaussian kernel only; the {kernel!r} kernel "
                         "needs nbody='bh' or 'exact'")
    return method


def check_accuracy(method, accuracy):
    """Validated accuracy parameters: fgt p (order, 1..16) or tol; bh theta >= 0."""
    if accuracy is not None and not isinstance(accuracy, collections.abc.Mapping):
        raise TypeError("accuracy must be a dict: {'theta': ...} for nbody='bh', {'p': ...} "
                        f"or {{'tol': ...}} for 'fgt', got {accuracy!r}")
    accuracy = dict(accuracy or {})
    allowed = ACCURACY_PARAMETERS[method]
    unknown = set(accuracy) - set(allowed)
    if unknown:
        raise TypeError(f"nbody={method!r} takes accuracy parameters {allowed}, "
                        f"got {sorted(unknown)}")
    if "p" in accuracy:
        check_int(accuracy["p"], "p", 1, MAX_ORDER)
    if "tol" in accuracy:
        check_float(accuracy["tol"], "tol", 0.0, 1.0, low_open=True)
    if "p" in accuracy and "tol" in accuracy:
        raise TypeError("give the FGT either p or tol, not both")
    if "theta" in accuracy:
        check_float(accuracy["theta"], "theta", 0.0)
    return accuracy


def engine_sums(be, method, X, kernels, Y=None, weights=None, accuracy=None, sources=None,
                **shifts):
    """[(S, SX) for each kernel] by engine ``method`` (already resolved).

    ``shifts`` (target_shift / source_shift) are an exact-engine feature.
    ``sources``: a dict the caller keeps while X and weights stay the same (new
    targets Y at every call), in which an engine may keep what depends on the
    sources alone (Barnes-Hut: the tree).
    """
    if method == "exact":
        return exact_sums(be, X, kernels, Y=Y, weights=weights, **shifts)
    if any(v is not None for v in shifts.values()):
        raise ValueError(f"nbody={method!r} does not take distance shifts; use 'exact'")
    accuracy = accuracy or {}
    if method == "fgt":
        p = accuracy.get("p")
        if p is None:
            tol = accuracy.get("tol")
            p = DEFAULT_ORDER if tol is None else order_for_tolerance(tol, X.shape[1])
        return fgt_sums(be, X, kernels, Y=Y, weights=weights, p=p)
    return bh_sums(be, X, kernels, Y=Y, weights=weights,
                   theta=accuracy.get("theta", DEFAULT_THETA), sources=sources)


def kernel_sums(X, kernel, method="exact", *, backend="auto", **accuracy):
    """S_n = sum_{m != n} K(|x_n - x_m|^2) and SX_n = sum_{m != n} K(...) x_m over the
    rows of ``X`` (N, d).

    kernel: "gaussian" exp(-t) | "student" 1/(1+t) | "student2" 1/(1+t)^2.
    method: "exact" | "fgt" (Gaussian only) | "bh" | "auto"; fgt and bh need d <= 3.
    accuracy: p (FGT order, default 8) or tol (FGT: smallest p whose error bound
    (5.5)-(5.7), relative to N, is below tol); theta (Barnes-Hut opening angle, default 0.5).
    Returns (S (N,), SX (N, d)) on the backend's device.
    """
    be = get_backend(backend)
    X = check_data(X, be)
    check_choice(kernel, "kernel", KERNELS)
    method = resolve_method(method, X.shape[0], X.shape[1], kernel, be)
    accuracy = check_accuracy(method, accuracy)
    return engine_sums(be, method, X, (kernel,), accuracy=accuracy)[0]
