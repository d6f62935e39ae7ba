// Fast Gauss transform on the GPU (gpuembed/nbody/fgt.py): every pass over
// points or box pairs.  The array code of fgt.py is the NumPy reference of all of
// them; fgt_cpu.py holds their compiled CPU twins.
//
// fgt_hermite_coefficients: one block per big source box, one thread per
//   coefficient alpha: A_alpha = sum over the box's points q_m (x_m - s_B)^alpha / alpha!.
// fgt_taylor_from_sources (case III): one block per big target box C, one thread
//   per coefficient beta: C_beta += q_m h_beta(x_m - t_C) / beta! over the points
//   of the small source boxes paired with C.
// fgt_hermite_to_taylor (case IV): one block per big target box C, one thread per
//   beta: C_beta += sum_alpha A_alpha prod_i M[o_i, beta_i, alpha_i] over the big
//   source boxes paired with C (o: the integer offset between the centres, M the
//   1-D translation matrices (-1)^beta / beta! h_{alpha+beta}(o SIDE)).
//   Pairs come grouped by target box, so each block owns its box's coefficients.
// fgt_small_targets: one thread per target point in a small target box (fewer
//   than the cutoff points).  It visits the rows of neighbouring box offsets
//   along the last dimension (fgt._offset_rows; a row's boxes have consecutive
//   keys), finds a row's first occupied source box by binary search over the
//   sorted box keys and the others by walking on, and adds
//   - case I  (small source box): the direct sum over its points, or
//   - case II (big source box): its Hermite series at the target (eq. 5.2).
// fgt_taylor_targets: one thread per target point in a big target box; it
//   evaluates the box's Taylor series (cases III and IV, accumulated beforehand).
// Coefficient layout: multi-index alpha over FGT_DIM digits in base FGT_P, the
// first dimension most significant, times FGT_Q charge columns (as _tensor).
// Defines prepended by the loader: FGT_DIM (1..3), FGT_P (order), FGT_Q (charges).

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
// series (factors h_k(u_i)) or a Taylor series (factors u_i^k) at one point, or
// one row of case IV's translation (factors M[o_i, beta_i, :]).
template <typename T>
__device__ __forceinline__ void fgt_series_add(const T* const (&factors)[FGT_DIM],
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

// The digits of the flat multi-index alpha, the first dimension most significant.
__device__ __forceinline__ void fgt_digits(int alpha, int (&digit)[FGT_DIM]) {
    for (int i = FGT_DIM - 1; i >= 0; --i) {
        digit[i] = alpha % FGT_P;
        alpha /= FGT_P;
    }
}

// h_k(u) = exp(-u^2) H_k(u) by the Hermite recurrence.
template <typename T>
__device__ __forceinline__ T fgt_hermite(T u, int k) {
    T prev = exp(-u * u);
    if (k == 0) return prev;
    T cur = 2 * u * prev;
    for (int j = 1; j < k; ++j) {
        const T next = 2 * u * cur - 2 * j * prev;
        prev = cur;
        cur = next;
    }
    return cur;
}

template <typename T>
__global__ void fgt_hermite_coefficients(
    const long long* __restrict__ big_boxes, const long long* __restrict__ start,
    const long long* __restrict__ count, const T* __restrict__ points,
    const T* __restrict__ center, const T* __restrict__ charges,
    const T* __restrict__ inv_fact, T* __restrict__ A) {
    const long long g = blockIdx.x, b = big_boxes[g];
    const long long end = start[b] + count[b];
    for (int alpha = threadIdx.x; alpha < FGT_TERMS; alpha += blockDim.x) {
        int digit[FGT_DIM];
        fgt_digits(alpha, digit);
        T acc[FGT_Q] = {};
        for (long long m = start[b]; m < end; ++m) {
            T mono = 1;
            for (int i = 0; i < FGT_DIM; ++i) {
                const T u = points[m * FGT_DIM + i] - center[b * FGT_DIM + i];
                T power = inv_fact[digit[i]];
                for (int k = 0; k < digit[i]; ++k) power *= u;
                mono *= power;
            }
            for (int q = 0; q < FGT_Q; ++q) acc[q] += mono * charges[m * FGT_Q + q];
        }
        for (int q = 0; q < FGT_Q; ++q) A[(g * FGT_TERMS + alpha) * FGT_Q + q] = acc[q];
    }
}

template <typename T>
__global__ void fgt_taylor_from_sources(
    const long long* __restrict__ first, const long long* __restrict__ source,
    const long long* __restrict__ start, const long long* __restrict__ count,
    const T* __restrict__ points, const T* __restrict__ centers,
    const T* __restrict__ charges, const T* __restrict__ inv_fact,
    const long long* __restrict__ target, T* __restrict__ taylor) {
    const long long g = blockIdx.x;
    for (int beta = threadIdx.x; beta < FGT_TERMS; beta += blockDim.x) {
        int digit[FGT_DIM];
        fgt_digits(beta, digit);
        T acc[FGT_Q] = {};
        for (long long k = first[g]; k < first[g + 1]; ++k) {
            const long long b = source[k], end = start[b] + count[b];
            for (long long m = start[b]; m < end; ++m) {
                T term = 1;
                for (int i = 0; i < FGT_DIM; ++i)
                    term *= fgt_hermite(points[m * FGT_DIM + i] - centers[g * FGT_DIM + i],
                                        digit[i]) * inv_fact[digit[i]];
                for (int q = 0; q < FGT_Q; ++q) acc[q] += term * charges[m * FGT_Q + q];
            }
        }
        T* C = taylor + (target[g] * FGT_TERMS + beta) * FGT_Q;
        for (int q = 0; q < FGT_Q; ++q) C[q] += acc[q];
    }
}

template <typename T>
__global__ void fgt_hermite_to_taylor(
    const long long* __restrict__ first, const long long* __restrict__ source,
    const long long* __restrict__ offset, const T* __restrict__ hermite,
    const T* __restrict__ M, const long long* __restrict__ target, T* __restrict__ taylor) {
    const long long g = blockIdx.x;
    constexpr int PP = FGT_P * FGT_P;
    for (int beta = threadIdx.x; beta < FGT_TERMS; beta += blockDim.x) {
        int digit[FGT_DIM];
        fgt_digits(beta, digit);
        T acc[FGT_Q] = {};
        for (long long k = first[g]; k < first[g + 1]; ++k) {
            // Row beta_i of each dimension's translation matrix for this pair.
            const T* row[FGT_DIM];
            for (int i = 0; i < FGT_DIM; ++i)
                row[i] = M + offset[k * FGT_DIM + i] * PP + digit[i] * FGT_P;
            fgt_series_add(row, hermite + source[k] * (long long)FGT_TERMS * FGT_Q, acc);
        }
        T* C = taylor + (target[g] * FGT_TERMS + beta) * FGT_Q;
        for (int q = 0; q < FGT_Q; ++q) C[q] += acc[q];
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
                const T* rows_h[FGT_DIM];
                for (int i = 0; i < FGT_DIM; ++i) rows_h[i] = h[i];
                fgt_series_add(rows_h, hermite + src_big_index[b] * (long long)FGT_TERMS * FGT_Q,
                               acc);
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
    const T* rows_p[FGT_DIM];
    for (int i = 0; i < FGT_DIM; ++i) rows_p[i] = powers[i];
    fgt_series_add(rows_p, taylor + tgt_big_index[box] * (long long)FGT_TERMS * FGT_Q, acc);
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
template __global__ void fgt_hermite_coefficients<float>(
    const long long*, const long long*, const long long*, const float*, const float*,
    const float*, const float*, float*);
template __global__ void fgt_hermite_coefficients<double>(
    const long long*, const long long*, const long long*, const double*, const double*,
    const double*, const double*, double*);
template __global__ void fgt_taylor_from_sources<float>(
    const long long*, const long long*, const long long*, const long long*, const float*,
    const float*, const float*, const float*, const long long*, float*);
template __global__ void fgt_taylor_from_sources<double>(
    const long long*, const long long*, const long long*, const long long*, const double*,
    const double*, const double*, const double*, const long long*, double*);
template __global__ void fgt_hermite_to_taylor<float>(
    const long long*, const long long*, const long long*, const float*, const float*,
    const long long*, float*);
template __global__ void fgt_hermite_to_taylor<double>(
    const long long*, const long long*, const long long*, const double*, const double*,
    const long long*, double*);
