import subprocess
import shutil

import numpy as np
import pytest

import gpuembed as ge
from gpuembed import backend as backend_module
from gpuembed.backend import kernel_path, kernel_source
from conftest import HAS_GPU

KERNEL_FILES = ["adam.cu", "attraction.cu", "barneshut.cu", "bh_tree.cu", "cg.cu", "entropic.cu",
                "fgt.cu", "graph.cu", "knn_select.cu", "mlp.cu", "msne.cu", "nbody_exact.cu"]


def test_cpu_backend_attributes():
    be = ge.get_backend("cpu")
    assert be.name == "cpu" and be.xp is np
    assert be.default_float == np.float64
    assert ge.get_backend(be) is be
    a = be.asarray([1.0, 2.0])
    assert isinstance(a, np.ndarray) and be.to_host(a) is a


def test_cpu_scatter_add_accumulates_repeats():
    be = ge.get_backend("cpu")
    out = be.scatter_add(np.zeros(3), np.array([0, 2, 0, 0]), np.array([1.0, 2.0, 3.0, 4.0]))
    np.testing.assert_array_equal(out, [8.0, 0.0, 2.0])


def test_unknown_backend_name():
    with pytest.raises(ValueError, match="backend"):
        ge.get_backend("tpu")


def test_auto_falls_back_to_cpu_without_gpu():
    assert ge.get_backend("auto").name == ("gpu" if HAS_GPU else "cpu")


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_gpu_unavailable_says_what_is_missing():
    with pytest.raises(ge.BackendUnavailable, match="CuPy|CUDA|device"):
        ge.get_backend("gpu")


def test_cpu_backend_refuses_kernels():
    with pytest.raises(ge.BackendUnavailable):
        ge.get_backend("cpu").kernel("knn_select.cu", "knn_select", np.float32)


@pytest.mark.parametrize("name", KERNEL_FILES)
def test_kernel_sources_are_found(name):
    path = kernel_path(name)
    assert path.is_file() and path.suffix == ".cu"


def test_every_kernel_file_is_listed():
    # The repository's kernels/ must match what the tests know about.
    shipped = sorted(p.name for d in backend_module.kernel_dirs() if d.is_dir()
                     for p in d.glob("*.cu"))
    assert sorted(set(shipped)) == sorted(KERNEL_FILES)


def test_kernel_lookup_prefers_package_then_checkout(tmp_path, monkeypatch):
    package_dir, checkout_dir = tmp_path / "pkg", tmp_path / "checkout"
    package_dir.mkdir()
    checkout_dir.mkdir()
    (checkout_dir / "a.cu").write_text("// checkout a")
    (checkout_dir / "b.cu").write_text("// checkout b")
    (package_dir / "a.cu").write_text("// package a")
    monkeypatch.setattr(backend_module, "kernel_dirs", lambda: [package_dir, checkout_dir])
    assert kernel_path("a.cu") == package_dir / "a.cu"
    assert kernel_path("b.cu") == checkout_dir / "b.cu"
    with pytest.raises(FileNotFoundError, match="c.cu"):
        kernel_path("c.cu")


def test_kernel_source_prepends_defines():
    src = kernel_source("knn_select.cu", {"KNN_MAX_K": 64, "A_FLAG": 1})
    assert src.startswith("#define A_FLAG 1\n#define KNN_MAX_K 64\n")
    assert src.endswith(kernel_path("knn_select.cu").read_text())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", KERNEL_FILES)
