"""get_params / set_params in scikit-learn's convention, without depending on it.

With them (and ``fit(X, y=None)``, and ``__sklearn_tags__`` for scikit-learn
1.6 and later) the estimators work in scikit-learn's Pipeline, ``clone`` and
GridSearchCV: a parameter is an ``__init__`` argument
of the class or of one of its bases, stored under its own name; nested
estimators' parameters read ``outer__inner``.  The embeddings with ``transform``
also take scikit-learn's output API (:class:`TransformerOutput`).
"""
from __future__ import annotations

import functools
import importlib
import inspect
import sys

import numpy as np

from ._checks import check_choice, check_fitted


class Params:
    """Mixin: parameters from the ``__init__`` signatures along the MRO, plus
    the names in ``extra_params`` kept in the dict ``self._method_params``
    (the embeddings' ``**method_params``)."""

    extra_params = frozenset()
    takes_sparse = True         # ParametricEmbedding: False

    @classmethod
    def _param_names(cls):
        names = []
        for klass in cls.__mro__:
            init = klass.__dict__.get("__init__")
            if init is None or klass is object:
                continue
            for p in inspect.signature(init).parameters.values():
                if (p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                        and p.name not in names):
                    names.append(p.name)
        return names

    def get_params(self, deep=True):
        params = {name: getattr(self, name) for name in self._param_names()}
        params.update(getattr(self, "_method_params", {}))
        if deep:
            for name, value in list(params.items()):
                if hasattr(value, "get_params") and not isinstance(value, type):
                    params.update({f"{name}__{k}": v for k, v in value.get_params().items()})
        return params

    def set_params(self, **params):
        names = self._param_names()
        nested = {}
        for key, value in params.items():
            head, _, tail = key.partition("__")
            if tail and head in names:
                nested.setdefault(head, {})[tail] = value
            elif key in names:
                setattr(self, key, value)
            elif key in self.extra_params:
                self._method_params[key] = value
            else:
                valid = sorted(set(names) | set(self.extra_params))
                raise ValueError(f"invalid parameter {key!r} for {type(self).__name__}; "
                                 f"valid parameters are {valid}")
        for head, values in nested.items():
            getattr(self, head).set_params(**values)
        return self

    def __sklearn_is_fitted__(self):
        # Every fit sets n_features_in_; scikit-learn's default test (any attribute
        # ending in "_") would take EE's parameter lambda_ for a fitted state.
        return hasattr(self, "n_features_in_")

    def __sklearn_tags__(self):
        # Only scikit-learn calls this, so it is there to import.
        from sklearn.utils import InputTags, Tags, TargetTags, TransformerTags

        return Tags(estimator_type=None, target_tags=TargetTags(required=False),
                    transformer_tags=TransformerTags() if hasattr(self, "transform") else None,
                    input_tags=InputTags(sparse=self.takes_sparse))

    def __repr__(self):
        defaults = {}
        for klass in reversed(type(self).__mro__):
            init = klass.__dict__.get("__init__")
            if init is not None and klass is not object:
                defaults.update({p.name: p.default for p in
                                 inspect.signature(init).parameters.values()})
        changed = [f"{k}={v!r}" for k, v in self.get_params(deep=False).items()
                   if k not in defaults or not _same(defaults[k], v)]
        return f"{type(self).__name__}({', '.join(changed)})"


OUTPUTS = ("default", "pandas", "polars")


class TransformerOutput:
    """scikit-learn's output API, for the estimators with ``transform``:
    ``get_feature_names_out`` (the embedding's columns named as scikit-learn names
    its embeddings': tsne0, tsne1, ...) and ``set_output``, whose "pandas" or
    "polars" makes ``transform`` and ``fit_transform`` return DataFrames of those
    columns (with a pandas input's index), as scikit-learn's global
    ``set_config(transform_output=...)`` does where no estimator setting is given.
    Without them a Pipeline of these estimators refused ``set_output``."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in ("transform", "fit_transform"):
            if name in cls.__dict__:
                setattr(cls, name, _in_output_container(cls.__dict__[name]))

    def get_feature_names_out(self, input_features=None):
        """The output columns' names: the class name in lower case and the column's
        number.  ``input_features``, if given, must hold one name per input feature
        (a DataFrame's column names are not kept: no ``feature_names_in_``)."""
        check_fitted(self, hasattr(self, "embedding_"), "get_feature_names_out")
        n_in = getattr(self, "n_features_in_", None)      # none: affinities given alone
        if input_features is not None and n_in is not None and len(input_features) != n_in:
            raise ValueError(f"input_features should have length equal to number of "
                             f"features ({n_in}), got {len(input_features)}")   # scikit-learn's
        prefix = type(self).__name__.lower()
        return np.asarray([f"{prefix}{i}" for i in range(self.embedding_.shape[1])], dtype=object)

    def set_output(self, *, transform=None):
        """The container ``transform`` and ``fit_transform`` return: "default" (NumPy
        arrays), "pandas" or "polars" (DataFrames); None keeps the setting."""
        if transform is None:
            return self
        check_choice(transform, "transform", OUTPUTS)
        if transform != "default":
            try:
                importlib.import_module(transform)
            except ImportError as error:
                raise ImportError(f"set_output(transform={transform!r}) needs {transform}, "
                                  f"which is not installed") from error
        self._sklearn_output_config = {"transform": transform}  # scikit-learn's clone keeps it
        return self


def _in_output_container(method):
    """``method`` (transform or fit_transform) returning the container that
    set_output (or scikit-learn's global setting) asks for."""
    data = list(inspect.signature(method).parameters)[1]      # X, X_new, Y or Y_new

    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        out = method(self, *args, **kwargs)
        X = args[0] if args else kwargs.get(data)
        kind = getattr(self, "_sklearn_output_config", {}).get("transform")
        if kind is None and "sklearn" in sys.modules:   # set by a user who imported it
            kind = sys.modules["sklearn"].get_config().get("transform_output", "default")
        if kind in (None, "default"):
            return out
        columns = list(self.get_feature_names_out())
        if kind == "polars":
            import polars

            return polars.DataFrame(out, schema=columns, orient="row")
        import pandas

        index = X.index if isinstance(X, pandas.DataFrame) else None
        return pandas.DataFrame(out, columns=columns, index=index)
    return wrapped


def _same(default, value):
    try:
        return bool(default is value or default == value)
    except (TypeError, ValueError):       # arrays compare elementwise
        return False


def fill_doc(**sections):
    """Decorator of classes and functions: each line of the docstring that is only
    ``{name}`` becomes ``sections[name]``, indented as that line was (numpydoc
    sections that several estimators share, written once)."""
    def decorate(cls):
        if cls.__doc__ is None:                   # python -OO drops docstrings
            return cls
        lines = []
        for line in cls.__doc__.splitlines():
            name = line.strip()
            if name.startswith("{") and name.endswith("}") and name[1:-1] in sections:
                indent = line[:len(line) - len(line.lstrip())]
                lines += [indent + text if text else text
                          for text in inspect.cleandoc(sections[name[1:-1]]).splitlines()]
            else:
                lines.append(line)
        cls.__doc__ = "\n".join(lines)
        return cls
    return decorate
