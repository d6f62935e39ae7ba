// Exact N-body kernel sums, tiled: one thread per NBODY_TPT targets, sources
// streamed through shared memory one block-sized tile at a time.
//
//   S[k][n]     = sum_m w_m K_k(|y_n - x_m|^2)
//   SX[k][n][i] = sum_m w_m K_k(|y_n - x_m|^2) x_mi
//
// with the self pair m = n skipped when self_pairs != 0 (targets == sources).
// Defines prepended by the loader (gpuembed/nbody/exact.py, _exact_gpu):
//   NBODY_DIM     dimension of the points (register arrays, unrolled)
//   NBODY_KERNEL  0: gaussian exp(-t); 1: student 1/(1+t);
//                 2: student and student2 1/(1+t)^2 together (t-SNE's Z and forces)
//   NBODY_SHIFTED 1: the Gaussian of t - a_n - b_m (per-target and per-source shifts,
//                 multi-scale SNE's nearest-neighbour distances, so that fine scales
//                 do not underflow), and per target the one source exclude[n] (-1:
//                 none) skipped instead of self_pairs; three more arguments.
// Each thread keeps NBODY_TPT targets in registers (register blocking: every
// shared-memory source load serves NBODY_TPT pairs).  Sums over one tile are
// accumulated in T, then added to double totals, so float32 runs lose no more
// than a tile's worth of rounding.  The NumPy reference is exact_sums().

#ifndef NBODY_DIM
#define NBODY_DIM 2
#endif
#ifndef NBODY_KERNEL
#define NBODY_KERNEL 0
#endif
#ifndef NBODY_SHIFTED
#define NBODY_SHIFTED 0
#endif
#if NBODY_SHIFTED && NBODY_KERNEL != 0
#error "distance shifts are for the Gaussian kernel"
#endif
#define NBODY_TPT 2
#define NBODY_OUTS (NBODY_KERNEL == 2 ? 2 : 1)
#define NBODY_STRIDE (NBODY_DIM + 1 + NBODY_SHIFTED)   // a source: x, w[, its shift]

__device__ __forceinline__ float nbody_exp_neg(float t) { return __expf(-t); }
__device__ __forceinline__ double nbody_exp_neg(double t) { return exp(-t); }
__device__ __forceinline__ float nbody_rcp1p(float t) { return __fdividef(1.0f, 1.0f + t); }
__device__ __forceinline__ double nbody_rcp1p(double t) { return 1.0 / (1.0 + t); }

template <typename T, bool CHECK_SELF>
__device__ __forceinline__ void nbody_tile(const T* __restrict__ tile, int n_tile,
                                           long long tile_start, const long long* skip,
                                           const T (&y)[NBODY_TPT][NBODY_DIM],
                                           const T (&shift)[NBODY_TPT],
                                           T (&ps)[NBODY_TPT][NBODY_OUTS],
                                           T (&px)[NBODY_TPT][NBODY_OUTS][NBODY_DIM]) {
    for (int k = 0; k < n_tile; ++k) {
        const T* src = tile + k * NBODY_STRIDE;
        T x[NBODY_DIM];
#pragma unroll
        for (int i = 0; i < NBODY_DIM; ++i) x[i] = src[i];
        const T w = src[NBODY_DIM];
#pragma unroll
        for (int r = 0; r < NBODY_TPT; ++r) {
            T t = 0;
#pragma unroll
            for (int i = 0; i < NBODY_DIM; ++i) {
                const T diff = y[r][i] - x[i];
                t = fma(diff, diff, t);
            }
#if NBODY_SHIFTED
            t = t - shift[r] - src[NBODY_DIM + 1];
#endif
            T K[NBODY_OUTS];
#if NBODY_KERNEL == 0
            K[0] = nbody_exp_neg(t);
#else
            K[0] = nbody_rcp1p(t);
#endif
#if NBODY_OUTS == 2
            K[1] = K[0] * K[0];
#endif
#pragma unroll
            for (int o = 0; o < NBODY_OUTS; ++o) {
                T kw = K[o] * w;
                if (CHECK_SELF && tile_start + k == skip[r]) kw = 0;
                ps[r][o] += kw;
#pragma unroll
                for (int i = 0; i < NBODY_DIM; ++i) px[r][o][i] = fma(kw, x[i], px[r][o][i]);
            }
        }
    }
}

#if NBODY_SHIFTED
#define NBODY_SHIFT_PARAMS(T) \
    const T* __restrict__ target_shift, const T* __restrict__ source_shift, \
    const long long* __restrict__ exclude,
#define NBODY_SHIFT_TYPES(T) const T*, const T*, const long long*,
#else
#define NBODY_SHIFT_PARAMS(T)
#define NBODY_SHIFT_TYPES(T)
#endif

