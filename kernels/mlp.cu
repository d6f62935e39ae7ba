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
// (100 rows by default; 1,000 in MAC's t-SNE benchmark, where a step's products
// are about 0.45 GFLOP) against a layer's weights.  Plain 16 x 16 tiles: on an H200
// (4856c9f, calls back to back) the 256-wide products of that benchmark took 27-37 us
// each, cuBLAS 19-22 us, the host's launch pace.
#define GEMM_TILE 16

// C (M x N, row-major) = A B, A (M x K) and B (K x N) read through element strides
// (row, column), so that the transposed views of back-propagation (A^T, W^T) are
// read in place.  A block per 16 x 16 tile of C, the sums over k in tiles of 16
// staged in shared memory, each in ascending k.  Each tile is loaded with the
// threads of a warp along the operand's contiguous direction: by rows, the
// loads of a transposed view (dW = A^T delta over a minibatch of 1,000 rows,
// delta W^T) were 16 words 256 apart, one memory transaction each.
// Block z of a grid of depth gridDim.z sums only k in [z k_chunk, (z + 1) k_chunk)
// (k_chunk a multiple of the tile) into C + z M N, for sum_splits to add: the
// weight gradients sum 1,000 rows into 16 to 256 tiles, 63 tiles of k one after
// the other on each of few blocks.
template <typename T>
__global__ void gemm(const T* __restrict__ A, long long a_row, long long a_col,
                     const T* __restrict__ B, long long b_row, long long b_col,
                     T* __restrict__ C, int M, int N, int K, int k_chunk) {
    // Padded rows: a tile loaded across (tx the row) hits 16 distinct banks.
    __shared__ T As[GEMM_TILE][GEMM_TILE + 1];
    __shared__ T Bs[GEMM_TILE][GEMM_TILE + 1];
    const int ty = threadIdx.y, tx = threadIdx.x;
    const int i0 = blockIdx.y * GEMM_TILE, j0 = blockIdx.x * GEMM_TILE;
    const int i = i0 + ty, j = j0 + tx;
    // (r, c) of the element this thread loads: along the contiguous direction.
    const bool a_columns = a_row == 1 && a_col != 1, b_columns = b_row == 1 && b_col != 1;
    const int ar = a_columns ? tx : ty, ac = a_columns ? ty : tx;
    const int br = b_columns ? tx : ty, bc = b_columns ? ty : tx;
    const int k_begin = blockIdx.z * k_chunk, k_end = min(K, k_begin + k_chunk);
    C += (long long)blockIdx.z * M * N;
    T sum = 0;
    for (int k0 = k_begin; k0 < k_end; k0 += GEMM_TILE) {
        As[ar][ac] = i0 + ar < M && k0 + ac < k_end
                         ? A[(i0 + ar) * a_row + (k0 + ac) * a_col] : (T)0;
        Bs[br][bc] = k0 + br < k_end && j0 + bc < N
                         ? B[(k0 + br) * b_row + (j0 + bc) * b_col] : (T)0;
        __syncthreads();
        for (int k = 0; k < GEMM_TILE; ++k) sum += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    if (i < M && j < N) C[(long long)i * N + j] = sum;
}

// out[i] = partial[i] + partial[n + i] + ... over gemm's split products, in
// ascending split (a fixed order).
template <typename T>
__global__ void sum_splits(T* __restrict__ out, const T* __restrict__ partial, long long n,
                           int splits) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        T sum = partial[i];
        for (int z = 1; z < splits; ++z) sum += partial[z * n + i];
        out[i] = sum;
    }
}

// out[j] = sum_i D[i, j] over the rows of D (rows x cols, row-major): a block of
// SUM_COLUMNS x SUM_STRIPES threads per SUM_COLUMNS columns, thread (x, y) summing
// rows y, y + SUM_STRIPES, ... in ascending order, then the stripes' sums added in
// ascending y (a fixed order).  A thread per column made a bias gradient over a
// minibatch of 1,000 rows a chain of 1,000 dependent additions on one block; with
// 32 stripes each thread reads 32 rows or fewer (8 stripes: 125, not yet timed).
#define SUM_COLUMNS 32
#define SUM_STRIPES 32
template <typename T>
__global__ void column_sums(const T* __restrict__ D, T* __restrict__ out, int rows, int cols) {
    __shared__ T stripes[SUM_STRIPES][SUM_COLUMNS];
    const int x = threadIdx.x, y = threadIdx.y, j = blockIdx.x * SUM_COLUMNS + x;
    T sum = 0;
    if (j < cols) {
        for (int i = y; i < rows; i += SUM_STRIPES) sum += D[(long long)i * cols + j];
    }
    stripes[y][x] = sum;
    __syncthreads();
    if (y == 0 && j < cols) {
        for (int s = 1; s < SUM_STRIPES; ++s) sum += stripes[s][x];
        out[j] = sum;
    }
}

template __global__ void gemm<float>(const float*, long long, long long, const float*, long long,
                                     long long, float*, int, int, int, int);
template __global__ void gemm<double>(const double*, long long, long long, const double*,
                                      long long, long long, double*, int, int, int, int);
template __global__ void sum_splits<float>(float*, const float*, long long, int);
template __global__ void sum_splits<double>(double*, const double*, long long, int);
template __global__ void column_sums<float>(const float*, float*, int, int);
template __global__ void column_sums<double>(const double*, double*, int, int);
template __global__ void bias_activation<float>(float*, const float*, long long, long long, int);
template __global__ void bias_activation<double>(double*, const double*, long long, long long,
                                                 int);
template __global__ void tanh_backward<float>(float*, const float*, long long);
template __global__ void tanh_backward<double>(double*, const double*, long long);
template __global__ void scaled_residual<float>(float*, const float*, long long, double);
template __global__ void scaled_residual<double>(double*, const double*, long long, double);
