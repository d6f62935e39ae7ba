// The spectral direction's Jacobi-preconditioned linear CG on the GPU: A X = B
// for the sparse symmetric A (CSR) and the CG_D columns of B at once, each an
// independent system.  Mirrors gpuembed/optim/directions.py:pcg, its CuPy
// array-code reference (same iterates and stopping test), and
// gpuembed/optim/sparse_cpu.py:jacobi_pcg, the CPU's.
//
// As array code a CG step was about 19 CuPy calls and one host read (the
// stopping test), and SD's iterations on an H100 were bound by those calls.
// Here a step is three launches, one thread per row with the row's CG_D values
// in registers: cg_product (A P and p.Ap), cg_update (alpha, X, R and the new
// r.z and r.r) and cg_direction (beta and P).  The scalars never leave the
// device: each kernel reads those it needs from `sums`, written by the kernels
// before it, and every kernel of a step returns at once (the same decision in
// every thread) when all columns met the stopping test at that step's start.
// So the host enqueues steps without waiting and reads `sums` only every few
// steps, to stop enqueueing.
//
// sums[k][slot][c], k = 0 .. maxiter, slot: 0 b.b (row 0 only), 1 r_k.z_k,
// 2 r_k.r_k, 3 p_k.A p_k; all in double, zeros where not yet written (a step
// whose r.r is 0 counts as converged, and only follows a converged step).
// The dot products are deterministic: each block writes its partial sums to
// `partials`, and the last block to finish (a ticket counter) adds them in
// block order, so every run gives the same bits (atomicAdd of the partials
// would not).

#ifndef CG_D
#define CG_D 2
#endif

#define CG_FULL 0xffffffffu
#define CG_SLOTS 4

template <typename S>
__device__ __forceinline__ S* cg_row(S* sums, int k) {
    return sums + (long long)k * CG_SLOTS * CG_D;
}

// Whether every column's residual norm is at most rtol |b| at the start of step k.
__device__ __forceinline__ bool cg_converged(const double* sums, int k, double rtol) {
    const double* row = cg_row(sums, k);
    for (int c = 0; c < CG_D; ++c)
        if (!(sqrt(row[2 * CG_D + c]) <= rtol * sqrt(sums[c]))) return false;
    return true;
}

// In threads m < M: the sum of v[m] over the block (warp shuffles, then the
// warps' sums in warp order); warp_sums is shared scratch.
template <int M>
__device__ double cg_block_sum(const double* v, double (*warp_sums)[M]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int m = 0; m < M; ++m) {
        double s = v[m];
        for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_xor_sync(CG_FULL, s, offset);
        if (lane == 0) warp_sums[warp][m] = s;
    }
    __syncthreads();
    double s = 0.0;
    if (threadIdx.x < M)
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) s += warp_sums[w][threadIdx.x];
    return s;
}

// out[m] = the sum of v[m] over all threads of the grid, m < M, in a fixed order.
// Every thread of every block must call it (rows past the end with zeros).
template <int M>
__device__ void cg_grid_sum(const double* v, double* partials, unsigned int* ticket,
                            double* out) {
    __shared__ double warp_sums[32][M];
    __shared__ bool last;
    const double block = cg_block_sum<M>(v, warp_sums);
    if (threadIdx.x < M) {
        partials[(long long)blockIdx.x * M + threadIdx.x] = block;
        __threadfence();    // the partial is visible to every block before the ticket
    }
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    const volatile double* all = partials;     // written by other blocks: bypass L1
    double mine[M];
    for (int m = 0; m < M; ++m) {
        mine[m] = 0.0;
        for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x)
            mine[m] += all[(long long)b * M + m];
    }
    const double total = cg_block_sum<M>(mine, warp_sums);
    if (threadIdx.x < M) out[threadIdx.x] = total;
    if (threadIdx.x == 0) *ticket = 0;      // ready for the next launch
}

// (A V)[i, :] in double.
template <typename T>
__device__ __forceinline__ void cg_row_product(const int* indptr, const int* indices, const T* data,
                                               const T* V, int i, double* out) {
    for (int c = 0; c < CG_D; ++c) out[c] = 0.0;
    for (int e = indptr[i]; e < indptr[i + 1]; ++e) {
        const double w = data[e];
        const T* v = V + (long long)indices[e] * CG_D;
        for (int c = 0; c < CG_D; ++c) out[c] += w * (double)v[c];
    }
}

