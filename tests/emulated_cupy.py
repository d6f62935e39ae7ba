"""CuPy's host/device boundary and API on NumPy arrays, for the GPU code paths
without a GPU.

The emulated "gpu" backend (tests/emulated_cuda.py) hands gpuembed a ``cupy``
module (:data:`cupy`) whose arrays are :class:`DeviceArray`: NumPy arrays that
refuse what a ``cupy.ndarray`` refuses, so the GPU paths fail here where they
would fail on a GPU:

- a host (NumPy) array, a list or a 0-d NumPy array where CuPy wants a device
  array: an operand of arithmetic or of a cupy function, a kernel argument, the
  value of a basic-slice assignment (CuPy: ``TypeError: Unsupported type``,
  ``ValueError: non-scalar numpy.ndarray cannot be used for fill``);
- a device array where host code wants a NumPy array: ``np.asarray``, SciPy,
  ``isinstance(a, np.ndarray)``, using a device scalar as a list index
  (``cupy.ndarray`` has ``__array__`` raising TypeError and no ``__index__``);
- a name or keyword argument that CuPy lacks: every function, ndarray
  attribute, sparse matrix method and ``cupyx.scipy.sparse.linalg`` solver is
  checked against what both tests/cupy_api.json (a recent CuPy release) and
  tests/cupy_api_oldest.json (the oldest pyproject.toml allows) have, each
  recorded by tests/record_cupy_api.py (parameter names wherever Python can read
  them).

What CuPy accepts, this accepts: NumPy and Python scalars anywhere, host arrays
and lists as indices, ``cupy.asarray(host)``, NumPy functions and ufuncs called
on device arrays (CuPy implements ``__array_function__`` and
``__array_ufunc__``), ``float``/``int``/``bool`` of a one-element array.
Reductions return 0-d device arrays, as CuPy's do.  The numbers are NumPy's:
this checks the boundary, not CuPy's arithmetic.

:func:`counting` counts what the GPU would be asked to do: cupy calls (most
launch one kernel or more), RawKernel launches and host reads of device values
(each waits for the device), optionally per gpuembed source line
(benchmarks/gpu_call_counts.py).
"""
from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import sys
import types
from copy import deepcopy
from pathlib import Path

import numpy as np
import scipy.sparse
import scipy.sparse.linalg



def _common_parameters(a, b):
    """The calls both parameter lists take (None: unknown, so the other's): the
    keywords both take (a list with ``**kwargs`` takes the other's), as many
    positional arguments as the shorter takes (a slot the two name differently is
    kept as "a|b", which no keyword matches; where the keywords outnumber the
    slots, as many positional arguments as keywords pass), and ``*args`` or
    ``**kwargs`` where both have it."""
    if a is None or b is None:
        return b if a is None else a
    named = lambda params: [p for p in params if not p.startswith("*")]
    star = lambda params, n: [p for p in params if p.count("*", 0, 2) == n][:1]
    keywords = ([p for p in named(a) if p in named(b) or star(b, 2)]
                + [p for p in named(b) if p not in named(a) and star(a, 2)])
    slots = min(len(named(a)), len(named(b)))
    placeholders = [f"{x}|{y}" for x, y in zip(named(a), named(b)) if x != y]
    return (keywords + placeholders[:max(0, slots - len(keywords))]
            + (star(a, 1) if star(b, 1) else []) + (star(a, 2) if star(b, 2) else []))


def _common_api(apis):
    """The API that every one of ``apis`` (recorded CuPy releases) has."""
    first, *rest = apis
    common = deepcopy(first)
    for api in rest:
        for name, names in common["namespaces"].items():
            other = api["namespaces"].get(name, {})
            for attr in [a for a in names if a not in other]:
                del names[attr]
            for attr, entry in names.items():
                entry["params"] = _common_parameters(entry["params"], other[attr]["params"])
        for attrs, other in [(common["ndarray"], api["ndarray"]),
                             *((common["sparse_classes"][c], api["sparse_classes"][c])
                               for c in common["sparse_classes"])]:
            for attr in [a for a in attrs if a not in other]:
                del attrs[attr]
            for attr in attrs:
                attrs[attr] = _common_parameters(attrs[attr], other[attr])
        common["ufunc"] = [u for u in common["ufunc"] if u in api["ufunc"]]
    common["cupy_version"] = " and ".join(api["cupy_version"] for api in apis)
    return common