def test_kernel_compiles_with_nvcc(name, tmp_path):
    src = tmp_path / name
    src.write_text(kernel_source(name))
    result = subprocess.run(
        ["nvcc", "-std=c++17", "-arch=sm_90", "-ptx", "-o", str(tmp_path / "out.ptx"), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert ".entry" in (tmp_path / "out.ptx").read_text()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("m", [512, 600, 1025])
def test_knn_selection_lists_fit_shared_memory(m, tmp_path):
    """The k-NN selection's defines for m (list length, warps per block) pass
    ptxas's 48 KiB static shared-memory limit for both instantiations."""
    from gpuembed.neighbors import _pow2, _warps_per_block

    src = tmp_path / "knn_select.cu"
    src.write_text(kernel_source("knn_select.cu", {"KNN_MAX_K": _pow2(m),
                                                   "KNN_WARPS": _warps_per_block(m)}))
    result = subprocess.run(
        ["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-o", str(tmp_path / "out.cubin"),
         str(src)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


@pytest.mark.gpu
def test_gpu_backend_round_trip():
    be = ge.get_backend("gpu")
    a = be.asarray(np.arange(5.0))
    assert hasattr(a, "__cuda_array_interface__") and not isinstance(a, np.ndarray)
    np.testing.assert_array_equal(be.to_host(a), np.arange(5.0))
    out = be.scatter_add(be.xp.zeros(3), be.asarray(np.array([0, 2, 0])),
                         be.asarray([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(be.to_host(out), [4.0, 0.0, 2.0])


@pytest.mark.gpu
def test_a_captured_graph_replays_on_the_contents_at_launch(rng):
    """Backend.capture records without running, and each launch runs the work on
    the arrays' contents then: RawKernels (the MLP's product, split in parts whose
    sums a second launch adds, and column sums into preallocated outputs), CuPy's
    elementwise arithmetic with a temporary (from the graph's own pool) and an
    in-place update.  (CuPy refuses cuBLAS calls during capture.)"""
    from gpuembed.parametric.mappings import GEMM_WORKSPACE, column_sums, gemm, gemm_splits
    be = ge.get_backend("gpu")
    xp = be.xp
    A, B = be.asarray(rng.normal(size=(50, 300))), be.asarray(rng.normal(size=(300, 20)))
    out, col, workspace = xp.zeros((50, 20)), xp.zeros(20), xp.zeros(GEMM_WORKSPACE)
    assert gemm_splits(50, 20, 300)[0] > 1

    def work():
        column_sums(gemm(A, B, out, workspace), col)
        col[...] = col * 2.0 + 1.0
    graph = be.capture(work)
    np.testing.assert_array_equal(be.to_host(col), 0.0)         # nothing ran
    for _ in range(2):
        graph.launch()
        want = 2.0 * (be.to_host(A) @ be.to_host(B)).sum(axis=0) + 1.0
        np.testing.assert_allclose(be.to_host(col), want, rtol=1e-10, atol=1e-10)
        A[...] = -A


def test_minimize_runs_blas_on_one_thread(rng):
    """OpenBLAS workers that busy-wait between the loop's dot products slowed
    numba's parallel sweeps 2x; minimize holds BLAS at one thread, and gives the
    threads back after."""
    threadpoolctl = pytest.importorskip("threadpoolctl")

    def blas_threads():
        return [p["num_threads"] for p in threadpoolctl.threadpool_info()
                if p["user_api"] == "blas"]

    before = blas_threads()
    seen = []
    X = rng.standard_normal((60, 5))
    ge.TSNE(perplexity=10, optimizer="lbfgs", max_iter=5, backend="cpu",
            callbacks=[lambda *args: seen.append(blas_threads())]).fit(X)
    assert seen and all(threads == [1] * len(before) for threads in seen)
    assert blas_threads() == before


def test_serial_blas_sections_of_several_threads_share_one_limit(rng):
    """BLAS's thread count is the process's.  A section that ends while another
    thread's runs leaves BLAS on one thread (a limit per section, restored as it
    ended, had put the other back on OpenBLAS's threads), the last to end gives
    the threads back, and a worker thread's section holds too after the main
    thread's (threadpoolctl from 3.8 ignores a thread other than the first to
    set a pthreads OpenBLAS's limit, until that one lets go).  So fits in
    threads, beside each other and beside other BLAS work, give the bits of
    the same fits alone."""
    import threading
    threadpoolctl = pytest.importorskip("threadpoolctl")

    def blas_threads():
        return [p["num_threads"] for p in threadpoolctl.threadpool_info()
                if p["user_api"] == "blas"]

    be = ge.get_backend("cpu")
    before = blas_threads()
    inside, outer_done, seen = threading.Event(), threading.Event(), {}

    def inner():
        with be.serial_blas():
            inside.set()
            outer_done.wait(10)
            seen["after the other ended"] = blas_threads()

    with be.serial_blas():                  # the main thread's, first
        worker = threading.Thread(target=inner)
        worker.start()
        inside.wait(10)
    outer_done.set()
    worker.join()
    assert seen["after the other ended"] == [1] * len(before)
    assert blas_threads() == before

    X = rng.standard_normal((150, 8))
    fit = lambda: ge.TSNE(perplexity=10, max_iter=60, random_state=0, backend="cpu"
                          ).fit_transform(X)
    alone, beside = fit(), {}
    work = [threading.Thread(target=lambda i=i: beside.update({i: fit()})) for i in range(3)]
    spin = threading.Thread(target=lambda: [X.T @ X for _ in range(2000)])
    for t in work + [spin]:
        t.start()
    for t in work + [spin]:
        t.join()
    for Y in beside.values():
        np.testing.assert_array_equal(Y, alone)
    assert blas_threads() == before


def test_block_products_cut_tiles_on_single_threaded_blas(rng, monkeypatch):
    """The k-NN's block products (_sparse.BlockProducts): on the CPU, A @ B.T in
    fixed tiles on numba's threads with BLAS held at one thread inside the context
    (with one thread too) and given back after, the same bits on 1 and 2 threads
    (float32: an entry's last bits depend on the cut); sparse operands take
    _sparse.product."""
    import numba
    import scipy.sparse
    threadpoolctl = pytest.importorskip("threadpoolctl")

    from gpuembed import _sparse

    if numba.get_num_threads() < 2:
        pytest.skip("needs 2 of numba's threads")

    def blas_threads():
        return [p["num_threads"] for p in threadpoolctl.threadpool_info()
                if p["user_api"] == "blas"]

    monkeypatch.setattr(_sparse, "TILE_ROWS", 16)
    monkeypatch.setattr(_sparse, "TILE_COLS", 24)
    before = blas_threads()
    A = rng.standard_normal((37, 300)).astype(np.float32)
    B = rng.standard_normal((50, 300)).astype(np.float32)
    calls = []
    product = _sparse.product
    monkeypatch.setattr(_sparse, "product", lambda *a: calls.append(1) or product(*a))
    threads, products = numba.get_num_threads(), {}
    try:
        for n_threads in (2, 1):
            numba.set_num_threads(n_threads)
            with _sparse.BlockProducts(ge.get_backend("cpu")) as block_products:
                assert blas_threads() == [1] * len(before)
                products[n_threads] = block_products(A, B.T)
    finally:
        numba.set_num_threads(threads)
    assert not calls and blas_threads() == before
    np.testing.assert_array_equal(products[1], products[2])
    np.testing.assert_allclose(products[2], A.astype(np.float64) @ B.T, rtol=1e-5, atol=1e-4)
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    with _sparse.BlockProducts(ge.get_backend("cpu")) as block_products:
        S = block_products(scipy.sparse.csr_matrix(A64),
                           _sparse.transposed(scipy.sparse.csr_matrix(B64)))
    assert calls == [1]
    np.testing.assert_allclose(S, A64 @ B64.T, rtol=1e-12, atol=1e-12)
