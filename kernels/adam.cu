// One Adam step (Kingma & Ba 2015) on a parameter array, fused into one launch:
// the MLP mapping's minibatch update (gpuembed/parametric/mappings.py:adam_step,
// whose NumPy branch is the reference).  As CuPy array code the update was 14
// calls per parameter array, 84 of the 110 calls of a minibatch of a two-hidden-
// layer net, and MAC's F steps on the GPU were bound by those calls.
//
//   g <- g + decay p;  m <- beta1 m + (1 - beta1) g;  v <- beta2 v + (1 - beta2) g^2
//   p <- p - lr (m / bias1) / (sqrt(v / bias2) + eps)
// with bias1 = 1 - beta1^t, bias2 = 1 - beta2^t; arithmetic in T as the
// reference's, one thread per element (grid-stride).  The step's scalars
// (lr, bias1, bias2, decay) are read from device memory, not passed by value, so
// that a CUDA graph of many steps (MLPMapping.fit's segments) replays with the
// scalars written before each replay.

template <typename T>
__global__ void adam_step(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m,
                          T* __restrict__ v, long long n, const double* __restrict__ scalars,
                          double beta1, double beta2, double eps) {
    const double lr = scalars[0], bias1 = scalars[1], bias2 = scalars[2], decay = scalars[3];
    const T b1 = (T)beta1, b2 = (T)beta2, c1 = (T)(1.0 - beta1), c2 = (T)(1.0 - beta2);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const T gi = decay != 0.0 ? g[i] + (T)decay * p[i] : g[i];
        const T mi = m[i] * b1 + c1 * gi;
        const T vi = v[i] * b2 + c2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] -= (T)lr * (mi / (T)bias1) / (sqrt(vi / (T)bias2) + (T)eps);
    }
}

template __global__ void adam_step<float>(float*, const float*, float*, float*, long long,
                                          const double*, double, double, double);
template __global__ void adam_step<double>(double*, const double*, double*, double*, long long,
                                           const double*, double, double, double);
