"""The CPU emulator of CUDA kernels (tests/emulated_cuda.py), which runs the
``gpu`` tests without a GPU (``pytest -m gpu --emulated-gpu``): its barriers must
be real barriers, and what is undefined or silently wrong on a GPU must raise."""
import numpy as np
import pytest

from emulated_cuda import COMPILER, EmulatedBackend, compile_kernel

pytestmark = pytest.mark.skipif(COMPILER is None, reason="the CUDA emulator needs g++")

# Block sum through shared memory; SYNC is where the barrier goes.
BLOCK_SUM = """
template <typename T>
__global__ void block_sum(const T* __restrict__ x, long long n, T* __restrict__ out) {
    extern __shared__ unsigned char smem[];
    T* buf = reinterpret_cast<T*>(smem);
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    buf[threadIdx.x] = i < n ? x[i] : T(0);
    SYNC
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        SYNC
    }
    if (threadIdx.x == 0) out[blockIdx.x] = buf[0];
}
template __global__ void block_sum<double>(const double*, long long, double*);
"""

WARP_SUM = """
__global__ void warp_sum(const float* __restrict__ x, int early_exit, float* __restrict__ out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (early_exit && threadIdx.x == 5) return;
    float v = x[i];
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    out[i] = __shfl_sync(0xffffffffu, v, 3);
}
"""

EXIT_BEFORE_SYNC = """
__global__ void exit_before_sync(float* __restrict__ out) {
    if (threadIdx.x == 0) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}
"""


def block_sum(sync):
    return compile_kernel(BLOCK_SUM.replace("SYNC", sync), "block_sum<double>")


def test_shared_memory_reduction_needs_its_barriers(rng):
    x = rng.standard_normal(1000)
    n_blocks = 4
    expected = np.add.reduceat(np.pad(x, (0, 24)), np.arange(0, 1024, 256))
    for sync, correct in (("__syncthreads();", True), ("", False)):
        out = np.zeros(n_blocks)
        block_sum(sync)((n_blocks,), (256,), (x, np.int64(x.size), out), shared_mem=256 * 8)
        # Without the barriers thread 0 runs through the whole tree before the
        # other threads store their values: the emulator must show that race.
        assert np.allclose(out, expected, rtol=1e-12) == correct


def test_warp_shuffles_exchange_lane_values(rng):
    x = rng.standard_normal(128).astype(np.float32)
    out = np.zeros_like(x)
    kernel = compile_kernel(WARP_SUM, "warp_sum")
    kernel((2,), (64,), (x, np.int32(0), out))
    np.testing.assert_allclose(out, np.repeat(x.reshape(4, 32).sum(axis=1), 32), rtol=1e-5)


READ_LEFT_NEIGHBOUR = """
__global__ void read_left(const float* __restrict__ x, float* __restrict__ out) {
    extern __shared__ unsigned char smem[];
    float* buf = reinterpret_cast<float*>(smem);
    buf[threadIdx.x] = x[threadIdx.x];
    SYNC
    out[threadIdx.x] = threadIdx.x ? buf[threadIdx.x - 1] : 0.0f;
}
"""


def test_reverse_order_exposes_a_race_the_forward_order_hides(rng):
    x = rng.standard_normal(64).astype(np.float32)
    expected = np.concatenate([[0.0], x[:-1]])
    for sync, flags, correct in (("", (), True), ("", ("-DEMU_REVERSE_ORDER",), False),
                                 ("__syncthreads();", ("-DEMU_REVERSE_ORDER",), True)):
        out = np.zeros_like(x)
        kernel = compile_kernel(READ_LEFT_NEIGHBOUR.replace("SYNC", sync), "read_left", flags)
        kernel((1,), (64,), (x, out), shared_mem=64 * 4)
        assert np.array_equal(out, expected) == correct


def test_undefined_behaviour_is_reported(rng):
    x = rng.standard_normal(64).astype(np.float32)
    warp_sum = compile_kernel(WARP_SUM, "warp_sum")
    with pytest.raises(RuntimeError, match="lanes that exited"):
        warp_sum((1,), (64,), (x, np.int32(1), np.zeros_like(x)))
    with pytest.raises(RuntimeError, match="do not exist"):
        warp_sum((1,), (48,), (x, np.int32(0), np.zeros_like(x)))
    with pytest.raises(RuntimeError, match="__syncthreads"):
        compile_kernel(EXIT_BEFORE_SYNC, "exit_before_sync")((1,), (64,),
                                                             (np.zeros(64, np.float32),))


def test_launches_are_checked_like_a_gpu_would_fail(rng):
    x = rng.standard_normal(256)
    kernel = block_sum("__syncthreads();")
    good = (x, np.int64(x.size), np.zeros(1))
    kernel((1,), (256,), good, shared_mem=256 * 8)
    with pytest.raises(TypeError, match="NumPy int64 scalar"):
        kernel((1,), (256,), (x, x.size, np.zeros(1)), shared_mem=2048)   # CuPy passes int64 anyway
    with pytest.raises(TypeError, match="NumPy int64 scalar"):
        kernel((1,), (256,), (x, np.int32(x.size), np.zeros(1)), shared_mem=2048)
    with pytest.raises(TypeError, match="points to float64; got an array of float32"):
        kernel((1,), (256,), (x.astype(np.float32), np.int64(256), np.zeros(1)), shared_mem=2048)
    with pytest.raises(ValueError, match="C-contiguous"):
        kernel((1,), (128,), (x[::2], np.int64(128), np.zeros(1)), shared_mem=1024)
    with pytest.raises(ValueError, match="read-only"):
        out = np.zeros(1)
        out.flags.writeable = False
        kernel((1,), (256,), (x, np.int64(256), out), shared_mem=2048)
    with pytest.raises(TypeError, match="takes 3 arguments"):
        kernel((1,), (256,), good[:2], shared_mem=2048)
    with pytest.raises(ValueError, match="1024 threads"):
        kernel((1,), (64, 32), good, shared_mem=2048)
    with pytest.raises(ValueError, match="grid"):
        kernel((0,), (256,), good, shared_mem=2048)
    with pytest.raises(ValueError, match="shared_mem"):
        kernel((1,), (256,), good, shared_mem=64 * 1024)


def test_backend_runs_the_shipped_kernels_from_the_gpu_code_paths(rng):
    """The emulated backend is the "gpu" backend on emulated CuPy arrays: a GPU
    entry point runs its launch code and the kernel of kernels/*.cu, which
    refuses host arrays as CuPy does."""
    from gpuembed.nbody.exact import _exact_gpu, blocked_sums

    be = EmulatedBackend()
    assert be.is_gpu and be.xp is not np
    X = be.asarray(rng.standard_normal((300, 2)))
    S, SX = _exact_gpu(be, X, 2, None, None)
    for (s, sx), (ref_s, ref_sx) in zip(zip(S, SX), blocked_sums(be, X, ("student", "student2"))):
        ref_sx = be.to_host(ref_sx)
        np.testing.assert_allclose(be.to_host(s), be.to_host(ref_s), rtol=1e-13)
        np.testing.assert_allclose(be.to_host(sx), ref_sx, rtol=1e-12,
                                   atol=1e-13 * np.abs(ref_sx).max())
    kernel = be.kernel("nbody_exact.cu", "nbody_exact", np.float64,
                       {"NBODY_DIM": 2, "NBODY_KERNEL": 0})
    with pytest.raises(TypeError, match="host array"):
        kernel((1,), (32,), (np.zeros(4),) + (None,) * (len(kernel.signature) - 1))
