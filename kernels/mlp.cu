// The MLP mapping's elementwise steps, one launch each in place of 2-3 CuPy calls
// (gpuembed/parametric/mappings.py, whose NumPy branches are the references).  A
// minibatch of a net with two hidden layers made 38 calls and launches; MAC's F
// steps on the GPU are bound by their count, not by the arithmetic.  Arithmetic in
// T as the references', one thread per element (grid-stride).

// H (rows x cols, row-major) <- H + b (bias per column), then tanh if activate.
template <typename T>
__global__ void bias_activation(T* __restrict__ H, const T* __restrict__ b, long long n,
                                long long cols, int activate) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const T h = H[i] + b[i % cols];
        H[i] = activate ? tanh(h) : h;
    }
}

// D <- D (1 - A^2): back through tanh, whose output is A.
template <typename T>
__global__ void tanh_backward(T* __restrict__ D, const T* __restrict__ A, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        D[i] *= (T)1 - A[i] * A[i];
    }
}

// O <- (O - Z) scale: the squared error's gradient at the output O for targets Z.
template <typename T>
__global__ void scaled_residual(T* __restrict__ O, const T* __restrict__ Z, long long n,
                                double scale) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        O[i] = (O[i] - Z[i]) * (T)scale;
    }
}

template __global__ void bias_activation<float>(float*, const float*, long long, long long, int);
template __global__ void bias_activation<double>(double*, const double*, long long, long long,
                                                 int);
template __global__ void tanh_backward<float>(float*, const float*, long long);
template __global__ void tanh_backward<double>(double*, const double*, long long);
template __global__ void scaled_residual<float>(float*, const float*, long long, double);
template __global__ void scaled_residual<double>(double*, const double*, long long, double);