// X holds X0.  R = B - A X0, P = Z = R / diag; sums[0]: b.b, r.z, r.r.
template <typename T>
__global__ void cg_start(const int* __restrict__ indptr, const int* __restrict__ indices,
                         const T* __restrict__ data, const T* __restrict__ diag,
                         const T* __restrict__ B, const T* __restrict__ X, T* __restrict__ R,
                         T* __restrict__ P, int n, double* __restrict__ sums,
                         double* __restrict__ partials, unsigned int* __restrict__ ticket) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    double v[3 * CG_D] = {};
    if (i < n) {
        double ax[CG_D];
        cg_row_product(indptr, indices, data, X, i, ax);
        for (int c = 0; c < CG_D; ++c) {
            const long long at = (long long)i * CG_D + c;
            const T r = (T)((double)B[at] - ax[c]);
            const T z = r / diag[i];
            R[at] = r;
            P[at] = z;
            v[c] = (double)B[at] * (double)B[at];
            v[CG_D + c] = (double)r * (double)z;
            v[2 * CG_D + c] = (double)r * (double)r;
        }
    }
    cg_grid_sum<3 * CG_D>(v, partials, ticket, sums);
}

// Step k: AP = A P; sums[k][3] = p.Ap.
template <typename T>
__global__ void cg_product(const int* __restrict__ indptr, const int* __restrict__ indices,
                           const T* __restrict__ data, const T* __restrict__ P,
                           T* __restrict__ AP, int n, int k, double rtol,
                           double* __restrict__ sums, double* __restrict__ partials,
                           unsigned int* __restrict__ ticket) {
    if (cg_converged(sums, k, rtol)) return;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    double v[CG_D] = {};
    if (i < n) {
        double ap[CG_D];
        cg_row_product(indptr, indices, data, P, i, ap);
        for (int c = 0; c < CG_D; ++c) {
            const long long at = (long long)i * CG_D + c;
            AP[at] = (T)ap[c];
            v[c] = (double)P[at] * (double)(T)ap[c];
        }
    }
    cg_grid_sum<CG_D>(v, partials, ticket, cg_row(sums, k) + 3 * CG_D);
}

// Step k: alpha = r.z / p.Ap; X += alpha P, R -= alpha AP; sums[k + 1]: r.z, r.r.
template <typename T>
__global__ void cg_update(const T* __restrict__ P, const T* __restrict__ AP,
                          const T* __restrict__ diag, T* __restrict__ X, T* __restrict__ R,
                          int n, int k, double rtol, double tiny, double* __restrict__ sums,
                          double* __restrict__ partials, unsigned int* __restrict__ ticket) {
    if (cg_converged(sums, k, rtol)) return;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const double* now = cg_row(sums, k);
    double v[2 * CG_D] = {};
    if (i < n) {
        for (int c = 0; c < CG_D; ++c) {
            const long long at = (long long)i * CG_D + c;
            const T alpha = (T)(now[CG_D + c] / max(now[3 * CG_D + c], tiny));
            X[at] += alpha * P[at];
            const T r = R[at] - alpha * AP[at];
            const T z = r / diag[i];
            R[at] = r;
            v[c] = (double)r * (double)z;
            v[CG_D + c] = (double)r * (double)r;
        }
    }
    cg_grid_sum<2 * CG_D>(v, partials, ticket, cg_row(sums, k + 1) + CG_D);
}

// Step k: P = R / diag + beta P, beta = r_{k+1}.z_{k+1} / r_k.z_k.
template <typename T>
__global__ void cg_direction(const T* __restrict__ R, const T* __restrict__ diag,
                             T* __restrict__ P, int n, int k, double rtol, double tiny,
                             double* __restrict__ sums) {
    if (cg_converged(sums, k, rtol)) return;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const double* now = cg_row(sums, k);
    const double* next = cg_row(sums, k + 1);
    for (int c = 0; c < CG_D; ++c) {
        const long long at = (long long)i * CG_D + c;
        const T beta = (T)(next[CG_D + c] / max(now[CG_D + c], tiny));
        P[at] = R[at] / diag[i] + beta * P[at];
    }
}

#define CG_INSTANTIATE(T)                                                                          \
    template __global__ void cg_start<T>(const int*, const int*, const T*, const T*, const T*,     \
                                         const T*, T*, T*, int, double*, double*, unsigned int*); \
    template __global__ void cg_product<T>(const int*, const int*, const T*, const T*, T*, int,   \
                                           int, double, double*, double*, unsigned int*);         \
    template __global__ void cg_update<T>(const T*, const T*, const T*, T*, T*, int, int, double, \
                                          double, double*, double*, unsigned int*);               \
    template __global__ void cg_direction<T>(const T*, const T*, T*, int, int, double, double,    \
                                             double*);
CG_INSTANTIATE(float)
CG_INSTANTIATE(double)
