"""Entropic affinities (../shared/papers/003_e1371111a5435f8e.txt; dissertation ch. 2)."""

from pathlib import Path

import numba
import numpy as np
import pytest
import scipy.optimize

import gpuembed as ge
from gpuembed.affinities import orders, rootfinding, rootfinding_cpu
from gpuembed.affinities.entropic import joint, solve_rows
from gpuembed.fastexp import expneg, logpos, negexp

LOG = np.log


def entropy_of_rows(sqdist, beta):
    """Independent entropy: -sum p log p from scratch (no shift trick)."""
    logits = -beta[:, None] * sqdist
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    return -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=1)


def dense_reference_beta(X, K):
    """k = N-1: solve each row of the full distance matrix with brentq (xtol tiny)."""
    D = ((X[:, None] - X[None]) ** 2).sum(-1)
    out = []
    for i in range(len(X)):
        d = np.delete(D[i], i)
        d = d - d.min()
        f = lambda a: entropy_of_rows(d[None], np.array([np.exp(a)]))[0] - LOG(K)
        out.append(np.exp(scipy.optimize.brentq(f, -30, 30, xtol=1e-14, rtol=1e-15)))
    return np.array(out)


@pytest.fixture(scope="module")
def clusters():
    X, _ = ge.datasets.gaussian_clusters(400, 4, 5, random_state=0)
    return X


