// Fast Gauss transform, the per-target passes (gpuembed/nbody/fgt.py, _fgt_targets_gpu).
//
// fgt_small_targets: one thread per target point in a small target box (fewer
//   than the cutoff points).  It visits the rows of neighbouring box offsets
//   along the last dimension (fgt._offset_rows; a row's boxes have consecutive
//   keys), finds a row's first occupied source box by binary search over the
//   sorted box keys and the others by walking on, and adds
//   - case I  (small source box): the direct sum over its points, or
//   - case II (big source box): its Hermite series at the target (eq. 5.2).
// fgt_taylor_targets: one thread per target point in a big target box; it
//   evaluates the box's Taylor series (cases III and IV, accumulated on the
//   array side beforehand).
// Coefficient layout: multi-index alpha over FGT_DIM digits in base FGT_P, the
// first dimension most significant, times FGT_Q charge columns (as _tensor).
// Defines prepended by the loader: FGT_DIM (1..3), FGT_P (order), FGT_Q (charges).
// The NumPy reference is the _direct / _hermite_eval / _taylor_eval path of fgt.py.

#ifndef FGT_DIM
#define FGT_DIM 2
#endif
#ifndef FGT_P
#define FGT_P 8
#endif
#ifndef FGT_Q
#define FGT_Q 3
#endif

// The first position whose key is >= key (keys sorted ascending).
__device__ __forceinline__ long long fgt_lower_bound(const long long* __restrict__ keys,
                                                     long long n, long long key) {
    long long lo = 0, hi = n;
    while (lo < hi) {
        const long long mid = (lo + hi) >> 1;
        if (keys[mid] < key) lo = mid + 1; else hi = mid;
    }
    return lo;
}

constexpr int fgt_terms() {
    int v = 1;
    for (int i = 0; i < FGT_DIM; ++i) v *= FGT_P;
    return v;
}
constexpr int FGT_TERMS = fgt_terms();   // p^d coefficients per charge column

// acc[q] += sum_alpha prod_i factors[i][alpha_i] * coef[alpha, q]: a Hermite
// series (factors h_k(u_i)) or a Taylor series (factors u_i^k) at one point.
template <typename T>
__device__ __forceinline__ void fgt_series_add(const T (&factors)[FGT_DIM][FGT_P],
                                               const T* __restrict__ coef, T (&acc)[FGT_Q]) {
    for (int alpha = 0; alpha < FGT_TERMS; ++alpha) {
        int rest = alpha;
        T prod = 1;
        for (int i = FGT_DIM - 1; i >= 0; --i) {
            prod *= factors[i][rest % FGT_P];
            rest /= FGT_P;
        }
        for (int q = 0; q < FGT_Q; ++q) acc[q] += prod * coef[alpha * FGT_Q + q];
    }
}

