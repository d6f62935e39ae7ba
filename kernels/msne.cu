// Multi-scale SNE's cost and gradient with every pair summed exactly, in three
// launches (gpuembed/objectives/msne_gpu.py; the NumPy/CuPy reference is the
// array code of objectives/msne.py, the CPU twin msne_cpu.fused_exact).  Per
// scale h, with c_h = p_h / 2, the kernels of row i are shifted by its nearest
// neighbour's squared distance n_i: e_hik = exp(-c_h (t_ik - n_i)) <= 1, so the
// finest scales cannot underflow, and s_hik = e_hik / Z_hi.
//
//   msne_row_sums  one thread per row, sources through shared memory:
//                  n_i, Z_hi = sum_k e_hik and DX_hi = sum_k e_hik (x_i - x_k).
//                  n_i is found in the same pass: when a nearer source turns up,
//                  the sums so far are rescaled to the new shift (as an online
//                  softmax), so the row's nearest kernel is exactly 1.
//   msne_edges     one warp per row, lanes over its pattern edges (also the
//                  FGT path's; it takes the shifts m_hi = c_h n_i): s_hij, the
//                  cost term and r_ij = -dE/ds_ij of their mean (floored at the
//                  smallest normal double, where r = 0), the edge weight
//                  g_ij = (1/H) sum_h c_h s_hij r_ij, the row's Laplacian half
//                  sum_j g_ij (x_i - x_j), and w_hi = c_h rs_hi / (H Z_hi) with
//                  rs_hi = sum_j r_ij s_hij.
//   msne_gradient  one thread per row, sources through shared memory: the dense
//                  part sum_h w_hi DX_hi + sum_k (sum_h w_hk e_hki)(x_i - x_k),
//                  where e_hki = exp(-c_h (t_ik - n_k)) is in source k's own
//                  shift (t_ik >= n_k, so it cannot overflow).
//
// The gradient is then 2 (row half + transposed half) - 2 dense (msne_gpu.py).
// Two passes over all pairs with H exps each, as the per-scale sums they
// replace, but 3 launches where the per-scale code made ~300 CuPy calls per
// evaluation.  Arithmetic in double: at the fine scales the shifted exponent is
// a difference of squared distances 10^6 kernel widths large (msne.py); the
// float instantiations exist because the loader builds both, msne_gpu.py calls
// the double ones.
// Defines prepended by the loader:
//   MSNE_DIM     dimension of the layout (register arrays, unrolled)
//   MSNE_SCALES  number of scales H (register arrays, unrolled)

#ifndef MSNE_DIM
#define MSNE_DIM 2
#endif
#ifndef MSNE_SCALES
#define MSNE_SCALES 4
#endif
#define MSNE_FULL 0xffffffffu
#define MSNE_SOURCE (MSNE_DIM + 1 + MSNE_SCALES)   // msne_gradient's tile: x, n, w_h

__device__ __forceinline__ double msne_inf() { return __longlong_as_double(0x7ff0000000000000LL); }
__device__ __forceinline__ double msne_tiny() { return __longlong_as_double(0x0010000000000000LL); }

__device__ __forceinline__ double msne_warp_sum(double v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(MSNE_FULL, v, offset);
    return v;
}

