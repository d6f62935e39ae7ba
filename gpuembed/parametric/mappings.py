"""Mappings F: R^D -> R^L for parametric embeddings, behind one small interface:

    fit(Y, Z, warm_start=False) -> self      least-squares fit of Z (N, L) on Y (N, D)
    predict(Y) -> (N, L)

The regularized ones (RBF ridge, MLP weight decay) also take ``sample_weight``,
a float that multiplies the squared error and not the regularizer.

Written against the array module of their input (NumPy or CuPy), so they run
where the data is.  MAC calls ``fit`` once per F step with the same Y and
``warm_start=True``: each mapping keeps what does not depend on Z (the linear
map's pseudo-inverse of [Y, 1] as two factors, the RBF design matrix and its
regularized inverse, the MLP's weights) so an F step is cheap.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .._checks import check_float, check_int, make_rng
from ..backend import GraphReplays, get_backend
from ..nbody.exact import centred, centring_shift, squared_distances
from .mlp_cpu import adam_update


def array_module(a):
    """numpy, or the GPU backend's array module for a device array (anything
    with ``__cuda_array_interface__``: CuPy, and the tests' emulated arrays)."""
    if hasattr(a, "__cuda_array_interface__"):
        return get_backend("gpu").xp
    return np


def float_dtype(Y):
    """The floating dtype a mapping computes in for input Y: float32 stays
    float32, anything else (float64, integers) is float64."""
    return np.float32 if Y.dtype == np.float32 else np.float64


def _moments(xp, A):
    """A's column means and standard deviations (+ 1e-12), summed in float64 (a
    float32 sum drifts: _sparse.column_means), in the mapping's dtype."""
    dtype = float_dtype(A)
    return (A.mean(axis=0, dtype=xp.float64).astype(dtype),
            A.std(axis=0, dtype=xp.float64).astype(dtype) + 1e-12)


def _with_bias(xp, Y):
    return xp.concatenate([Y, xp.ones((Y.shape[0], 1), dtype=Y.dtype)], axis=1)


def _one_blas_thread():
    """BLAS on one thread (for host arrays; device arrays do not use it): the fits'
    Grams, pseudo-inverses and products, and the predictions' products, gave other
    last bits on 1 and 2 OpenBLAS threads (the RBF network's predictions on
    Fashion-MNIST 3k by 1e-9, the linear map's by 1e-15)."""
    return get_backend("cpu").serial_blas()


class _LinearInParameters:
    """F(Y) = Phi(Y) coef_ for a design Phi(Y) that does not depend on the
    parameters (the linear map's [Y, 1], the RBF network's features and bias).

    ``fit`` remembers what it built from the last Y it saw (by identity), so
    warm-started fits on the same inputs reuse it.  ``forward`` and ``backward``
    take a design already computed: the chain rule makes it once for all its
    evaluations (``fixed_design``)."""

    _key = None
    fixed_design = True

    def __getstate__(self):
        # What fit keeps for warm fits on the same Y (a design as large as Y) is
        # neither copied nor pickled: MAC copies its best mapping at every step,
        # and the key, Y's identity, means nothing in a copy.
        state = dict(self.__dict__)
        state.pop("_cache", None)
        state.pop("_key", None)
        return state

    def _fit_cache(self, Y, warm_start, build):
        key = (id(Y), Y.shape)
        if not (warm_start and key == self._key):
            self._cache = build(Y)
            self._key = key
        return self._cache

    def forward(self, Y, design=None):
        """(F(Y), the design of Y); ``design`` given is used as that of Y.  Float32
        input stays float32; other input (integers) gets float64."""
        with _one_blas_thread():
            design = self.design(Y) if design is None else design
            return (design @ self.coef_).astype(float_dtype(Y), copy=False), design

    def predict(self, Y):
        return self.forward(Y)[0]

    def parameters(self):
        return [self.coef_]

    def backward(self, Y, G, design=None):
        """Gradients of sum_n G_n . F(y_n) wrt parameters(): Phi(Y)^T G."""
        with _one_blas_thread():
            return [(self.design(Y) if design is None else design).T @ G]


