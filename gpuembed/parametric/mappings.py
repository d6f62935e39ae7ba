"""Mappings F: R^D -> R^L for parametric embeddings, behind one small interface:

    fit(Y, Z, warm_start=False) -> self      least-squares fit of Z (N, L) on Y (N, D)
    predict(Y) -> (N, L)

The regularized ones (RBF ridge, MLP weight decay) also take ``sample_weight``,
a float that multiplies the squared error and not the regularizer.

Written against the array module of their input (NumPy or CuPy), so they run
where the data is.  MAC calls ``fit`` once per F step with the same Y and
``warm_start=True``: each mapping keeps what does not depend on Z (the linear
map's Gram pseudo-inverse, the RBF design matrix and its regularized inverse,
the MLP's weights) so an F step is cheap.
"""
from __future__ import annotations

import numpy as np

from .._checks import check_float, check_int
from ..backend import get_backend
from ..nbody.exact import squared_distances


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


def _with_bias(xp, Y):
    return xp.concatenate([Y, xp.ones((Y.shape[0], 1), dtype=Y.dtype)], axis=1)


class _CachedDesign:
    """Remembers the design of the last Y it saw (by identity), so warm-started
    fits on the same inputs reuse it."""

    _key = None

    def _design(self, Y, warm_start, build):
        key = (id(Y), Y.shape)
        if not (warm_start and key == self._key):
            self._cache = build(Y)
            self._key = key
        return self._cache


class LinearMapping(_CachedDesign):
    """F(y) = A y + b by least squares, A = Z Y+ through the cached pseudo-inverse
    of the (D + 1) x (D + 1) Gram matrix of [Y, 1]."""

    def fit(self, Y, Z, warm_start=False):
        xp = array_module(Y)
        Yb = _with_bias(xp, Y)
        gram_pinv = self._design(Y, warm_start, lambda Y: xp.linalg.pinv(Yb.T @ Yb))
        self.coef_ = gram_pinv @ (Yb.T @ Z)            # (D + 1, L): [A^T; b]
        return self

    def predict(self, Y):
        xp = array_module(Y)
        return _with_bias(xp, Y) @ self.coef_

    def parameters(self):
        return [self.coef_]

    def backward(self, Y, G):
        """Gradients of sum_n G_n . F(y_n) wrt parameters(): [Y, 1]^T G."""
        return [_with_bias(array_module(Y), Y).T @ G]


class RBFMapping(_CachedDesign):
    """F(y) = W^T [phi(y); 1] with Gaussian features phi_j = exp(-|y - c_j|^2 / (2 sigma^2)).

    ``n_centers`` centres (default min(200, N)) by k-means (on at most
    ``max_kmeans_points`` points), sigma by default
    the root mean squared distance of the points to their nearest centre times
    ``width``; W by least squares, the minimum-norm solution (wide Gaussians
    make the features nearly collinear), or by ridge regression with ``ridge``
    > 0 (ridge x N on the features' weights).

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

    def _features(self, Y):
        # In float64 for every input: the Gram of wide Gaussians is ill-conditioned
        # (condition number about 1e9 on digits and on Fashion-MNIST, beyond float32).
        xp = array_module(Y)
        D = squared_distances(xp, Y.astype(xp.float64, copy=False), self.centers_)
        return _with_bias(xp, xp.exp(D * (-0.5 / self.sigma_**2)))

    def _build(self, Y):
        from ..spectral.kmeans import kmeans

        xp = array_module(Y)
        n = Y.shape[0]
        k = min(200, n) if self.n_centers is None else check_int(self.n_centers, "n_centers", 1, n)
        rng = np.random.default_rng(self.random_state)
        host = Y.get() if xp is not np else Y
        sample = host[rng.choice(n, min(n, self.max_kmeans_points), replace=False)]
        _, centers, inertia = kmeans(sample, k, n_init=1, random_state=self.random_state)
        self.centers_ = xp.asarray(centers, dtype=xp.float64)
        self.sigma_ = (float(self.sigma) if self.sigma is not None
                       else self.width * max(float(np.sqrt(inertia / len(sample))), 1e-12))
        Phi = self._features(Y)
        return Phi, Phi.T @ Phi, {}     # the dict keeps the inverse for the last ridge strength

    def fit(self, Y, Z, warm_start=False, sample_weight=None):
        weight = uniform_sample_weight(sample_weight)
        ridge = check_float(self.ridge, "ridge", 0.0)
        Phi, gram, inverses = self._design(Y, warm_start, self._build)
        strength = ridge * Y.shape[0] / weight
        if strength not in inverses:
            inverses.clear()
            inverses[strength] = _regularized_pinv(gram, strength)
        self.coef_ = inverses[strength] @ (Phi.T @ Z)
        return self

    def predict(self, Y):
        # Float32 input stays float32; other input (integers) gets the features' float64.
        return (self._features(Y) @ self.coef_).astype(float_dtype(Y), copy=False)

    def parameters(self):
        return [self.coef_]

    def backward(self, Y, G):
        """Gradients of sum_n G_n . F(y_n) wrt parameters(): the features' Phi^T G."""
        return [self._features(Y).T @ G]


