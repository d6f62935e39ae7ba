"""Parametric embeddings: mappings, the chain-rule baseline and MAC (paper 001)."""
import copy
import itertools
import pickle

import numpy as np
import pytest

import gpuembed as ge
from gpuembed.backend import get_backend
from gpuembed.objectives import make_objective
from gpuembed.parametric import LinearMapping, MLPMapping, RBFMapping, chain_rule, make_mapping
from gpuembed.parametric.chainrule import _ParametricObjective
from gpuembed.parametric.mac import path_curvature
from gpuembed.parametric.mappings import _MinibatchBuffers

CPU = get_backend("cpu")


@pytest.fixture(scope="module")
def coil15():
    """rotating_objects after PCA to 15 dimensions (paper 001, fig. 1)."""
    X, labels = ge.datasets.rotating_objects()
    Xc = X - X.mean(0)
    U, s, _ = np.linalg.svd(Xc, full_matrices=False)
    return U[:, :15] * s[:15], labels


@pytest.fixture(scope="module")
def coil_mac(coil15):
    Y, _ = coil15
    # The paper's quadratic penalty (the default adds augmented-Lagrangian multipliers).
    return ge.ParametricEmbedding(ge.EE(backend="cpu", random_state=0), "linear",
                                  augmented=False).fit(Y)


def test_linear_mapping_recovers_an_affine_map(rng):
    Y = rng.normal(size=(200, 6))
    A, b = rng.normal(size=(6, 2)), rng.normal(size=2)
    m = LinearMapping().fit(Y, Y @ A + b)
    assert np.allclose(m.coef_[:6], A, atol=1e-10) and np.allclose(m.coef_[6], b, atol=1e-10)
    # A warm start on the same Y reuses the cached design and Gram pseudo-inverse.
    cached = m._cache
    m.fit(Y, Y @ (2 * A), warm_start=True)
    assert m._cache is cached and np.allclose(m.predict(Y), Y @ (2 * A), atol=1e-9)


@pytest.mark.parametrize("n", [100, 400])
def test_linear_mapping_of_float32_rows_is_the_least_norm_solution(rng, n):
    """Float32 pixel rows, fewer (100) and more (400) than the 301 columns of
    [Y, 1]: the map is float64 least squares' solution of least norm, so it fits
    the training targets exactly when it can and predicts other rows as that
    solution does.  Through the float32 Gram with every eigenvalue inverted the
    100 rows were fitted 11 units off and other rows predicted 14x their scale off."""
    from scipy.linalg import lstsq

    Y = (rng.integers(0, 256, size=(n + 50, 300)) / 255).astype(np.float32)
    Z = rng.standard_normal((n, 2))
    m = LinearMapping().fit(Y[:n], Z)
    X = np.c_[Y.astype(np.float64) - m.origin_, np.ones(n + 50)]
    expected = X @ lstsq(X[:n], Z)[0]
    np.testing.assert_allclose(m.predict(Y), expected, atol=1e-6 * np.abs(expected).max())
    if n < 301:
        np.testing.assert_allclose(m.predict(Y[:n]), Z, atol=1e-6)


def test_gram_pseudo_inverse_cuts_rounding_level_eigenvalues(rng):
    """An eigenvalue of 8e-15 of the largest, below what an 81 x 81 Gram
    resolves (81 eps = 1.8e-14; NumPy 2.5.5's OpenBLAS left one at 1.03e-15 on
    an exactly singular Gram), is cut, not inverted as by pinv's default cut,
    1e-15."""
    from gpuembed.parametric.mappings import _gram_pinv

    V = np.linalg.qr(rng.standard_normal((81, 81)))[0]
    eigenvalues = np.r_[np.linspace(1.0, 250.0, 60), np.full(21, 0.0)]
    eigenvalues[-1] = 8e-15 * 250.0
    G = (V * eigenvalues) @ V.T
    projector = V[:, :60] @ V[:, :60].T
    np.testing.assert_allclose(_gram_pinv(G) @ G, projector, atol=1e-9)
    assert np.linalg.norm(_gram_pinv(G), 2) < 1.0 + 1e-9
    assert np.linalg.norm(np.linalg.pinv(G), 2) > 1e11              # 1 / (8e-15 * 250)


@pytest.mark.parametrize("make", [LinearMapping, lambda: RBFMapping(n_centers=30,
                                                                    random_state=0)])
def test_copies_leave_the_warm_fits_cache_behind(rng, make):
    """Copies and pickles of a fitted mapping (MAC copies its best at every step)
    hold its parameters, not the design of the training rows kept for warm fits
    (as large as Y); a copy's warm fit on the same rows builds it again and gives
    the coefficients of a cold fit."""
    Y, Z = rng.normal(size=(300, 6)), rng.normal(size=(300, 2))
    m = make().fit(Y, Z)
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert not hasattr(other, "_cache") and other._key is None
        np.testing.assert_array_equal(other.predict(Y), m.predict(Y))
        other.fit(Y, 2 * Z, warm_start=True)
        np.testing.assert_allclose(other.coef_, make().fit(Y, 2 * Z).coef_, rtol=1e-12,
                                   atol=1e-12)
    assert len(pickle.dumps(m)) < Y.nbytes


def test_linear_mapping_of_rows_far_from_the_origin(rng):
    """The least squares are solved relative to the rows' rounded mean: integer rows
    moved 1e3 (float32) or 1e5 (float64) from the origin, exact in either, fit an
    affine map as the unmoved ones do.  Through the Gram of [Y, 1] their RMS
    errors were 45 and 2.2 against the noise's 0.1."""
    Y = rng.integers(0, 8, (5000, 20)).astype(np.float64)
    A = rng.standard_normal((20, 2))
    Z = Y @ A + 0.1 * rng.standard_normal((5000, 2))
    near = LinearMapping().fit(Y, Z).predict(Y)
    for offset, dtype in ((1e3, np.float32), (1e5, np.float64)):
        far = (Y + offset).astype(dtype)
        np.testing.assert_allclose(LinearMapping().fit(far, Z.astype(dtype)).predict(far), near,
                                   atol=1e-4 * np.abs(Z).max())


def _smooth_targets(Y):
    return np.c_[np.sin(Y[:, 0]) + np.cos(Y[:, 1]), Y[:, 0] * Y[:, 1] / 4]


def test_rbf_mapping_fits_a_smooth_function(rng):
    Y = rng.uniform(-3, 3, size=(1500, 2))
    Z = _smooth_targets(Y)
    m = RBFMapping(n_centers=150, random_state=0).fit(Y, Z)
    Y_test = rng.uniform(-2.5, 2.5, size=(300, 2))
    err = np.sqrt(((m.predict(Y_test) - _smooth_targets(Y_test)) ** 2).mean())
    assert err < 0.02 * Z.std()


def test_mappings_do_not_depend_on_the_number_of_blas_threads():
    """The linear map's and the RBF network's fits (Grams, pseudo-inverses, the RBF
    design's distances and k-means), predictions and gradients run on one BLAS
    thread: on 1 and 2 OpenBLAS threads their coefficients and predictions
    differed in the last bits (the RBF network's predictions on Fashion-MNIST 3k
    by 1e-9, the linear map's by 1e-15)."""
    import threadpoolctl

    rng = np.random.default_rng(0)
    Y = rng.random((3000, 300)) ** 4
    Z = rng.standard_normal((3000, 2))
    for make in (lambda: RBFMapping(random_state=0), LinearMapping):
        fits, outputs = [], []
        for threads in (1, 2):
            with threadpoolctl.threadpool_limits(threads, user_api="blas"):
                fits.append(make().fit(Y, Z))
                outputs.append((fits[-1].predict(Y), fits[-1].backward(Y, Z)[0]))
        np.testing.assert_array_equal(fits[0].coef_, fits[1].coef_)
        for a, b in zip(*outputs):
            np.testing.assert_array_equal(a, b)
        for name in ("centers_", "sigma_"):
            np.testing.assert_array_equal(getattr(fits[0], name, None),
                                          getattr(fits[1], name, None))


