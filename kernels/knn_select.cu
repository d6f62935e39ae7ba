// Row-wise selection of the m smallest entries of D[row, j] + offset[j] over
// the columns j != skip[row] of a dense B x N block: one warp per row and
// column segment.  k-NN passes D = -2 x.y and offset = |y|^2, so the squared
// norms are added as the block is read instead of by a pass over it that read
// and wrote the whole block once more; skip is each query's own column (-1:
// none).
//
// The grid's y dimension splits each row into gridDim.y segments of
// floor or ceil(N / gridDim.y) columns; the warp of (row, segment) writes that
// segment's m best values and columns, in order, to out_val / out_idx[row,
// segment, :].  Segments keep the GPU busy when a block has few rows (268 rows
// of 1e6 columns); the caller selects the m best of the segments' winners with
// one more launch of one segment.
//
// The warp keeps one sorted list of its m best (value, column) pairs in shared
// memory and reads 32 columns at a time, one per lane.  Only the lanes whose
// pair beats the list's last entry (a ballot) are inserted, one after another,
// each by the whole warp: its rank is a warp-wide count, the entries behind it
// move one slot.  After the first few m columns insertions are rare (about
// m log(N / m) per row), so the scan runs at the speed of reading D.  An
// earlier version kept a sorted list of m pairs per lane in local memory: at
// m = 98 the lists overflowed the L1 cache and a 1e6-point k-NN took minutes.
// The segments of one row share a bound, bound[row]: a warp whose list is full
// lowers it (atomicMin) to its last value, and every warp of the row skips the
// values above it, which no segment's list needs (the warp that set it holds m
// values at or below it).  Without it each segment paid its own m ln(L / m)
// insertions (L its columns): at 1e6 columns in 62 segments about 37,000 per
// row against 31,000 reads of 32 columns, and on an H100 the selection took
// 6.9 ms per block of 268 rows, some 20x the time to read the block.  A
// segment's list may then end with fewer than m entries (infinite values); the
// merge of the segments' winners still finds the m best.  Values are compared
// as order-preserving unsigned keys (negative floats too: D + offset is
// |x - y|^2 - |x|^2).
// Pairs compare lexicographically, so ties are resolved by column index and
// the output is deterministic.  Used by gpuembed/neighbors.py (_select_gpu);
// the NumPy reference is _select_cpu.
//
// KNN_MAX_K (prepended by the loader) bounds m; KNN_WARPS is the number of
// warps per block the caller launches, as many lists as fit 48 KiB of shared
// memory (the caller sorts whole rows where not even one fits).

#ifndef KNN_MAX_K
#define KNN_MAX_K 128
#endif
#ifndef KNN_WARPS
#define KNN_WARPS 4
#endif

#define KNN_NO_INDEX 0x7fffffffffffffffLL

