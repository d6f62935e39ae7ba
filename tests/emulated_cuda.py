"""The CUDA kernels of kernels/*.cu run on the CPU, for tests without a GPU.

:class:`EmulatedBackend` is the "gpu" backend with the emulated CuPy of
tests/emulated_cupy.py (NumPy arrays behind CuPy's host/device boundary and
API): code that branches on ``be.is_gpu`` takes its GPU path with device
arrays, and ``be.kernel(...)`` returns the
kernel compiled by g++ against tests/cuda_emulator.h (every CUDA thread a fiber;
``__syncthreads`` and warp shuffles are real barriers) instead of a CuPy
RawModule.  The launch code in gpuembed therefore runs unchanged, with its grid,
block, shared-memory size and arguments, and each launch is checked the way a
GPU would fail or silently misbehave: argument count, scalar types and array
dtypes against the kernel's parameters, contiguity, writable outputs, launch
limits, device arrays only.  What it cannot show: timing, blocks running
concurrently, the last bits of the GPU's special-function units (``__expf`` is
modelled as exp2 of a float-rounded x log2(e)), and CuPy's own arithmetic.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

import emulated_cupy
from gpuembed.backend import _CTYPES, Backend, kernel_source

HEADER = Path(__file__).with_name("cuda_emulator.h")
CACHE = Path(tempfile.gettempdir()) / f"gpuembed-cuda-emulator-{os.getuid()}"
COMPILER = shutil.which("g++")
# Extra g++ flags: "-fsanitize=address" (then run Python with libasan in
# LD_PRELOAD and ASAN_OPTIONS=detect_leaks=0) catches out-of-bounds accesses;
# "-DEMU_REVERSE_ORDER" runs threads and blocks backwards, to expose races.
EXTRA_FLAGS = os.environ.get("GPUEMBED_EMULATOR_CFLAGS", "").split()
MAX_SHARED_BYTES = 48 * 1024        # without the opt-in attribute, as CuPy launches
MAX_GRID = (2**31 - 1, 65535, 65535)

_DTYPES = {"f4": np.float32, "f8": np.float64, "i8": np.int64, "i4": np.int32,
           "u4": np.uint32, "b1": np.bool_, "u1": np.uint8, "u8": np.uint64}
_SCALARS = {"f4": ctypes.c_float, "f8": ctypes.c_double, "i8": ctypes.c_longlong,
            "i4": ctypes.c_int, "u4": ctypes.c_uint, "b1": ctypes.c_bool}


class EmulatedBackend(Backend):
    """The GPU backend's code paths on emulated CuPy arrays, kernels emulated on the CPU."""

    def __init__(self):
        super().__init__("gpu", emulated_cupy.cupy, emulated_cupy.sparse,
                         emulated_cupy.sparse_linalg, np.float32, "CUDA emulator on the CPU")

    def kernel(self, filename, name, dtype, defines=None):
        ctype = _CTYPES[np.dtype(dtype)]
        return _kernel(filename, name, ctype, tuple(sorted((defines or {}).items())))

    can_capture = True

    def capture(self, work):
        return EmulatedGraph(work)


class EmulatedGraph:
    """Backend.capture's graph: capture runs nothing, and each launch runs
    ``work`` again, refusing host reads of device values, uploads of host data
    and cuBLAS calls as stream capture does.  It checks the bookkeeping around a
    graph, not that the host values ``work`` passes stay what the capture froze.
    The host makes one call per launch, which is what emulated_cupy.counting
    counts ("graphs"), not the work's calls and kernels."""

    def __init__(self, work):
        self._work = work

    def launch(self):
        counts, sites = emulated_cupy.COUNTS.copy(), emulated_cupy.sites_copy()
        emulated_cupy.capturing = True
        try:
            self._work()
        finally:
            emulated_cupy.capturing = False
            emulated_cupy.restore_counts(counts, sites)
        emulated_cupy.count("graphs")


def install():
    """Make :class:`EmulatedBackend` what ``get_backend("gpu")`` (and "auto")
    returns in this process; returns it."""
    import gpuembed.backend

    emulated = EmulatedBackend()
    gpuembed.backend._gpu_backend = lambda: emulated
    return emulated


def _translate(source):
    """Dynamic shared memory (``extern __shared__ T name[];``) from the emulator."""
    return re.sub(r"extern\s+__shared__\s+(\w[\w ]*?)\s+(\w+)\s*\[\s*\]\s*;",
                  r"\1* \2 = reinterpret_cast<\1*>(emu::shared_memory());", source)


@functools.lru_cache(maxsize=None)
def _kernel(filename, name, ctype, defines_key):
    kernel = compile_kernel(kernel_source(filename, dict(defines_key)), f"{name}<{ctype}>")
    kernel.device_arrays_only = True     # as launched by gpuembed through CuPy
    return kernel