class LinearMapping(_LinearInParameters):
    """F(y) = A (y - o) + b by least squares, the solution of least norm, o
    (``origin_``) the training rows' mean rounded as nbody.exact.centring_shift
    rounds it.  Relative to it the Gram is as well conditioned as the rows' own
    spread: of [Y, 1], float32 integer rows moved 1e3 from the origin fitted an
    affine map 45 units off (0.1, the noise, centred), float64 ones moved 1e5 2.2.

    The least squares go through the pseudo-inverse of the smaller Gram of
    X = [Y - o, 1], kept for warm fits: X^+ = (X^T X)^+ X^T for more rows than
    columns, X^T (X X^T)^+ for fewer (N^2 where D^2 would not fit: 20,000 genes
    of 500 cells).  Both in float64 whatever Y's dtype, their eigenvalues cut
    below the Gram's rounding (_gram_pinv).  With the (D + 1) x (D + 1) Gram in
    Y's dtype and every eigenvalue above 1e-15 of the largest inverted, as
    before, 100 float32 rows of 300 pixels fitted a unit-spread Z (N, 2) 11
    units off and predicted other rows 14x its scale off (now 1e-7 and 4e-8 of
    it); 60 float64 rows of 80 were fitted with |Z - F(Y)|^2 = 0.0099, not 0,
    where NumPy 2.5.5's OpenBLAS left a rounding-level eigenvalue at 1.03e-15.
    A warm fit on 20,000 float32 images takes 12-18 ms, against 8-10 ms with
    the products in float32."""

    def design(self, Y):
        xp = array_module(Y)
        return _with_bias(xp, (Y - self.origin_).astype(float_dtype(Y), copy=False))

    def _build(self, Y):
        """(left, right) with X^+ = left @ right."""
        self.origin_ = centring_shift(array_module(Y), Y)
        X = self.design(Y).astype(np.float64, copy=False)
        if X.shape[0] >= X.shape[1]:
            return _gram_pinv(X.T @ X), X.T
        return X.T, _gram_pinv(X @ X.T)

    def fit(self, Y, Z, warm_start=False):
        with _one_blas_thread():
            left, right = self._fit_cache(Y, warm_start, self._build)
            # (D + 1, L): [A^T; b]
            self.coef_ = left @ (right @ Z.astype(np.float64, copy=False))
        return self


def _centre_spread(sample, centers, inertia):
    """The RMS distance of the sample to its nearest centre, or, where every point is
    a centre (inertia at rounding level), half the RMS distance from each centre to
    its nearest other one.  Taken from a zero inertia, sigma was 3e-12 and the
    features of 60 points with 60 centres vanished off their own centre, even
    at a training point whose distance to it rounded to 1e-15."""
    scatter = float(((sample - sample.mean(axis=0)) ** 2).sum())
    if inertia > 1e-12 * scatter or len(centers) < 2:
        return max(float(np.sqrt(inertia / len(sample))), 1e-12)
    centers = centred(np, centers)
    D = squared_distances(np, centers, centers)
    np.fill_diagonal(D, np.inf)
    return max(0.5 * float(np.sqrt(D.min(axis=1).mean())), 1e-12)


class RBFMapping(_LinearInParameters):
    """F(y) = W^T [phi(y); 1] with Gaussian features phi_j = exp(-|y - c_j|^2 / (2 sigma^2)).

    ``n_centers`` centres (default min(200, N)) by k-means (on at most
    ``max_kmeans_points`` points; clusters that k-means leaves empty, for lack of
    distinct rows, give none), sigma by default
    the root mean squared distance of the points to their nearest centre times
    ``width`` (half that between neighbouring centres where every point is one);
    W by least squares, the minimum-norm solution (wide Gaussians make the
    features nearly collinear), or by ridge regression with ``ridge`` > 0 (ridge
    x N on the features' weights).

    ``fit`` takes a ``sample_weight`` (a float: every sample the same weight),
    as scikit-learn's regressors do; it scales the squared error, so the ridge
    acts at ``ridge N / sample_weight``.  MAC passes mu / mu_1, which keeps a
    ridge a fixed term of the objective along the path (see mac.py).
    """

    def __init__(self, n_centers=None, sigma=None, width=3.0, ridge=0.0, max_kmeans_points=20000,
                 random_state=None):
        self.n_centers = n_centers
        self.sigma = sigma
        self.width = width
        self.ridge = ridge
        self.max_kmeans_points = max_kmeans_points
        self.random_state = random_state

    def design(self, Y):
        # In float64 for every input: the Gram of wide Gaussians is ill-conditioned
        # (condition number about 1e9 on digits and on Fashion-MNIST, beyond float32).
        # Relative to the centres' mean: the distances then round to the data's
        # spread (digits moved 1e6 from the origin: F 2e-4 off, 1e-2 after MAC).
        xp = array_module(Y)
        D = squared_distances(xp, Y.astype(xp.float64, copy=False) - self.origin_,
                              self.centers_ - self.origin_)
        return _with_bias(xp, xp.exp(D * (-0.5 / self.sigma_**2)))

    def _build(self, Y):
        from ..spectral.kmeans import _kmeans

        xp = array_module(Y)
        n = Y.shape[0]
        k = min(200, n) if self.n_centers is None else check_int(self.n_centers, "n_centers", 1, n)
        rng = make_rng(self.random_state)
        host = Y.get() if xp is not np else Y
        sample = host[rng.choice(n, min(n, self.max_kmeans_points), replace=False)]
        labels, centers, inertia = _kmeans(sample, k, n_init=1, random_state=self.random_state)
        # Clusters left empty by duplicated rows had kept centres on the rows too,
        # whose zero distances halved sigma (60 points tiled 5 times: held-out
        # error 0.44 against 0.12 for the 60).
        centers = centers[np.unique(labels)]
        self.centers_ = xp.asarray(centers, dtype=xp.float64)
        self.origin_ = centring_shift(xp, self.centers_)
        self.sigma_ = (float(self.sigma) if self.sigma is not None
                       else self.width * _centre_spread(sample, centers, inertia))
        Phi = self.design(Y)
        return Phi, Phi.T @ Phi, {}     # the dict keeps the inverse for the last ridge strength

    def fit(self, Y, Z, warm_start=False, sample_weight=None):
        weight = uniform_sample_weight(sample_weight)
        ridge = check_float(self.ridge, "ridge", 0.0)
        with _one_blas_thread():
            Phi, gram, inverses = self._fit_cache(Y, warm_start, self._build)
            strength = ridge * Y.shape[0] / weight
            if strength not in inverses:
                inverses.clear()
                inverses[strength] = _regularized_pinv(gram, strength)
            self.coef_ = inverses[strength] @ (Phi.T @ Z)
        return self


