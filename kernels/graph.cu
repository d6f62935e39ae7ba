// The spectral direction's refresh of B on the device (gpuembed/optim/sparse_gpu.py):
// each row's kappa largest weights and the connected components of the kept graph.
// Their references are the CPU's: gpuembed/optim/sparse_cpu.py:largest_per_row and
// SciPy's connected_components.  On the host, a refresh at Fashion-MNIST 70k took
// 0.19-0.22 s of an H100 fit (W's 9.9M entries copied out, sparsified and split
// into components, the kept graph copied back), 1.6 s of a 7.5-s default t-SNE.
// T is the weights' type; the component kernels take none and are instantiated
// per type only to share the module.

// keep[e] for each entry e of row `row`: whether fewer than kappa entries of the
// row come before it, by a larger weight or an equal one stored earlier (so a row
// of at most kappa entries is kept whole).  A thread per row, its entries compared
// pairwise, which stops counting at kappa: rows of t-SNE's affinities hold about
// 140 entries.
template <typename T>
__global__ void largest_per_row(const int* __restrict__ indptr, const T* __restrict__ data,
                                int kappa, bool* __restrict__ keep, int n) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= n) return;
    const int lo = indptr[row], hi = indptr[row + 1];
    for (int e = lo; e < hi; ++e) {
        const T value = data[e];
        int before = 0;
        for (int f = lo; f < hi && before < kappa; ++f)
            before += data[f] > value || (data[f] == value && f < e);
        keep[e] = before < kappa;
    }
}

// Connected components by hooking and pointer jumping.  labels[i] <= i always
// names a point of i's component, and after compress_labels every label is a
// root (labels[r] == r).  hook_components: for each edge whose ends carry
// different labels, the larger label is pointed at the smaller (atomicMin: the
// labels only decrease), and *changed is set; a hook that overwrites another
// made in the same pass loses that merge for now, but its edge still differs
// and hooks again in the next pass.  A pass that finds no such edge changed
// nothing, so every edge joins equal labels: each component has one root, its
// smallest point, which is what SciPy's numbering sorts by.
template <typename T>
__global__ void hook_components(const int* __restrict__ indptr, const int* __restrict__ indices,
                                int* labels, int* changed, int n) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= n) return;
    for (int e = indptr[row]; e < indptr[row + 1]; ++e) {
        const int a = labels[row], b = labels[indices[e]];
        if (a != b) {
            atomicMin(labels + max(a, b), min(a, b));
            *changed = 1;
        }
    }
}

// Each label replaced by its root.  Roots do not change here (a root's chain is
// itself), so a chain read while other threads shorten theirs still ends at one.
// Each step is written back at once: a thread whose chain passes through i then
// skips what i's thread has climbed, so the threads of a long chain (points
// ordered along a path) share the climb instead of each walking it whole.
template <typename T>
__global__ void compress_labels(int* labels, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int label = labels[i];
    for (int up = labels[label]; up != label; up = labels[label]) {
        label = up;
        labels[i] = label;
    }
}

#define GRAPH_INSTANTIATE(T)                                                                   \
    template __global__ void largest_per_row<T>(const int*, const T*, int, bool*, int);        \
    template __global__ void hook_components<T>(const int*, const int*, int*, int*, int);      \
    template __global__ void compress_labels<T>(int*, int);
GRAPH_INSTANTIATE(float)
GRAPH_INSTANTIATE(double)
