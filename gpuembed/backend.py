"""Compute backends: one object that carries the array module and its helpers.

A public entry point resolves ``backend="auto" | "cpu" | "gpu"`` once with
:func:`get_backend` and passes the :class:`Backend` down; nothing below it
re-detects the device.  CuPy is imported here and only here, lazily, so the
CPU path never needs it.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse
import scipy.sparse.linalg

from .median_cpu import middle_values

__all__ = ["Backend", "BackendUnavailable", "get_backend", "kernel_path", "kernel_source"]


@functools.lru_cache(maxsize=None)
def _blas_controller():
    """threadpoolctl's controller of the BLAS libraries loaded now (NumPy's and
    SciPy's OpenBLAS, which this module imports), made once: each
    ``threadpool_limits`` scans the process's libraries again, 0.65 ms against
    0.009 ms for a limit by this controller."""
    from threadpoolctl import ThreadpoolController
    return ThreadpoolController()


# BLAS's thread count is the process's: the serial sections of fits in several
# Python threads share one limit, set as the first begins and lifted as the last
# ends.  A limit per section, restored as it ended, put other threads' sections
# back on OpenBLAS's threads, whose products cut differently (t-SNE of digits
# beside three other fits: coordinates 0.57 apart from the same fit alone).
_SERIAL = {"lock": threading.Lock(), "depth": 0, "limiter": None}


@contextlib.contextmanager
def _serial_blas_section():
    with _SERIAL["lock"]:
        if _SERIAL["depth"] == 0:
            with _blas_control():
                _SERIAL["limiter"] = _blas_controller().limit(limits=1, user_api="blas")
        _SERIAL["depth"] += 1
    try:
        yield
    finally:
        with _SERIAL["lock"]:
            _SERIAL["depth"] -= 1
            if _SERIAL["depth"] == 0:
                with _blas_control():
                    _SERIAL["limiter"].restore_original_limits()


@contextlib.contextmanager
def _blas_control():
    """This thread's hold on OpenBLAS's limit while the lock above is held:
    threadpoolctl (from 3.8) lets only one thread set a pthreads OpenBLAS's
    thread count, the first to set it, until it lets go, and silently ignores the
    others, whose sections then ran on OpenBLAS's threads (a fit in a worker
    thread gave other bits than in the main thread)."""
    from threadpoolctl import OpenBLASController

    release = getattr(OpenBLASController, "clear_controlling_thread", lambda force: None)
    release(force=True)
    try:
        yield
    finally:
        release(force=True)


BACKEND_NAMES = ("auto", "cpu", "gpu")


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here (no CuPy, or no CUDA device)."""


