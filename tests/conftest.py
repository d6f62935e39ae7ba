"""Shared fixtures: every test marked ``gpu`` is skipped without CuPy and a
CUDA device, and the ``backend`` fixture runs a test once per available
backend (inputs are always drawn with NumPy, then moved to the device)."""
import numpy as np
import pytest

from gpuembed.backend import get_backend, gpu_available

HAS_GPU = gpu_available()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
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