template <typename T>
__global__ void msne_row_sums(const T* __restrict__ X, long long n, const T* __restrict__ half_p,
                              T* __restrict__ nearest, T* __restrict__ Z, T* __restrict__ DX) {
    extern __shared__ unsigned char msne_smem[];
    T* tile = reinterpret_cast<T*>(msne_smem);     // blockDim.x sources x MSNE_DIM
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const bool valid = i < n;
    double y[MSNE_DIM], c[MSNE_SCALES], z[MSNE_SCALES], dx[MSNE_SCALES][MSNE_DIM];
#pragma unroll
    for (int a = 0; a < MSNE_DIM; ++a) y[a] = valid ? (double)X[i * MSNE_DIM + a] : 0.0;
#pragma unroll
    for (int h = 0; h < MSNE_SCALES; ++h) {
        c[h] = half_p[h];
        z[h] = 0.0;
#pragma unroll
        for (int a = 0; a < MSNE_DIM; ++a) dx[h][a] = 0.0;
    }
    double shift = msne_inf();

    for (long long start = 0; start < n; start += blockDim.x) {
        if (start + threadIdx.x < n) {
#pragma unroll
            for (int a = 0; a < MSNE_DIM; ++a)
                tile[threadIdx.x * MSNE_DIM + a] = X[(start + threadIdx.x) * MSNE_DIM + a];
        }
        __syncthreads();
        const int n_tile = (int)min((long long)blockDim.x, n - start);
        for (int k = 0; k < n_tile; ++k) {
            if (start + k == i) continue;
            double diff[MSNE_DIM], t = 0.0;
#pragma unroll
            for (int a = 0; a < MSNE_DIM; ++a) {
                diff[a] = y[a] - (double)tile[k * MSNE_DIM + a];
                t = fma(diff[a], diff[a], t);
            }
            if (t < shift) {   // a nearer source: the sums so far to the new shift
#pragma unroll
                for (int h = 0; h < MSNE_SCALES; ++h) {
                    const double f = exp(-c[h] * (shift - t));
                    z[h] *= f;
#pragma unroll
                    for (int a = 0; a < MSNE_DIM; ++a) dx[h][a] *= f;
                }
                shift = t;
            }
#pragma unroll
            for (int h = 0; h < MSNE_SCALES; ++h) {
                const double e = exp(-c[h] * (t - shift));
                z[h] += e;
#pragma unroll
                for (int a = 0; a < MSNE_DIM; ++a) dx[h][a] = fma(e, diff[a], dx[h][a]);
            }
        }
        __syncthreads();
    }
    if (!valid) return;
    nearest[i] = (T)shift;
#pragma unroll
    for (int h = 0; h < MSNE_SCALES; ++h) {
        Z[h * n + i] = (T)z[h];
#pragma unroll
        for (int a = 0; a < MSNE_DIM; ++a) DX[(h * n + i) * MSNE_DIM + a] = (T)dx[h][a];
    }
}

template <typename T>
__global__ void msne_edges(const int* __restrict__ indptr, const int* __restrict__ indices,
                           const T* __restrict__ X,
                           const T* __restrict__ sigma, long long n, const T* __restrict__ half_p,
                           const T* __restrict__ shifts, const T* __restrict__ Z, int js,
                           double kappa, T* __restrict__ g_edge, T* __restrict__ W,
                           T* __restrict__ lap, T* __restrict__ totals) {
    const int lane = threadIdx.x & 31;
    const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (i >= n) return;  // whole warps leave together
    const double off = js ? log(1.0 / (1.0 - kappa)) : 0.0;
    const double inv_h = 1.0 / MSNE_SCALES;
    double y[MSNE_DIM], c[MSNE_SCALES], shift[MSNE_SCALES], inv_z[MSNE_SCALES];
#pragma unroll
    for (int a = 0; a < MSNE_DIM; ++a) y[a] = X[i * MSNE_DIM + a];
#pragma unroll
    for (int h = 0; h < MSNE_SCALES; ++h) {
        c[h] = half_p[h];
        shift[h] = shifts[h * n + i];
        inv_z[h] = 1.0 / (double)Z[h * n + i];
    }
    double rs[MSNE_SCALES], row[MSNE_DIM], cost = 0.0, mass = 0.0;
#pragma unroll
    for (int h = 0; h < MSNE_SCALES; ++h) rs[h] = 0.0;
#pragma unroll
    for (int a = 0; a < MSNE_DIM; ++a) row[a] = 0.0;

    for (long long e = indptr[i] + lane; e < indptr[i + 1]; e += 32) {
        const long long j = indices[e];
        double diff[MSNE_DIM], t = 0.0;
#pragma unroll
        for (int a = 0; a < MSNE_DIM; ++a) {
            diff[a] = y[a] - (double)X[j * MSNE_DIM + a];
            t = fma(diff[a], diff[a], t);
        }
        double s_h[MSNE_SCALES], s = 0.0, v = 0.0;
#pragma unroll
        for (int h = 0; h < MSNE_SCALES; ++h) {
            s_h[h] = exp(-(c[h] * t - shift[h])) * inv_z[h];
            s += s_h[h];
            v += c[h] * s_h[h];
        }
        s *= inv_h;
        const double sg = sigma[e], se = fmax(s, msne_tiny());
        double r;
        if (js) {
            const double zmix = kappa * sg + (1.0 - kappa) * se, log_sz = log(se / zmix);
            cost += (1.0 - kappa) * se * log_sz + (sg > 0.0 ? kappa * sg * log(sg / zmix) : 0.0);
            r = -(log_sz - off) / kappa;
        } else {
            cost -= sg * log(se);
            r = sg / se;
        }
        if (s < msne_tiny()) r = 0.0;
        mass += se;
        const double g = v * r * inv_h;
        g_edge[e] = (T)g;
#pragma unroll
        for (int h = 0; h < MSNE_SCALES; ++h) rs[h] = fma(r, s_h[h], rs[h]);
#pragma unroll
        for (int a = 0; a < MSNE_DIM; ++a) row[a] = fma(g, diff[a], row[a]);
    }
#pragma unroll
    for (int h = 0; h < MSNE_SCALES; ++h) rs[h] = msne_warp_sum(rs[h]);
#pragma unroll
    for (int a = 0; a < MSNE_DIM; ++a) row[a] = msne_warp_sum(row[a]);
    cost = msne_warp_sum(cost);
    mass = msne_warp_sum(mass);
    if (lane != 0) return;
#pragma unroll
    for (int h = 0; h < MSNE_SCALES; ++h) W[h * n + i] = (T)(c[h] * rs[h] * inv_z[h] * inv_h);
#pragma unroll
    for (int a = 0; a < MSNE_DIM; ++a) lap[i * MSNE_DIM + a] = (T)row[a];
    totals[i] = (T)cost;
    totals[n + i] = (T)mass;
}

