// The MLP mapping's elementwise steps, one launch each in place of 2-3 CuPy calls
// (gpuembed/parametric/mappings.py, whose NumPy branches are the references).  A
// minibatch of a net with two hidden layers made 38 calls and launches; MAC's F
// steps on the GPU are bound by their count, not by the arithmetic.  Arithmetic in
// T as the references', one thread per element (grid-stride).

// H (rows x cols, row-major) <- H + b (bias per column), then tanh if activate.
template <typename T>
__global__ void bias_activation(T* __restrict__ H, const T* __restrict__ b, long long n,
                                long long cols, int activate) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const T h = H[i] + b[i % cols];
        H[i] = activate ? tanh(h) : h;
    }
}

// D <- D (1 - A^2): back through tanh, whose output is A.
template <typename T>
__global__ void tanh_backward(T* __restrict__ D, const T* __restrict__ A, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        D[i] *= (T)1 - A[i] * A[i];
    }
}

// O <- (O - Z) scale: the squared error's gradient at the output O for targets Z.
template <typename T>
__global__ void scaled_residual(T* __restrict__ O, const T* __restrict__ Z, long long n,
                                double scale) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        O[i] = (O[i] - Z[i]) * (T)scale;
    }
}

// The minibatch steps' products and bias gradients, in place of cuBLAS and CuPy's
// reduction: CuPy refuses cuBLAS calls while a stream captures a CUDA graph, and
// MLPMapping.fit replays its steps from graphs.  The operands are a minibatch
// (about 100 rows) against a layer's weights, small enough that 16 x 16 tiles
// fill the GPU poorly but cost no more than the launches they replace.
#define GEMM_TILE 16

// C (M x N, row-major) = A B, A (M x K) and B (K x N) read through element strides
// (row, column), so that the transposed views of back-propagation (A^T, W^T) are
// read in place.  A block per 16 x 16 tile of C, the sums over k in tiles of 16
// staged in shared memory, each in ascending k.
template <typename T>
__global__ void gemm(const T* __restrict__ A, long long a_row, long long a_col,
                     const T* __restrict__ B, long long b_row, long long b_col,
                     T* __restrict__ C, int M, int N, int K) {
    __shared__ T As[GEMM_TILE][GEMM_TILE];
    __shared__ T Bs[GEMM_TILE][GEMM_TILE + 1];
    const int ty = threadIdx.y, tx = threadIdx.x;
    const int i = blockIdx.y * GEMM_TILE + ty, j = blockIdx.x * GEMM_TILE + tx;
    T sum = 0;
    for (int k0 = 0; k0 < K; k0 += GEMM_TILE) {
        As[ty][tx] = i < M && k0 + tx < K ? A[i * a_row + (k0 + tx) * a_col] : (T)0;
        Bs[ty][tx] = k0 + ty < K && j < N ? B[(k0 + ty) * b_row + j * b_col] : (T)0;
        __syncthreads();
        for (int k = 0; k < GEMM_TILE; ++k) sum += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    if (i < M && j < N) C[(long long)i * N + j] = sum;
}

// out[j] = sum_i D[i, j] over the rows of D (rows x cols, row-major), in
// ascending i: a thread per column.
template <typename T>
__global__ void column_sums(const T* __restrict__ D, T* __restrict__ out, int rows, int cols) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    T sum = 0;
    for (int i = 0; i < rows; ++i) sum += D[(long long)i * cols + j];
    out[j] = sum;
}

template __global__ void gemm<float>(const float*, long long, long long, const float*, long long,
                                     long long, float*, int, int, int);
template __global__ void gemm<double>(const double*, long long, long long, const double*,
                                      long long, long long, double*, int, int, int);
template __global__ void column_sums<float>(const float*, float*, int, int);
template __global__ void column_sums<double>(const double*, double*, int, int);
template __global__ void bias_activation<float>(float*, const float*, long long, long long, int);
template __global__ void bias_activation<double>(double*, const double*, long long, long long,
                                                 int);
template __global__ void tanh_backward<float>(float*, const float*, long long);
template __global__ void tanh_backward<double>(double*, const double*, long long);
template __global__ void scaled_residual<float>(float*, const float*, long long, double);
template __global__ void scaled_residual<double>(double*, const double*, long long, double);
