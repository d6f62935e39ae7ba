"""Record the CuPy API that tests/emulated_cupy.py holds gpuembed's GPU code to.

Run once per CuPy release with CuPy installed (no GPU needed: importing CuPy and
inspecting it touches no device), e.g.

    python -m venv /tmp/cupy && /tmp/cupy/bin/pip install cupy-cuda12x
    /tmp/cupy/bin/python tests/record_cupy_api.py

and once for the oldest release pyproject.toml allows, into tests/cupy_api_oldest.json:

    /tmp/cupy13/bin/pip install cupy-cuda12x==13.0.0 "numpy<2"
    /tmp/cupy13/bin/python tests/record_cupy_api.py tests/cupy_api_oldest.json

The emulator holds the code to what both take.  It writes tests/cupy_api.json (or
the path given): the public names of cupy, cupy.linalg,
cupy.random, cupyx.scipy.sparse and cupyx.scipy.sparse.linalg, the attributes
of cupy.ndarray and of the sparse matrix classes, and the parameter names of
every function whose signature Python can read (ufuncs and most ndarray
methods are compiled and have none).  cupyx.scipy.sparse.linalg needs cuBLAS
to import, so its functions are read from the source instead.
"""
from __future__ import annotations

import ast
import inspect
import json
import sys
import textwrap
from pathlib import Path

import cupy
import cupyx
import cupyx.scipy.sparse

OUT = Path(__file__).with_name("cupy_api.json")


def parameters(obj):
    """Parameter names, with "**" when it takes arbitrary keywords; None if unknown."""
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return None
    return [("**" if p.kind is p.VAR_KEYWORD else "*" if p.kind is p.VAR_POSITIONAL else "")
            + p.name for p in params]


def namespace(module):
    names = {}
    for name in dir(module):
        if name.startswith("_"):
            continue
        obj = getattr(module, name)
        names[name] = {"ufunc": isinstance(obj, cupy.ufunc),
                       "module": inspect.ismodule(obj),
                       "params": parameters(obj) if callable(obj) else None}
    return names


def class_attributes(cls):
    names = {name: parameters(getattr(cls, name)) if callable(getattr(cls, name)) else None
             for name in dir(cls) if not name.startswith("_")}
    # Instance attributes (a sparse matrix's data, indices, indptr, row, col) are
    # set in the methods' source, where only the source shows them.
    for klass in cls.__mro__:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name) and node.value.id == "self"
                    and not node.attr.startswith("_")):
                names.setdefault(node.attr, None)
    return names


def source_functions(folder):
    """Functions that folder/__init__.py imports from its modules, with parameters
    read from the source."""
    found = {}
    for node in ast.parse((folder / "__init__.py").read_text()).body:
        if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
            continue
        tree = ast.parse((folder / (node.module.rsplit(".", 1)[1] + ".py")).read_text())
        defs = {d.name: d for d in tree.body if isinstance(d, (ast.FunctionDef, ast.ClassDef))}
        for alias in node.names:
            d = defs.get(alias.name)
            params = None
            if isinstance(d, ast.FunctionDef):
                a = d.args
                params = ([x.arg for x in a.posonlyargs + a.args]
                          + (["*" + a.vararg.arg] if a.vararg else [])
                          + [x.arg for x in a.kwonlyargs]
                          + (["**" + a.kwarg.arg] if a.kwarg else []))
            found[alias.asname or alias.name] = {"ufunc": False, "module": False,
                                                 "params": params}
    return found


def main():
    api = {
        "cupy_version": cupy.__version__,
        "namespaces": {
            "cupy": namespace(cupy),
            "cupy.linalg": namespace(cupy.linalg),
            "cupy.random": namespace(cupy.random),
            "cupy.fft": namespace(cupy.fft),
            "cupyx": namespace(cupyx),
            "cupyx.scipy.sparse": namespace(cupyx.scipy.sparse),
            "cupyx.scipy.sparse.linalg": source_functions(
                Path(cupyx.scipy.sparse.__file__).parent / "linalg"),
        },
        "ndarray": class_attributes(cupy.ndarray),
        "ufunc": sorted(n for n in dir(cupy.add) if not n.startswith("_")),
        "sparse_classes": {name: class_attributes(getattr(cupyx.scipy.sparse, name))
                           for name in ("csr_matrix", "csc_matrix", "coo_matrix")},
    }
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    out.write_text(json.dumps(api, indent=0, sort_keys=True) + "\n")
    print(f"wrote {out} (CuPy {cupy.__version__})")


if __name__ == "__main__":
    main()