API = _common_api([json.loads(Path(__file__).with_name(name).read_text())
                   for name in ("cupy_api_oldest.json", "cupy_api.json")])
# Functions that take host data (the host-to-device copies).
HOST_INPUT = {"asarray", "array", "asanyarray"}


def _stable(sort):
    """CuPy's sort and argsort are stable whatever ``kind`` says; NumPy's default
    (quicksort) is not."""
    @functools.wraps(sort)
    def stable(*args, kind=None, **kwargs):
        return sort(*args, kind="stable", **kwargs)
    return stable


# The NumPy/SciPy module that computes each emulated namespace.
IMPLEMENTATION = {
    "cupy": types.SimpleNamespace(**{**vars(np), "sort": _stable(np.sort),
                                     "argsort": _stable(np.argsort)}),
    "cupy.linalg": np.linalg, "cupy.random": np.random, "cupy.fft": np.fft,
    "cupyx.scipy.sparse": scipy.sparse,
    # cupyx's factorized converts its matrix to CSC itself; SciPy's warns.
    "cupyx.scipy.sparse.linalg": types.SimpleNamespace(**{
        **vars(scipy.sparse.linalg),
        "factorized": lambda A: scipy.sparse.linalg.factorized(scipy.sparse.csc_matrix(A))}),
}
SPARSE_CLASSES = {"csr": "csr_matrix", "csc": "csc_matrix", "coo": "coo_matrix"}


# Counted while counting() is active: "calls" (cupy functions, operators,
# advanced indexing, assignments), "uploads" (host data to cupy.asarray),
# "kernels" (RawKernel launches, by tests/emulated_cuda.py), "reads" (the
# host reading a device value: float(), int(), bool(), .get(), .item()) and
# "graphs" (launches of captured CUDA graphs, whose work the host does not make).
COUNTS = collections.Counter()
_sites = None


@contextlib.contextmanager
def counting(sites=False):
    """Reset COUNTS and count into it; ``sites=True`` also counts per
    (kind, gpuembed source line), in the Counter this yields second."""
    global _sites
    COUNTS.clear()
    _sites = collections.Counter() if sites else None
    try:
        yield COUNTS, _sites
    finally:
        _sites = None


# Set while an emulated CUDA graph runs (tests/emulated_cuda.py): stream capture
# refuses what waits on the host, a read of a device value or an upload of host data,
# and CuPy refuses cuBLAS calls (NotImplementedError, seen on an H100 with CuPy 14).
capturing = False
CUBLAS_CALLS = {"cupy.matmul", "cupy.dot", "cupy.tensordot", "cupy.inner", "cupy.vdot",
                "cupy.einsum", "the operator matmul"}


def sites_copy():
    return None if _sites is None else _sites.copy()


def restore_counts(counts, sites):
    """Put back what COUNTS (and the per-site counts) held before an emulated
    graph's work ran (its calls are the device's, not the host's)."""
    COUNTS.clear()
    COUNTS.update(counts)
    if _sites is not None:
        _sites.clear()
        _sites.update(sites)


def count(kind):
    if capturing and kind in ("reads", "uploads"):
        raise RuntimeError(f"operation not permitted when stream is capturing ({kind[:-1]} "
                           "between host and device in a captured CUDA graph)")
    COUNTS[kind] += 1
    if _sites is not None:
        _sites[kind, _caller()] += 1