def compile_kernel(source, function, flags=()):
    """:class:`EmulatedKernel` for ``function`` (e.g. "name<float>") of CUDA ``source``,
    compiled with EXTRA_FLAGS and ``flags``; the shared library is cached by content."""
    if COMPILER is None:
        raise RuntimeError("the CUDA emulator needs g++")
    source = _translate(source) + f"\nEMU_EXPORT({function})\n"
    # -fno-gnu-unique: a kernel template's static __shared__ arrays would otherwise
    # be one process-wide symbol, shared by every library compiled from that
    # source, whatever size its defines gave them.
    flags = ["-fno-gnu-unique", *EXTRA_FLAGS, *flags]
    digest = hashlib.sha256(
        "\n".join([HEADER.read_text(), source, *flags]).encode()).hexdigest()[:20]
    library = CACHE / f"{digest}.so"
    if not library.exists():
        CACHE.mkdir(exist_ok=True)
        cpp = CACHE / f"{digest}.{os.getpid()}.cpp"
        cpp.write_text(f'#include "{HEADER}"\n{source}')
        partial = cpp.with_suffix(".so")
        run = subprocess.run([COMPILER, "-std=c++17", "-O1", "-shared", "-fPIC", *flags,
                              "-o", str(partial), str(cpp)], capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(f"g++ failed on {function}:\n{run.stderr}")
        os.replace(partial, library)    # atomic: parallel test runs never load half a file
        cpp.unlink()
    return EmulatedKernel(function, ctypes.CDLL(str(library)))


def _dims(value, what, limits):
    dims = tuple(value) if isinstance(value, tuple) else (value,)
    if not 1 <= len(dims) <= 3 or not all(isinstance(v, (int, np.integer)) for v in dims):
        raise TypeError(f"{what} must be 1 to 3 integers, got {value!r}")
    dims = tuple(int(v) for v in dims) + (1,) * (3 - len(dims))
    if any(v < 1 or v > hi for v, hi in zip(dims, limits)):
        raise ValueError(f"{what} {dims} outside 1..{limits} (CUDA: invalid configuration)")
    return (ctypes.c_uint * 3)(*dims)


class EmulatedKernel:
    """Callable like a CuPy RawKernel function: ``f(grid, block, args, shared_mem=0)``.

    Array arguments are device arrays (tests/emulated_cupy.py); NumPy arrays are
    accepted too unless ``device_arrays_only`` (CuPy refuses them), so the
    emulator's own tests can launch kernels on plain arrays."""

    device_arrays_only = False

    def __init__(self, name, library):
        self.name = name
        self._library = library
        library.emu_signature.restype = ctypes.c_char_p
        self.signature = library.emu_signature().decode().split(",")
        library.emu_launch.restype = ctypes.c_int

    def __call__(self, grid, block, args, shared_mem=0):
        grid = _dims(grid, "grid", MAX_GRID)
        block = _dims(block, "block", (1024, 1024, 64))
        if block[0] * block[1] * block[2] > 1024:
            raise ValueError(f"block {tuple(block)} has more than 1024 threads")
        if not 0 <= shared_mem <= MAX_SHARED_BYTES:
            raise ValueError(f"shared_mem={shared_mem} above {MAX_SHARED_BYTES} bytes")
        args = tuple(args)
        if len(args) != len(self.signature):
            raise TypeError(f"{self.name} takes {len(self.signature)} arguments, "
                            f"got {len(args)}")
        holders = [self._marshal(i, a, code) for i, (a, code) in
                   enumerate(zip(args, self.signature))]
        pointers = (ctypes.c_void_p * len(args))(
            *(ctypes.cast(ctypes.pointer(h), ctypes.c_void_p) for h in holders))
        if self.device_arrays_only:
            emulated_cupy.count("kernels")
        message = ctypes.create_string_buffer(512)
        if self._library.emu_launch(grid, block, ctypes.c_size_t(shared_mem), pointers,
                                    message, ctypes.c_size_t(len(message))):
            raise RuntimeError(f"{self.name}: {message.value.decode()}")

    def _marshal(self, i, a, code):
        where = f"{self.name} argument {i}"
        if "*" in code:
            const, dtype = code.startswith("c"), np.dtype(_DTYPES[code.split("*")[1]])
            if isinstance(a, emulated_cupy.DeviceArray):
                a = a._a
            elif self.device_arrays_only and isinstance(a, np.ndarray):
                raise TypeError(f"{where}: Unsupported type numpy.ndarray (a host array "
                                "passed to a CUDA kernel)")
            if not isinstance(a, np.ndarray):
                raise TypeError(f"{where} is a {dtype} pointer; got {type(a).__name__}")
            if a.dtype != dtype:
                raise TypeError(f"{where} points to {dtype}; got an array of {a.dtype}")
            if not a.flags.c_contiguous:
                raise ValueError(f"{where}: the kernel indexes a C-contiguous array")
            if not const and not a.flags.writeable:
                raise ValueError(f"{where}: the kernel writes to a read-only array")
            return ctypes.c_void_p(a.ctypes.data)
        # CuPy passes a Python int as int64 and a float as float64 whatever the
        # parameter is, so only NumPy scalars of the exact type are safe.
        if not isinstance(a, np.generic) or a.dtype != np.dtype(_DTYPES[code]):
            raise TypeError(f"{where} must be a NumPy {np.dtype(_DTYPES[code])} scalar; "
                            f"got {a!r} ({type(a).__name__})")
        return _SCALARS[code](a.item())