class Backend:
    """Array module plus the few operations that differ between NumPy and CuPy.

    Attributes
    ----------
    name : "cpu" or "gpu"
    xp : the array module (numpy or cupy)
    sparse : scipy.sparse or cupyx.scipy.sparse
    sparse_linalg : scipy.sparse.linalg or cupyx.scipy.sparse.linalg
    default_float : float64 on the CPU, float32 on the GPU (DESIGN.md rule 3)
    device_name : human-readable device name
    """

    def __init__(self, name, xp, sparse, sparse_linalg, default_float, device_name):
        self.name = name
        self.xp = xp
        self.sparse = sparse
        self.sparse_linalg = sparse_linalg
        self.default_float = np.dtype(default_float)
        self.device_name = device_name

    def __repr__(self):
        return f"Backend(name={self.name!r}, device={self.device_name!r})"

    def __reduce__(self):
        # Pickled by name (its modules cannot be): a fitted estimator saved with
        # pickle or joblib finds its backend again where it is loaded.
        return get_backend, (self.name,)

    @property
    def is_gpu(self):
        return self.name == "gpu"

    @property
    def can_capture(self):
        """Whether :meth:`capture` records CUDA graphs here (CuPy on CUDA)."""
        return self.is_gpu and not self.xp.cuda.runtime.is_hip

    def capture(self, work):
        """``work()``'s device work recorded once as a CUDA graph, not run; the
        returned object's ``launch()`` replays it on the current stream, on the
        arrays ``work`` touched (their contents at launch).  ``work`` must not read
        device values on the host (no host synchronization during capture) nor call
        cuBLAS (CuPy raises NotImplementedError), and every host value it passes to
        the device is frozen into the graph.  What it allocates comes from a memory
        pool of the graph's own, kept as long as the graph: temporaries freed during
        capture are not reused elsewhere while the graph may still write them."""
        cupy = self.xp
        stream, pool = cupy.cuda.Stream(non_blocking=True), cupy.cuda.MemoryPool()
        with cupy.cuda.using_allocator(pool.malloc), stream:
            stream.begin_capture()
            try:
                work()
            finally:
                graph = stream.end_capture()
        return CapturedGraph(graph, pool)

    def try_capture(self, work, what):
        """:meth:`capture`, or False with a RuntimeWarning where CUDA refuses the
        capture (``what``, the work's name in the warning, then runs as calls)."""
        try:
            return self.capture(work)
        except RuntimeError as exc:
            warnings.warn(f"CUDA graph capture failed ({exc}); {what} run without graphs",
                          RuntimeWarning)
            return False

    def asarray(self, a, dtype=None):
        """Move ``a`` (numpy, cupy or list) to this backend's device, as ``dtype``."""
        if self.is_gpu:
            return self.xp.asarray(a, dtype=dtype)
        if hasattr(a, "get") and not isinstance(a, np.ndarray):  # a cupy array
            a = a.get()
        return np.asarray(a, dtype=dtype)

    def host_floats(self, *values):
        """Python floats of scalar ``values`` (0-d device arrays on the GPU) in one host read:
        each read waits for all the queued work, so reading two separately drains
        the device's queue twice."""
        if not self.is_gpu:
            return tuple(float(v) for v in values)
        # stack promotes mixed dtypes (float32 sums beside float64 ones) exactly
        return tuple(self.to_host(self.xp.stack(values)).tolist())

    def to_host(self, a):
        """Return ``a`` as a numpy array (sparse matrices come back as scipy CSR)."""
        if a is None or isinstance(a, np.ndarray) or np.isscalar(a):
            return a
        if scipy.sparse.issparse(a):
            return a
        if hasattr(a, "get"):
            out = a.get()
            return out.tocsr() if hasattr(out, "tocsr") else out
        return np.asarray(a)

    def median(self, a):
        """np.median of the non-empty 1-D array ``a`` of finite floats as a Python
        float, the same value.  On the CPU by radix selection (median_cpu.py):
        NumPy's partition took 0.69-0.80 ms over t-SNE's 58,124 edges of
        rotating_objects (SD's refreshed curvature, tsne.attractive_weights), a
        third of a refresh of B there, against 0.20 ms."""
        if self.is_gpu:
            return float(self.xp.median(a))
        a = np.asarray(a)
        lo, hi = middle_values(np.ascontiguousarray(a, dtype=np.float64))
        if a.size % 2:
            return float(hi)
        # The mean in a's dtype, as np.median's.
        return float((a.dtype.type(lo) + a.dtype.type(hi)) / 2)

    def serial_blas(self):
        """Context in which NumPy's BLAS runs on one thread (the CPU; no-op on the
        GPU), for loops that interleave small BLAS calls (dot products of N x d
        arrays) with numba's parallel sweeps: OpenBLAS's workers busy-wait after
        each threaded call and take the cores from numba's threads.  In t-SNE's SD
        on Fashion-MNIST 20k that made the attractive sweep 32 ms instead of 13 ms."""
        if self.is_gpu:
            return contextlib.nullcontext()
        return _serial_blas_section()

    def scatter_add(self, target, indices, values):
        """``target[indices] += values`` with repeated indices accumulated.  On the
        GPU by atomic additions, whose order (and so the last bits of a float sum)
        changes from run to run: the fits sum in a fixed order instead
        (PairSet.row_sums, Spectral._component_sum)."""
        if self.xp is not np:
            self.xp.add.at(target, indices, values)     # (cupyx.scatter_add is deprecated)
            return target
        # bincount is ~10x faster than np.add.at for 1-D integer indices.
        n = target.shape[0]
        if target.ndim == 1:
            target += np.bincount(indices, weights=values, minlength=n)
        else:
            values = np.broadcast_to(values, (len(indices),) + target.shape[1:])
            for j in range(target.shape[1]):
                target[:, j] += np.bincount(indices, weights=values[:, j], minlength=n)
        return target

    def kernel(self, filename, name, dtype, defines=None):
        """Compiled CUDA function ``name<ctype>`` from ``kernels/filename``, ctype
        that of ``dtype``.

        The module is compiled once per (device, file, defines) for both float
        and double and memoized; see :func:`kernel_source`.
        """
        if not self.is_gpu:
            raise BackendUnavailable("CUDA kernels need the 'gpu' backend")
        ctype = _CTYPES[np.dtype(dtype)]
        device = self.xp.cuda.Device().id
        defines_key = tuple(sorted((defines or {}).items()))
        module = _raw_module(device, filename, name, defines_key)
        return module.get_function(f"{name}<{ctype}>")