def _caller():
    import gpuembed

    package = os.path.dirname(gpuembed.__file__) + os.sep
    frame = sys._getframe(2)
    while frame is not None and not frame.f_code.co_filename.startswith(package):
        frame = frame.f_back
    if frame is None:
        return "outside gpuembed"
    return f"{frame.f_code.co_filename[len(package):]}:{frame.f_lineno}"


def _unsupported(obj, where):
    return TypeError(f"Unsupported type {type(obj)}: {where} takes device arrays "
                     "(CuPy refuses host data here; move it with cupy.asarray)")


def _device(obj, where, sequences=True):
    """The NumPy value behind a device argument; host arrays are refused."""
    if isinstance(obj, DeviceArray):
        return obj._a
    if isinstance(obj, DeviceSparse):
        return obj._m
    if isinstance(obj, np.ndarray) or scipy.sparse.issparse(obj):
        raise _unsupported(obj, where)
    if isinstance(obj, (list, tuple)):
        if not sequences:
            raise _unsupported(obj, where)
        return type(obj)(_device(x, where) for x in obj)
    return obj


def _wrap(value):
    """NumPy/SciPy results as device objects (NumPy scalars become 0-d arrays)."""
    if isinstance(value, (np.ndarray, np.generic)):      # np.matrix too: cupyx gives arrays
        return DeviceArray(np.asarray(value))
    if scipy.sparse.issparse(value):
        return DeviceSparse(value)
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    if isinstance(value, list) and any(isinstance(v, np.ndarray) for v in value):
        return [_wrap(v) for v in value]
    if callable(value) and not isinstance(value, type):
        return _strict(value, getattr(value, "__name__", "returned function"), None)
    return value


def _check_parameters(where, params, args, kwargs):
    if params is None:
        return
    if params and params[0] == "self":
        params = params[1:]
    if not any(p.startswith("**") for p in params):
        unknown = set(kwargs) - set(params)
        if unknown:
            raise TypeError(f"{where}() got unexpected keyword argument(s) {sorted(unknown)} "
                            f"(CuPy {API['cupy_version']} both take {params})")
    if not any(p.startswith("*") and not p.startswith("**") for p in params):
        if len(args) > len([p for p in params if not p.startswith("*")]):
            raise TypeError(f"{where}() takes at most {len(params)} arguments "
                            f"(CuPy {API['cupy_version']}: {params})")


def _strict(function, where, params, host_input=False, sequences=True):
    """``function`` on device arguments, results returned as device objects."""
    @functools.wraps(function)
    def call(*args, **kwargs):
        _check_parameters(where, params, args, kwargs)
        if capturing and (where in CUBLAS_CALLS or where.startswith("cupy.linalg.")):
            raise NotImplementedError(f"{where}: calling cuBLAS API during stream capture is "
                                      "currently unsupported")
        if not host_input:
            count("calls")
            args = tuple(_device(a, where, sequences) for a in args)
            kwargs = {k: _device(v, where, sequences) for k, v in kwargs.items()}
        elif args and hasattr(args[0], "__cuda_array_interface__") and not isinstance(
                args[0], DeviceArray):
            # Another library's device array: CuPy wraps its memory, no copy.
            view = types.SimpleNamespace(__array_interface__=args[0].__cuda_array_interface__)
            return _wrap(function(np.asarray(view), *args[1:], **kwargs))
        elif args and not isinstance(args[0], DeviceArray):
            count("uploads")
            # An upload is a copy: device and host arrays never share memory.
            result = function(*args, **kwargs)
            if isinstance(result, np.ndarray) and np.may_share_memory(result, args[0]):
                result = np.array(result, order="K")
            return _wrap(result)
        else:
            args = (args[0]._a,) + args[1:]
        return _wrap(function(*args, **kwargs))
    return call


