// Row-wise selection of the m smallest entries of a dense B x N block of
// (shifted) squared distances: one warp per row and column segment.
//
// The grid's y dimension splits each row into gridDim.y segments of
// floor or ceil(N / gridDim.y) columns; the warp of (row, segment) writes that
// segment's m best columns to out[row, segment, :].  Segments keep the GPU busy
// when a block has few rows (268 rows of 1e6 columns: 268 warps, each scanning
// a million columns, took 184 s for a 1e6-point k-NN); the caller selects the
// m best of the segments' winners with one more launch of one segment.
//
// Each lane scans columns start + lane, start + lane + 32, ... and keeps its own m best
// (value, column) pairs sorted in local memory; the warp then merges the 32
// sorted lists with m rounds of a shuffle argmin over the list heads.
// Pairs compare lexicographically, so ties are resolved by column index and
// the output is deterministic.  Used by gpuembed/neighbors.py (_select_gpu);
// the NumPy reference is _select_cpu.
//
// KNN_MAX_K (prepended by the loader) bounds m: the local list size.

#ifndef KNN_MAX_K
#define KNN_MAX_K 128
#endif

#define KNN_NO_INDEX 0x7fffffffffffffffLL

template <typename T> __device__ __forceinline__ T knn_inf();
template <> __device__ __forceinline__ float knn_inf<float>() { return __int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double knn_inf<double>() {
    return __longlong_as_double(0x7ff0000000000000LL);
}

template <typename T>
__device__ __forceinline__ bool knn_less(T a, long long ia, T b, long long ib) {
    return a < b || (a == b && ia < ib);
}

template <typename T>
__global__ void knn_select(const T* __restrict__ D, long long n_rows, long long n_cols, int m,
                           long long* __restrict__ out) {
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n_rows) return;  // the whole warp leaves together

    T val[KNN_MAX_K];
    long long idx[KNN_MAX_K];
    for (int t = 0; t < m; ++t) {
        val[t] = knn_inf<T>();
        idx[t] = KNN_NO_INDEX;
    }

    const long long seg = blockIdx.y;
    const long long start = seg * n_cols / gridDim.y, stop = (seg + 1) * n_cols / gridDim.y;
    const T* d = D + row * n_cols;
    for (long long j = start + lane; j < stop; j += 32) {
        const T v = d[j];
        if (knn_less(v, j, val[m - 1], idx[m - 1])) {
            int t = m - 1;
            while (t > 0 && knn_less(v, j, val[t - 1], idx[t - 1])) {
                val[t] = val[t - 1];
                idx[t] = idx[t - 1];
                --t;
            }
            val[t] = v;
            idx[t] = j;
        }
    }

    int head = 0;
    for (int r = 0; r < m; ++r) {
        const T v = head < m ? val[head] : knn_inf<T>();
        const long long i = head < m ? idx[head] : KNN_NO_INDEX;
        T best_v = v;
        long long best_i = i;
        for (int offset = 16; offset > 0; offset >>= 1) {
            const T other_v = __shfl_xor_sync(0xffffffffu, best_v, offset);
            const long long other_i = __shfl_xor_sync(0xffffffffu, best_i, offset);
            if (knn_less(other_v, other_i, best_v, best_i)) {
                best_v = other_v;
                best_i = other_i;
            }
        }
        // Column indices are unique, so exactly one lane owns the winner.
        if (head < m && best_i == i) ++head;
        if (lane == 0) out[(row * gridDim.y + seg) * m + r] = best_i;
    }
}

template __global__ void knn_select<float>(const float*, long long, long long, int, long long*);
template __global__ void knn_select<double>(const double*, long long, long long, int, long long*);