class GraphReplays(dict):
    """Work replayed from CUDA graphs, one per key (the work's shape): at a key's
    first use the work runs as calls (which loads its kernels), at the second it
    is captured (:meth:`Backend.try_capture`) and from then on replayed.  Maps
    each key to None (ran once), its graph, or False (no graphs: not CUDA, or a
    capture CUDA refused), where the work always runs as calls."""

    def __init__(self, be, what):
        super().__init__()
        self.be, self.what = be, what

    def run(self, key, work):
        if key not in self:
            self[key] = None if self.be.can_capture else False
        elif self[key] is None:
            self[key] = self.be.try_capture(work, self.what)
        if self[key]:
            self[key].launch()
        else:
            work()


class CapturedGraph:
    """A CUDA graph from :meth:`Backend.capture` with the memory pool it uses."""

    def __init__(self, graph, pool):
        self._graph, self._pool = graph, pool

    def launch(self):
        """Replay the graph on the current stream (after the work queued there)."""
        self._graph.launch()


_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


def kernel_dirs():
    """Where kernel sources are looked for: inside the installed package (wheel),
    then the ``kernels/`` folder of a source checkout."""
    here = Path(__file__).resolve().parent
    return [here / "kernels", here.parent / "kernels"]


def kernel_path(filename):
    """Path of ``kernels/filename``, from the wheel or the source checkout."""
    for folder in kernel_dirs():
        candidate = folder / filename
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"CUDA kernel source {filename!r} not found in any of {[str(d) for d in kernel_dirs()]}"
    )


def kernel_source(filename, defines=None):
    """Source text of ``kernels/filename`` with ``#define NAME VALUE`` lines prepended."""
    header = "".join(f"#define {key} {value}\n" for key, value in sorted((defines or {}).items()))
    return header + kernel_path(filename).read_text()


@functools.lru_cache(maxsize=None)
def _raw_module(device, filename, name, defines_key):
    # ``device`` is part of the cache key: a RawModule is bound to the device
    # that was current when it was compiled.
    import cupy

    code = kernel_source(filename, dict(defines_key))
    return cupy.RawModule(
        code=code,
        options=("-std=c++17",),
        name_expressions=[f"{name}<float>", f"{name}<double>"],
    )


@functools.lru_cache(maxsize=None)
def _cpu_backend():
    import platform

    return Backend("cpu", np, scipy.sparse, scipy.sparse.linalg, np.float64,
                   platform.processor() or platform.machine())


@functools.lru_cache(maxsize=None)
def _gpu_backend():
    try:
        import cupy
        import cupyx.scipy.sparse
        import cupyx.scipy.sparse.linalg
    except ImportError as exc:
        raise BackendUnavailable(
            "backend='gpu' needs CuPy, which is not installed "
            "(pip install 'gpuembed[gpu]' for CUDA 12 or 'gpuembed[gpu-cuda13]' for CUDA 13)"
        ) from exc
    try:
        n_devices = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDA driver missing or broken
        raise BackendUnavailable(
            f"backend='gpu': CuPy is installed but CUDA failed: {exc}") from exc
    if n_devices < 1:
        raise BackendUnavailable("backend='gpu': CuPy is installed but no CUDA device is visible")
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    device_name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return Backend("gpu", cupy, cupyx.scipy.sparse, cupyx.scipy.sparse.linalg, np.float32,
                   device_name)


def get_backend(backend="auto"):
    """Resolve ``backend``, ``"auto" | "cpu" | "gpu"`` (or a :class:`Backend`), to a
    Backend.

    "auto" is the GPU when CuPy and a CUDA device are present, else the CPU.
    "gpu" without them raises :class:`BackendUnavailable` saying what is missing.
    """
    if isinstance(backend, Backend):
        return backend
    if backend not in BACKEND_NAMES:
        raise ValueError(f"backend must be one of {BACKEND_NAMES} or a Backend, got {backend!r}")
    if backend == "cpu":
        return _cpu_backend()
    if backend == "gpu":
        return _gpu_backend()
    try:
        return _gpu_backend()
    except BackendUnavailable:
        return _cpu_backend()


def gpu_available():
    """True when the 'gpu' backend can be used here."""
    try:
        _gpu_backend()
    except BackendUnavailable:
        return False
    return True