class Namespace(types.ModuleType):
    """A CuPy module: the names CuPy has, computed by NumPy/SciPy."""

    def __init__(self, name):
        super().__init__(name)
        self._names = API["namespaces"][name]
        self._impl = IMPLEMENTATION.get(name)

    def __getattr__(self, attr):
        entry = self._names.get(attr)
        if entry is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r} "
                                 f"(CuPy {API['cupy_version']})")
        where = f"{self.__name__}.{attr}"
        if entry["module"]:
            return Namespace(where)
        if attr == "ndarray":
            return DeviceArray
        if attr == "asnumpy":
            return lambda a, *args, **kwargs: a.get() if isinstance(a, DeviceArray) else a
        target = getattr(self._impl, attr)
        if entry["ufunc"]:
            return Ufunc(target, where)
        if not callable(target) or isinstance(target, type):
            return target           # constants, dtypes (cupy.float32 is numpy's)
        return _strict(target, where, entry["params"], host_input=attr in HOST_INPUT)


class Ufunc:
    """A cupy.ufunc: elementwise on device arrays and scalars only (no lists)."""

    def __init__(self, ufunc, where):
        self._ufunc, self._where = ufunc, where

    def __call__(self, *args, **kwargs):
        return _strict(self._ufunc, self._where, None, sequences=False)(*args, **kwargs)

    def __getattr__(self, attr):
        if attr not in API["ufunc"]:
            raise AttributeError(f"cupy.ufunc has no attribute {attr!r}")
        value = getattr(self._ufunc, attr)
        return _strict(value, f"{self._where}.{attr}", None) if callable(value) else value


def _operator(ufunc, reflected=False):
    def op(self, other):
        if isinstance(other, DeviceSparse):
            return NotImplemented
        a, b = (other, self) if reflected else (self, other)
        return _strict(ufunc, f"the operator {ufunc.__name__}", None, sequences=False)(a, b)
    return op


def _in_place(ufunc):
    def op(self, other):
        count("calls")
        ufunc(self._a, _device(other, f"the operator {ufunc.__name__}=", sequences=False),
              out=self._a)
        return self
    return op


def _is_advanced(key):
    parts = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, (np.ndarray, DeviceArray, list)) for k in parts)


def _index(key):
    """CuPy converts host arrays and lists used as indices."""
    if isinstance(key, tuple):
        return tuple(_index(k) for k in key)
    return key._a if isinstance(key, DeviceArray) else key


class DeviceArray:
    """A cupy.ndarray stand-in holding a NumPy array."""

    __slots__ = ("_a",)
    __hash__ = None

    def __init__(self, a):
        self._a = a

    # -- the boundary ----------------------------------------------------
    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    def get(self, stream=None, order="C", out=None, blocking=True):
        count("reads")
        return np.array(self._a, order=order)

    @property
    def __cuda_array_interface__(self):
        """What marks a device array for duck typing (the pointer is the host's)."""
        return {"shape": self._a.shape, "typestr": self._a.dtype.str, "version": 3,
                "data": (self._a.ctypes.data, not self._a.flags.writeable),
                "strides": None if self._a.flags.c_contiguous else self._a.strides}

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__" or ufunc.__name__ not in API["namespaces"]["cupy"]:
            return NotImplemented
        return _strict(ufunc, f"numpy.{ufunc.__name__} on a device array", None,
                       sequences=False)(*inputs, **kwargs)

    def __array_function__(self, func, types_, args, kwargs):
        module = func.__module__.replace("numpy", "cupy", 1)
        entry = API["namespaces"].get(module, {}).get(func.__name__)
        if entry is None or any(not issubclass(t, DeviceArray) for t in types_):
            return NotImplemented
        return _strict(func, f"{module}.{func.__name__}", entry["params"])(*args, **kwargs)

    # -- attributes --------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: DeviceArray(self._a.T))
    real = property(lambda self: DeviceArray(self._a.real))
    imag = property(lambda self: DeviceArray(self._a.imag))

    def __getattr__(self, attr):
        if attr not in API["ndarray"]:
            raise AttributeError(f"cupy.ndarray has no attribute {attr!r}")
        value = getattr(self._a, attr)
        if not callable(value):
            return _wrap(value)
        if attr in ("item", "tolist"):
            count("reads")
            return value
        if attr in ("sort", "argsort"):
            value = _stable(value)
        return _strict(value, f"cupy.ndarray.{attr}", API["ndarray"][attr])

    def __repr__(self):
        return f"DeviceArray({self._a!r})"

    # -- Python protocols --------------------------------------------------
    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (DeviceArray(np.asarray(row)) for row in self._a)

    def __format__(self, spec):
        count("reads")
        return format(self._a.item() if self._a.ndim == 0 else self._a, spec)

    def __getitem__(self, key):
        if _is_advanced(key):
            count("calls")          # a gather kernel; basic indexing makes a view
        return _wrap(self._a[_index(key)])

    def __setitem__(self, key, value):
        if isinstance(value, np.ndarray) and value.ndim and not _is_advanced(key):
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill "
                             "(a host array assigned to a slice of a device array)")
        count("calls")
        self._a[_index(key)] = value._a if isinstance(value, DeviceArray) else value

    def __neg__(self):
        return DeviceArray(-self._a)

    def __pos__(self):
        return DeviceArray(+self._a)

    def __abs__(self):
        return DeviceArray(abs(self._a))

    def __invert__(self):
        return DeviceArray(~self._a)


