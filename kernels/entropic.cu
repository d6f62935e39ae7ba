// Entropic-affinity root finding (Algorithm 1 of ../shared/papers/003_*.txt):
// one warp per row, the row's k shifted squared distances held in registers
// (EA_PER_LANE per lane, so k <= 32 * EA_PER_LANE), sums by warp shuffles.
// Mirrors gpuembed/affinities/rootfinding.py:solve, its NumPy/CuPy reference:
// same derivative steps, bracket updates and bisection safeguards, and the
// same count of function evaluations.  Arithmetic is in double whatever T is.

#ifndef EA_PER_LANE
#define EA_PER_LANE 4
#endif

#define EA_FULL 0xffffffffu
#define EA_NEWTON 0
#define EA_HALLEY 1
#define EA_EULER 2
#define EA_BISECTION 3

__device__ __forceinline__ double ea_inf() { return __longlong_as_double(0x7ff0000000000000LL); }

// Sum over the warp, then broadcast lane 0's value: every lane must hold the
// bit-identical scalar, or lanes could take different branches.
__device__ __forceinline__ double ea_warp_sum(double v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(EA_FULL, v, offset);
    return __shfl_sync(EA_FULL, v, 0);
}

__device__ __forceinline__ double ea_step(int method, double f, double g, double h2) {
    const double newton = -f / g;
    if (method == EA_HALLEY) return -2.0 * f * g / (2.0 * g * g - f * h2);
    if (method == EA_EULER) {
        const double disc = g * g - 2.0 * h2 * f;
        if (disc < 0.0) return newton;
        const double root = sqrt(disc);
        return -2.0 * f / (g + (g >= 0.0 ? root : -root));
    }
    return newton;
}

template <typename T>
__global__ void entropic_solve(const T* __restrict__ shifted, long long k,
                               const long long* __restrict__ rows, long long m,
                               const double* __restrict__ alpha0, const double* __restrict__ lo_in,
                               const double* __restrict__ hi_in, const double* __restrict__ log_k,
                               int method, double tol, int max_inner, int max_eval,
                               double* __restrict__ alpha_out, double* __restrict__ entropy_out,
                               long long* __restrict__ n_eval_out) {
    const int lane = threadIdx.x & 31;
    const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (i >= m) return;  // whole warps leave together

    const T* row = shifted + rows[i] * k;
    double d[EA_PER_LANE];
    bool valid[EA_PER_LANE];
#pragma unroll
    for (int r = 0; r < EA_PER_LANE; ++r) {
        const long long j = lane + 32LL * r;
        valid[r] = j < k;
        d[r] = valid[r] ? (double)row[j] : 0.0;
    }

    double lo = lo_in[i], hi = hi_in[i];
    double a = alpha0[i];
    if (!(a > lo && a < hi)) a = 0.5 * (lo + hi);
    const double target = log_k[i];
    const double eps = 2.220446049250313e-16;
    double prev_f = ea_inf(), a_eval = a, H = 0.0;
    int inner = 0, evals = 0;
    while (evals < max_eval) {
        ++evals;
        a_eval = a;
        const double beta = exp(a);
        double w[EA_PER_LANE];
        double z = 0.0, s1 = 0.0;
#pragma unroll
        for (int r = 0; r < EA_PER_LANE; ++r) {
            w[r] = valid[r] ? exp(-beta * d[r]) : 0.0;
            z += w[r];
            s1 += w[r] * d[r];
        }
        z = ea_warp_sum(z);
        const double m1 = ea_warp_sum(s1) / z;
        double s2 = 0.0, s3 = 0.0;
#pragma unroll
        for (int r = 0; r < EA_PER_LANE; ++r) {
            const double c = d[r] - m1;
            s2 += w[r] * c * c;
            s3 += w[r] * c * c * c;
        }
        const double var = ea_warp_sum(s2) / z;
        const double mu3 = ea_warp_sum(s3) / z;
        H = beta * m1 + log(z);
        const double dH = -beta * beta * var;
        const double d2H = 2.0 * dH + beta * beta * beta * mu3;
        const double f = H - target;
        // Too high an entropy means beta is too small: the root lies right of a.
        if (f > 0.0) lo = a;
        if (f < 0.0) hi = a;
        if (fabs(f) <= tol || hi - lo <= 4.0 * eps * fmax(1.0, fabs(a))) break;
        const double mid = 0.5 * (lo + hi);
        if (method == EA_BISECTION) {
            a = mid;
            continue;
        }
        const double next = a + ea_step(method, f, dH, d2H);
        const bool bisect = !isfinite(next) || next <= lo || next >= hi || inner >= max_inner ||
                            fabs(f) > 0.5 * fabs(prev_f);
        a = bisect ? mid : next;
        prev_f = bisect ? ea_inf() : f;
        inner = bisect ? 0 : inner + 1;
    }
    if (lane == 0) {
        alpha_out[i] = a_eval;
        entropy_out[i] = H;
        n_eval_out[i] = evals;
    }
}

template __global__ void entropic_solve<float>(const float*, long long, const long long*, long long,
                                               const double*, const double*, const double*,
                                               const double*, int, double, int, int, double*,
                                               double*, long long*);
template __global__ void entropic_solve<double>(const double*, long long, const long long*,
                                                long long, const double*, const double*,
                                                const double*, const double*, int, double, int,
                                                int, double*, double*, long long*);