def _regularized_pinv(gram, strength):
    """(gram + strength I')^+, I' the identity without the bias's entry; singular
    values below the Gram's precision are cut (the least-squares solution of
    least norm for strength 0)."""
    xp = array_module(gram)
    A = gram.copy()
    k = len(A) - 1
    A[xp.arange(k), xp.arange(k)] += strength                  # the bias is not penalized
    return xp.linalg.pinv(A, rcond=len(A) * np.finfo(A.dtype).eps)


def uniform_sample_weight(sample_weight):
    """The float weight of every sample (1.0 for None); the mappings take no
    per-sample weights."""
    if sample_weight is None:
        return 1.0
    return check_float(sample_weight, "sample_weight", 0.0, low_open=True)


ADAM_BLOCK, ADAM_MAX_BLOCKS = 256, 1024


def adam_step(p, g, m, v, lr, step, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    """One Adam step, in place on the parameters ``p`` and the moments ``m``, ``v``,
    from the gradient ``g`` (``step`` = t >= 1 sets the bias corrections).  The
    NumPy code is the reference; on the GPU it is one launch of kernels/adam.cu
    instead of 14 CuPy calls."""
    bias1, bias2 = 1.0 - beta1**step, 1.0 - beta2**step
    if array_module(p) is np:
        if weight_decay:
            g = g + weight_decay * p
        m *= beta1
        m += (1 - beta1) * g
        v *= beta2
        v += (1 - beta2) * g * g
        p -= lr * (m / bias1) / (np.sqrt(v / bias2) + eps)
        return
    be = get_backend("gpu")
    kernel = be.kernel("adam.cu", "adam_step", p.dtype)
    g = be.xp.ascontiguousarray(g, dtype=p.dtype)
    blocks = min(-(-p.size // ADAM_BLOCK), ADAM_MAX_BLOCKS)
    kernel((blocks,), (ADAM_BLOCK,), (p, g, m, v, np.int64(p.size), *map(
        np.float64, (lr, beta1, beta2, bias1, bias2, eps, weight_decay))))


class MLPMapping:
    """A fully connected net y -> tanh layers -> linear output, trained by minibatch
    Adam on the mean squared error, in the input's array module (no deep-learning
    framework).  Inputs and targets are standardized with the statistics of the
    first fit.  ``warm_start`` continues from the current weights and optimizer
    state for ``epochs`` epochs; a cold fit initializes (Glorot) and trains
    ``initial_epochs``.

    The k-th warm start trains at ``learning_rate / (1 + k)^power_t`` (as
    scikit-learn's "invscaling"; ``learning_rate_`` is the rate of the last fit).
    MAC's F steps are such warm starts, and at a constant rate the minibatch noise
    outgrows the shrinking Z steps: on t-SNE + MLP (Fashion-MNIST 5k, PCA 50,
    256-256, 3 epochs per F step) P(F) fell to 1.935 and then rose to 2.33 with
    |Z - F(Y)|^2 jumping from 6.6e3 to 9.9e4, while with power_t = 0.5 both fall
    along the whole path, to P(F) 1.877 and |Z - F(Y)|^2 32.

    ``fit``'s ``sample_weight`` (a float) scales the squared error as in
    RBFMapping: the weight decay acts at ``weight_decay / sample_weight``.
    """

    def __init__(self, hidden=(100,), epochs=5, initial_epochs=50, batch_size=100,
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

    def _init(self, xp, Y, Z):
        rng = np.random.default_rng(self.random_state)
        self._rng = rng
        self.y_mean_, self.y_std_ = Y.mean(axis=0), Y.std(axis=0) + 1e-12
        self.z_mean_, self.z_std_ = Z.mean(axis=0), Z.std(axis=0) + 1e-12
        sizes = (Y.shape[1],) + self.hidden + (Z.shape[1],)
        dtype = float_dtype(Y)      # integer weights of integer input would not train
        self.weights_ = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            scale = np.sqrt(6.0 / (a + b))
            self.weights_.append([xp.asarray(rng.uniform(-scale, scale, (a, b)), dtype=dtype),
                                  xp.zeros(b, dtype=dtype)])
        self._adam = ([[(xp.zeros_like(p), xp.zeros_like(p)) for p in layer]
                       for layer in self.weights_], 0)
        self.n_warm_starts_ = 0

    def _forward(self, xp, U):
        activations = [U]
        for i, (W, b) in enumerate(self.weights_):
            U = U @ W + b
            if i < len(self.weights_) - 1:
                U = xp.tanh(U)
            activations.append(U)
        return activations

    def fit(self, Y, Z, warm_start=False, sample_weight=None):
        xp = array_module(Y)
        weight_decay = check_float(self.weight_decay, "weight_decay", 0.0)
        weight_decay /= uniform_sample_weight(sample_weight)
        epochs = self.epochs
        if not (warm_start and hasattr(self, "weights_")):
            self._init(xp, Y, Z)
            epochs = self.initial_epochs
        else:
            self.n_warm_starts_ += 1
        check_int(epochs, "epochs", 0)
        batch = check_int(self.batch_size, "batch_size", 1)
        lr = check_float(self.learning_rate, "learning_rate", 0.0, low_open=True)
        power_t = check_float(self.power_t, "power_t", 0.0)
        self.learning_rate_ = lr = lr / (1.0 + self.n_warm_starts_) ** power_t
        U = (Y - self.y_mean_) / self.y_std_
        T = (Z - self.z_mean_) / self.z_std_
        n = Y.shape[0]
        # Adam's state carries over warm starts: restarting it (bias-corrected first
        # steps of size ~lr whatever the gradient) shook a converged net at every
        # F step, and P(F) rose late on the MAC path (Fashion-MNIST 5k: best P 1.85
        # restarting, see benchmarks/results/mac.json for the carried state).
        moments, step = self._adam
        for _ in range(epochs):
            order = xp.asarray(self._rng.permutation(n))
            for start in range(0, n, batch):
                idx = order[start:start + batch]
                grads = self._gradients(xp, U[idx], T[idx])
                step += 1
                for layer, layer_grads, layer_moments in zip(self.weights_, grads, moments):
                    for p, g, (m, v) in zip(layer, layer_grads, layer_moments):
                        adam_step(p, g, m, v, lr, step, weight_decay=weight_decay)
        self._adam = (moments, step)
        return self

    def _gradients(self, xp, U, T):
        """Gradients of the mean squared error over one minibatch."""
        acts = self._forward(xp, U)
        return self._backprop(xp, acts, (acts[-1] - T) * (2.0 / T.size))

    def _backprop(self, xp, acts, delta):
        """Parameter gradients [(dW, db) per layer] from the output gradient ``delta``."""
        grads = []
        for i in range(len(self.weights_) - 1, -1, -1):
            W, _ = self.weights_[i]
            grads.append((acts[i].T @ delta, delta.sum(axis=0)))
            if i:
                delta = (delta @ W.T) * (1.0 - acts[i] * acts[i])    # tanh' = 1 - tanh^2
        return grads[::-1]

    def predict(self, Y):
        xp = array_module(Y)
        out = self._forward(xp, (Y - self.y_mean_) / self.y_std_)[-1]
        return out * self.z_std_ + self.z_mean_

    def parameters(self):
        return [p for layer in self.weights_ for p in layer]

    def backward(self, Y, G):
        """Gradients of sum_n G_n . F(y_n) wrt parameters() (backpropagation)."""
        xp = array_module(Y)
        acts = self._forward(xp, (Y - self.y_mean_) / self.y_std_)
        return [g for layer in self._backprop(xp, acts, G * self.z_std_) for g in layer]


MAPPINGS = {"linear": LinearMapping, "rbf": RBFMapping, "mlp": MLPMapping}


def make_mapping(mapping, params=None, random_state=None):
    """A mapping object from a name in MAPPINGS (with ``params``) or a user object
    with fit(Y, Z) and predict(Y)."""
    if isinstance(mapping, str):
        if mapping not in MAPPINGS:
            raise ValueError(f"mapping must be one of {tuple(MAPPINGS)} or an object with "
                             f"fit and predict, got {mapping!r}")
        params = dict(params or {})
        if mapping != "linear":
            params.setdefault("random_state", random_state)
        return MAPPINGS[mapping](**params)
    if not (callable(getattr(mapping, "fit", None)) and callable(getattr(mapping, "predict", None))):
        raise TypeError("mapping must be 'linear', 'rbf', 'mlp' or an object with fit(Y, Z) "
                        f"and predict(Y) methods, got {type(mapping).__name__}")
    if params:
        raise TypeError("mapping_params apply to the named mappings only")
    return mapping
