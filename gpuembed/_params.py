"""get_params / set_params in scikit-learn's convention, without depending on it.

With them (and ``fit(X, y=None)``, and ``__sklearn_tags__`` for scikit-learn
1.6 and later) the estimators work in scikit-learn's Pipeline, ``clone`` and
GridSearchCV: a parameter is an ``__init__`` argument
of the class or of one of its bases, stored under its own name; nested
estimators' parameters read ``outer__inner``.  They keep a DataFrame's column
names as scikit-learn's do (:class:`FeatureNamesIn`), and the embeddings with
``transform`` take its output API (:class:`TransformerOutput`).
"""
from __future__ import annotations

import functools
import importlib
import inspect
import sys

import numpy as np

from ._checks import check_choice, check_fitted, warn


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


def _data_argument(method, args, kwargs):
    """The data a method was given: its first argument (X, X_new, Y or Y_new)."""
    if args:
        return args[0]
    return kwargs.get(list(inspect.signature(method).parameters)[1])


def _feature_names(X):
    """A DataFrame's column names as an object array where all are strings, else
    None; mixed strings and others raise scikit-learn's TypeError."""
    columns = getattr(X, "columns", None)
    if columns is None:
        return None
    names = np.asarray(list(columns), dtype=object)
    kinds = sorted({type(name).__qualname__ for name in names})
    if len(kinds) > 1 and "str" in kinds:
        raise TypeError(f"Feature names are only supported if all input features have string "
                        f"names, but your input has {kinds} as feature name / column name "
                        f"types. Convert them all to strings (X.columns = "
                        f"X.columns.astype(str)) or none of them.")
    return names if kinds == ["str"] else None


def _keeping_feature_names(fit):
    """``fit`` that keeps its data's column names as ``feature_names_in_``."""
    @functools.wraps(fit)
    def wrapped(self, *args, **kwargs):
        names = _feature_names(_data_argument(fit, args, kwargs))
        out = fit(self, *args, **kwargs)
        if names is None:
            self.__dict__.pop("feature_names_in_", None)
        else:
            self.feature_names_in_ = names
        return out
    return wrapped


def _check_feature_names(estimator, X):
    """scikit-learn's check of new data's column names against ``feature_names_in_``."""
    fitted, names = getattr(estimator, "feature_names_in_", None), _feature_names(X)
    what = type(estimator).__name__
    if fitted is None and names is not None:
        warn(f"X has feature names, but {what} was fitted without feature names", UserWarning)
    elif fitted is not None and names is None:
        warn(f"X does not have valid feature names, but {what} was fitted with feature names",
             UserWarning)
    elif fitted is not None and not np.array_equal(fitted, names):
        unseen = sorted(set(names) - set(fitted))
        missing = sorted(set(fitted) - set(names))
        listed = lambda values: "".join(f"- {v}\n" for v in values[:5]) + (
            "- ...\n" if len(values) > 5 else "")
        message = "The feature names should match those that were passed during fit.\n"
        if unseen:
            message += "Feature names unseen at fit time:\n" + listed(unseen)
        if missing:
            message += "Feature names seen at fit time, yet now missing:\n" + listed(missing)
        if not unseen and not missing:
            message += "Feature names must be in the same order as they were in fit.\n"
        raise ValueError(message)


def _checking_feature_names(method):
    """``method`` (transform or predict) that checks its data's column names first."""
    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        _check_feature_names(self, _data_argument(method, args, kwargs))
        return method(self, *args, **kwargs)
    return wrapped


def _in_output_container(method):
    """``method`` (transform or fit_transform) returning the container that
    set_output (or scikit-learn's global setting) asks for."""
    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        X = _data_argument(method, args, kwargs)
        out = method(self, *args, **kwargs)
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


def _wrap_methods(cls, wrappers, mark):
    """Wraps the methods of ``cls`` named in ``wrappers`` (inherited ones too:
    LaplacianEigenmaps' fit is its base's), each once per ``mark``."""
    for name, wrap in wrappers:
        method = getattr(cls, name, None)
        if method is not None and mark not in getattr(method, "_conventions", ()):
            wrapped = wrap(method)
            wrapped._conventions = getattr(method, "_conventions", frozenset()) | {mark}
            setattr(cls, name, wrapped)


class FeatureNamesIn:
    """scikit-learn's ``feature_names_in_``: ``fit`` keeps a DataFrame's column
    names (where all are strings), and ``transform`` and ``predict`` refuse a
    DataFrame whose columns differ from them, with scikit-learn's messages (and
    its warnings where only one of the two has names).  A DataFrame with its
    columns reordered had been embedded or clustered silently as other features."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _wrap_methods(cls, (("fit", _keeping_feature_names),
                            ("transform", _checking_feature_names),
                            ("predict", _checking_feature_names)), "names")


class TransformerOutput(FeatureNamesIn):
    """scikit-learn's output API, for the estimators with ``transform``:
    ``get_feature_names_out`` names the embedding's columns as scikit-learn names
    its embeddings' (tsne0, tsne1, ...), and ``set_output``'s "pandas" or "polars"
    makes ``transform`` and ``fit_transform`` return DataFrames of those columns
    (with a pandas input's index), as scikit-learn's global
    ``set_config(transform_output=...)`` does where no estimator setting is given.
    Without it a Pipeline of these estimators refused ``set_output``."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _wrap_methods(cls, (("transform", _in_output_container),
                            ("fit_transform", _in_output_container)), "output")

    def get_feature_names_out(self, input_features=None):
        """The output columns' names: the class name in lower case and the column's
        number.  ``input_features``, if given, must be ``feature_names_in_`` where
        fit kept those, else hold one name per input feature."""
        check_fitted(self, hasattr(self, "embedding_"), "get_feature_names_out")
        if input_features is not None:              # scikit-learn's words
            known = getattr(self, "feature_names_in_", None)
            if known is not None and not np.array_equal(np.asarray(input_features, object),
                                                        known):
                raise ValueError("input_features is not equal to feature_names_in_")
            n_in = getattr(self, "n_features_in_", None)  # none: affinities given alone
            if n_in is not None and len(input_features) != n_in:
                raise ValueError(f"input_features should have length equal to number of "
                                 f"features ({n_in}), got {len(input_features)}")
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
