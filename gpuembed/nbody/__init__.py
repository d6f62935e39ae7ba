"""N-body kernel sums behind one interface (exact engine; FGT and Barnes-Hut follow)."""
from __future__ import annotations

from .._checks import check_choice, check_data
from ..backend import get_backend
from .exact import KERNELS, exact_sums

__all__ = ["kernel_sums", "exact_sums", "resolve_method", "KERNELS", "METHODS"]

METHODS = ("exact",)


def resolve_method(method, n, dim, kernel, backend):
    """The engine ``nbody="auto"`` picks; only the exact engine exists so far."""
    if method == "auto":
        return "exact"
    return check_choice(method, "nbody", METHODS)


def kernel_sums(X, kernel, method="exact", *, backend="auto", **accuracy):
    """S_n = sum_{m != n} K(|x_n - x_m|^2) and SX_n = sum_{m != n} K(...) x_m.

    kernel: "gaussian" exp(-t) | "student" 1/(1+t) | "student2" 1/(1+t)^2.
    Returns (S (N,), SX (N, d)) on the backend's device.
    """
    be = get_backend(backend)
    X = check_data(X, be)
    check_choice(kernel, "kernel", KERNELS)
    method = resolve_method(method, X.shape[0], X.shape[1], kernel, be)
    if accuracy:
        raise TypeError(f"the exact engine takes no accuracy parameters, got {sorted(accuracy)}")
    return exact_sums(be, X, (kernel,))[0]