def _regularized_pinv(gram, strength):
    """(gram + strength I')^+, I' the identity without the bias's entry (the
    least-squares solution of least norm for strength 0)."""
    xp = array_module(gram)
    A = gram.copy()
    k = len(A) - 1
    A[xp.arange(k), xp.arange(k)] += strength                  # the bias is not penalized
    return _gram_pinv(A)


def _gram_pinv(gram):
    """The pseudo-inverse of a Gram matrix with its eigenvalues below its size
    times eps of the largest cut: those are rounding (of an exactly singular
    Gram) or directions that it cannot resolve."""
    return array_module(gram).linalg.pinv(gram, rcond=len(gram) * np.finfo(gram.dtype).eps)


def uniform_sample_weight(sample_weight):
    """The float weight of every sample (1.0 for None); the mappings take no
    per-sample weights."""
    if sample_weight is None:
        return 1.0
    return check_float(sample_weight, "sample_weight", 0.0, low_open=True)


# Grid of the elementwise kernels (kernels/adam.cu, kernels/mlp.cu): grid-stride
# loops over at most this many blocks.
ELEMENTWISE_BLOCK, ELEMENTWISE_MAX_BLOCKS = 256, 1024


def _launch(name, filename, arrays, scalars=()):
    """One grid-stride kernel of ``filename`` over the elements of ``arrays[0]``,
    whose arguments are the arrays, their element count and the scalars."""
    first = arrays[0]
    blocks = min(-(-first.size // ELEMENTWISE_BLOCK), ELEMENTWISE_MAX_BLOCKS)
    get_backend("gpu").kernel(filename, name, first.dtype)(
        (blocks,), (ELEMENTWISE_BLOCK,), (*arrays, np.int64(first.size), *scalars))


def adam_scalars(lr, step, beta1=0.9, beta2=0.999, weight_decay=0.0):
    """The scalars of Adam's step ``step`` = t >= 1: (lr, bias1, bias2, weight
    decay), with the bias corrections bias1 = 1 - beta1^t, bias2 = 1 - beta2^t."""
    return (lr, 1.0 - beta1**step, 1.0 - beta2**step, weight_decay)


def adam_step(p, g, m, v, scalars, beta1=0.9, beta2=0.999, eps=1e-8):
    """One Adam step, in place on the parameters ``p`` and the moments ``m``, ``v``,
    from the gradient ``g``, with :func:`adam_scalars`' four ``scalars``: one pass
    over the vector, compiled on the CPU (mlp_cpu.adam_update), one launch of
    kernels/adam.cu on the GPU instead of 14 CuPy calls.  On the GPU the scalars
    may be a float64 device array, which the kernel reads when it runs (a row of
    MLPMapping.fit's schedule, rewritten before each replay of a captured graph);
    host values are copied over."""
    if array_module(p) is np:
        lr, bias1, bias2, weight_decay = map(float, scalars)
        adam_update(p, np.ascontiguousarray(g, dtype=p.dtype), m, v, *map(p.dtype.type, (
            beta1, beta2, lr / bias1, 1.0 / math.sqrt(bias2), eps, weight_decay)))
        return
    xp = get_backend("gpu").xp
    scalars = xp.asarray(scalars, dtype=np.float64)
    g = xp.ascontiguousarray(g, dtype=p.dtype)
    _launch("adam_step", "adam.cu", (p, g, m, v), (scalars, *map(np.float64, (beta1, beta2, eps))))


def bias_activation(H, b, activate):
    """H <- H + b (b per column), then tanh if ``activate``; in place.  One launch
    of kernels/mlp.cu on the GPU."""
    if array_module(H) is np:
        H += b
        if activate:
            np.tanh(H, out=H)
        return
    b = get_backend("gpu").xp.asarray(b, dtype=H.dtype)
    _launch("bias_activation", "mlp.cu", (H, b), (np.int64(H.shape[1]), np.int32(activate)))


# kernels/mlp.cu's product tile (GEMM_TILE there).
GEMM_TILE = 16
# A product with a workspace splits its sum over K into as many parts as keep its
# blocks within this count (a few per multiprocessor), each part at least 2 tiles
# of K: the weight gradients A^T delta of a minibatch of 1,000 rows have 16 to 256
# tiles of output, and each block summed 63 tiles of k in turn, where the
# minibatch's forward products have about 1,000 tiles of K = 50 or 256 (no split).
# Not yet timed on a GPU.
GEMM_TARGET_BLOCKS = 1024
# Elements of a workspace that every split product fits (splits x tiles <=
# GEMM_TARGET_BLOCKS).
GEMM_WORKSPACE = GEMM_TARGET_BLOCKS * GEMM_TILE**2


def gemm_splits(M, N, K):
    """(splits, k_chunk): the parts of :func:`gemm`'s sum over K with a workspace
    and the length of each (whole tiles; the last part may be shorter)."""
    tiles = -(-M // GEMM_TILE) * -(-N // GEMM_TILE)
    splits = max(1, min(-(-K // GEMM_TILE) // 2, GEMM_TARGET_BLOCKS // tiles))
    k_chunk = -(-K // (splits * GEMM_TILE)) * GEMM_TILE
    return -(-K // k_chunk), k_chunk


def gemm(A, B, out, workspace=None):
    """out <- A @ B for 2-D A (M x K) and B (K x N), K >= 1, and a C-contiguous out
    (M x N); A and B may be transposed views.  On the GPU one launch of
    kernels/mlp.cu, which a CUDA graph can capture (CuPy refuses cuBLAS calls
    while a stream captures), and with a ``workspace`` (GEMM_WORKSPACE elements of
    out's dtype) where the output has few tiles for a long sum, partial products
    over parts of K (:func:`gemm_splits`) and a second launch that adds them in
    order; np.matmul on the CPU."""
    if array_module(out) is np:
        return np.matmul(A, B, out=out)
    (M, K), N = A.shape, B.shape[1]
    splits, k_chunk = (1, K) if workspace is None else gemm_splits(M, N, K)
    target = out if splits == 1 else workspace[:splits * M * N]
    # Each operand by its element strides, passed as the contiguous array its
    # view reads (the kernel takes a pointer, and transposing moves none).
    operands = []
    for X in (A, B):
        operands += [X if X.flags.c_contiguous else X.T,
                     *(np.int64(stride // X.itemsize) for stride in X.strides)]
    get_backend("gpu").kernel("mlp.cu", "gemm", out.dtype)(
        (-(-N // GEMM_TILE), -(-M // GEMM_TILE), splits), (GEMM_TILE, GEMM_TILE),
        (*operands, target, np.int32(M), np.int32(N), np.int32(K), np.int32(k_chunk)))
    if splits > 1:
        _launch("sum_splits", "mlp.cu", (out, target), (np.int32(splits),))
    return out


# kernels/mlp.cu's column-sum block: SUM_COLUMNS columns by SUM_STRIPES row stripes.
SUM_COLUMNS, SUM_STRIPES = 32, 32


def column_sums(D, out):
    """out <- D.sum(axis=0) for a C-contiguous D; one launch of kernels/mlp.cu on
    the GPU (capturable, as :func:`gemm`)."""
    if array_module(D) is np:
        return D.sum(axis=0, out=out)
    rows, cols = D.shape
    get_backend("gpu").kernel("mlp.cu", "column_sums", D.dtype)(
        (-(-cols // SUM_COLUMNS),), (SUM_COLUMNS, SUM_STRIPES),
        (D, out, np.int32(rows), np.int32(cols)))
    return out


def tanh_backward(D, A, scratch=None):
    """D <- D (1 - A^2) in place: back through a tanh whose output is A (on the
    CPU through ``scratch``, an array shaped as A, allocated when None)."""
    if array_module(D) is np:
        S = np.multiply(A, A, out=scratch)
        np.subtract(1.0, S, out=S)
        D *= S
        return
    _launch("tanh_backward", "mlp.cu", (D, A))


def scaled_residual(O, Z, scale):
    """O <- (O - Z) scale in place."""
    if array_module(O) is np:
        O -= Z
        O *= scale
        return
    Z = get_backend("gpu").xp.ascontiguousarray(Z, dtype=O.dtype)
    _launch("scaled_residual", "mlp.cu", (O, Z), (np.float64(scale),))


# Minibatches per segment of an epoch.  A segment's rows are gathered into fixed
# buffers and its Adam scalars written to a fixed schedule, so that on the GPU one
# CUDA graph of its steps replays every segment of the same length: an epoch is
# a few launches instead of about 21 per minibatch.
SEGMENT_STEPS = 256


class _MinibatchBuffers:
    """Every array MLPMapping.fit's minibatch steps read or write, allocated once
    and kept over warm starts of the same shapes and parameter vector: a
    segment's inputs and targets, its steps' Adam scalars (adam_scalars), the
    layers' outputs, the hidden layers' back-propagated gradients, the
    parameters' gradient, (on the CPU) the scratch of tanh_backward, and (on the
    GPU) the CUDA graphs of the segments.
    Allocated per minibatch, arrays of a few hundred KB went back to
    the OS and came back as fresh pages (glibc's malloc): an epoch of a net
    3-100-500-2 on 20,000 points took 0.19-0.52 s on a 2-core EPYC, as the
    allocator happened to keep memory or not, and takes 0.18 s with the buffers.
    A short segment or minibatch uses the first rows of each array."""

    def __init__(self, xp, sizes, n, batch, parameters):
        theta = parameters[0]
        self.shape = (n, batch, sizes)
        self.parameters = parameters                # theta, m, v: what the graphs update
        steps = min(SEGMENT_STEPS, -(-n // batch))
        self.rows = min(steps * batch, n)
        self.inputs = xp.empty((self.rows, sizes[0]), dtype=theta.dtype)
        self.targets = xp.empty((self.rows, sizes[-1]), dtype=theta.dtype)
        self.schedule = np.empty((steps, 4))
        self.device_schedule = None if xp is np else xp.empty(self.schedule.shape)
        self.outputs = [xp.empty((batch, w), dtype=theta.dtype) for w in sizes[1:]]
        self.deltas = [xp.empty((batch, w), dtype=theta.dtype) for w in sizes[1:-1]]
        self.gradient = xp.empty_like(theta)
        self._scratch = np.empty(batch * max(sizes[1:]), dtype=theta.dtype) if xp is np else None
        # The split products' partial sums (gemm), on the GPU.
        self.partials = None if xp is np else xp.empty(GEMM_WORKSPACE, dtype=theta.dtype)
        self._xp = xp
        # By a segment's row count (no graphs on the CPU, whose backend captures none).
        self._graphs = GraphReplays(get_backend("cpu" if xp is np else "gpu"),
                                    "MLPMapping's steps")

    def serve(self, n, batch, sizes, parameters):
        """Whether these buffers serve a fit of n rows in minibatches of ``batch``
        rows of a net of layer ``sizes`` with these parameters and moments."""
        return self.shape == (n, batch, sizes) and all(
            a is b for a, b in zip(self.parameters, parameters))

    def scratch(self, shape):
        """A contiguous host array of ``shape`` (at most the widest layer's); None
        on the GPU, whose kernels need none."""
        if self._scratch is None:
            return None
        return self._scratch[:shape[0] * shape[1]].reshape(shape)

    def load(self, U, T, rows, scalars):
        """The segment of the rows ``rows`` of U and T (a device index array on the
        GPU) and its steps' Adam scalars (one row each)."""
        xp, count = self._xp, len(rows)
        xp.take(U, rows, axis=0, out=self.inputs[:count])
        xp.take(T, rows, axis=0, out=self.targets[:count])
        self.schedule[:len(scalars)] = scalars
        if self.device_schedule is not None:
            self.device_schedule[...] = xp.asarray(self.schedule)

    def step_scalars(self, j):
        """Step j's row of the schedule, where adam_step reads it."""
        return self.schedule[j] if self.device_schedule is None else self.device_schedule[j]

    def run(self, count, train):
        """``train()``, the steps of a segment of ``count`` rows.  On the GPU the
        first segment of each length runs as it is (compiling its kernels); the
        second is captured as a CUDA graph, which that run and all later ones
        replay (backend.GraphReplays)."""
        self._graphs.run(count, train)


# (epochs, least minibatch steps) of MLPMapping's default warm and cold fits.
WARM_FIT, COLD_FIT = (5, 500), (50, 5000)


class MLPMapping:
    """A fully connected net y -> tanh layers -> linear output, trained by minibatch
    Adam on the mean squared error, in the input's array module (no deep-learning
    framework).  Inputs and targets are standardized with the statistics of the
    first fit.  ``warm_start`` continues from the current weights and optimizer
    state for ``epochs`` epochs; a cold fit initializes (Glorot) and trains
    ``initial_epochs``.

    None (the defaults) is 5 epochs for a warm start and 50 for a cold fit, but
    at least 500 and 5,000 minibatch steps: on small data an epoch is only a
    few steps (6 of 100 points at N = 600), and 50 epochs left the net far from
    its target.  The direct fit of an EE layout of 600 points (5 clusters in
    20-D) by the default net had P(F) 56.3 after 300 steps (free embedding
    12.75, RBF network 13.95) and has 14.7; MAC then ends at 13.2 against 19.6
    in half the time (fewer steps along the path), t-SNE's at 0.986 (the free
    embedding's) against 1.126 in 5.5 s against 2.0 s.  On digits (1,797
    points, default TSNE and EE, 2-core EPYC) MAC ends at t-SNE 0.732 against
    1.376 (free 0.725; 10-NN accuracy 0.987 against 0.965) and EE 13.54 against
    14.24 (free 13.52), in the same 16 s and 7 s; multi-scale SNE on the first
    1,000 digits (8 mu values, 3 steps each) at 426 against 1367 (free 430;
    accuracy 0.983 against 0.909) in 10.6 s against 9.1 s.  From 10,000 points
    (batch 100) the epochs alone count.

    The k-th warm start trains at ``learning_rate / (1 + k)^power_t`` (as
    scikit-learn's "invscaling"; ``learning_rate_`` is the rate of the last fit).
    MAC's F steps are such warm starts, and at a constant rate the minibatch noise
    outgrows the shrinking Z steps: on t-SNE + MLP (Fashion-MNIST 5k, PCA 50,
    256-256, 3 epochs per F step) P(F) fell to 1.935 and then rose to 2.33 with
    |Z - F(Y)|^2 jumping from 6.6e3 to 9.9e4, while with power_t = 0.5 both fall
    along the whole path, to P(F) 1.877 and |Z - F(Y)|^2 32.

    ``fit``'s ``sample_weight`` (a float) scales the squared error as in
    RBFMapping: the weight decay acts at ``weight_decay / sample_weight``.

    All weights and biases are views of one vector, and so are their gradients
    and Adam's moments: a minibatch's update is one Adam step over the vector
    (on the GPU one launch, not one per array).  Each epoch permutes the inputs
    and gathers them a segment (SEGMENT_STEPS minibatches) at a time, so that a
    minibatch is a slice.  Every array a minibatch reads or writes is allocated
    once and kept over warm starts (_MinibatchBuffers).  On the GPU a minibatch
    of a net with two hidden layers is 18 kernel launches and one more per
    product that gemm splits (its products too are in kernels/mlp.cu, as CuPy
    refuses cuBLAS calls in a capture), and each segment
    length is captured once as a CUDA graph and replayed: the host makes a few
    calls per segment, not about 21 per minibatch (benchmarks/gpu_call_counts.py;
    an epoch of a 3-100-500-2 net over 20,000 points took 15.7 ms against 111 ms
    on an H100).
    """

    def __init__(self, hidden=(100,), epochs=None, initial_epochs=None, batch_size=100,
                 learning_rate=1e-3, power_t=0.5, weight_decay=0.0, random_state=None):
        # One int is one hidden layer; every layer needs a unit at least.
        layers = (hidden,) if isinstance(hidden, (int, np.integer)) else tuple(hidden)
        self.hidden = tuple(check_int(h, "hidden", 1) for h in layers)
        self.epochs = epochs
        self.initial_epochs = initial_epochs
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.power_t = power_t
        self.weight_decay = weight_decay
        self.random_state = random_state

    def __getstate__(self):
        # The next fit rebuilds the minibatch buffers: a copy trains its own
        # parameter vector, and CUDA graphs do not pickle.
        state = dict(self.__dict__)
        state.pop("_buffers", None)
        return state

    @property
    def weights_(self):
        """[(W, b) per layer]: views of the parameter vector (views are not kept, so
        that a copied or unpickled mapping still trains the vector it reads)."""
        return self._layers(self._theta)

    def _layers(self, vector):
        """[(W, b) per layer] as views of a parameter-sized vector."""
        layers, start = [], 0
        for a, b in zip(self._sizes[:-1], self._sizes[1:]):
            W = vector[start:start + a * b].reshape(a, b)
            layers.append((W, vector[start + a * b:start + a * b + b]))
            start += a * b + b
        return layers

    def _init(self, xp, Y, Z):
        rng = make_rng(self.random_state)
        self._rng = rng
        self.y_mean_, self.y_std_ = _moments(xp, Y)
        self.z_mean_, self.z_std_ = _moments(xp, Z)
        self._sizes = (Y.shape[1],) + self.hidden + (Z.shape[1],)
        dtype = float_dtype(Y)      # integer weights of integer input would not train
        n_params = sum(a * b + b for a, b in zip(self._sizes[:-1], self._sizes[1:]))
        self._theta = xp.zeros(n_params, dtype=dtype)
        for W, _ in self.weights_:
            scale = np.sqrt(6.0 / sum(W.shape))
            W[...] = xp.asarray(rng.uniform(-scale, scale, W.shape), dtype=dtype)
        self._adam = (xp.zeros_like(self._theta), xp.zeros_like(self._theta), 0)
        self.n_warm_starts_ = 0

    @staticmethod
    def _forward(xp, U, layers, buffers=None):
        """Each layer's output for input rows U, into the ``buffers``' outputs where
        given."""
        activations = [U]
        last = len(layers) - 1
        for i, (W, b) in enumerate(layers):
            U = (U @ W if buffers is None
                 else gemm(U, W, buffers.outputs[i][:len(U)], buffers.partials))
            bias_activation(U, b, i < last)
            activations.append(U)
        return activations

    def fit(self, Y, Z, warm_start=False, sample_weight=None):
        xp = array_module(Y)
        weight_decay = check_float(self.weight_decay, "weight_decay", 0.0)
        weight_decay /= uniform_sample_weight(sample_weight)
        batch = check_int(self.batch_size, "batch_size", 1)
        warm = warm_start and hasattr(self, "weights_")
        if warm:
            self.n_warm_starts_ += 1
        else:
            self._init(xp, Y, Z)
        epochs = self._epochs(warm, -(-Y.shape[0] // batch))
        lr = check_float(self.learning_rate, "learning_rate", 0.0, low_open=True)
        power_t = check_float(self.power_t, "power_t", 0.0)
        self.learning_rate_ = lr = lr / (1.0 + self.n_warm_starts_) ** power_t
        # In the parameters' dtype, that of the buffers they are gathered into.
        U = ((Y - self.y_mean_) / self.y_std_).astype(self._theta.dtype, copy=False)
        T = ((Z - self.z_mean_) / self.z_std_).astype(self._theta.dtype, copy=False)
        n, batch = Y.shape[0], min(batch, Y.shape[0])
        # Adam's state carries over warm starts: restarting it (bias-corrected first
        # steps of size ~lr whatever the gradient) shook a converged net at every
        # F step, and P(F) rose late on the MAC path (Fashion-MNIST 5k: best P 1.85
        # restarting, see benchmarks/results/mac.json for the carried state).
        m, v, step = self._adam
        buffers = getattr(self, "_buffers", None)
        if buffers is None or not buffers.serve(n, batch, self._sizes, (self._theta, m, v)):
            buffers = self._buffers = _MinibatchBuffers(xp, self._sizes, n, batch,
                                                        (self._theta, m, v))
        for _ in range(epochs):
            order = xp.asarray(self._rng.permutation(n))
            for start in range(0, n, buffers.rows):
                rows = order[start:start + buffers.rows]
                steps = -(-len(rows) // batch)
                buffers.load(U, T, rows, [adam_scalars(lr, step + j, weight_decay=weight_decay)
                                          for j in range(1, steps + 1)])
                buffers.run(len(rows), functools.partial(self._train_segment, xp, buffers,
                                                         len(rows), batch))
                step += steps
        self._adam = (m, v, step)
        return self

    def _train_segment(self, xp, buffers, count, batch):
        """Minibatch steps over the first ``count`` rows of the buffers' segment, each
        an Adam step with its row of the schedule.  What it touches stays fixed
        while the buffers serve (a CUDA graph of it replays on the same arrays)."""
        layers, gradients = self.weights_, self._layers(buffers.gradient)
        theta, m, v = buffers.parameters
        for j, start in enumerate(range(0, count, batch)):
            stop = min(start + batch, count)
            self._minibatch_gradient(xp, layers, buffers.inputs[start:stop],
                                     buffers.targets[start:stop], gradients, buffers)
            adam_step(theta, buffers.gradient, m, v, buffers.step_scalars(j))

    def _epochs(self, warm, steps_per_epoch):
        """The epochs of a warm or cold fit (None: WARM_FIT's or COLD_FIT's epochs,
        or more to make its least number of minibatch steps)."""
        name = "epochs" if warm else "initial_epochs"
        epochs = getattr(self, name)
        if epochs is not None:
            return check_int(epochs, name, 0)
        default, least_steps = WARM_FIT if warm else COLD_FIT
        return max(default, -(-least_steps // steps_per_epoch))

    def _minibatch_gradient(self, xp, layers, U, T, gradients, buffers=None):
        """The mean squared error's gradient on one minibatch, into ``gradients``."""
        acts = self._forward(xp, U, layers, buffers)
        scaled_residual(acts[-1], T, 2.0 / T.size)
        self._backprop(xp, layers, acts, acts[-1], gradients, buffers)

    @staticmethod
    def _backprop(xp, layers, acts, delta, gradients, buffers=None):
        """Parameter gradients into ``gradients`` ([(dW, db) per layer], views of one
        vector) from the output gradient ``delta`` (overwritten); the hidden layers'
        gradients into ``buffers`` where given."""
        rows = len(delta)
        for i in range(len(layers) - 1, -1, -1):
            dW, db = gradients[i]
            if buffers is None:
                xp.matmul(acts[i].T, delta, out=dW)
                delta.sum(axis=0, out=db)
            else:       # a minibatch step: kernels a CUDA graph can capture
                gemm(acts[i].T, delta, dW, buffers.partials)
                column_sums(delta, db)
            if i:
                W = layers[i][0]
                if buffers is None:
                    delta, scratch = delta @ W.T, None
                else:
                    delta = gemm(delta, W.T, buffers.deltas[i - 1][:rows], buffers.partials)
                    scratch = buffers.scratch(delta.shape)
                tanh_backward(delta, acts[i], scratch)

    fixed_design = False        # forward's activations change with the weights

    def forward(self, Y):
        """(F(Y), the layers' activations for ``backward``)."""
        acts = self._forward(array_module(Y), (Y - self.y_mean_) / self.y_std_, self.weights_)
        return acts[-1] * self.z_std_ + self.z_mean_, acts

    def predict(self, Y):
        return self.forward(Y)[0]

    def parameters(self):
        return [p for layer in self.weights_ for p in layer]

    def backward(self, Y, G, acts=None):
        """Gradients of sum_n G_n . F(y_n) wrt parameters() (backpropagation), from
        ``forward``'s activations at Y when given."""
        xp = array_module(Y)
        if acts is None:
            acts = self.forward(Y)[1]
        gradients = self._layers(xp.empty_like(self._theta))
        self._backprop(xp, self.weights_, acts, G * self.z_std_, gradients)
        return [g for layer in gradients for g in layer]


MAPPINGS = {"linear": LinearMapping, "rbf": RBFMapping, "mlp": MLPMapping}


def make_mapping(mapping, params=None, random_state=None):
    """A mapping object from a name in MAPPINGS (with ``params``) or a user object
    with fit(Y, Z) and predict(Y)."""
    if isinstance(mapping, str):
        if mapping not in MAPPINGS:
            raise ValueError(f"mapping must be one of {tuple(MAPPINGS)} or an object with "
                             f"fit and predict, got {mapping!r}")
        if params is not None and not isinstance(params, dict):
            raise TypeError(f"mapping_params must be a dict, got {type(params).__name__}")
        params = dict(params or {})
        if mapping != "linear":
            params.setdefault("random_state", random_state)
        return MAPPINGS[mapping](**params)
    if not all(callable(getattr(mapping, name, None)) for name in ("fit", "predict")):
        raise TypeError("mapping must be 'linear', 'rbf', 'mlp' or an object with fit(Y, Z) "
                        f"and predict(Y) methods, got {type(mapping).__name__}")
    if params:
        raise TypeError("mapping_params apply to the named mappings only")
    return mapping