template <typename T>
__global__ void nbody_exact(const T* __restrict__ X, const T* __restrict__ W,
                            const T* __restrict__ Y, long long n_s, long long n_t,
                            int self_pairs, NBODY_SHIFT_PARAMS(T)
                            T* __restrict__ S, T* __restrict__ SX) {
    extern __shared__ unsigned char nbody_smem[];
    T* tile = reinterpret_cast<T*>(nbody_smem);   // blockDim.x sources x NBODY_STRIDE

    const long long block_first = (long long)blockIdx.x * blockDim.x * NBODY_TPT;
    const long long block_last = block_first + (long long)blockDim.x * NBODY_TPT;  // exclusive
    long long target[NBODY_TPT], skip[NBODY_TPT];
    T y[NBODY_TPT][NBODY_DIM], shift[NBODY_TPT];
    double ts[NBODY_TPT][NBODY_OUTS];
    double tx[NBODY_TPT][NBODY_OUTS][NBODY_DIM];
#pragma unroll
    for (int r = 0; r < NBODY_TPT; ++r) {
        target[r] = block_first + (long long)r * blockDim.x + threadIdx.x;
        const bool valid = target[r] < n_t;
#pragma unroll
        for (int i = 0; i < NBODY_DIM; ++i) y[r][i] = valid ? Y[target[r] * NBODY_DIM + i] : T(0);
#if NBODY_SHIFTED
        shift[r] = valid ? target_shift[target[r]] : T(0);
        skip[r] = valid ? exclude[target[r]] : -1;
#else
        shift[r] = 0;
        skip[r] = target[r];
#endif
#pragma unroll
        for (int o = 0; o < NBODY_OUTS; ++o) {
            ts[r][o] = 0.0;
#pragma unroll
            for (int i = 0; i < NBODY_DIM; ++i) tx[r][o][i] = 0.0;
        }
    }

    for (long long tile_start = 0; tile_start < n_s; tile_start += blockDim.x) {
        const long long j = tile_start + threadIdx.x;
        T* mine = tile + threadIdx.x * NBODY_STRIDE;
        if (j < n_s) {
#pragma unroll
            for (int i = 0; i < NBODY_DIM; ++i) mine[i] = X[j * NBODY_DIM + i];
            mine[NBODY_DIM] = W[j];
#if NBODY_SHIFTED
            mine[NBODY_DIM + 1] = source_shift[j];
#endif
        }
        __syncthreads();
        const int n_tile = (int)min((long long)blockDim.x, n_s - tile_start);
        T ps[NBODY_TPT][NBODY_OUTS];
        T px[NBODY_TPT][NBODY_OUTS][NBODY_DIM];
#pragma unroll
        for (int r = 0; r < NBODY_TPT; ++r)
#pragma unroll
            for (int o = 0; o < NBODY_OUTS; ++o) {
                ps[r][o] = 0;
#pragma unroll
                for (int i = 0; i < NBODY_DIM; ++i) px[r][o][i] = 0;
            }
        // Only tiles overlapping this block's targets can hold a self pair; an
        // excluded source (NBODY_SHIFTED) can be in any tile.
        const bool check = NBODY_SHIFTED || (self_pairs && tile_start < block_last &&
                                             tile_start + n_tile > block_first);
        if (check)
            nbody_tile<T, true>(tile, n_tile, tile_start, skip, y, shift, ps, px);
        else
            nbody_tile<T, false>(tile, n_tile, tile_start, skip, y, shift, ps, px);
#pragma unroll
        for (int r = 0; r < NBODY_TPT; ++r)
#pragma unroll
            for (int o = 0; o < NBODY_OUTS; ++o) {
                ts[r][o] += (double)ps[r][o];
#pragma unroll
                for (int i = 0; i < NBODY_DIM; ++i) tx[r][o][i] += (double)px[r][o][i];
            }
        __syncthreads();
    }

#pragma unroll
    for (int r = 0; r < NBODY_TPT; ++r) {
        if (target[r] >= n_t) continue;
#pragma unroll
        for (int o = 0; o < NBODY_OUTS; ++o) {
            S[o * n_t + target[r]] = (T)ts[r][o];
#pragma unroll
            for (int i = 0; i < NBODY_DIM; ++i)
                SX[(o * n_t + target[r]) * NBODY_DIM + i] = (T)tx[r][o][i];
        }
    }
}

template __global__ void nbody_exact<float>(const float*, const float*, const float*, long long,
                                            long long, int, NBODY_SHIFT_TYPES(float)
                                            float*, float*);
template __global__ void nbody_exact<double>(const double*, const double*, const double*,
                                             long long, long long, int,
                                             NBODY_SHIFT_TYPES(double) double*, double*);
