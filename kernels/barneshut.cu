// Barnes-Hut kernel sums: one thread per target walks the tree depth first
// (gpuembed/nbody/barneshut.py, _walk_gpu), the twin of the compiled CPU walk in
// gpuembed/nbody/barneshut_cpu.py.  From the root, a popped cell that
//   - is a leaf (no children): adds the exact sum over its points, the target's
//     own point skipped;
//   - does not hold the target and has side^2 < theta^2 |y - com|^2: adds
//     mass K(|y - com|^2) to S and mass K(...) com to SX;
//   - else: pushes its children.
// Threads take targets in the tree's Morton order (``visit``), so the threads of
// a warp walk nearly the same cells.  Sums accumulate in double.
// Defines prepended by the loader:
//   BH_DIM     dimension (1..3)
//   BH_KERNEL  0: gaussian exp(-t); 1: student 1/(1+t);
//              2: student and student2 1/(1+t)^2 together (t-SNE's Z and forces)
//   BH_STACK   stack entries: (2^BH_DIM - 1)(levels) + 1 bounds a depth-first
//              walk that pushes at most 2^BH_DIM children per level
// The NumPy reference is vectorized_bh_sums() of barneshut.py.

#ifndef BH_DIM
#define BH_DIM 2
#endif
#ifndef BH_KERNEL
#define BH_KERNEL 0
#endif
#ifndef BH_STACK
#define BH_STACK 67
#endif
#define BH_OUTS (BH_KERNEL == 2 ? 2 : 1)

__device__ __forceinline__ float bh_exp_neg(float t) { return __expf(-t); }
__device__ __forceinline__ double bh_exp_neg(double t) { return exp(-t); }
__device__ __forceinline__ float bh_rcp1p(float t) { return __fdividef(1.0f, 1.0f + t); }
__device__ __forceinline__ double bh_rcp1p(double t) { return 1.0 / (1.0 + t); }

// c = src[0 .. BH_DIM), returns |y - c|^2.
template <typename T>
__device__ __forceinline__ T bh_load_sqdist(const T (&y)[BH_DIM], const T* __restrict__ src,
                                            T (&c)[BH_DIM]) {
    T t = 0;
#pragma unroll
    for (int i = 0; i < BH_DIM; ++i) {
        c[i] = src[i];
        const T diff = y[i] - c[i];
        t = fma(diff, diff, t);
    }
    return t;
}

// s[o] += m K_o(t), sx[o][i] += m K_o(t) c[i] for the kernels of BH_KERNEL.
template <typename T>
__device__ __forceinline__ void bh_add(T t, T m, const T (&c)[BH_DIM], double (&s)[BH_OUTS],
                                       double (&sx)[BH_OUTS][BH_DIM]) {
    T K[BH_OUTS];
#if BH_KERNEL == 0
    K[0] = bh_exp_neg(t);
#else
    K[0] = bh_rcp1p(t);
#endif
#if BH_OUTS == 2
    K[1] = K[0] * K[0];
#endif
#pragma unroll
    for (int o = 0; o < BH_OUTS; ++o) {
        const T km = K[o] * m;
        s[o] += (double)km;
#pragma unroll
        for (int i = 0; i < BH_DIM; ++i) sx[o][i] += (double)(km * c[i]);
    }
}

template <typename T>
__global__ void bh_walk(const T* __restrict__ points, const T* __restrict__ w,
                        const T* __restrict__ targets, const long long* __restrict__ visit,
                        const long long* __restrict__ rank, const long long* __restrict__ start,
                        const long long* __restrict__ count,
                        const long long* __restrict__ first_child,
                        const long long* __restrict__ n_children, const T* __restrict__ side2,
                        const T* __restrict__ mass, const T* __restrict__ com, T theta2,
                        long long n_t, T* __restrict__ S, T* __restrict__ SX) {
    const long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= n_t) return;
    const long long target = visit[v];
    const long long own = rank[target];           // the target's sorted position, or -1
    T y[BH_DIM];
#pragma unroll
    for (int i = 0; i < BH_DIM; ++i) y[i] = targets[target * BH_DIM + i];
    double s[BH_OUTS], sx[BH_OUTS][BH_DIM];
#pragma unroll
    for (int o = 0; o < BH_OUTS; ++o) {
        s[o] = 0.0;
#pragma unroll
        for (int i = 0; i < BH_DIM; ++i) sx[o][i] = 0.0;
    }

    int stack[BH_STACK];                          // cell indices (local memory: int, not int64)
    int top = 0;
    stack[top++] = 0;                             // the root
    while (top > 0) {
        const long long cell = stack[--top];
        const long long lo = start[cell], hi = lo + count[cell];
        const long long n_child = n_children[cell];
        if (n_child == 0) {                       // leaf: its points, exactly
            for (long long j = lo; j < hi; ++j) {
                if (j == own) continue;
                T c[BH_DIM];
                const T t = bh_load_sqdist(y, points + j * BH_DIM, c);
                bh_add(t, w[j], c, s, sx);
            }
            continue;
        }
        T c[BH_DIM];
        const T t = bh_load_sqdist(y, com + cell * BH_DIM, c);
        if ((own < lo || own >= hi) && side2[cell] < theta2 * t) {
            bh_add(t, mass[cell], c, s, sx);
        } else {
            const int child = (int)first_child[cell];
            for (int k = 0; k < (int)n_child; ++k) stack[top++] = child + k;
        }
    }

#pragma unroll
    for (int o = 0; o < BH_OUTS; ++o) {
        S[o * n_t + target] = (T)s[o];
#pragma unroll
        for (int i = 0; i < BH_DIM; ++i) SX[(o * n_t + target) * BH_DIM + i] = (T)sx[o][i];
    }
}

template __global__ void bh_walk<float>(const float*, const float*, const float*,
                                        const long long*, const long long*, const long long*,
                                        const long long*, const long long*, const long long*,
                                        const float*, const float*, const float*, float,
                                        long long, float*, float*);
template __global__ void bh_walk<double>(const double*, const double*, const double*,
                                         const long long*, const long long*, const long long*,
                                         const long long*, const long long*, const long long*,
                                         const double*, const double*, const double*, double,
                                         long long, double*, double*);
