"""Generated numba loops (gpuembed/_generated.py) are cached on disk across processes."""
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuembed._generated import cache_folder, compile_source
from gpuembed.nbody.barneshut_cpu import _compiled as bh_compiled
from gpuembed.nbody.exact_cpu import _compiled as exact_compiled

# A small loop in the generated engines' style (prange, expneg), quick to compile.
SOURCE = """
def sums(x, out):
    for i in prange(x.shape[0]):
        out[i] = expneg(x[i]) + np.float64(1.0)
"""

SCRIPT = f"""
import json, numpy as np
from gpuembed._generated import compile_source
f = compile_source({SOURCE!r}, "sums", parallel=True)
x = np.linspace(0.0, 5.0, 11)
out = np.empty_like(x)
f(x, out)
print(json.dumps({{"hits": sum(f.stats.cache_hits.values()),
                  "misses": sum(f.stats.cache_misses.values()), "out": out.tolist()}}))
"""


def _run(script, cache_dir):
    """The last line ``script`` prints, run in a new process with ``cache_dir``."""
    env = dict(os.environ, GPUEMBED_CACHE_DIR=str(cache_dir))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_second_process_loads_the_compiled_loop(tmp_path):
    first, second = (json.loads(_run(SCRIPT, tmp_path)) for _ in range(2))
    assert (first["hits"], first["misses"]) == (0, 1)
    assert (second["hits"], second["misses"]) == (1, 0)
    expected = np.exp(-np.linspace(0.0, 5.0, 11)) + 1.0
    np.testing.assert_allclose(first["out"], expected, rtol=1e-12)
    assert second["out"] == first["out"]
    assert len(list(tmp_path.glob("sums_*.py"))) == 1


def test_unwritable_cache_folder_compiles_in_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("GPUEMBED_CACHE_DIR", str(blocker / "cache"))
    f = compile_source(SOURCE, "sums")
    x = np.array([0.0, 1.0, 2.0])
    out = np.empty(3)
    f(x, out)
    np.testing.assert_allclose(out, np.exp(-x) + 1.0, rtol=1e-12)


def test_a_damaged_source_file_is_written_again(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUEMBED_CACHE_DIR", str(tmp_path))
    compile_source(SOURCE, "sums")
    (path,) = tmp_path.glob("sums_*.py")
    path.write_text("def sums(x, out):\n    pass\n")
    f = compile_source(SOURCE, "sums")
    out = np.zeros(1)
    f(np.array([1.0]), out)
    np.testing.assert_allclose(out, np.exp(-1.0) + 1.0, rtol=1e-12)


def test_each_source_gets_its_own_file(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUEMBED_CACHE_DIR", str(tmp_path))
    compile_source(SOURCE, "sums")
    compile_source(SOURCE, "sums")
    compile_source(SOURCE.replace("1.0", "2.0"), "sums")
    assert len(list(tmp_path.glob("sums_*.py"))) == 2


def test_the_engines_loops_come_from_the_cache_folder():
    try:
        cache_folder().mkdir(parents=True, exist_ok=True)
    except OSError:
        pytest.skip(f"{cache_folder()} cannot be made here")
    for compiled in (exact_compiled(2, 1, False, False), bh_compiled(2, 2)):
        assert Path(inspect.getfile(compiled.py_func)).parent == cache_folder()


ENGINES = """
import hashlib, numpy as np, gpuembed as ge
rng = np.random.default_rng(0)
digest = hashlib.sha256()
for dim, kernel in ((1, "gaussian"), (2, "student2"), (3, "student")):
    X = rng.normal(size=(600, dim))
    for method in ("exact", "bh"):
        for part in ge.nbody.kernel_sums(X, kernel, method=method, backend="cpu"):
            digest.update(np.ascontiguousarray(part).tobytes())
# The exact loop with shifts, weights and excluded sources (multi-scale SNE's).
X = rng.normal(size=(600, 2))
Y, own = X[:200] + 0.01, np.arange(200)
for S, SX in ge.nbody.exact.exact_sums(
        ge.get_backend("cpu"), X, ("gaussian",), Y=Y, weights=rng.random(600),
        target_shift=np.full(200, 0.01), source_shift=np.zeros(600), exclude=own):
    digest.update(S.tobytes() + SX.tobytes())
print(digest.hexdigest())
"""


def test_engines_give_the_same_bits_compiled_or_loaded_from_the_cache(tmp_path):
    """A first run from a new checkout (the loops compiled in the process) must
    repeat later ones (loaded from the cache): the exact loops reassociate their
    sums, whose order is the machine code's (an earlier form, compiled with all
    of fastmath's flags, differed in the last bits)."""
    digests = [_run(ENGINES, tmp_path) for _ in range(2)]
    assert len(list(tmp_path.glob("sums_*.py"))) == 7
    assert digests[0] == digests[1]


def test_modules_inlining_fastexp_carry_its_digest():
    """numba's cache of a hand-written module is keyed by that module's text, not
    by fastexp.py's, whose functions its compiled code inlines: every module that
    imports fastexp carries FASTEXP_DIGEST, current, so that a change to the exp
    changes the module and its cached code is compiled again."""
    import importlib

    from gpuembed._generated import fastexp_digest

    package = Path(__file__).resolve().parents[1] / "gpuembed"
    importers = sorted(
        ".".join(path.relative_to(package.parent).with_suffix("").parts)
        for path in package.rglob("*.py")
        if any(f"from {dots}fastexp import" in path.read_text() for dots in ("..", ".")))
    assert len(importers) == 4
    for name in importers:
        assert importlib.import_module(name).FASTEXP_DIGEST == fastexp_digest(), (
            f"{name}.FASTEXP_DIGEST should be {fastexp_digest()!r}")