template <typename T> __device__ __forceinline__ T knn_inf();
template <> __device__ __forceinline__ float knn_inf<float>() { return __int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double knn_inf<double>() {
    return __longlong_as_double(0x7ff0000000000000LL);
}

// Unsigned keys in the order of the values (the sign bit flipped, or all bits
// for negatives), widened to 64 bits for one atomicMin for both types.
__device__ __forceinline__ unsigned long long knn_key(float v) {
    const unsigned u = (unsigned)__float_as_int(v);
    return (u >> 31) ? (unsigned long long)(~u) : (unsigned long long)(u | 0x80000000u);
}
__device__ __forceinline__ unsigned long long knn_key(double v) {
    const unsigned long long u = (unsigned long long)__double_as_longlong(v);
    return (u >> 63) ? ~u : (u | 0x8000000000000000ULL);
}

template <typename T>
__device__ __forceinline__ bool knn_less(T a, long long ia, T b, long long ib) {
    return a < b || (a == b && ia < ib);
}

template <typename T>
__global__ void knn_select(const T* __restrict__ D, const T* __restrict__ offset,
                           const long long* __restrict__ skip,
                           unsigned long long* __restrict__ bound, long long n_rows,
                           long long n_cols, int m, T* __restrict__ out_val,
                           long long* __restrict__ out_idx) {
    __shared__ T list_val[KNN_WARPS][KNN_MAX_K];
    __shared__ long long list_idx[KNN_WARPS][KNN_MAX_K];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long row = (long long)blockIdx.x * KNN_WARPS + warp;
    if (row >= n_rows) return;  // the whole warp leaves together
    T* val = list_val[warp];
    long long* idx = list_idx[warp];
    for (int t = lane; t < m; t += 32) {
        val[t] = knn_inf<T>();
        idx[t] = KNN_NO_INDEX;
    }
    __syncwarp();
    T last_v = knn_inf<T>();
    long long last_i = KNN_NO_INDEX;

    const long long seg = blockIdx.y;
    const long long start = seg * n_cols / gridDim.y, stop = (seg + 1) * n_cols / gridDim.y;
    const T* d = D + row * n_cols;
    const long long own = skip[row];
    volatile unsigned long long* shared_bound = bound + row;
    unsigned long long row_bound = *shared_bound;
    for (long long base = start; base < stop; base += 32) {
        // Other segments' progress, every 32 reads (the bound lives in L2).
        if (((base - start) & 1023) == 0) row_bound = *shared_bound;
        const long long j = base + lane;
        const bool take = j < stop && j != own;
        const T v = take ? d[j] + offset[j] : knn_inf<T>();
        unsigned pending = __ballot_sync(
            0xffffffffu, take && knn_less(v, j, last_v, last_i) && knn_key(v) <= row_bound);
        const bool inserts = pending != 0;
        while (pending) {
            const int src = __ffs(pending) - 1;
            pending &= pending - 1;
            const T cv = __shfl_sync(0xffffffffu, v, src);
            const long long ci = __shfl_sync(0xffffffffu, j, src);
            if (!knn_less(cv, ci, last_v, last_i)) continue;  // an earlier insert raised the bar
            // Rank of (cv, ci) in the list: the entries before it, counted by all lanes.
            int rank = 0;
            for (int t = lane; t < m; t += 32) rank += knn_less(val[t], idx[t], cv, ci);
            for (int offset = 16; offset > 0; offset >>= 1)
                rank += __shfl_xor_sync(0xffffffffu, rank, offset);
            // Entries rank .. m - 2 move one slot back; the last one drops out.
            T moved_v[(KNN_MAX_K + 31) / 32];
            long long moved_i[(KNN_MAX_K + 31) / 32];
            for (int q = 0, t = lane; t < m - 1; ++q, t += 32) {
                moved_v[q] = val[t];
                moved_i[q] = idx[t];
            }
            __syncwarp();
            for (int q = 0, t = lane; t < m - 1; ++q, t += 32) {
                if (t >= rank) {
                    val[t + 1] = moved_v[q];
                    idx[t + 1] = moved_i[q];
                }
            }
            if (lane == 0) {
                val[rank] = cv;
                idx[rank] = ci;
            }
            __syncwarp();
            last_v = val[m - 1];
            last_i = idx[m - 1];
        }
        if (inserts && last_i != KNN_NO_INDEX) {      // the list is full: share its bar
            const unsigned long long key = knn_key(last_v);
            if (key < row_bound) {
                row_bound = key;
                if (lane == 0) atomicMin(bound + row, key);
            }
        }
    }
    for (int t = lane; t < m; t += 32) {
        out_val[(row * gridDim.y + seg) * m + t] = val[t];
        out_idx[(row * gridDim.y + seg) * m + t] = idx[t];
    }
}

template __global__ void knn_select<float>(const float*, const float*, const long long*,
                                           unsigned long long*, long long, long long, int,
                                           float*, long long*);
template __global__ void knn_select<double>(const double*, const double*, const long long*,
                                            unsigned long long*, long long, long long, int,
                                            double*, long long*);
