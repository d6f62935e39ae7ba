// The Barnes-Hut tree built on the device (gpuembed/nbody/barneshut.py, _build_gpu):
// the arrays of Tree's array code (_build, the reference) in a fixed number of
// launches, where that code spends some 20 CuPy calls and a host read per level.
//
// Points sorted by Morton code: the cells of level l are the runs of equal code
// prefixes (BH_DIM l bits), kept inside cells of more than one point.  Two
// neighbours i - 1 and i share the cells of levels 0..lcp[i] (bh_shared_levels),
// so point i's deepest cell, a leaf, is at level top[i] = min(max(lcp[i],
// lcp[i + 1]) + 1, BH_DEPTH), and point i starts the cells of the levels
// lcp[i] < l <= top[i] (lcp[0] = -1).  With those flags laid out level by level
// (row l, column i), their inclusive prefix sum numbers every cell as _build
// does: level by level, each level in the order of its first points.
// Arithmetic in double whatever the points' type, as barneshut_cpu.build_tree.
// Defines prepended by the loader:
//   BH_DIM    dimension (1..3)
//   BH_DEPTH  levels below the root (barneshut.MAX_DEPTH)

#ifndef BH_DIM
#define BH_DIM 2
#endif
#ifndef BH_DEPTH
#define BH_DEPTH 21
#endif

// The side of the bounding cube: its widest extent, widened by a relative 1e-12
// so that the largest coordinate falls inside the grid (1 for a single point).
__device__ __forceinline__ double bh_box_size(const double* __restrict__ lo,
                                              const double* __restrict__ hi) {
    double size = 0.0;
#pragma unroll
    for (int c = 0; c < BH_DIM; ++c) size = max(size, hi[c] - lo[c]);
    return size > 0.0 ? size * (1.0 + 1e-12) : 1.0;
}

// Bit b of a BH_DEPTH-bit cell coordinate moved to bit BH_DIM b (barneshut._SPREAD).
__device__ __forceinline__ long long bh_spread_bits(long long v) {
#if BH_DIM == 2
    v = (v | (v << 16)) & 0x0000FFFF0000FFFFLL;
    v = (v | (v << 8)) & 0x00FF00FF00FF00FFLL;
    v = (v | (v << 4)) & 0x0F0F0F0F0F0F0F0FLL;
    v = (v | (v << 2)) & 0x3333333333333333LL;
    v = (v | (v << 1)) & 0x5555555555555555LL;
#elif BH_DIM == 3
    v = (v | (v << 32)) & 0x001F00000000FFFFLL;
    v = (v | (v << 16)) & 0x001F0000FF0000FFLL;
    v = (v | (v << 8)) & 0x100F00F00F00F00FLL;
    v = (v | (v << 4)) & 0x10C30C30C30C30C3LL;
    v = (v | (v << 2)) & 0x1249249249249249LL;
#endif
    return v;
}

// code[i]: the Morton code of point i on a 2^BH_DEPTH grid over the bounding
// cube whose corner is lo (hi: the largest coordinates).
template <typename T>
__global__ void bh_morton(const T* __restrict__ X, const double* __restrict__ lo,
                          const double* __restrict__ hi, long long n,
                          long long* __restrict__ code) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const double size = bh_box_size(lo, hi);
    const long long cells = 1LL << BH_DEPTH;
    long long c = 0;
#pragma unroll
    for (int k = 0; k < BH_DIM; ++k) {
        const double scaled = ((double)X[i * BH_DIM + k] - lo[k]) / size * (double)cells;
        c |= bh_spread_bits(min((long long)scaled, cells - 1)) << (BH_DIM - 1 - k);
    }
    code[i] = c;
}

// The last level whose cells hold both codes: their prefixes agree on levels
// 0..bh_shared_levels(a, b) (BH_DEPTH for equal codes).
__device__ __forceinline__ int bh_shared_levels(long long a, long long b) {
    const long long differ = a ^ b;
    int level = 0;
    while (level < BH_DEPTH && (differ >> (BH_DIM * (BH_DEPTH - level - 1))) == 0) ++level;
    return level;
}

