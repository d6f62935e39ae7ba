"""Input validation shared by the public entry points.

Every message names the parameter and the allowed range (DESIGN.md rule 4);
nothing is silently clipped.
"""
from __future__ import annotations

import inspect
import numbers
import reprlib
import sys
import warnings
from pathlib import Path

import numpy as np

from ._sparse import is_sparse, to_csr


class NotFittedError(ValueError, AttributeError):
    """A fitted estimator's method called before ``fit`` (scikit-learn's convention:
    both a ValueError and an AttributeError)."""


def check_fitted(estimator, fitted, method="transform"):
    """Raise :class:`NotFittedError` unless ``fitted`` is true."""
    if not fitted:
        raise NotFittedError(f"this {type(estimator).__name__} instance is not fitted yet; "
                             f"call fit before {method}")


def check_features(X, estimator, name="X_new"):
    """New data must have the training data's number of features."""
    if X.shape[1] != estimator.n_features_in_:
        raise ValueError(f"{name} has {X.shape[1]} features, but {type(estimator).__name__} "
                         f"is expecting {estimator.n_features_in_} features as input")


def check_data(X, backend, *, name="X", dtype=None, min_samples=2, sparse=False):
    """``X`` as a finite 2-D floating array on ``backend``'s device, C-ordered.

    Integer input becomes float64 (float32 on the GPU unless ``dtype`` says
    otherwise); float32/float64 input keeps its dtype unless ``dtype`` is given.
    ``sparse=True``: a sparse matrix is accepted and comes back as a canonical
    CSR copy on the device (scipy or cupyx); otherwise it is refused.
    """
    xp = backend.xp
    if X is None:
        raise ValueError(f"{name} is required")
    if is_sparse(X) and not sparse:
        raise TypeError(f"{name} is a sparse matrix, which this function does not take; "
                        f"pass a dense array ({name}.toarray())")
    if not (is_sparse(X) or isinstance(getattr(X, "dtype", None), np.dtype)):
        # Lists, tables (pandas DataFrames) and other libraries' tensors; on the GPU
        # device arrays through the CUDA array interface (PyTorch, Numba, JAX).
        cuda = backend.is_gpu and hasattr(X, "__cuda_array_interface__")
        X = xp.asarray(X) if cuda else np.asarray(X)
    if X.dtype == object:           # numbers in an object array (a mixed table)
        try:
            X = np.asarray(X, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            missing = sum(v is None or type(v).__name__ == "NAType" for v in X.ravel())
            if missing:             # the message had been float()'s, about NAType
                raise ValueError(f"{name} contains {missing} missing value(s) (None or "
                                 f"pandas' NA)") from None
            raise type(exc)(f"{name} must be numeric: {exc}") from None
    shape = X.shape
    if len(shape) != 2:
        one = f" ({name}.reshape(1, -1) for one sample)" if len(shape) == 1 else ""
        raise ValueError(f"{name} must be 2-D (n_samples, n_features), got shape "
                         f"{tuple(shape)}. Reshape your data{one}.")
    if shape[0] < min_samples:
        raise ValueError(f"{name} needs at least {min_samples} samples, got n_samples="
                         f"{shape[0]}")
    if shape[1] < 1:
        raise ValueError(f"{name} has 0 feature(s) (shape={tuple(shape)}) while a minimum of "
                         f"1 is required.")
    if dtype is None:
        kind = np.dtype(X.dtype).kind
        if kind == "f" and np.dtype(X.dtype).itemsize in (4, 8):
            dtype = X.dtype
        elif kind in "biuf":
            dtype = backend.default_float
        elif kind == "c":
            raise ValueError(f"{name}: Complex data not supported, got dtype {X.dtype}")
        else:
            raise TypeError(f"{name} must be numeric, got dtype {X.dtype}")
    # Dense rows in C order: BLAS takes a Fortran-ordered X (a pandas DataFrame's
    # values, often) the other way round, with other last bits, which an
    # optimizer's path can grow (float32 digits' t-SNE: 0.35 apart).
    X = (to_csr(X, backend, dtype) if is_sparse(X)
         else xp.ascontiguousarray(backend.asarray(X, dtype=dtype)))
    if not bool(xp.isfinite(X.data if is_sparse(X) else X).all()):
        raise ValueError(f"{name} contains NaN or infinite values")
    return X


def check_labels(labels, name="labels"):
    """``labels`` (host array-like) as a 1-D array of at least one entry, none NaN:
    NumPy's unique had made the NaNs one class of their own, silently."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"{name} must be a 1-D array (N,), N >= 1, got shape {labels.shape}")
    if labels.dtype.kind in "fc" and np.isnan(labels).any():
        raise ValueError(f"{name} contains NaN at {int(np.isnan(labels).sum())} point(s): "
                         f"every point needs a class")
    return labels


def check_int(value, name, low=None, high=None):
    """An integer in [low, high] (None means unbounded)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be {_range_text(low, high, False, False)}, got {value}")
    return value


def check_bool(value, name):
    """True or False (NumPy's bool too): a string such as "no" would read as True."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_verbose(value):
    """``verbose``: True, False or a non-negative integer (scikit-learn's levels)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if not isinstance(value, numbers.Integral):
        raise TypeError(f"verbose must be True, False or an integer >= 0, got {value!r}")
    if value < 0:
        raise ValueError(f"verbose must be True, False or an integer >= 0, got {value!r}")
    return int(value)


def _range_text(low, high, low_open, high_open):
    """The allowed range as text: 'in [low, high]', or '>= low' / '<= high' where
    a side is unbounded (not 'in [1, None]'); an open side is strict."""
    if high is None:
        return f"{'>' if low_open else '>='} {low}"
    if low is None:
        return f"{'<' if high_open else '<='} {high}"
    return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def check_float(value, name, low=None, high=None, *, low_open=False, high_open=False):
    """A finite real number within the given bounds."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        raise ValueError(f"{name} must be {_range_text(low, high, low_open, high_open)}, "
                         f"got {value}")
    return value


def check_choice(value, name, choices):
    try:
        # NumPy 1.x warns where an array meets a string in ``in``; 2.x compares
        # elementwise and raises, as does CuPy.
        known = not isinstance(value, np.ndarray) and value in choices
    except (TypeError, ValueError):
        known = False
    if not known:                           # reprlib: an array's repr cut short
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {reprlib.repr(value)}")
    return value


def check_random_state(value, name="random_state"):
    """None, a non-negative integer, a numpy Generator or (scikit-learn's
    convention) a numpy RandomState, checked here so the message names the
    parameter; :func:`make_rng` turns any of them into a Generator."""
    if value is None or isinstance(value, (np.random.Generator, np.random.RandomState)):
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be None, an integer, a numpy Generator or a numpy "
                        f"RandomState, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value}")
    return value


def make_rng(random_state):
    """np.random.default_rng(random_state), where a RandomState seeds the Generator
    with its next draw (it advances, as scikit-learn's estimators advance one)."""
    if isinstance(random_state, np.random.RandomState):
        random_state = int(random_state.randint(np.iinfo(np.int64).max, dtype=np.int64))
    return np.random.default_rng(random_state)


def check_callbacks(callbacks):
    """A list of callables from None, one callable or an iterable of them, each
    called as ``callback(iteration, time, objective, embedding)``: one that takes
    three positional arguments (DESIGN.md's ``(iteration, time, objective)``)
    gets those three."""
    if callbacks is None:
        return []
    if callable(callbacks):
        callbacks = [callbacks]
    try:
        callbacks = list(callbacks)
    except TypeError:
        raise TypeError(f"callbacks must be a callable or a list of callables, "
                        f"got {callbacks!r}") from None
    for c in callbacks:
        if not callable(c):
            raise TypeError(f"callbacks must be callables, got {c!r}")
    return [_with_embedding(c) for c in callbacks]


def _with_embedding(callback):
    try:
        signature = inspect.signature(callback)
    except (TypeError, ValueError):             # some builtins have none: call with four
        return callback
    for args in ((0, 0.0, 0.0, None), (0, 0.0, 0.0)):
        try:
            signature.bind(*args)
        except TypeError:
            continue
        return callback if len(args) == 4 else (lambda it, t, E, X: callback(it, t, E))
    raise TypeError(f"callbacks must take (iteration, time, objective) or (iteration, "
                    f"time, objective, embedding), got {callback!r} with signature {signature}")


def check_dtype(dtype, backend):
    """The floating dtype of a computation: float32 or float64, the backend's
    default when None."""
    dtype = np.dtype(dtype) if dtype is not None else backend.default_float
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    return dtype


_PACKAGE = Path(__file__).resolve().parent


def warn(message, category=RuntimeWarning):
    """warnings.warn attributed to the first caller outside gpuembed (the user's
    line), however deep in the package the condition was found."""
    frame, level = sys._getframe(1), 2         # stacklevel 2: warn's caller
    while frame is not None and _PACKAGE in Path(frame.f_code.co_filename).resolve().parents:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