def test_rbf_features_of_rows_far_from_the_origin(rng):
    """The Gaussian features come from distances to the centres taken relative to
    the centres' mean: rows moved 1e6 from the origin fit and predict as the
    unmoved ones up to the conditioning of the features' Gram (2e-5 of the
    targets; uncentred, 6e-3)."""
    Y = rng.standard_normal((400, 8))
    Z = _smooth_targets(Y[:, :2])
    near = RBFMapping(random_state=0).fit(Y, Z)
    far = RBFMapping(random_state=0).fit(Y + 1e6, Z)
    np.testing.assert_allclose(far.centers_ - 1e6, near.centers_, atol=1e-9)
    np.testing.assert_allclose(far.predict(Y + 1e6), near.predict(Y),
                               atol=2e-4 * np.abs(Z).max())


def test_mlp_standardizes_float32_rows_far_from_the_origin(rng):
    """The MLP's input standardization sums in float64: float32 rows moved 1e5 from
    the origin train and predict as the unmoved ones, up to their rounding (1/128
    there).  With NumPy's float32 sums the means were 15 units off and the standard
    deviations 15 instead of 1: predictions 0.15 of the targets' range apart, and
    a worse fit (RMS error 0.84 against 0.73)."""
    Y = rng.standard_normal((20000, 50))
    Z = _smooth_targets(Y[:, :2]).astype(np.float32)
    far_rows = (Y + 1e5).astype(np.float32)
    fit = lambda rows: MLPMapping(hidden=(16,), initial_epochs=5, random_state=0).fit(rows, Z)
    far = fit(far_rows)
    np.testing.assert_allclose(far.y_mean_, far_rows.astype(np.float64).mean(axis=0),
                               atol=2.0**-7)
    np.testing.assert_allclose(far.y_std_, Y.std(axis=0), rtol=0.01)
    near = fit(Y.astype(np.float32)).predict(Y.astype(np.float32))
    assert np.abs(far.predict(far_rows) - near).max() < 2e-3 * np.ptp(Z)


def test_rbf_default_centres_fit_small_data(rng):
    """The default takes min(200, N) centres: 60 points get 60 (200 refused them),
    and the 60 tiled 5 times keep the 60 non-empty clusters of 200; every point
    is then a centre, and sigma is width x half the RMS distance
    between neighbouring centres: held-out points' RMS error 6-40% of the
    targets' over 7 draws, where the rounding-level sigma of a zero inertia (3e-8
    or 3e-12) fitted the training points alone (97-175%); an explicit count
    above N is still refused by name."""
    Y = rng.uniform(-3, 3, size=(60, 2))
    Z = _smooth_targets(Y)
    m = RBFMapping(random_state=0).fit(Y, Z)
    assert m.centers_.shape == (60, 2)
    D = ((m.centers_[:, None] - m.centers_[None]) ** 2).sum(axis=-1)
    np.fill_diagonal(D, np.inf)
    assert m.sigma_ == pytest.approx(3.0 * 0.5 * np.sqrt(D.min(axis=1).mean()), rel=1e-12)
    assert np.abs(m.predict(Y) - Z).max() < 0.05 * np.abs(Z).max()
    held = rng.uniform(-2.5, 2.5, size=(200, 2))
    Z_held = _smooth_targets(held)
    assert np.sqrt(((m.predict(held) - Z_held) ** 2).mean()) < 0.5 * np.sqrt((Z_held ** 2).mean())
    # Each distinct point a centre once: clusters left empty by the duplicates had
    # kept centres on them, whose zero distances halved sigma (held-out error 0.44
    # against 0.12 on one draw).
    tiled = RBFMapping(random_state=0).fit(np.tile(Y, (5, 1)), np.tile(Z, (5, 1)))
    assert tiled.centers_.shape == (60, 2)
    assert tiled.sigma_ == pytest.approx(m.sigma_, rel=1e-12)
    np.testing.assert_allclose(tiled.predict(held), m.predict(held), atol=1e-6 * np.abs(Z).max())
    with pytest.raises(ValueError, match="n_centers"):
        RBFMapping(n_centers=61).fit(Y, Z)


def test_rbf_least_squares_ridge_and_sample_weight(rng):
    """Closed forms: ridge 0 is the least-squares fit on the features (for float32
    data too: the features are float64); ridge r with sample_weight w solves
    (Phi^T Phi + (r N / w) I') W = Phi^T Z, the bias unpenalized."""
    Y = rng.uniform(-3, 3, size=(300, 3))
    Z = _smooth_targets(Y)
    m = RBFMapping(n_centers=40, random_state=0).fit(Y, Z)
    Phi = m.design(Y)
    lstsq = Phi @ np.linalg.lstsq(Phi, Z, rcond=None)[0]
    np.testing.assert_allclose(m.predict(Y), lstsq, atol=1e-8 * np.abs(Z).max())
    m32 = RBFMapping(n_centers=40, random_state=0).fit(Y.astype(np.float32), Z.astype(np.float32))
    assert m32.predict(Y[:3].astype(np.float32)).dtype == np.float32
    np.testing.assert_allclose(m32.predict(Y.astype(np.float32)), lstsq,
                               atol=2e-4 * np.abs(Z).max())
    ridge, weight = 1e-3, 4.0
    m = RBFMapping(n_centers=40, ridge=ridge, random_state=0)
    for w in (weight, 2 * weight):          # a warm start with another weight re-solves
        m.fit(Y, Z, warm_start=w != weight, sample_weight=w)
        penalty = np.full(41, ridge * len(Y) / w)
        penalty[-1] = 0.0
        expected = np.linalg.solve(Phi.T @ Phi + np.diag(penalty), Phi.T @ Z)
        np.testing.assert_allclose(m.coef_, expected, rtol=1e-7,
                                   atol=1e-9 * np.abs(expected).max())
    for bad, error in ((np.ones(len(Y)), TypeError), (0.0, ValueError), (-1.0, ValueError)):
        with pytest.raises(error, match="sample_weight"):
            m.fit(Y, Z, sample_weight=bad)
    with pytest.raises(ValueError, match="ridge"):
        RBFMapping(ridge=-1.0).fit(Y, Z)


@pytest.mark.parametrize("make", [lambda: RBFMapping(n_centers=10, random_state=0),
                                  lambda: MLPMapping(hidden=(8,), initial_epochs=5,
                                                     random_state=0)])
def test_mappings_treat_integer_input_as_float64(rng, make):
    Y, Z = rng.integers(0, 10, size=(100, 3)), rng.normal(size=(100, 2))
    on_integers, on_floats = make().fit(Y, Z), make().fit(Y.astype(np.float64), Z)
    assert on_integers.predict(Y).dtype == np.float64
    np.testing.assert_allclose(on_integers.predict(Y), on_floats.predict(Y.astype(np.float64)),
                               rtol=1e-12, atol=1e-12)


def test_mlp_sample_weight_scales_the_weight_decay(rng):
    Y, Z = rng.normal(size=(50, 3)), rng.normal(size=(50, 2))
    fits = [MLPMapping(hidden=(4,), initial_epochs=3, weight_decay=decay,
                       random_state=0).fit(Y, Z, **kw)
            for decay, kw in ((0.1, {"sample_weight": 4.0}), (0.025, {}), (0.1, {}))]
    assert np.array_equal(fits[0].predict(Y), fits[1].predict(Y))
    assert not np.array_equal(fits[0].predict(Y), fits[2].predict(Y))
    with pytest.raises(ValueError, match="weight_decay"):
        MLPMapping(weight_decay=-1.0).fit(Y, Z)


def test_mlp_mapping_learns_and_warm_starts(rng):
    Y = rng.uniform(-3, 3, size=(2000, 2))
    Z = _smooth_targets(Y)
    m = MLPMapping(hidden=(32, 32), initial_epochs=100, epochs=20, random_state=0).fit(Y, Z)
    mse = ((m.predict(Y) - Z) ** 2).mean()
    assert mse < 0.01 * Z.var()                       # measured 0.002
    m.fit(Y, Z, warm_start=True)                      # continues from the current weights
    assert ((m.predict(Y) - Z) ** 2).mean() < mse


@pytest.mark.parametrize("n, cold, warm", [(600, 5004, 504), (300, 5001, 501),
                                           (12000, 6000, 600)])