// For each sorted point i: lcp[i] (levels shared with point i - 1, -1 for the
// first point), top[i] (the level of its leaf) and cells[i] (the cells it starts).
template <typename T>
__global__ void bh_levels(const long long* __restrict__ code, long long n,
                          int* __restrict__ lcp, int* __restrict__ top,
                          long long* __restrict__ cells) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int before = i > 0 ? bh_shared_levels(code[i - 1], code[i]) : -1;
    const int after = i + 1 < n ? bh_shared_levels(code[i], code[i + 1]) : -1;
    const int leaf = min(max(before, after) + 1, BH_DEPTH);
    lcp[i] = before;
    top[i] = leaf;
    cells[i] = leaf - before;
}

// One thread per (level l, sorted point i) of the levels 0..depth: where point i
// starts a cell of level l, that cell's entry (index number[l, i] - 1; number is
// the flags' inclusive prefix sum, row by row).  Its points run to the first
// whose level-l prefix differs (a binary search in the sorted codes); an inner
// cell's children are the next level's cells that start within that range.
// cw, cwx: prefix sums of the sorted weights and weighted points, a zero row first.
template <typename T>
__global__ void bh_cells(const long long* __restrict__ code, const int* __restrict__ lcp,
                         const int* __restrict__ top, const int* __restrict__ number,
                         const double* __restrict__ cw, const double* __restrict__ cwx,
                         const double* __restrict__ lo, const double* __restrict__ hi,
                         long long n, int depth, long long* __restrict__ start,
                         long long* __restrict__ count, long long* __restrict__ first_child,
                         long long* __restrict__ n_children, double* __restrict__ side,
                         double* __restrict__ mass, double* __restrict__ wx,
                         double* __restrict__ com) {
    const long long flat = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (flat >= (long long)(depth + 1) * n) return;
    const int level = (int)(flat / n);
    const long long i = flat % n;
    if (level <= lcp[i] || level > top[i]) return;
    const long long cell = number[flat] - 1;
    const int shift = BH_DIM * (BH_DEPTH - level);
    const long long prefix = code[i] >> shift;
    long long a = i + 1, b = n;                   // the end: first j > i off the prefix
    while (a < b) {
        const long long mid = a + (b - a) / 2;
        if ((code[mid] >> shift) == prefix) a = mid + 1;
        else b = mid;
    }
    const long long end = a;
    start[cell] = i;
    count[cell] = end - i;
    if (level < top[i]) {                         // inner: its first child starts at i
        const long long below = flat + n;
        first_child[cell] = number[below] - 1;
        n_children[cell] = number[below + (end - 1 - i)] - number[below] + 1;
    } else {
        first_child[cell] = 0;
        n_children[cell] = 0;
    }
    side[cell] = bh_box_size(lo, hi) / (double)(1LL << level);
    const double m = cw[end] - cw[i];
    mass[cell] = m;
    const double tiny = 2.2250738585072014e-308;  // the smallest normal double
#pragma unroll
    for (int c = 0; c < BH_DIM; ++c) {
        const double s = cwx[end * BH_DIM + c] - cwx[i * BH_DIM + c];
        wx[cell * BH_DIM + c] = s;
        com[cell * BH_DIM + c] = s / max(m, tiny);
    }
}

template __global__ void bh_morton<float>(const float*, const double*, const double*, long long,
                                          long long*);
template __global__ void bh_morton<double>(const double*, const double*, const double*,
                                           long long, long long*);
template __global__ void bh_levels<float>(const long long*, long long, int*, int*, long long*);
template __global__ void bh_levels<double>(const long long*, long long, int*, int*, long long*);
template __global__ void bh_cells<float>(const long long*, const int*, const int*,
                                         const int*, const double*, const double*,
                                         const double*, const double*, long long, int,
                                         long long*, long long*, long long*, long long*,
                                         double*, double*, double*, double*);
template __global__ void bh_cells<double>(const long long*, const int*, const int*,
                                          const int*, const double*, const double*,
                                          const double*, const double*, long long, int,
                                          long long*, long long*, long long*, long long*,
                                          double*, double*, double*, double*);
