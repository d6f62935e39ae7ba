"""Shared fixtures: every test marked ``gpu`` is skipped without CuPy and a
CUDA device, and the ``backend`` fixture runs a test once per available
backend (inputs are always drawn with NumPy, then moved to the device).

``pytest -m gpu --emulated-gpu`` runs the gpu tests without a GPU: the "gpu"
backend becomes tests/emulated_cuda.py's, NumPy arrays with the CUDA kernels
emulated on the CPU ("auto" resolves to it too, so select the gpu tests).

``numba_cache_runs(script)`` runs a script in two new processes sharing one empty
numba cache folder: the first compiles, the second loads what the first cached."""
import os
import subprocess
import sys

import numpy as np
import pytest

from gpuembed.backend import get_backend, gpu_available

HAS_GPU = gpu_available()


def pytest_addoption(parser):
    parser.addoption("--emulated-gpu", action="store_true",
                     help="run the gpu tests on NumPy arrays with the CUDA kernels emulated "
                          "on the CPU (tests/emulated_cuda.py)")


def pytest_configure(config):
    if config.getoption("--emulated-gpu"):
        from emulated_cuda import install

        install()


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs CuPy and a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def backend(request):
    return get_backend(request.param)


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture
def numba_cache_runs(tmp_path):
    """script -> the last line each of two processes printed running it with
    NUMBA_CACHE_DIR a folder that is empty before the first."""
    def runs(script):
        env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
        lines = []
        for _ in range(2):
            done = subprocess.run([sys.executable, "-c", script], capture_output=True,
                                  text=True, env=env, timeout=600)
            assert done.returncode == 0, done.stderr
            lines.append(done.stdout.strip().splitlines()[-1])
        return lines
    return runs