def test_mlp_default_epochs_make_enough_steps_on_small_data(rng, n, cold, warm):
    """Default fits: 50 epochs (5 warm), but at least 5,000 (500) minibatch
    steps, counted by Adam's step; explicit epochs are taken as given."""
    Y, Z = rng.normal(size=(n, 3)), rng.normal(size=(n, 2))
    m = MLPMapping(hidden=(2,), batch_size=100, random_state=0).fit(Y, Z)
    assert m._adam[2] == cold
    m.fit(Y, Z, warm_start=True)
    assert m._adam[2] == cold + warm
    m = MLPMapping(hidden=(2,), initial_epochs=3, epochs=2, random_state=0).fit(Y, Z)
    assert m._adam[2] == 3 * -(-n // 100)
    assert m.fit(Y, Z, warm_start=True)._adam[2] == 5 * -(-n // 100)
    for name in ("epochs", "initial_epochs"):
        with pytest.raises(ValueError, match=f"^{name} must be >= 0"):
            MLPMapping(**{name: -1}).fit(Y, Z).fit(Y, Z, warm_start=True)


def test_mlp_default_fit_is_close_on_small_data():
    """600 points are 6 minibatches an epoch: 50 epochs (the default before)
    left 4.1% of a target the net can represent unexplained, the default's
    5,000 steps 0.7%."""
    Y, _ = ge.datasets.gaussian_clusters(600, 5, 20, random_state=0)
    W = np.random.default_rng(0).standard_normal((20, 8)) / np.sqrt(20)
    Z = np.tanh(Y @ W) @ np.random.default_rng(1).standard_normal((8, 2))

    def unexplained(m):
        return ((m.fit(Y, Z).predict(Y) - Z) ** 2).sum() / ((Z - Z.mean(0)) ** 2).sum()
    assert unexplained(MLPMapping(random_state=0)) < 0.015
    assert unexplained(MLPMapping(initial_epochs=50, random_state=0)) > 0.03


def test_mlp_warm_starts_decay_the_learning_rate(rng):
    Y, Z = rng.normal(size=(50, 3)), rng.normal(size=(50, 2))
    m = MLPMapping(hidden=(4,), initial_epochs=1, epochs=1, learning_rate=0.01,
                   random_state=0).fit(Y, Z)
    assert m.learning_rate_ == 0.01
    for k in (1, 2, 3):
        m.fit(Y, Z, warm_start=True)
        assert m.learning_rate_ == pytest.approx(0.01 / np.sqrt(1 + k), rel=1e-15)
    assert m.fit(Y, Z).learning_rate_ == 0.01                 # a cold fit starts over
    m.power_t = 0.0
    assert m.fit(Y, Z, warm_start=True).learning_rate_ == 0.01
    m.power_t = -0.5
    with pytest.raises(ValueError, match="power_t"):
        m.fit(Y, Z, warm_start=True)


def test_mlp_hidden_layers(rng):
    Y, Z = rng.normal(size=(50, 3)), rng.normal(size=(50, 2))
    assert MLPMapping(hidden=16, initial_epochs=1).fit(Y, Z).hidden == (16,)
    for bad in (0, (8, 0)):          # was "'int' object is not iterable" for 0
        with pytest.raises(ValueError, match="hidden"):
            MLPMapping(hidden=bad)


def test_mlp_copies_and_pickles_train_their_own_parameters(rng):
    """The layers are views of one parameter vector: a deep copy or an unpickled
    mapping must train and read its own vector (kept views would come apart)."""
    import copy
    import pickle
    Y, Z = rng.normal(size=(60, 3)), rng.normal(size=(60, 2))
    m = MLPMapping(hidden=(6,), initial_epochs=2, epochs=2, random_state=0).fit(Y, Z)
    before = m.predict(Y)
    copies = [copy.deepcopy(m), pickle.loads(pickle.dumps(m))]
    for c in [m] + copies:
        c.fit(Y, Z, warm_start=True)
    for c in copies:
        np.testing.assert_array_equal(c.predict(Y), m.predict(Y))
    assert not np.allclose(m.predict(Y), before)


def test_mlp_segments_of_an_epoch_change_nothing(rng, monkeypatch):
    """An epoch's minibatches gathered a segment at a time give the bits of one
    segment per epoch: segments of 2 minibatches (the last one short, with a short
    minibatch) over a cold fit and warm starts with another weight decay."""
    import gpuembed.parametric.mappings as mappings
    Y, Z = rng.normal(size=(250, 4)), rng.normal(size=(250, 2))
    fits = []
    for steps in (mappings.SEGMENT_STEPS, 2):
        monkeypatch.setattr(mappings, "SEGMENT_STEPS", steps)
        m = MLPMapping(hidden=(7, 5), initial_epochs=3, epochs=2, batch_size=32,
                       weight_decay=0.01, random_state=0).fit(Y, Z)
        m.fit(Y, 2 * Z, warm_start=True, sample_weight=3.0)
        assert m._buffers.rows == min(steps * 32, 250)
        fits.append(m.predict(Y))
    np.testing.assert_array_equal(fits[1], fits[0])


def test_mlp_keeps_its_buffers_over_warm_starts_only(rng):
    """Warm starts on data of the same shape train through the same buffers (and
    on the GPU the same graphs); a cold fit or other shapes get new ones, and a
    copy builds its own."""
    import copy
    Y, Z = rng.normal(size=(90, 3)), rng.normal(size=(90, 2))
    m = MLPMapping(hidden=(6,), initial_epochs=1, epochs=1, random_state=0).fit(Y, Z)
    first = m._buffers
    assert m.fit(Y, 3 * Z, warm_start=True)._buffers is first
    assert m.fit(Y[:80], Z[:80], warm_start=True)._buffers is not first
    assert m.fit(Y, Z)._buffers is not first
    assert not hasattr(copy.deepcopy(m), "_buffers")


def test_mlp_backpropagation_matches_finite_differences(rng):
    Y, Z = rng.normal(size=(40, 3)), rng.normal(size=(40, 2))
    m = MLPMapping(hidden=(8, 5), initial_epochs=0, random_state=0).fit(Y, Z)
    U, T = (Y - m.y_mean_) / m.y_std_, (Z - m.z_mean_) / m.z_std_
    grads = m._layers(np.empty_like(m._theta))
    m._minibatch_gradient(np, m.weights_, U, T, grads)

    def loss():
        return ((m._forward(np, U, m.weights_)[-1] - T) ** 2).mean()
    h = 1e-6
    for layer, layer_grads in zip(m.weights_, grads):
        for p, g in zip(layer, layer_grads):
            V = rng.normal(size=p.shape)
            p += h * V
            up = loss()
            p -= 2 * h * V
            down = loss()
            p += h * V
            assert (g * V).sum() == pytest.approx((up - down) / (2 * h), rel=1e-6)
    # fit's path through buffers allocated once, on a short (last) minibatch
    buffers = _MinibatchBuffers(np, m._sizes, 40, 40, (m._theta, *m._adam[:2]))
    buffered = m._layers(buffers.gradient)
    m._minibatch_gradient(np, m.weights_, U[:25], T[:25], buffered, buffers)
    m._minibatch_gradient(np, m.weights_, U[:25], T[:25], grads)
    for layer, layer_buffered in zip(grads, buffered):
        for g, g_buffered in zip(layer, layer_buffered):
            np.testing.assert_array_equal(g_buffered, g)


def test_chain_rule_gradient_matches_finite_differences(rng):
    X, _ = ge.datasets.gaussian_clusters(120, 3, 6, random_state=0)
    P = ge.entropic_affinities(X, 10, backend="cpu").P
    Z0 = rng.normal(size=(120, 2))
    for name in ("ee", "tsne"):
        for mapping in (LinearMapping().fit(X, Z0),
                        RBFMapping(n_centers=20, random_state=0).fit(X, Z0),
                        MLPMapping(hidden=(5,), initial_epochs=1, random_state=0).fit(X, Z0)):
            problem = _ParametricObjective(make_objective(name, P, CPU, np.float64), X, mapping)
            theta = problem.flat()
            _, G = problem.value_and_grad(theta)
            V = rng.normal(size=theta.shape)
            h = 1e-6
            fd = problem.value_and_grad(theta + h * V)[0] - problem.value_and_grad(theta - h * V)[0]
            assert (G * V).sum() == pytest.approx(fd / (2 * h), rel=1e-5)


def test_chain_rule_makes_a_fixed_design_once_and_agrees_with_predict_then_backward(rng):
    # The built-in maps go through forward (one pass per evaluation, the linear and
    # RBF designs made once); a user map with predict and backward only must get
    # the same values and gradients.
    X, _ = ge.datasets.gaussian_clusters(120, 3, 6, random_state=0)
    objective = make_objective("tsne", ge.entropic_affinities(X, 10, backend="cpu").P, CPU,
                               np.float64)
    Z0 = rng.normal(size=(120, 2))

    class PredictThenBackward:
        def __init__(self, inner):
            self.parameters, self.predict, self.backward = (inner.parameters, inner.predict,
                                                            inner.backward)
    for make in (lambda: RBFMapping(n_centers=20, random_state=0).fit(X, Z0),
                 lambda: MLPMapping(hidden=(5,), initial_epochs=1, random_state=0).fit(X, Z0)):
        mapping = make()
        designs = []
        if mapping.fixed_design:
            design = mapping.design
            mapping.design = lambda Y: designs.append(1) or design(Y)
        problem = _ParametricObjective(objective, X, mapping)
        plain = _ParametricObjective(objective, X, PredictThenBackward(make()))
        for step in range(3):
            theta = problem.flat() + 0.01 * step * rng.normal(size=problem.flat().shape)
            E, G = problem.value_and_grad(theta)
            E0, G0 = plain.value_and_grad(theta)
            assert E == E0
            np.testing.assert_array_equal(G, G0)
        assert len(designs) == (1 if mapping.fixed_design else 0)


def test_mac_improves_on_the_direct_fit_and_meets_the_constraint(coil15, coil_mac):
    Y, _ = coil15
    pe, history = coil_mac, coil_mac.history_
    assert set(history[0]) >= {"objective", "constraint", "mu", "time"}
    assert history[0]["mu"] == 0.0                               # the direct fit
    direct = history[0]["objective"]
    assert pe.objective_ < direct - 0.05 * abs(direct)           # measured 19.39 -> 17.58
    assert pe.objective_ >= pe.free_objective_                   # theorem 2.1
    assert history[-1]["constraint"] < 1e-4 * history[0]["constraint"]   # Z -> F(Y)
    mus = [h["mu"] for h in history]
    assert mus == sorted(mus)
    assert np.allclose(pe.transform(Y), pe.embedding_)           # transform(Y) = F(Y)
    E = make_objective("ee", ge.entropic_affinities(Y, 30, backend="cpu").P, CPU, np.float64)
    assert pe.objective_ == pytest.approx(E.value(pe.embedding_), rel=1e-8)


def test_augmented_lagrangian_mac_reaches_a_lower_p_with_the_constraint_met(coil15, coil_mac):
    # The multipliers let the path stop at a finite mu with Z = F(Y): the penalty
    # path stalls at 17.58 (tiny steps at large mu), the augmented one reaches
    # 17.534, near the chain rule's 17.529.
    Y, _ = coil15
    pe = ge.ParametricEmbedding(ge.EE(backend="cpu", random_state=0), "linear",
                                mu_start=1.0).fit(Y)
    assert pe.objective_ < coil_mac.objective_ - 0.02
    assert pe.history_[-1]["constraint"] < 1e-6 * pe.history_[0]["constraint"]
    assert pe.objective_ == pytest.approx(pe.history_[-1]["objective"], rel=1e-6)


class _RecordingLinear(LinearMapping):
    def fit(self, Y, Z, warm_start=False, sample_weight=None):
        self.weights = getattr(self, "weights", []) + [sample_weight]
        return super().fit(Y, Z, warm_start)


def test_mac_weights_the_f_steps_by_mu_over_mu_1():
    """The path's F steps get sample_weight = mu / mu_1, so a regularized
    regression minimizes (mu/2)|Z - F(Y)|^2 + R(F) with R fixed; the direct fit
    is the regression as configured."""
    X, _ = ge.datasets.gaussian_clusters(150, 3, 5, random_state=0)
    mapping = _RecordingLinear()
    pe = ge.ParametricEmbedding(ge.EE(backend="cpu", random_state=0), mapping,
                                mu=[0.5, 2.0, 3.0], augmented=False).fit(X)
    assert mapping.weights[0] is None
    assert mapping.weights[1:] == [h["mu"] / 0.5 for h in pe.history_[1:]]
    assert {h["mu"] for h in pe.history_[1:]} == {0.5, 2.0, 3.0}


@pytest.mark.parametrize("ridge", [0.0, 1e-6])
def test_mac_with_rbf_decreases_p_along_the_path(ridge):
    """With an unweighted ridge the F steps' regularization grew with mu and drew
    F to zero: P(F) fell from 12.20 to 11.87 and rose to 12.21, above the direct
    fit; weighted it falls to 11.53 along the whole path (11.62 with the penalty)."""
    X, _ = ge.datasets.digits()
    pe = ge.ParametricEmbedding(ge.EE(backend="cpu", random_state=0), "rbf",
                                mapping_params={"ridge": ridge, "n_centers": 100},
                                random_state=0).fit(X[:500])
    P = np.array([h["objective"] for h in pe.history_])
    assert P[-1] < 0.97 * P[0]                                    # measured 0.950
    assert P[-1] <= P.min() * (1 + 1e-4)
    assert pe.objective_ == P[-1]


def test_mac_with_a_scikit_learn_kernel_ridge():
    """scikit-learn's regressors take the float sample_weight; unweighted, the
    kernel ridge's alpha grew with mu and P(F) went from 11.94 (the direct fit,
    the best point) to 71.6; weighted it falls to 10.54."""
    kernel_ridge = pytest.importorskip("sklearn.kernel_ridge")
    X, _ = ge.datasets.digits()
    pe = ge.ParametricEmbedding(ge.EE(backend="cpu", random_state=0),
                                kernel_ridge.KernelRidge(alpha=1.0, kernel="rbf", gamma=1e-3)
                                ).fit(X[:500])
    P = np.array([h["objective"] for h in pe.history_])
    assert P[-1] < 0.95 * P[0]                                    # measured 0.882
    assert P[-1] <= P.min() * (1 + 1e-4)


def test_path_curvature_is_the_hessian_along_the_first_direction(rng):
    """v^T H v / v^T v against the Hessian by central differences of the gradient
    (t-SNE of 30 points at its free embedding); the attractive curvature where
    v = 0 or E is concave along v."""
    free = ge.TSNE(perplexity=5, backend="cpu", random_state=0)._free_fit(
        rng.normal(size=(30, 5)))
    objective, Z = free.objective, free.Z
    h, columns = 1e-5, []
    for j in range(Z.size):
        step = np.zeros(Z.size)
        step[j] = h
        step = step.reshape(Z.shape)
        columns.append((objective.value_and_grad(Z + step)[1]
                        - objective.value_and_grad(Z - step)[1]).ravel() / (2 * h))
    H = np.array(columns).T
    V = rng.normal(size=Z.shape) * Z.std()
    exact = V.ravel() @ H @ V.ravel() / (V * V).sum()
    assert path_curvature(objective, Z, Z - V, fraction=1e-5) == pytest.approx(exact, rel=1e-4)
    assert path_curvature(objective, Z, Z - V) == pytest.approx(exact, rel=0.1)  # 4%: 1% steps
    # The steps are a fraction of the layout, not of v: a v at rounding level
    # (a direct fit that reproduces Z) gave 1.39 for MSNE's 1e-4.
    assert path_curvature(objective, Z, Z - 1e-12 * V) == pytest.approx(
        path_curvature(objective, Z, Z - V), rel=1e-3)
    attractive = 4.0 * np.asarray(objective.attractive_weights(Z).sum(axis=1)).mean()
    assert path_curvature(objective, Z, Z) == pytest.approx(attractive, rel=1e-12)

    class Concave:
        be, attractive_weights = objective.be, objective.attractive_weights

        def value_and_grad(self, Z):
            return -float((Z * Z).sum()), -2.0 * Z
    assert path_curvature(Concave(), Z, Z - V) == pytest.approx(attractive, rel=1e-12)


def test_tsne_mac_leaves_the_free_embedding_slowly_enough():
    """Scaled by the attractive curvature at X = 0 (27x t-SNE's curvature along
    the path here), the schedule's first mu already pulled Z far from the free
    embedding, towards a worse optimum."""
    X, _ = ge.datasets.digits()
    X = X[:1500]
    old = 0.01 * (4.0 / len(X)) * 2.0 ** np.arange(16)         # 4 mean(D+) at X = 0
    runs = [ge.ParametricEmbedding(ge.TSNE(backend="cpu", random_state=0), "linear",
                                   **kw).fit(X) for kw in ({}, {"mu": old})]
    assert runs[0].objective_ < runs[1].objective_ - 0.3          # measured 2.097, 2.497


@pytest.mark.parametrize("dtype, rtol, objective_rtol", [(np.float64, 1e-16, 1e-10),
                                                         (np.float32, 1e-12, 1e-6)])
def test_mac_gives_back_a_free_embedding_the_mapping_can_represent(rng, dtype, rtol,
                                                                   objective_rtol):
    # Theorem 2.2: with more inputs than points a linear map reproduces any free
    # embedding, so the direct fit is already optimal and MAC keeps it.  In float32
    # (the GPU's default) the direct fit's constraint had been 39 times |Z|^2.
    Y = rng.normal(size=(60, 80))
    free = ge.EE(perplexity=10, tol=1e-13, max_iter=5000, backend="cpu", random_state=0,
                 dtype=dtype)
    pe = ge.ParametricEmbedding(free, "linear").fit(Y)
    assert pe.history_[0]["constraint"] < rtol * (pe.free_embedding_ ** 2).sum()
    assert pe.history_[0]["objective"] == pytest.approx(pe.free_objective_, rel=objective_rtol)
    assert pe.objective_ == pytest.approx(pe.free_objective_, rel=1e-6)


def test_mac_with_multiscale_sne():
    # E is the fit's final stage: every scale at the LD precisions it ended with.
    X, labels = ge.datasets.gaussian_clusters(300, 4, 10, random_state=0)
    msne = ge.MultiscaleSNE(backend="cpu", random_state=0)
    pe = ge.ParametricEmbedding(msne, "linear").fit(X)
    free = msne._free_fit(X)                      # the same fit again (same seed)
    np.testing.assert_array_equal(pe.free_embedding_, free.Z)
    assert pe.free_objective_ == pytest.approx(free.objective.value(free.Z), rel=1e-12)
    assert pe.objective_ == pytest.approx(free.objective.value(pe.embedding_), rel=1e-10)
    direct = pe.history_[0]["objective"]
    assert pe.free_objective_ <= pe.objective_ < direct - 0.05 * direct   # measured 446 -> 399
    assert pe.history_[-1]["constraint"] < 1e-5 * pe.history_[0]["constraint"]   # 6.6e-8
    assert ge.metrics.knn_accuracy(pe.embedding_, labels) == 1.0
    # The mu schedule is scaled by E's curvature from the free embedding towards
    # the direct fit.
    FY = LinearMapping().fit(free.X, free.Z).predict(free.X)
    assert pe.history_[1]["mu"] == pytest.approx(
        0.01 * path_curvature(free.objective, free.Z, FY), rel=1e-8)


def test_mac_gives_back_a_multiscale_free_embedding_the_mapping_can_represent(rng):
    Y = rng.normal(size=(60, 80))
    free = ge.MultiscaleSNE(max_iter=2000, tol=1e-13, backend="cpu", random_state=0)
    pe = ge.ParametricEmbedding(free, "linear", n_mu=3).fit(Y)
    assert pe.history_[0]["constraint"] < 1e-16 * (pe.free_embedding_ ** 2).sum()
    assert pe.objective_ == pytest.approx(pe.free_objective_, rel=1e-10)


def test_mac_with_tsne_mlp_and_a_non_differentiable_user_mapping():
    X, labels = ge.datasets.gaussian_clusters(400, 4, 10, random_state=0)
    pe = ge.ParametricEmbedding(ge.TSNE(backend="cpu", random_state=0, max_iter=200), "mlp",
                                mapping_params={"hidden": (32,), "initial_epochs": 30},
                                n_mu=4, random_state=0).fit(X)
    assert pe.objective_ <= pe.history_[0]["objective"]
    assert ge.metrics.knn_accuracy(pe.embedding_, labels) > 0.95
    tree = pytest.importorskip("sklearn.tree")
    pe = ge.ParametricEmbedding(ge.EE(backend="cpu", random_state=0),
                                tree.DecisionTreeRegressor(max_depth=6, random_state=0),
                                n_mu=4).fit(X)
    assert pe.objective_ <= pe.history_[0]["objective"]
    assert pe.transform(X[:5]).shape == (5, 2)


def test_mac_moves_to_the_next_mu_once_p_stops_decreasing():
    """A mu's inner loop ends when P(F) decreases by less than tol, so at once on a
    rise (the paper's rule; the old test of |decrease| went on after a rise).
    The mapping scales the free embedding by a scripted factor at each F step; EE's
    P grows as the factor leaves 1.  tol = 0 leaves the rise alone to stop a mu."""
    class Scripted:
        scales = [0.5, 0.8, 0.6, 0.9, 0.95, 0.97]

        def fit(self, Y, Z):
            if not hasattr(self, "free"):
                self.free, self.k = Z.copy(), 0
            else:
                self.k += 1
            return self

        def predict(self, Y):
            return self.free * self.scales[min(self.k, len(self.scales) - 1)]

    X, _ = ge.datasets.gaussian_clusters(200, 3, 5, random_state=0)
    pe = ge.ParametricEmbedding(ge.EE(backend="cpu", random_state=0, max_iter=100),
                                Scripted(), n_mu=2, max_inner=3, tol=0.0).fit(X)
    P = [h["objective"] for h in pe.history_]
    assert P[0] > P[1] < P[2] > P[3] > P[4] > P[5]   # the script's rise at the second step
    mu = [h["mu"] for h in pe.history_]
    assert len(mu) == 6 and mu[1] == mu[2] < mu[3] == mu[4] == mu[5]
    assert pe.objective_ == P[5]


def test_mac_warns_when_a_wrapped_fit_hides_warm_start(recwarn):
    """A mapping whose fit is a (*args, **kwargs) wrapper is fitted from scratch at
    every F step (MAC cannot tell whether it forwards warm_start): MAC says so once.
    A fit that names warm_start, or takes no keywords at all, gets no warning."""
    class Wrapped(LinearMapping):
        def fit(self, *args, **kwargs):
            return super().fit(*args, **kwargs)

    class Plain:
        def fit(self, Y, Z):
            self.inner = LinearMapping().fit(Y, Z)
            return self

        def predict(self, Y):
            return self.inner.predict(Y)

    X, _ = ge.datasets.gaussian_clusters(100, 2, 4, random_state=0)
    embedding = ge.EE(backend="cpu", max_iter=20)
    with pytest.warns(RuntimeWarning, match="Wrapped.fit takes .*warm_start") as caught:
        ge.ParametricEmbedding(embedding, Wrapped(), n_mu=2).fit(X)
    assert len(caught) == 1
    for mapping in (LinearMapping(), Plain()):
        ge.ParametricEmbedding(embedding, mapping, n_mu=2).fit(X)
    assert not [w for w in recwarn if "warm_start" in str(w.message)]


def test_penalized_objective_adds_the_penalty_everywhere(rng):
    """The Z step's objective E(Z) + (mu/2)|Z - T|^2 (objectives/penalty.py) in
    every piece a direction may ask for: value and gradient, the Hessian diagonal
    (DiagH), the curvature shift (SD) and the N-body accuracy, which must reach
    the wrapped objective (a schedule sets it)."""
    from gpuembed.objectives.penalty import Penalized

    X, _ = ge.datasets.gaussian_clusters(80, 2, 4, random_state=0)
    P = ge.entropic_affinities(X, 10.0, backend="cpu").P
    inner = make_objective("ee", P, get_backend("cpu"), np.float64, nbody="fgt")
    Z, T = rng.standard_normal((80, 2)), rng.standard_normal((80, 2))
    pen = Penalized(inner, T, 0.3)
    E, G = inner.value_and_grad(Z)
    E_pen, G_pen = pen.value_and_grad(Z)
    assert E_pen == pytest.approx(E + 0.15 * ((Z - T) ** 2).sum(), rel=1e-12)
    np.testing.assert_allclose(G_pen, G + 0.3 * (Z - T), rtol=1e-12)
    assert pen.value(Z) == E_pen
    np.testing.assert_allclose(pen.hessian_diagonal(Z), inner.hessian_diagonal(Z) + 0.3)
    assert pen.curvature_shift == inner.curvature_shift + 0.3
    pen.accuracy = {"p": 3}
    assert inner.accuracy == pen.accuracy == {"p": 3}


def test_mac_z_steps_start_from_the_last_evaluation(monkeypatch):
    """Each Z step starts where the last one ended, with E and its gradient there
    from that step's last evaluation (mac.py's ``known``; the N-body sums are most
    of a Z step's cost): one evaluation fewer in every Z step after the first,
    and the same fit, to the last bit, as with every evaluation done."""
    from gpuembed.objectives.ee import ElasticEmbedding
    from gpuembed.parametric import mac

    X, _ = ge.datasets.gaussian_clusters(150, 3, 6, random_state=0)
    counts = []
    evaluate = ElasticEmbedding.value_and_grad

    def counted(self, Z):
        counts[-1] += 1
        return evaluate(self, Z)

    def fit():
        counts.append(0)
        return ge.ParametricEmbedding(ge.EE(backend="cpu", random_state=0, max_iter=50),
                                      "linear", n_mu=4, max_inner=3, z_max_iter=2).fit(X)

    monkeypatch.setattr(ElasticEmbedding, "value_and_grad", counted)
    reused = fit()
    minimize = mac.minimize
    monkeypatch.setattr(mac, "minimize", lambda *args, initial=None, **kw: minimize(*args, **kw))
    every = fit()
    z_steps = len(reused.history_) - 1
    assert z_steps >= 6
    assert counts[1] - counts[0] == z_steps - 1
    np.testing.assert_array_equal(reused.embedding_, every.embedding_)
    assert [h["objective"] for h in reused.history_] == [h["objective"] for h in every.history_]


def test_mac_z_steps_with_other_optimizers(capsys):
    """The Z steps run the embedding's own optimizer (DiagH here, through the
    penalized Hessian diagonal), and "sd" for the classic t-SNE optimizer, which
    has no use for a penalty; verbose prints a line per (Z, F) step."""
    X, _ = ge.datasets.gaussian_clusters(150, 3, 6, random_state=0)
    for embedding in (ge.EE(optimizer="diagh", max_iter=100, backend="cpu", random_state=0),
                      ge.TSNE(optimizer="tsne", max_iter=300, backend="cpu", random_state=0)):
        pe = ge.ParametricEmbedding(embedding, "linear", n_mu=3, max_inner=2,
                                    verbose=True).fit(X)
        assert pe.objective_ < pe.history_[0]["objective"]
        lines = capsys.readouterr().out.splitlines()
        assert len([line for line in lines if line.startswith("mu ")]) == len(pe.history_)


def test_mac_checks_what_a_users_mapping_returns():
    X, _ = ge.datasets.gaussian_clusters(100, 2, 4, random_state=0)

    class ThreeColumns:
        def fit(self, Y, Z):
            self.inner = LinearMapping().fit(Y, Z)
            return self

        def predict(self, Y):
            return np.c_[self.inner.predict(Y), np.zeros(len(Y))]

    with pytest.raises(ValueError, match=r"mapping.predict returned shape \(100, 3\)"):
        ge.ParametricEmbedding(ge.EE(max_iter=20, backend="cpu"), ThreeColumns(), n_mu=2).fit(X)
    with pytest.raises(TypeError, match="mapping_params apply to the named mappings only"):
        ge.ParametricEmbedding(ge.EE(max_iter=20, backend="cpu"), LinearMapping(),
                               mapping_params={"ridge": 1.0}).fit(X)


def test_chain_rule_decreases_p(coil15, coil_mac):
    Y, _ = coil15
    est = ge.EE(backend="cpu", random_state=0).fit(Y)
    be, Y_dev, Z, objective, _ = est._fitted
    mapping = LinearMapping().fit(Y_dev, Z)                     # the direct fit
    result = chain_rule(objective, Y_dev, mapping, max_iter=50)
    assert result.objective < coil_mac.history_[0]["objective"]
    assert result.objective == pytest.approx(objective.value(mapping.predict(Y_dev)))


def test_bad_input():
    X, _ = ge.datasets.gaussian_clusters(100, 2, 4, random_state=0)
    with pytest.raises(ValueError, match="increasing"):
        ge.ParametricEmbedding(ge.EE(backend="cpu"), mu=[1.0, 0.5]).fit(X)
    with pytest.raises(ValueError, match="positive"):
        ge.ParametricEmbedding(ge.EE(backend="cpu"), mu=[0.0, 1.0]).fit(X)
    with pytest.raises(TypeError, match="fit"):
        ge.ParametricEmbedding(ge.EE(backend="cpu"), mapping=object()).fit(X)
    with pytest.raises(ValueError, match="mapping"):
        make_mapping("tree")
    with pytest.raises(TypeError, match="embedding"):
        ge.ParametricEmbedding(embedding="ee").fit(X)
    with pytest.raises(TypeError, match="verbose"):
        ge.ParametricEmbedding(ge.EE(backend="cpu"), verbose="no").fit(X)
    with pytest.raises(TypeError, match="augmented must be True or False"):
        ge.ParametricEmbedding(ge.EE(backend="cpu"), augmented="no").fit(X)
    with pytest.raises(TypeError, match="mu must be a sequence of numbers"):
        ge.ParametricEmbedding(ge.EE(backend="cpu"), mu="fast").fit(X)
    with pytest.raises(TypeError, match="mapping_params must be a dict, got str"):
        ge.ParametricEmbedding(ge.EE(backend="cpu"), mapping="rbf", mapping_params="x").fit(X)
    # fit's data is Y (the paper's name, as in transform's Y_new), not the free embedding's X.
    with pytest.raises(ValueError, match="^Y contains NaN"):
        ge.ParametricEmbedding(ge.EE(backend="cpu")).fit(np.where(X > 3, np.nan, X))
    with pytest.raises(ValueError, match="^Y needs at least 5 samples, got n_samples=4"):
        ge.ParametricEmbedding(ge.MultiscaleSNE(backend="cpu")).fit(X[:4])
    with pytest.raises(ValueError, match="^Y needs at least 4 samples, got n_samples=3"):
        ge.ParametricEmbedding(ge.TSNE(backend="cpu")).fit(X[:3])
    pe = ge.ParametricEmbedding(ge.EE(backend="cpu", max_iter=20), n_mu=2).fit(X)
    with pytest.raises(ValueError, match="features"):
        pe.transform(X[:, :3])
    with pytest.raises(ValueError, match="NaN"):
        pe.transform(np.full((2, 4), np.nan))
    with pytest.raises(ge.NotFittedError, match="call fit before transform"):
        ge.ParametricEmbedding().transform(X)


@pytest.mark.parametrize("augmented", [False, True])
@pytest.mark.parametrize("estimator", [ge.TSNE, ge.MultiscaleSNE])
def test_float32_stays_float32(backend, augmented, estimator):
    """A float32 embedding (the GPU's default) gives a float32 MAC path: NumPy
    scalars of the mu schedule once promoted every Z step to float64."""
    X, _ = ge.datasets.swiss_roll(200, random_state=0)
    pe = ge.ParametricEmbedding(estimator(backend=backend, dtype=np.float32, max_iter=10),
                                "linear", n_mu=2, augmented=augmented).fit(X)
    assert pe.embedding_.dtype == pe.transform(X[:3]).dtype == np.float32
    assert np.isfinite(pe.objective_)


def adam_reference(p, g, m, v, lr, step, weight_decay, beta1=0.9, beta2=0.999, eps=1e-8):
    """Adam (Kingma & Ba 2015) as the paper writes it, in float64."""
    g = g + weight_decay * p
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    p = p - lr * (m / (1 - beta1**step)) / (np.sqrt(v / (1 - beta2**step)) + eps)
    return p, m, v


@pytest.mark.parametrize("dtype,rel", [(np.float64, 1e-13), (np.float32, 1e-5)])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adam_step_on_the_cpu_matches_the_formula(rng, dtype, rel, weight_decay):
    """The compiled step (bias corrections folded into two scalars) against the
    formula over 5 steps from zero moments (the corrections change each step) with
    gradients of both signs, a float64 gradient into float32 parameters (float32
    stays float32), and the first step's closed form."""
    from gpuembed.parametric.mappings import adam_scalars, adam_step
    n = 1001
    arrays = [rng.normal(size=n).astype(dtype), np.zeros(n, dtype), np.zeros(n, dtype)]
    want = [a.astype(np.float64) for a in arrays]
    for step in range(1, 6):
        g = rng.normal(size=n)
        start = arrays[0].astype(np.float64)
        adam_step(arrays[0], g, *arrays[1:], adam_scalars(0.01, step, weight_decay=weight_decay))
        want = adam_reference(want[0], g.astype(dtype), *want[1:], 0.01, step, weight_decay)
        if step == 1:       # the first step: lr against the gradient's sign (eps aside)
            first = g.astype(dtype) + weight_decay * start
            np.testing.assert_allclose(start - arrays[0], 0.01 * first / (np.abs(first) + 1e-8),
                                       atol=2 * np.finfo(dtype).eps * np.abs(start).max())
    for got, expected in zip(arrays, want):
        assert got.dtype == dtype
        np.testing.assert_allclose(got, expected, rtol=rel, atol=rel * np.abs(expected).max())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,rel", [(np.float64, 1e-13), (np.float32, 1e-5)])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adam_step_kernel_matches_the_cpu(rng, dtype, rel, weight_decay):
    """kernels/adam.cu against adam_step's CPU loop (checked against the formula
    above) over 5 steps (the bias corrections change each step) on more elements
    than the launch's threads (the grid-stride loop), gradients of both signs and
    moments from zero.  A float32 parameter's five steps can cancel to nothing."""
    from gpuembed.parametric.mappings import (ELEMENTWISE_BLOCK, ELEMENTWISE_MAX_BLOCKS,
                                              adam_scalars, adam_step)
    gpu = get_backend("gpu")
    n = ELEMENTWISE_BLOCK * ELEMENTWISE_MAX_BLOCKS + 37
    host = [rng.normal(size=n).astype(dtype), np.zeros(n, dtype), np.zeros(n, dtype)]
    device = [gpu.asarray(a) for a in host]
    start = host[0].copy()
    for step in range(1, 6):
        g = rng.normal(size=n).astype(dtype)
        scalars = adam_scalars(0.01, step, weight_decay=weight_decay)
        adam_step(*host[:1], g, *host[1:], scalars)
        # The scalars as the host's tuple (copied over) and as a device row, which
        # the kernel reads when it runs (a captured graph's schedule).
        adam_step(*device[:1], gpu.asarray(g), *device[1:],
                  scalars if step % 2 else gpu.asarray(np.array(scalars)))
    for want, got in zip(host, device):
        assert got.dtype == dtype
        np.testing.assert_allclose(gpu.to_host(got), want, rtol=rel, atol=rel * np.abs(want).max())
    moved = np.abs(host[0] - start)
    assert np.mean(moved > 0) > 0.999 and np.median(moved) > 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,rel", [(np.float64, 1e-13), (np.float32, 1e-6)])
def test_mlp_elementwise_kernels_match_numpy(rng, dtype, rel):
    """kernels/mlp.cu against the NumPy branches of bias_activation (with and
    without tanh), tanh_backward and scaled_residual, on more elements than the
    launch's threads (the grid-stride loop) and a column count that does not
    divide them (the bias index)."""
    from gpuembed.parametric.mappings import (ELEMENTWISE_BLOCK, ELEMENTWISE_MAX_BLOCKS,
                                              bias_activation, scaled_residual, tanh_backward)
    gpu = get_backend("gpu")
    shape = (ELEMENTWISE_BLOCK * ELEMENTWISE_MAX_BLOCKS // 7 + 5, 7)
    H, A, Z = (rng.normal(size=shape).astype(dtype) for _ in range(3))
    b = rng.normal(size=shape[1]).astype(dtype)
    steps = [lambda H, A, Z, b: bias_activation(H, b, True),
             lambda H, A, Z, b: bias_activation(H, b, False),
             lambda H, A, Z, b: tanh_backward(H, A),
             lambda H, A, Z, b: scaled_residual(H, Z, 0.37)]
    for step in steps:
        want = H.copy()
        step(want, A, Z, b)
        got = gpu.asarray(H)
        step(got, *map(gpu.asarray, (A, Z, b)))
        assert got.dtype == dtype
        np.testing.assert_allclose(gpu.to_host(got), want, rtol=rel, atol=rel)
        assert not np.allclose(want, H)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,rel", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_mlp_gemm_and_column_sums_kernels_match_numpy(rng, dtype, rel):
    """kernels/mlp.cu's product on shapes that its 16 x 16 tiles do not divide
    (one row, two columns, a minibatch against a 256-wide layer), each operand as
    stored and as the transposed view of its transpose (back-propagation's A^T and
    W^T, read in place, and loaded along their columns), and its column sums.  The
    layouts change how a tile is loaded, not the order of the sums: the same bits.
    With a workspace the products of few tiles and long sums (a weight gradient over
    1,000 rows; a part of K shorter than the others, and one not a whole tile) are
    partial products added by a second launch."""
    from gpuembed.parametric.mappings import GEMM_WORKSPACE, column_sums, gemm, gemm_splits
    gpu = get_backend("gpu")
    workspace = gpu.xp.full(GEMM_WORKSPACE, np.nan, dtype=dtype)
    shapes = {(37, 53, 29): 2, (100, 256, 256): 8, (1, 5, 3): 1, (300, 17, 2): 1,
              (40, 1000, 3): 21, (37, 200, 29): 5}
    for (M, K, N), splits in shapes.items():
        assert gemm_splits(M, N, K)[0] == splits
        A, B = rng.normal(size=(M, K)).astype(dtype), rng.normal(size=(K, N)).astype(dtype)
        want = A @ B
        As, Bs = gpu.asarray(A), gpu.asarray(B)
        At, Bt = gpu.asarray(A.T.copy()).T, gpu.asarray(B.T.copy()).T
        for space in (None, workspace):
            products = [gpu.to_host(gemm(a, b, gpu.xp.empty((M, N), dtype=dtype), space))
                        for a, b in ((As, Bs), (At, Bs), (As, Bt), (At, Bt))]
            np.testing.assert_allclose(products[0], want, rtol=rel,
                                       atol=rel * np.abs(want).max())
            for got in products[1:]:
                np.testing.assert_array_equal(got, products[0])
    # Columns beyond a block's 32, rows fewer than its 32 stripes.
    for rows, cols in ((70, 300), (3, 40)):
        D = rng.normal(size=(rows, cols)).astype(dtype)
        got = column_sums(gpu.asarray(D), gpu.xp.empty(cols, dtype=dtype))
        np.testing.assert_allclose(gpu.to_host(got), D.sum(axis=0), rtol=rel, atol=rel * 10)


def test_gemm_splits_cover_k_in_whole_tiles_within_the_workspace():
    """gemm's split products: parts of K of whole tiles (2 at least) that cover K,
    the last one shorter, their partial products within GEMM_WORKSPACE; no split
    where the output's tiles alone fill GEMM_TARGET_BLOCKS or K is 3 tiles or less."""
    from gpuembed.parametric.mappings import (GEMM_TARGET_BLOCKS, GEMM_TILE, GEMM_WORKSPACE,
                                              gemm_splits)
    for M, N, K in itertools.product(range(1, 700, 37), range(1, 700, 41), range(1, 2100, 53)):
        splits, chunk = gemm_splits(M, N, K)
        assert chunk % GEMM_TILE == 0 and (splits - 1) * chunk < K <= splits * chunk
        tiles = -(-M // GEMM_TILE) * -(-N // GEMM_TILE)
        if splits > 1:
            assert chunk >= 2 * GEMM_TILE and splits * M * N <= GEMM_WORKSPACE
            assert splits * tiles <= GEMM_TARGET_BLOCKS
        else:
            assert tiles * 2 > GEMM_TARGET_BLOCKS or K <= 3 * GEMM_TILE
    assert gemm_splits(256, 256, 1000) == (4, 256)     # dW of a 256-256 layer, 1,000 rows
    assert gemm_splits(1000, 256, 256) == (1, 256)     # its forward product


@pytest.mark.gpu
def test_mlp_mapping_gpu_matches_cpu(rng):
    """Two hidden layers, warm starts and weight decay: the fit, predict and
    backward of the flat parameter vector on device arrays equal the CPU's (to
    1e-7: a GPU's last bits of tanh and of the products go through 15 Adam steps;
    a wrong step moves the outputs by 1e-3 and more)."""
    Y, Z = rng.normal(size=(250, 6)), rng.normal(size=(250, 2))
    gpu = get_backend("gpu")
    maps = []
    for Yb, Zb in ((Y, Z), (gpu.asarray(Y), gpu.asarray(Z))):
        m = MLPMapping(hidden=(12, 9), initial_epochs=3, epochs=2, weight_decay=0.01,
                       random_state=0).fit(Yb, Zb)
        m.fit(Yb, 1.5 * Zb, warm_start=True)
        maps.append((m, m.predict(Yb), m.backward(Yb, Zb)))
    (_, want, want_grads), (_, got, got_grads) = maps
    np.testing.assert_allclose(gpu.to_host(got), want, rtol=1e-7, atol=1e-7)
    for g_want, g_got in zip(want_grads, got_grads):
        np.testing.assert_allclose(gpu.to_host(g_got), g_want, rtol=1e-7, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mlp_graph_replays_equal_the_calls(rng, monkeypatch, dtype):
    """MLPMapping.fit on the GPU with its segments replayed from CUDA graphs against
    the same fit with every call made from Python: a cold fit and warm starts with
    other targets and weight decays, segments of 3 minibatches (two lengths: two
    graphs, the short one with a short minibatch).  Same kernels on the same
    arrays, so the same numbers.  Had a replay missed the schedule's rewrite
    (Adam's bias corrections, or the rate and decay, frozen at capture), the
    outputs would move by 33% and 24% of their largest (measured on the CPU)."""
    import gpuembed.parametric.mappings as mappings
    gpu = get_backend("gpu")
    monkeypatch.setattr(mappings, "SEGMENT_STEPS", 3)
    Y, Z = (gpu.asarray(rng.normal(size=(250, 5)), dtype=dtype) for _ in range(2))
    Z = Z[:, :2].copy()

    def fit():
        m = MLPMapping(hidden=(16, 8), initial_epochs=3, epochs=2, batch_size=32,
                       weight_decay=0.01, random_state=0).fit(Y, Z)
        m.fit(Y, 1.5 * Z, warm_start=True, sample_weight=2.0)
        m.fit(Y, 0.5 * Z, warm_start=True)
        return m

    replayed = fit()
    assert sorted(replayed._buffers._graphs) == [58, 96]
    assert all(g not in (None, False) for g in replayed._buffers._graphs.values())
    monkeypatch.setattr(type(gpu), "can_capture", False)
    called = fit()
    assert all(g is False for g in called._buffers._graphs.values())
    want = gpu.to_host(called.predict(Y))
    np.testing.assert_allclose(gpu.to_host(replayed.predict(Y)), want,
                               rtol=1e-6, atol=1e-6 * np.abs(want).max())
    # A capture that CUDA refuses: a warning, and the steps run as calls.
    monkeypatch.setattr(type(gpu), "can_capture", True)

    def refuse(self, work):
        raise RuntimeError("cudaErrorStreamCaptureUnsupported")
    monkeypatch.setattr(type(gpu), "capture", refuse)
    with pytest.warns(RuntimeWarning, match="capture failed"):
        refused = fit()
    np.testing.assert_allclose(gpu.to_host(refused.predict(Y)), want,
                               rtol=1e-6, atol=1e-6 * np.abs(want).max())


@pytest.mark.gpu
@pytest.mark.parametrize("mapping,rel", [("linear", 1e-6), ("rbf", 1e-6), ("mlp", 1e-5)])
def test_mac_gpu_matches_cpu(mapping, rel):
    """The same MAC run on both backends, SD by CG on both ("auto" factorizes on
    the CPU only, and a different free embedding moves P(F) by 1e-3) and without
    EE's default curvature pairs (from iteration 51 on they amplify the backends'
    different rounding to 1e-3 in P(F) as well).  The MLP's minibatch steps may
    amplify the GPU's different rounding a little; 30 per F step (the default's 500
    took 15 s on the CUDA emulator)."""
    X, _ = ge.datasets.swiss_roll(300, random_state=0)
    params = {"rbf": {"n_centers": 30}, "mlp": {"hidden": (16,), "initial_epochs": 5, "epochs": 10},
              "linear": {}}[mapping]
    runs = [ge.ParametricEmbedding(ge.EE(backend=b, dtype=np.float64, random_state=0,
                                         sd_solver="cg", sd_memory=0), mapping,
                                   mapping_params=params, n_mu=4, random_state=0).fit(X)
            for b in ("cpu", "gpu")]
    assert len(runs[1].history_) == len(runs[0].history_)
    assert runs[1].objective_ == pytest.approx(runs[0].objective_, rel=rel)
    np.testing.assert_allclose(runs[1].transform(X[:20]), runs[0].transform(X[:20]),
                               rtol=10 * rel, atol=10 * rel * np.abs(runs[0].embedding_).max())


@pytest.mark.gpu
def test_mac_with_multiscale_sne_gpu_matches_cpu():
    """Short fits: 30 iterations per stage leave the two free embeddings 7e-8
    apart, which MAC's L-BFGS Z steps amplify to 2e-5 in P(F)."""
    X, _ = ge.datasets.gaussian_clusters(150, 3, 6, random_state=0)
    runs = [ge.ParametricEmbedding(ge.MultiscaleSNE(backend=b, dtype=np.float64, max_iter=5,
                                                    random_state=0), "linear", n_mu=3,
                                   z_max_iter=5).fit(X)
            for b in ("cpu", "gpu")]
    assert len(runs[1].history_) == len(runs[0].history_)
    for a, b in zip(runs[0].history_, runs[1].history_):
        assert b["mu"] == pytest.approx(a["mu"], rel=1e-13)
        assert b["objective"] == pytest.approx(a["objective"], rel=1e-11)
    assert runs[0].objective_ < runs[0].history_[0]["objective"]


@pytest.mark.gpu
@pytest.mark.parametrize("make", [lambda: MLPMapping(hidden=(8,), initial_epochs=2, random_state=0),
                                  lambda: LinearMapping(),
                                  lambda: RBFMapping(n_centers=20, random_state=0)])
def test_chain_rule_gpu_matches_cpu(make):
    """The chain-rule baseline's parameters, gradients and steps on device arrays
    (on a connected manifold: separated clusters drift apart under forces near
    zero, and the two free embeddings would already differ by 1e-5)."""
    X, _ = ge.datasets.swiss_roll(150, random_state=0)
    values = []
    for b in ("cpu", "gpu"):
        est = ge.EE(backend=b, dtype=np.float64, random_state=0, max_iter=20,
                    sd_solver="cg").fit(X)
        be, Y_dev, Z, objective, _ = est._fitted
        values.append(chain_rule(objective, Y_dev, make().fit(Y_dev, Z), max_iter=10).objective)
    assert values[1] == pytest.approx(values[0], rel=1e-6)