template <typename T>
__global__ void fgt_small_targets(
    const long long* __restrict__ members, long long n_members,
    const T* __restrict__ tgt_points, const long long* __restrict__ tgt_box_of,
    const long long* __restrict__ tgt_cell,
    const long long* __restrict__ src_key, long long n_src_boxes,
    const long long* __restrict__ src_start, const long long* __restrict__ src_count,
    const T* __restrict__ src_center, const long long* __restrict__ src_big_index,
    const bool* __restrict__ src_big, const T* __restrict__ src_points,
    const T* __restrict__ charges, const T* __restrict__ hermite,
    const long long* __restrict__ rows, long long n_rows,
    const long long* __restrict__ shape, T* __restrict__ out) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n_members) return;
    const long long t = members[idx];
    T y[FGT_DIM];
    long long cell[FGT_DIM];
    for (int i = 0; i < FGT_DIM; ++i) {
        y[i] = tgt_points[t * FGT_DIM + i];
        cell[i] = tgt_cell[tgt_box_of[t] * FGT_DIM + i];
    }
    T acc[FGT_Q];
    for (int q = 0; q < FGT_Q; ++q) acc[q] = 0;
    constexpr int LAST = FGT_DIM - 1;
    for (long long r = 0; r < n_rows; ++r) {
        const long long* row = rows + r * (FGT_DIM + 1);
        long long key = 0;
        bool inside = true;
        for (int i = 0; i < LAST; ++i) {
            const long long c = cell[i] + row[i];
            inside = inside && c >= 0 && c < shape[i];
            key = key * shape[i] + c;
        }
        const long long lo = max(cell[LAST] + row[LAST], 0LL);
        const long long hi = min(cell[LAST] + row[LAST + 1], shape[LAST] - 1);
        if (!inside || lo > hi) continue;
        key *= shape[LAST];
        for (long long b = fgt_lower_bound(src_key, n_src_boxes, key + lo);
             b < n_src_boxes && src_key[b] <= key + hi; ++b) {
            if (!src_big[b]) {                               // case I: direct
                const long long end = src_start[b] + src_count[b];
                for (long long m = src_start[b]; m < end; ++m) {
                    T d2 = 0;
                    for (int i = 0; i < FGT_DIM; ++i) {
                        const T diff = y[i] - src_points[m * FGT_DIM + i];
                        d2 += diff * diff;
                    }
                    const T K = exp(-d2);
                    for (int q = 0; q < FGT_Q; ++q) acc[q] += K * charges[m * FGT_Q + q];
                }
            } else {                                          // case II: Hermite series
                T h[FGT_DIM][FGT_P];
                for (int i = 0; i < FGT_DIM; ++i) {
                    const T u = y[i] - src_center[b * FGT_DIM + i];
                    h[i][0] = exp(-u * u);
                    if (FGT_P > 1) h[i][1] = 2 * u * h[i][0];
                    for (int k = 1; k + 1 < FGT_P; ++k)
                        h[i][k + 1] = 2 * u * h[i][k] - 2 * k * h[i][k - 1];
                }
                fgt_series_add(h, hermite + src_big_index[b] * (long long)FGT_TERMS * FGT_Q, acc);
            }
        }
    }
    for (int q = 0; q < FGT_Q; ++q) out[t * FGT_Q + q] += acc[q];
}

template <typename T>
__global__ void fgt_taylor_targets(
    const long long* __restrict__ members, long long n_members,
    const T* __restrict__ tgt_points, const long long* __restrict__ tgt_box_of,
    const T* __restrict__ tgt_center, const long long* __restrict__ tgt_big_index,
    const T* __restrict__ taylor, T* __restrict__ out) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n_members) return;
    const long long t = members[idx];
    const long long box = tgt_box_of[t];
    T powers[FGT_DIM][FGT_P];
    for (int i = 0; i < FGT_DIM; ++i) {
        const T u = tgt_points[t * FGT_DIM + i] - tgt_center[box * FGT_DIM + i];
        powers[i][0] = 1;
        for (int k = 1; k < FGT_P; ++k) powers[i][k] = powers[i][k - 1] * u;
    }
    T acc[FGT_Q];
    for (int q = 0; q < FGT_Q; ++q) acc[q] = 0;
    fgt_series_add(powers, taylor + tgt_big_index[box] * (long long)FGT_TERMS * FGT_Q, acc);
    for (int q = 0; q < FGT_Q; ++q) out[t * FGT_Q + q] += acc[q];
}

template __global__ void fgt_small_targets<float>(
    const long long*, long long, const float*, const long long*, const long long*,
    const long long*, long long, const long long*, const long long*, const float*,
    const long long*, const bool*, const float*, const float*, const float*, const long long*,
    long long, const long long*, float*);
template __global__ void fgt_small_targets<double>(
    const long long*, long long, const double*, const long long*, const long long*,
    const long long*, long long, const long long*, const long long*, const double*,
    const long long*, const bool*, const double*, const double*, const double*,
    const long long*, long long, const long long*, double*);
template __global__ void fgt_taylor_targets<float>(const long long*, long long, const float*,
                                                   const long long*, const float*,
                                                   const long long*, const float*, float*);
template __global__ void fgt_taylor_targets<double>(const long long*, long long, const double*,
                                                    const long long*, const double*,
                                                    const long long*, const double*, double*);