for _name, _ufunc in {"add": np.add, "sub": np.subtract, "mul": np.multiply,
                      "truediv": np.true_divide, "floordiv": np.floor_divide,
                      "mod": np.remainder, "pow": np.power, "matmul": np.matmul,
                      "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
                      "lshift": np.left_shift, "rshift": np.right_shift}.items():
    setattr(DeviceArray, f"__{_name}__", _operator(_ufunc))
    setattr(DeviceArray, f"__r{_name}__", _operator(_ufunc, reflected=True))
    setattr(DeviceArray, f"__i{_name}__", _in_place(_ufunc))
for _name, _ufunc in {"lt": np.less, "le": np.less_equal, "gt": np.greater,
                      "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal}.items():
    setattr(DeviceArray, f"__{_name}__", _operator(_ufunc))


def _read(convert):
    """bool(), int(), float(), complex(): the host reads a device value."""
    def read(self):
        count("reads")
        return convert(self._a)
    return read


for _convert in (bool, int, float, complex):
    setattr(DeviceArray, f"__{_convert.__name__}__", _read(_convert))


class DeviceSparse:
    """A cupyx.scipy.sparse matrix stand-in holding a SciPy matrix."""

    __slots__ = ("_m",)

    def __init__(self, m):
        if m.format not in SPARSE_CLASSES:
            m = m.tocsr()       # cupyx has csr, csc, coo (and dia, which we do not use)
        self._m = m

    def get(self, stream=None):
        return self._m.copy()

    def sum_duplicates(self):
        """cupyx rebuilds the matrix with new arrays (SciPy sorts in place)."""
        count("calls")
        if not self._m.has_canonical_format:
            m = self._m.copy()
            m.sum_duplicates()
            self._m = m

    def __getattr__(self, attr):
        cls = SPARSE_CLASSES[self._m.format]
        if attr not in API["sparse_classes"][cls]:
            raise AttributeError(f"cupyx.scipy.sparse.{cls} has no attribute {attr!r}")
        value = getattr(self._m, attr)
        if isinstance(value, np.ndarray):
            return DeviceArray(value)           # a view: in-place updates reach the matrix
        if not callable(value):
            return value
        return _strict(value, f"{cls}.{attr}", API["sparse_classes"][cls][attr])

    def __setattr__(self, attr, value):
        if attr == "_m":
            object.__setattr__(self, attr, value)
            return
        cls = SPARSE_CLASSES[self._m.format]
        if attr not in API["sparse_classes"][cls]:
            raise AttributeError(f"cupyx.scipy.sparse.{cls} has no attribute {attr!r}")
        setattr(self._m, attr, _device(value, f"{cls}.{attr}"))

    def __repr__(self):
        return f"DeviceSparse({self._m!r})"

    T = property(lambda self: DeviceSparse(self._m.T))

    def __getitem__(self, key):
        """cupyx's indexing: slices and integer arrays of rows (a gather)."""
        count("calls")
        return _wrap(self._m[_index(key)])

    def __neg__(self):
        return DeviceSparse(-self._m)

    def _extremum(self, other, name):
        """cupyx's csr maximum and minimum take a scalar, a dense array or another
        CSR matrix; any other sparse format raises NotImplementedError (SciPy
        converts it, so S.maximum(S.T) passed here and failed on a GPU)."""
        if (self._m.format == "csr" and isinstance(other, DeviceSparse)
                and other._m.format != "csr"):
            raise NotImplementedError(f"cupyx csr_matrix.{name} of a {other._m.format} matrix")
        count("calls")
        return _wrap(getattr(self._m, name)(_device(other, f"sparse {name}")))

    def maximum(self, other):
        return self._extremum(other, "maximum")

    def minimum(self, other):
        return self._extremum(other, "minimum")


for _name in ("add", "sub", "mul", "truediv", "matmul", "radd", "rsub", "rmul", "rmatmul"):
    def _sparse_op(self, other, _method=f"__{_name}__"):
        count("calls")
        return _wrap(getattr(self._m, _method)(_device(other, f"sparse {_method}")))
    setattr(DeviceSparse, f"__{_name}__", _sparse_op)


def _sparse_constructor(name):
    """cupyx's csr_matrix etc.: from a SciPy matrix (a host-to-device copy), a
    device matrix or dense array, or a tuple of device arrays."""
    scipy_class = getattr(scipy.sparse, name)

    def make(arg1, shape=None, dtype=None, copy=False):
        dense = isinstance(arg1, DeviceArray)
        if isinstance(arg1, tuple):
            arg1 = _device(arg1, f"cupyx.scipy.sparse.{name}")
        elif isinstance(arg1, (DeviceArray, DeviceSparse)):
            arg1 = _device(arg1, name)
        elif isinstance(arg1, np.ndarray):
            raise _unsupported(arg1, f"cupyx.scipy.sparse.{name}")
        elif scipy.sparse.issparse(arg1):
            copy = True                 # a host matrix is copied to the device
        matrix = scipy_class(arg1, shape=shape, dtype=dtype, copy=copy)
        if matrix.dtype.char not in "?fdFD":
            raise ValueError("Only bool, float32, float64, complex64 and complex128 are "
                             "supported")
        if dense and name == "csr_matrix":
            _unsort_rows(matrix)
        return DeviceSparse(matrix)
    return make


def _unsort_rows(matrix):
    """Each row's entries in descending column order, in place.  cuSPARSE's
    dense-to-CSR conversion does not sort them (on an H100 with CuPy 14 no row of
    a 40 x 40 matrix came back sorted: 0, 32, 33, 2, 34, ...), and code that
    relies on the order fails there, not on SciPy's sorted conversion."""
    for row in range(matrix.shape[0]):
        lo, hi = matrix.indptr[row], matrix.indptr[row + 1]
        matrix.indices[lo:hi] = matrix.indices[lo:hi][::-1].copy()
        matrix.data[lo:hi] = matrix.data[lo:hi][::-1].copy()
    matrix.has_sorted_indices = False


class SparseNamespace(Namespace):
    def __getattr__(self, attr):
        if attr in SPARSE_CLASSES.values():
            return _sparse_constructor(attr)
        if attr == "issparse":
            return lambda x: isinstance(x, DeviceSparse)
        return super().__getattr__(attr)


cupy = Namespace("cupy")
# The one CUDA-runtime piece gpuembed and its benchmarks touch (a device's id
# and synchronize) has nothing to emulate.
cupy.cuda = types.SimpleNamespace(
    Device=lambda device=None: types.SimpleNamespace(id=0, synchronize=lambda: None))
sparse = SparseNamespace("cupyx.scipy.sparse")
sparse_linalg = Namespace("cupyx.scipy.sparse.linalg")
