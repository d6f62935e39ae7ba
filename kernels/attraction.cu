// The attractive term of the embedding objectives over the sparse affinities P
// (gpuembed/objectives/attraction_gpu.py), the twin of the CPU's compiled sweep
// (attraction_cpu.attraction) and of the array code (base.PairSet.attraction_arrays,
// the reference):
//   value = sum_nm p_nm phi(d_nm^2),   G_n = sum_m w_nm (x_n - x_m)
// over the stored entries of each CSR row n, with phi = d^2 and w = p (EE, s-SNE,
// SNE) or phi = log(1 + d^2) and w = p / (1 + d^2) (t-SNE, ATT_STUDENT).  A warp per
// row: its lanes take every 32nd entry and their sums meet by shuffles, so a row
// is read once, and no per-edge array or sparse product is made (the array code
// writes five arrays of nnz values and runs two cuSPARSE passes).  Per-edge
// arithmetic in T, sums in double; part[n] is row n's share of the value.
// Defines prepended by the loader:
//   ATT_DIM      dimension of the layout
//   ATT_STUDENT  1 for t-SNE's phi and w

#ifndef ATT_DIM
#define ATT_DIM 2
#endif
#ifndef ATT_STUDENT
#define ATT_STUDENT 0
#endif
#define ATT_FULL 0xffffffffu

template <typename T>
__global__ void attraction(const int* __restrict__ indptr, const int* __restrict__ indices,
                           const T* __restrict__ p, const T* __restrict__ X, int n,
                           T* __restrict__ grad, double* __restrict__ part) {
    const int lane = threadIdx.x & 31;
    const long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= n) return;                         // a whole warp: its row is past the end
    T xi[ATT_DIM];
#pragma unroll
    for (int c = 0; c < ATT_DIM; ++c) xi[c] = X[row * ATT_DIM + c];
    double value = 0.0, g[ATT_DIM];
#pragma unroll
    for (int c = 0; c < ATT_DIM; ++c) g[c] = 0.0;
    for (int e = indptr[row] + lane; e < indptr[row + 1]; e += 32) {
        const long long m = indices[e];
        T diff[ATT_DIM], d2 = 0;
#pragma unroll
        for (int c = 0; c < ATT_DIM; ++c) {
            diff[c] = xi[c] - X[m * ATT_DIM + c];
            d2 += diff[c] * diff[c];
        }
        const T pe = p[e];
#if ATT_STUDENT
        const T w = pe / ((T)1 + d2);
        value += (double)(pe * log1p(d2));
#else
        const T w = pe;
        value += (double)(pe * d2);
#endif
#pragma unroll
        for (int c = 0; c < ATT_DIM; ++c) g[c] += (double)(w * diff[c]);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        value += __shfl_xor_sync(ATT_FULL, value, offset);
#pragma unroll
        for (int c = 0; c < ATT_DIM; ++c) g[c] += __shfl_xor_sync(ATT_FULL, g[c], offset);
    }
    if (lane == 0) {
        part[row] = value;
#pragma unroll
        for (int c = 0; c < ATT_DIM; ++c) grad[row * ATT_DIM + c] = (T)g[c];
    }
}

template __global__ void attraction<float>(const int*, const int*, const float*, const float*,
                                           int, float*, double*);
template __global__ void attraction<double>(const int*, const int*, const double*,
                                            const double*, int, double*, double*);