template <typename T>
__global__ void msne_gradient(const T* __restrict__ X, long long n, const T* __restrict__ half_p,
                              const T* __restrict__ nearest, const T* __restrict__ W,
                              const T* __restrict__ DX, T* __restrict__ dense) {
    extern __shared__ unsigned char msne_smem[];
    T* tile = reinterpret_cast<T*>(msne_smem);     // blockDim.x sources x MSNE_SOURCE
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const bool valid = i < n;
    double y[MSNE_DIM], c[MSNE_SCALES], out[MSNE_DIM];
#pragma unroll
    for (int a = 0; a < MSNE_DIM; ++a) {
        y[a] = valid ? (double)X[i * MSNE_DIM + a] : 0.0;
        out[a] = 0.0;
    }
#pragma unroll
    for (int h = 0; h < MSNE_SCALES; ++h) c[h] = half_p[h];

    for (long long start = 0; start < n; start += blockDim.x) {
        const long long j = start + threadIdx.x;
        if (j < n) {
            T* mine = tile + threadIdx.x * MSNE_SOURCE;
#pragma unroll
            for (int a = 0; a < MSNE_DIM; ++a) mine[a] = X[j * MSNE_DIM + a];
            mine[MSNE_DIM] = nearest[j];
#pragma unroll
            for (int h = 0; h < MSNE_SCALES; ++h) mine[MSNE_DIM + 1 + h] = W[h * n + j];
        }
        __syncthreads();
        const int n_tile = (int)min((long long)blockDim.x, n - start);
        for (int k = 0; k < n_tile; ++k) {
            if (start + k == i) continue;
            const T* src = tile + k * MSNE_SOURCE;
            double diff[MSNE_DIM], t = 0.0;
#pragma unroll
            for (int a = 0; a < MSNE_DIM; ++a) {
                diff[a] = y[a] - (double)src[a];
                t = fma(diff[a], diff[a], t);
            }
            t -= (double)src[MSNE_DIM];
            double coef = 0.0;
#pragma unroll
            for (int h = 0; h < MSNE_SCALES; ++h)
                coef = fma((double)src[MSNE_DIM + 1 + h], exp(-c[h] * t), coef);
#pragma unroll
            for (int a = 0; a < MSNE_DIM; ++a) out[a] = fma(coef, diff[a], out[a]);
        }
        __syncthreads();
    }
    if (!valid) return;
#pragma unroll
    for (int h = 0; h < MSNE_SCALES; ++h) {
        const double w = W[h * n + i];
#pragma unroll
        for (int a = 0; a < MSNE_DIM; ++a)
            out[a] = fma(w, (double)DX[(h * n + i) * MSNE_DIM + a], out[a]);
    }
#pragma unroll
    for (int a = 0; a < MSNE_DIM; ++a) dense[i * MSNE_DIM + a] = (T)out[a];
}

template __global__ void msne_row_sums<float>(const float*, long long, const float*, float*,
                                              float*, float*);
template __global__ void msne_row_sums<double>(const double*, long long, const double*, double*,
                                               double*, double*);
template __global__ void msne_edges<float>(const int*, const int*, const float*,
                                           const float*, long long, const float*, const float*,
                                           const float*, int, double, float*, float*, float*,
                                           float*);
template __global__ void msne_edges<double>(const int*, const int*, const double*,
                                            const double*, long long, const double*,
                                            const double*, const double*, int, double, double*,
                                            double*, double*, double*);
template __global__ void msne_gradient<float>(const float*, long long, const float*,
                                              const float*, const float*, const float*, float*);
template __global__ void msne_gradient<double>(const double*, long long, const double*,
                                               const double*, const double*, const double*,
                                               double*);