def test_entropy_derivatives_match_finite_differences(rng):
    shifted = rng.gamma(2.0, 3.0, (50, 40))
    shifted -= shifted.min(axis=1, keepdims=True)
    alpha = rng.uniform(-4, 1, 50)
    H, dH, d2H = rootfinding.entropy_terms(np, shifted, alpha)
    h = 1e-5
    Hp, dHp, _ = rootfinding.entropy_terms(np, shifted, alpha + h)
    Hm, dHm, _ = rootfinding.entropy_terms(np, shifted, alpha - h)
    np.testing.assert_allclose(dH, (Hp - Hm) / (2 * h), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(d2H, (dHp - dHm) / (2 * h), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(H, entropy_of_rows(shifted, np.exp(alpha)), rtol=1e-12)


def test_entropy_is_shift_stable():
    # Distances around 1e4 with beta ~ 1: exp(-beta d) underflows without the shift.
    d = np.array([[1e4, 1e4 + 1.0, 1e4 + 2.0, 1e4 + 5.0]])
    H, _, _ = rootfinding.entropy_terms(np, d - d.min(), np.array([0.0]))
    assert np.isfinite(H).all() and 0 < H[0] < LOG(4)


@pytest.mark.parametrize("n", [5, 30, 90, 1000, 10**6])
def test_p1_solves_equation_9(n):
    K = np.array([1.5, 3.0, 10.0, 29.0, 0.99 * n])
    K = K[K < n]
    p1 = rootfinding.perplexity_p1(n, K)
    assert np.all((p1 >= 0.75) & (p1 < 1))
    lhs = 2 * (1 - p1) * LOG(n / (2 * (1 - p1)))
    np.testing.assert_allclose(lhs, LOG(np.minimum(np.sqrt(2 * n), K)), rtol=1e-10)


def test_bounds_contain_the_root_property(rng):
    """Theorem 1.1 (eqs 7-9): H(beta_L) >= log K >= H(beta_U) over many random rows."""
    checked = 0
    for trial in range(60):
        k = int(rng.integers(3, 200))
        kind = trial % 4
        if kind == 0:
            d = rng.random((200, k)) * 10 ** rng.uniform(-6, 6)
        elif kind == 1:
            d = rng.gamma(rng.uniform(0.1, 5), 1.0, (200, k)) ** 2
        elif kind == 2:   # a few very close points, the rest far (two clusters)
            d = np.where(rng.random((200, k)) < 0.1, rng.random((200, k)),
                         1e3 + rng.random((200, k)))
        else:             # duplicates (exact zeros) and an offset
            d = rng.random((200, k)) * 5 + 7
            d[:, : max(1, k // 10)] = 7.0
        K = rng.uniform(1.01, k - 0.01, 200)
        ties = ((d - d.min(1, keepdims=True)) == 0).sum(1)
        ok = (ties < K) & (np.ptp(d, axis=1) > 0)
        d, K = d[ok], K[ok]
        shifted = d - d.min(axis=1, keepdims=True)
        lo, hi = rootfinding.log_beta_bounds(np, shifted, K)
        H_lo = entropy_of_rows(shifted, np.exp(lo))
        H_hi = entropy_of_rows(shifted, np.exp(hi))
        assert np.all(lo < hi)
        assert np.all(H_lo >= LOG(K) - 1e-12), trial
        assert np.all(H_hi <= LOG(K) + 1e-12), trial
        checked += len(K)
    assert checked > 5000


@pytest.mark.parametrize("K, first_term", [(2.0, True), (4.0, False)])
def test_bounds_equal_theorem_1_1_by_hand(K, first_term):
    """Eqs (7)-(9) of 003 written out for two rows (shifted, so d_1 = 0 and
    d_N^4 - d_1^4 = Delta_N^4; the second has a duplicate, so Delta_2 is its first
    nonzero gap), p1 by SciPy's bracketing solver: the bracket must be the
    theorem's, not just some interval around the root.  Eq. (7)'s first term is the
    larger at K = 2, its square root at K = 4."""
    from scipy.optimize import brentq
    d = np.array([[0.0, 1.0, 2.0, 4.0, 9.0], [0.0, 0.0, 0.5, 3.0, 6.0]])
    N = 5
    assert (N / (N - 1) * LOG(N / K) > np.sqrt(LOG(N / K))) == first_term
    # Decreasing on [1/2, 1); the root is 3/4 itself where K >= sqrt(2N), as at K = 4,
    # where a bracket from 3/4 holds it or not by rounding.
    p1 = brentq(lambda p: 2 * (1 - p) * LOG(N / (2 * (1 - p))) - LOG(min(np.sqrt(2 * N), K)),
                0.5, 1 - 1e-15, xtol=1e-15)
    for row, (delta_n, delta_2) in zip(d, ((9.0, 1.0), (6.0, 0.5))):
        beta_l = max(N * LOG(N / K) / ((N - 1) * delta_n), np.sqrt(LOG(N / K) / delta_n ** 2))
        beta_u = LOG(p1 / (1 - p1) * (N - 1)) / delta_2
        lo, hi = rootfinding.log_beta_bounds(np, row[None, :], K)
        np.testing.assert_allclose([lo[0], hi[0]], [LOG(beta_l), LOG(beta_u)], rtol=1e-12)


def test_bounds_scale_with_the_data(rng):
    d = rng.random((10, 20))
    d -= d.min(1, keepdims=True)
    lo, hi = rootfinding.log_beta_bounds(np, d, np.full(10, 5.0))
    lo2, hi2 = rootfinding.log_beta_bounds(np, 4.0 * d, np.full(10, 5.0))
    np.testing.assert_allclose(lo2, lo - LOG(4.0))
    np.testing.assert_allclose(hi2, hi - LOG(4.0))


def test_bounds_of_one_perplexity_equal_those_of_a_per_row_array(rng):
    """One value for all rows takes host scalars (p1 solved once); differing values
    take per-row arrays: both must give the same bracket."""
    d = rng.random((50, 30))
    d -= d.min(1, keepdims=True)
    K = np.full(50, 7.0)
    assert rootfinding.common_value(K).ndim == 0
    varied = K.copy()
    varied[0] = 7.0 + 1e-12                          # not all equal: the per-row path
    assert rootfinding.common_value(varied).ndim == 1
    for a, b in zip(rootfinding.log_beta_bounds(np, d, K),
                    rootfinding.log_beta_bounds(np, d, varied)):
        np.testing.assert_allclose(a, b, rtol=1e-10)
    for a, b in zip(rootfinding.log_beta_bounds(np, d, K),
                    rootfinding.log_beta_bounds(np, d, 7.0)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("method", rootfinding.METHODS)
def test_entropy_recomputed_from_P(clusters, method):
    A = ge.entropic_affinities(clusters, 10.0, method=method, symmetrize=False, backend="cpu")
    P = A.P.toarray()
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=1e-12)
    H = -(P * np.log(np.where(P > 0, P, 1.0))).sum(axis=1)
    assert np.abs(H - LOG(10.0)).max() <= 1e-9
    assert np.abs(A.entropy - LOG(10.0)).max() <= 1e-10
    # beta is the precision of the row: p(m|n) proportional to exp(-beta sqdist).
    sqdist, idx = A.neighbors
    row = np.exp(-A.beta[7] * (sqdist[7] - sqdist[7].min()))
    np.testing.assert_allclose(P[7, idx[7]], row / row.sum(), rtol=1e-12)


def test_k_equal_n_minus_1_matches_dense_brute_force(rng):
    X = rng.standard_normal((60, 3))
    A = ge.entropic_affinities(X, 12.0, n_neighbors=59, backend="cpu")
    np.testing.assert_allclose(A.beta, dense_reference_beta(X, 12.0), rtol=1e-8)


@pytest.mark.parametrize("order", orders.ORDERS)
def test_all_methods_and_orders_agree_on_beta(clusters, order):
    ref = ge.entropic_affinities(clusters, 15.0, method="bisection", order="bounds",
                                 backend="cpu").beta
    for method in ("newton", "halley", "euler"):
        A = ge.entropic_affinities(clusters, 15.0, method=method, order=order, backend="cpu")
        np.testing.assert_allclose(A.beta, ref, rtol=1e-8)


def test_warm_starts_need_fewer_evaluations(clusters):
    n_eval = {order: ge.entropic_affinities(clusters, 15.0, order=order,
                                            backend="cpu").n_iter.mean()
              for order in orders.ORDERS}
    for order in ("dk", "mst", "msp"):
        assert n_eval[order] < n_eval["bounds"] - 0.5, n_eval
    bisection = ge.entropic_affinities(clusters, 15.0, method="bisection", backend="cpu")
    assert bisection.n_iter.mean() > 3 * n_eval["dk"]


@pytest.mark.parametrize("order", ["dk", "mst", "msp"])
def test_sequential_and_parallel_orders_give_the_same_solution(clusters, order):
    be = ge.get_backend("cpu")
    sqdist, idx = ge.knn(clusters, 30)
    shifted = sqdist - sqdist.min(axis=1, keepdims=True)
    K = np.full(len(clusters), 10.0)
    results = []
    for parallel in (True, False):
        lo, hi = rootfinding.log_beta_bounds(np, shifted, K)
        results.append(solve_rows(be, shifted, K, lo, hi, "euler", order, 1e-10, (sqdist, idx),
                                  parallel=parallel))
    np.testing.assert_allclose(results[0][0], results[1][0], atol=1e-8)
    assert abs(results[0][2].mean() - results[1][2].mean()) < 0.5


def test_schedules_cover_every_point_once_after_its_sources(clusters):
    sqdist, idx = ge.knn(clusters, 30)
    K = np.full(len(clusters), 10.0)
    for order in orders.ORDERS:
        for parallel in (True, False):
            solved = np.zeros(len(clusters), dtype=bool)
            for rows, sources in orders.schedule(order, sqdist, idx, K, parallel):
                src = [] if sources is None else sources[sources >= 0]
                assert solved[src].all(), order
                assert not solved[rows].any()
                solved[rows] = True
            assert solved.all()


def test_schedules_copy_only_the_neighbour_columns_they_read(clusters):
    """On the GPU the neighbours stay on the device: 1e6 x 90 of them are 1.4 GB,
    of which an order copies nothing (dk sorts its column in place) or KAPPA columns."""
    sqdist, idx = ge.knn(clusters, 30)
    K = np.full(len(clusters), 10.0)
    for order, shapes in (("bounds", []), ("none", []), ("dk", []),
                          ("mst", [(len(clusters), orders.KAPPA)] * 2),
                          ("msp", [(len(clusters), orders.KAPPA)] * 2)):
        copied = []
        orders.schedule(order, sqdist, idx, K, to_host=lambda a: copied.append(a.shape) or a)
        assert copied == shapes, order


def test_raster_order_zigzags_through_adjacent_pixels():
    np.testing.assert_array_equal(orders.raster_order(3, 4),
                                  [0, 1, 2, 3, 7, 6, 5, 4, 8, 9, 10, 11])
    rows, cols = np.divmod(orders.raster_order(7, 5), 5)
    assert (np.abs(np.diff(rows)) + np.abs(np.diff(cols)) == 1).all()
    assert ge.affinities.raster_order(1, 1).tolist() == [0]
    with pytest.raises(ValueError, match="height"):
        orders.raster_order(0, 4)


def pixel_features(height=30, width=40):
    """(row, column, grey) of a smooth synthetic image, whose pixels vary slowly
    along the raster order."""
    rows, cols = np.indices((height, width))
    grey = 20 * np.sin(rows / 5.0) * np.cos(cols / 7.0)
    return np.column_stack([rows.ravel(), cols.ravel(), grey.ravel()])


def test_given_sequence_order_solves_like_the_named_orders():
    """A user's sequence (dissertation 2.3.4's raster order of an image's pixels) gives
    the same beta as bisection, with as few evaluations as the MST order and fewer
    than mid-bracket starts, in parallel waves and one point at a time; a reversed
    sequence and a list give the same solution."""
    X = pixel_features()
    raster = ge.affinities.raster_order(30, 40)
    ref = ge.entropic_affinities(X, 15.0, method="bisection", order="bounds", backend="cpu")
    A = ge.entropic_affinities(X, 15.0, method="euler", order=raster, backend="cpu")
    np.testing.assert_allclose(A.beta, ref.beta, rtol=1e-8)
    mst, bounds = (ge.entropic_affinities(X, 15.0, method="euler", order=o, backend="cpu")
                   for o in ("mst", "bounds"))
    assert A.n_iter.mean() < bounds.n_iter.mean() - 0.5
    assert A.n_iter.mean() < mst.n_iter.mean() + 0.2
    np.testing.assert_allclose(
        ge.entropic_affinities(X, 15.0, method="euler", order=list(raster[::-1]),
                               backend="cpu").beta, ref.beta, rtol=1e-8)
    sqdist, idx = A.neighbors
    shifted = sqdist - sqdist.min(axis=1, keepdims=True)
    K = np.full(len(X), 15.0)
    lo, hi = rootfinding.log_beta_bounds(np, shifted, K)
    sequential = solve_rows(ge.get_backend("cpu"), shifted, K, lo, hi, "euler", raster, 1e-10,
                            (sqdist, idx), parallel=False)
    np.testing.assert_allclose(np.exp(sequential[0]), ref.beta, rtol=1e-8)
    assert sequential[2].mean() < bounds.n_iter.mean() - 0.5
    for parallel in (True, False):
        solved = np.zeros(len(X), dtype=bool)
        for rows, sources in orders.schedule(raster, sqdist, idx, K, parallel):
            assert solved[[] if sources is None else sources[sources >= 0]].all()
            assert not solved[rows].any()
            solved[rows] = True
        assert solved.all()


@pytest.mark.parametrize("order,match", [
    (np.arange(49), "shape"),
    (np.arange(50.0), "dtype float64"),
    (np.r_[np.arange(49), 3], "repeats"),
    (np.r_[np.arange(49), 50], "outside"),
    (np.arange(50).reshape(5, 10), "shape"),
    ("raster", "sequence of all point indices"),
])
def test_bad_given_sequence(order, match):
    X = np.random.default_rng(0).random((50, 3))
    with pytest.raises(ValueError, match=f"order.*{match}"):
        ge.entropic_affinities(X, 5.0, order=order, backend="cpu")


def test_minimum_spanning_path_visits_all_once_greedily():
    X = np.array([[0.0], [1.0], [3.0], [6.0], [10.0], [100.0]])
    sqdist, idx = ge.knn(X, 2)
    path = orders.minimum_spanning_path(orders._knn_graph(sqdist, idx), root=0)
    assert sorted(path) == list(range(6))
    assert list(path[:5]) == [0, 1, 2, 3, 4]      # always the closest unvisited neighbour


def test_mst_depths():
    parent = np.array([-1, 0, 1, 1, 3, -1, 5])
    np.testing.assert_array_equal(orders._depths(parent), [0, 1, 2, 2, 3, 0, 1])


def test_symmetric_P(clusters):
    A = ge.entropic_affinities(clusters, 10.0, backend="cpu")
    P = A.P
    assert P.shape == (400, 400) and abs(P.sum() - 1.0) < 1e-12
    assert abs(P - P.T).max() < 1e-15
    C = ge.entropic_affinities(clusters, 10.0, symmetrize=False, backend="cpu").P
    np.testing.assert_allclose(P.toarray(), (C + C.T).toarray() / 800, atol=1e-16)
    # joint scales the sum in place: scipy's division's bits, the conditionals untouched
    before = C.copy()
    J = joint(C)
    expected = ((C + C.T) / 800).tocsr()
    for a in ("data", "indices", "indptr"):
        np.testing.assert_array_equal(getattr(J, a), getattr(expected, a))
    np.testing.assert_array_equal(C.data, before.data)


def test_precomputed_neighbors_and_default_k(clusters):
    A = ge.entropic_affinities(clusters, 10.0, backend="cpu")
    assert A.neighbors[0].shape == (400, 30)          # default k = 3 * perplexity
    B = ge.entropic_affinities(None, 10.0, neighbors=A.neighbors, backend="cpu")
    np.testing.assert_allclose(A.beta, B.beta, rtol=1e-12)


def test_per_point_perplexity(clusters):
    K = np.linspace(5, 20, 400)
    A = ge.entropic_affinities(clusters, K, n_neighbors=60, backend="cpu")
    np.testing.assert_allclose(A.entropy, LOG(K), atol=1e-10)


def test_duplicates_are_solved(rng):
    base = rng.standard_normal((100, 3))
    X = np.concatenate([base, base[:20], base[:20]])     # 20 points appear 3 times
    A = ge.entropic_affinities(X, 8.0, backend="cpu")
    assert np.isfinite(A.beta).all()
    np.testing.assert_allclose(A.entropy, LOG(8.0), atol=1e-10)


def test_too_many_duplicates_saturate_with_a_warning(rng):
    base = rng.standard_normal((50, 2))
    X = np.concatenate([base, np.repeat(base[:1], 10, axis=0)])  # point 0 has 10 copies
    with pytest.warns(RuntimeWarning, match="duplicates"):
        A = ge.entropic_affinities(X, 5.0, n_neighbors=15, symmetrize=False, backend="cpu")
    assert np.isinf(A.beta[0])
    assert A.entropy[0] == pytest.approx(LOG(10.0))
    row = A.P[[0]].toarray().ravel()
    np.testing.assert_allclose(row[row > 0], 0.1)
    ok = np.isfinite(A.beta)
    np.testing.assert_allclose(A.entropy[ok], LOG(5.0), atol=1e-10)


def test_degenerate_rows_warn_at_the_callers_line(rng):
    """The warning names the user's line, however deep the package found the
    condition: entropic_affinities, multi-scale affinities and an estimator's fit."""
    base = rng.standard_normal((60, 3))
    X = np.concatenate([base, np.repeat(base[:1], 12, axis=0)])
    calls = [lambda: ge.entropic_affinities(X, 5.0, n_neighbors=15, backend="cpu"),
             lambda: ge.multiscale_affinities(X, 2.0, n_scales=2, backend="cpu"),
             lambda: ge.TSNE(perplexity=5.0, max_iter=5, backend="cpu").fit(X)]
    for call in calls:
        with pytest.warns(RuntimeWarning, match="duplicates|distances equal") as record:
            call()
        assert {Path(w.filename).name for w in record} == {Path(__file__).name}


def test_equidistant_row_is_uniform_with_a_warning():
    # Point 0 at the centre of a regular simplex: all its distances are equal.
    X = np.vstack([np.zeros(6), np.eye(6), 5 + np.random.default_rng(0).random((20, 6))])
    sqdist, idx = ge.knn(X, 6)
    sqdist[0] = 1.0          # exact, as GEMM rounding may leave ~1e-16 differences
    with pytest.warns(RuntimeWarning, match="all neighbour distances equal"):
        A = ge.entropic_affinities(None, 3.0, neighbors=(sqdist, idx), symmetrize=False,
                                   backend="cpu")
    assert A.beta[0] == 0.0 and A.n_iter[0] == 0
    assert A.entropy[0] == pytest.approx(LOG(6))
    np.testing.assert_allclose(A.P[[0]].toarray()[0, 1:7], 1 / 6)


@pytest.mark.parametrize("kwargs,match", [
    (dict(perplexity=0.5), "perplexity"),
    (dict(perplexity=1.0), "perplexity"),
    (dict(perplexity=30.0, n_neighbors=30), "perplexity"),
    (dict(perplexity=np.nan), "perplexity"),
    (dict(perplexity=np.ones(7) * 5), "perplexity"),
    (dict(perplexity=5.0, n_neighbors=50), "n_neighbors"),
    (dict(perplexity=5.0, method="secant"), "method"),
    (dict(perplexity=5.0, order="random"), "order"),
    (dict(perplexity=5.0, tol=0.0), "tol"),
])
def test_bad_arguments(kwargs, match):
    X = np.random.default_rng(0).random((50, 3))
    with pytest.raises(ValueError, match=match):
        ge.entropic_affinities(X, backend="cpu", **kwargs)


@pytest.mark.parametrize("affinities", [ge.entropic_affinities, ge.multiscale_affinities])
def test_symmetrize_must_be_a_bool(affinities):
    X = np.random.default_rng(0).random((50, 3))
    with pytest.raises(TypeError, match="symmetrize must be True or False, got 'no'"):
        affinities(X, 5.0, symmetrize="no", backend="cpu")


def test_bad_data_and_neighbors():
    X = np.random.default_rng(0).random((50, 3))
    X[4, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        ge.entropic_affinities(X, 5.0, backend="cpu")
    with pytest.raises(ValueError, match="required"):
        ge.entropic_affinities(None, 5.0, backend="cpu")
    sq, idx = ge.knn(np.random.default_rng(0).random((50, 3)), 20)
    with pytest.raises(ValueError, match="indices shape"):
        ge.entropic_affinities(None, 5.0, neighbors=(sq, idx[:, :10]), backend="cpu")
    with pytest.raises(ValueError, match=">= 0"):
        ge.entropic_affinities(None, 5.0, neighbors=(-sq, idx), backend="cpu")
    with pytest.raises(ValueError, match="own neighbour"):
        ge.entropic_affinities(None, 5.0, neighbors=(sq, np.tile(np.arange(50)[:, None], 20)),
                               backend="cpu")
    # scikit-learn's kneighbors(X) lists each point first, at distance 0.
    with pytest.raises(ValueError, match=r"own neighbour \(row 0\).*first column dropped"):
        ge.entropic_affinities(None, 5.0, backend="cpu", neighbors=(
            np.hstack([np.zeros((50, 1)), sq[:, :-1]]),
            np.hstack([np.arange(50)[:, None], idx[:, :-1]])))
    # A pair listed twice would be two affinities.
    twice = idx.copy()
    twice[7, 3] = twice[7, 2]
    with pytest.raises(ValueError, match="row 7 lists a point twice"):
        ge.entropic_affinities(None, 5.0, neighbors=(sq, twice), backend="cpu")
    with pytest.raises(ValueError, match="pair"):
        ge.entropic_affinities(None, 5.0, neighbors=sq, backend="cpu")
    X = np.random.default_rng(0).random((50, 3))
    with pytest.raises(ValueError, match="either neighbors or n_neighbors"):
        ge.entropic_affinities(X, 5.0, neighbors=(sq, idx), n_neighbors=20, backend="cpu")
    with pytest.raises(ValueError, match="neighbors has 50 rows but X has 49"):
        ge.entropic_affinities(X[:49], 5.0, neighbors=(sq, idx), backend="cpu")
    with pytest.raises(TypeError, match="indices must be integers"):
        ge.entropic_affinities(None, 5.0, neighbors=(sq, idx * 1.0), backend="cpu")
    with pytest.raises(ValueError, match=r"indices must be in \[0, 49\]"):
        ge.entropic_affinities(None, 5.0, neighbors=(sq, np.where(idx == 3, 50, idx)),
                               backend="cpu")
    with pytest.raises(ValueError, match="at least 2 neighbours"):
        ge.entropic_affinities(None, 1.5, neighbors=(sq[:, :1], idx[:, :1]), backend="cpu")
    for bad in ("30", True, np.ones((50, 2)) * 5):
        with pytest.raises(TypeError, match="perplexity"):
            ge.entropic_affinities(None, bad, neighbors=(sq, idx), backend="cpu")


def test_compiled_negexp_is_within_two_ulp_of_numpy_exp(rng):
    d = np.concatenate([rng.uniform(0, 700, 20000), rng.uniform(0, 1e-8, 1000), [0.0, 707.9]])
    out = np.empty_like(d)
    for beta in (1.0, 0.37):
        negexp(beta, d, out)
        ref = np.exp(-beta * d)
        assert (np.abs(out - ref) / ref).max() <= 2 * np.finfo(float).eps
    negexp(1.0, np.array([800.0, 1e300]), out[:2])
    assert np.all((out[:2] > 0) & (out[:2] <= np.exp(-708.0) * (1 + 1e-15)))    # clamped


@pytest.mark.parametrize("fastmath", [{"contract"}, True])
def test_compiled_expneg_is_within_two_ulp_of_numpy_exp(rng, fastmath):
    """The scalar form, inlined into a loop compiled without reassociation (the
    exact N-body loops, multi-scale SNE's exact sweeps, which square its values
    up to 2^10-fold, so its error must start at the last bits) and with it (the
    FGT's loops and the edge sweep: LLVM merges the split ln 2, 2e-15 for
    t < 40 and 2.4e-14 near 708, where the rounding constant's add and subtract
    folded away gave 0.41); 0 beyond t = 708."""
    from numba import njit

    @njit(fastmath=fastmath)
    def loop(t, out):
        for j in range(t.size):
            out[j] = expneg(t[j])

    t = np.concatenate([rng.uniform(0, 708, 20000), rng.uniform(0, 40, 20000),
                        rng.uniform(0, 1e-8, 1000), [0.0, 708.0]])
    out = np.empty_like(t)
    loop(t, out)
    error = np.abs(out - np.exp(-t)) / np.exp(-t)
    if fastmath is True:
        assert error[t < 40].max() < 5e-15 and error.max() < 5e-14
    else:
        assert error.max() <= 2 * np.finfo(float).eps
    loop(np.array([708.5, 1e300]), out[:2])
    assert np.all(out[:2] == 0.0)


def test_compiled_logpos_matches_numpy_log(rng):
    y = np.concatenate([10 ** rng.uniform(-300, 300, 20000), 1 + rng.uniform(0, 1e-6, 2000),
                        rng.uniform(0.5, 2.0, 20000), [1.0, 2.0, 0.5, np.sqrt(2), np.sqrt(0.5)]])

    @numba.njit
    def apply(y, out):
        for i in range(y.size):
            out[i] = logpos(y[i])
    out = np.empty_like(y)
    apply(y, out)
    ref = np.log(y)
    assert np.all(np.abs(out - ref) <= 4 * np.finfo(float).eps * np.maximum(1.0, np.abs(ref)))
    assert out[-5] == 0.0


def test_row_extent_compiled_equals_array_code(rng):
    shifted = rng.uniform(0, 3, (50, 12)).round(1)          # ties and zeros
    shifted[:, 0] = 0.0
    shifted[7] = 0.0                                         # no positive entry
    spread, gap = rootfinding.row_extent(np, shifted)
    np.testing.assert_array_equal(spread, shifted.max(axis=1))
    np.testing.assert_array_equal(gap, np.where(shifted > 0, shifted, np.inf).min(axis=1))
    assert gap[7] == np.inf


@pytest.mark.parametrize("method", rootfinding.METHODS)
def test_compiled_cpu_solver_equals_array_reference(clusters, method):
    """rootfinding_cpu (the CPU path) against rootfinding.solve on the same rows."""
    sqdist, _ = ge.knn(clusters, 45, backend="cpu")
    shifted = sqdist - sqdist.min(axis=1, keepdims=True)
    K = np.random.default_rng(1).uniform(3, 30, len(clusters))
    lo, hi = rootfinding.log_beta_bounds(np, shifted, K)
    alpha0 = np.random.default_rng(2).uniform(lo, hi)
    rows = np.arange(0, len(clusters), 3)
    ref = rootfinding.solve(np, shifted[rows], LOG(K[rows]), alpha0[rows], lo[rows].copy(),
                            hi[rows].copy(), method, 1e-10)
    out = rootfinding_cpu.solve(shifted, rows, LOG(K[rows]), alpha0[rows], lo[rows], hi[rows],
                                method, 1e-10)
    np.testing.assert_allclose(out[0], ref[0], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(out[1], LOG(K[rows]), atol=1e-10)
    assert (out[2] == ref[2]).mean() > 0.98


@pytest.mark.gpu
@pytest.mark.parametrize("order", ["dk", "mst", "bounds"])
def test_gpu_equals_cpu(clusters, order):
    cpu = ge.entropic_affinities(clusters, 15.0, order=order, backend="cpu")
    be = ge.get_backend("gpu")
    gpu = ge.entropic_affinities(be.asarray(clusters), 15.0, order=order, backend=be)
    np.testing.assert_allclose(be.to_host(gpu.beta), cpu.beta, rtol=1e-8)
    np.testing.assert_allclose(be.to_host(gpu.entropy), LOG(15.0), atol=1e-10)
    np.testing.assert_allclose(be.to_host(gpu.P).toarray(), cpu.P.toarray(), rtol=1e-7, atol=1e-15)


@pytest.mark.gpu
def test_gpu_given_sequence_equals_cpu():
    """A raster order given as a device array: its waves are built on the device."""
    X = pixel_features()
    be = ge.get_backend("gpu")
    raster = ge.affinities.raster_order(30, 40)
    cpu = ge.entropic_affinities(X, 15.0, order=raster, backend="cpu")
    gpu = ge.entropic_affinities(be.asarray(X), 15.0, order=be.asarray(raster), backend=be)
    np.testing.assert_allclose(be.to_host(gpu.beta), cpu.beta, rtol=1e-8)
    np.testing.assert_allclose(be.to_host(gpu.n_iter).mean(), cpu.n_iter.mean(), atol=0.05)


@pytest.mark.gpu
def test_gpu_rows_longer_than_the_kernel_takes_equal_cpu():
    """Rows of more than rootfinding.KERNEL_MAX_K neighbours (the kernel's
    per-lane arrays would spill) are solved by the array code on the GPU."""
    from gpuembed.affinities.rootfinding import KERNEL_MAX_K

    X = np.random.default_rng(0).standard_normal((KERNEL_MAX_K + 40, 5))
    sqdist, indices = ge.knn(X, KERNEL_MAX_K + 10, backend="cpu")
    cpu = ge.entropic_affinities(None, 300.0, neighbors=(sqdist, indices), backend="cpu")
    be = ge.get_backend("gpu")
    gpu = ge.entropic_affinities(None, 300.0, backend=be,
                                 neighbors=(be.asarray(sqdist), be.asarray(indices)))
    np.testing.assert_allclose(be.to_host(gpu.beta), cpu.beta, rtol=1e-8)
    np.testing.assert_allclose(be.to_host(gpu.entropy), LOG(300.0), atol=1e-10)


@pytest.mark.gpu
def test_gpu_precomputed_neighbors_and_perplexity_array(clusters):
    """Neighbours given as device arrays, one perplexity per point, row-conditional P."""
    be = ge.get_backend("gpu")
    sqdist, indices = ge.knn(clusters, 40, backend="cpu")
    K = np.random.default_rng(0).uniform(5.0, 12.0, len(clusters))
    cpu = ge.entropic_affinities(None, K, neighbors=(sqdist, indices), symmetrize=False,
                                 backend="cpu")
    gpu = ge.entropic_affinities(None, be.asarray(K), symmetrize=False, backend=be,
                                 neighbors=(be.asarray(sqdist), be.asarray(indices)))
    np.testing.assert_allclose(be.to_host(gpu.beta), cpu.beta, rtol=1e-8)
    np.testing.assert_allclose(be.to_host(gpu.entropy), LOG(K), atol=1e-10)
    np.testing.assert_allclose(be.to_host(gpu.P).toarray(), cpu.P.toarray(), rtol=1e-7, atol=1e-15)


@pytest.mark.gpu
@pytest.mark.parametrize("method", rootfinding.METHODS)
def test_gpu_kernel_equals_array_reference(clusters, method):
    """kernels/entropic.cu against rootfinding.solve on the same rows (float64)."""
    be = ge.get_backend("gpu")
    xp = be.xp
    sqdist, _ = ge.knn(clusters, 45, backend="cpu")
    shifted = sqdist - sqdist.min(axis=1, keepdims=True)
    K = np.random.default_rng(1).uniform(3, 30, len(clusters))
    lo, hi = rootfinding.log_beta_bounds(np, shifted, K)
    alpha0 = np.random.default_rng(2).uniform(lo, hi)
    ref = rootfinding.solve(np, shifted, LOG(K), alpha0, lo.copy(), hi.copy(), method, 1e-10)
    rows = xp.arange(len(clusters))
    out = rootfinding.solve_kernel(be, be.asarray(shifted), rows, be.asarray(LOG(K)),
                                   be.asarray(alpha0), be.asarray(lo), be.asarray(hi), method,
                                   1e-10)
    np.testing.assert_allclose(be.to_host(out[0]), ref[0], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(be.to_host(out[1]), LOG(K), atol=1e-10)
    # Identical steps, so identical evaluation counts except for rare last-bit ties.
    assert (be.to_host(out[2]) == ref[2]).mean() > 0.98


def test_affinities_equal_whether_compiled_or_loaded_from_numba_cache(numba_cache_runs,
                                                                     tmp_path):
    """The root finding's compiled code, freshly compiled (an empty numba cache)
    or loaded from the cache, gives the same bits: with fastmath's reassociation
    in _entropy_terms the first process after an install differed from the rest."""
    script = ("import hashlib, numpy as np, gpuembed as ge\n"
              "X = np.random.default_rng(0).standard_normal((400, 10))\n"
              "A = ge.entropic_affinities(X, 20.0, backend='cpu')\n"
              "print(hashlib.sha1(A.P.data.tobytes() + A.beta.tobytes()).hexdigest())\n")
    first, second = numba_cache_runs(script)
    assert any(tmp_path.rglob("*.nbi"))             # the second run had a cache to load
    assert first == second


def test_perplexity_above_the_point_count_says_so():
    X = np.random.default_rng(0).standard_normal((20, 3))
    with pytest.raises(ValueError, match=r"N - 1 = 19: 20 points have no more neighbours"):
        ge.TSNE(backend="cpu").fit(X)                  # perplexity 30
