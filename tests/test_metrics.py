import numpy as np
import pytest

import gpuembed as ge
from gpuembed.metrics import knn_accuracy


def brute_knn_accuracy(Y, labels, k):
    D = ((Y[:, None] - Y[None]) ** 2).sum(-1)
    np.fill_diagonal(D, np.inf)
    correct = 0
    for i in range(len(Y)):
        nb = np.argsort(D[i], kind="stable")[:k]
        counts = np.bincount(labels[nb], minlength=labels.max() + 1)
        correct += counts.argmax() == labels[i]
    return correct / len(Y)


def test_knn_accuracy_matches_brute_force(rng, backend):
    Y = rng.standard_normal((200, 2))
    labels = (Y[:, 0] > 0).astype(int) + 2 * (rng.random(200) < 0.2)
    # Device arrays in, as a GPU optimizer's layout would come.
    got = knn_accuracy(backend.asarray(Y), backend.asarray(labels), k=7, backend=backend)
    assert got == pytest.approx(brute_knn_accuracy(Y, labels, 7))


def test_clustering_error_against_a_loop(rng, backend):
    """1 - purity: each cluster's majority class counts as right (section 4.8.4)."""
    labels = rng.choice(["a", "b", "c"], 500)
    clusters = rng.integers(0, 7, 500) * 3 - 5
    expected = 0
    for c in np.unique(clusters):
        members = labels[clusters == c]
        expected += (members != max(sorted(set(members)), key=list(members).count)).sum()
    assert ge.metrics.clustering_error(labels, backend.asarray(clusters)) == pytest.approx(
        expected / 500, abs=1e-15)
    assert ge.metrics.clustering_error(clusters, clusters) == 0.0
    assert ge.metrics.clustering_error([0, 0, 1, 1], [5, 5, 5, 5]) == 0.5
    assert ge.metrics.clustering_error([0, 1, 2, 3], [0, 1, 2, 3]) == 0.0
    with pytest.raises(ValueError, match="labels and clusters"):
        ge.metrics.clustering_error(labels, clusters[:-1])
    with pytest.raises(ValueError, match="clusters contains NaN at 1 point"):
        ge.metrics.clustering_error([0, 0, 1], [0.0, np.nan, 1.0])


@pytest.mark.parametrize("dim", [1, 2, 3, 4, 12])
def test_knn_accuracy_ties_and_duplicates_match_brute_force(rng, dim):
    """Exact copies of points and points at equal distances from them, ordered
    by index as the brute force orders them (on the CPU a k-d tree up to 10-D, the
    backend's knn beyond; ties number less than k + CANDIDATE_MARGIN)."""
    Y = rng.standard_normal((300, dim))
    Y[100:104] = Y[0]                       # four copies of point 0
    for j, sign in enumerate((1.0, -1.0)):  # and points at distance 0.01 on either side
        Y[110 + j] = Y[0]
        Y[110 + j, 0] += sign * 0.01
    Y[200:203] = Y[50]
    labels = rng.integers(0, 3, 300)
    for k in (1, 5, 15):
        assert knn_accuracy(Y, labels, k=k) == pytest.approx(brute_knn_accuracy(Y, labels, k))


def test_knn_accuracy_bad_layout():
    with pytest.raises(ValueError, match="X_low"):
        knn_accuracy(np.array([[0.0, 1.0], [np.nan, 0.0], [1.0, 1.0]]), np.zeros(3), k=1)


def test_knn_accuracy_extremes(rng):
    Y = np.concatenate([rng.standard_normal((50, 2)), rng.standard_normal((50, 2)) + 100])
    labels = np.repeat([0, 1], 50)
    assert knn_accuracy(Y, labels) == 1.0
    odd = labels.copy()
    odd[0] = 1        # one mislabelled point in cluster 0: only it is misclassified
    assert knn_accuracy(Y, odd) == 0.99


def test_knn_accuracy_bad_labels():
    with pytest.raises(ValueError, match="labels"):
        knn_accuracy(np.zeros((10, 2)), np.zeros(9))
    # A 2-D array of one row per point (gpuembed embed --labels data.npy) failed inside
    # NumPy's scatter with a shape mismatch.
    with pytest.raises(ValueError, match=r"labels must be a 1-D array \(N,\), N >= 1, got shape "
                                         r"\(10, 5\)"):
        knn_accuracy(np.zeros((10, 2)), np.zeros((10, 5)))
    # NaN, a missing label, had been a class of its own (NumPy's unique).
    with pytest.raises(ValueError, match=r"labels contains NaN at 2 point\(s\)"):
        knn_accuracy(np.zeros((10, 2)), np.r_[np.nan, np.nan, np.zeros(8)])


from gpuembed.metrics import auc_rnx, coranking, log_k_auc, procrustes_error, rnx  # noqa: E402


def brute_coranking(Xh, Xl):
    """Ranks by full sorting of the N x N distance matrices."""
    n = len(Xh)
    Q = np.zeros((n - 1, n - 1), dtype=int)
    for i in range(n):
        dh = ((Xh - Xh[i]) ** 2).sum(1)
        dl = ((Xl - Xl[i]) ** 2).sum(1)
        dh[i] = dl[i] = np.inf
        rho = np.empty(n, int)
        r = np.empty(n, int)
        rho[np.argsort(dh, kind="stable")] = np.arange(1, n + 1)
        r[np.argsort(dl, kind="stable")] = np.arange(1, n + 1)
        for j in range(n):
            if j != i:
                Q[rho[j] - 1, r[j] - 1] += 1
    return Q


def rnx_from_coranking(Q):
    n = Q.shape[0] + 1
    K = np.arange(1, n - 1)
    overlap = np.array([Q[:k, :k].sum() for k in K])
    return ((n - 1) * overlap / (K * n) - K) / (n - 1 - K)


def test_coranking_and_rnx_against_brute_force(rng, backend):
    Xh = rng.standard_normal((40, 5))
    Xl = Xh[:, :2] + 0.3 * rng.standard_normal((40, 2))
    Q = coranking(Xh, Xl)
    np.testing.assert_array_equal(Q, brute_coranking(Xh, Xl))
    assert (Q.sum(axis=0) == 40).all() and (Q.sum(axis=1) == 40).all()
    R = rnx_from_coranking(Q)
    np.testing.assert_allclose(rnx(Xh, Xl, backend=backend), R, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(rnx(Xh, Xl, k_max=7, backend=backend), R[:7], rtol=1e-12)


def test_identical_spaces_score_one(rng):
    X = rng.standard_normal((200, 3))
    np.testing.assert_allclose(rnx(X, X), 1.0)
    assert auc_rnx(X, 10 * X + 3) == pytest.approx(1.0)


def test_random_embedding_scores_near_zero(rng):
    Xh = rng.standard_normal((600, 10))
    Xl = rng.standard_normal((600, 2))
    assert abs(auc_rnx(Xh, Xl)) < 0.03


def test_auc_is_log_k_weighted(rng):
    Xh = rng.standard_normal((100, 6))
    Xl = Xh[:, :2]
    R = rnx(Xh, Xl)
    w = 1 / np.arange(1, 99)
    assert auc_rnx(Xh, Xl) == pytest.approx((R * w).sum() / w.sum())
    assert auc_rnx(Xh, Xl) != pytest.approx(R.mean())


def test_procrustes_error(rng):
    X = rng.standard_normal((50, 3))
    c, s = np.cos(0.7), np.sin(0.7)
    R = np.array([[c, -s, 0], [s, c, 0], [0, 0, -1.0]])       # rotation and reflection
    assert procrustes_error(X, 2.5 * X @ R + 4.0) < 1e-12
    noisy = X + 0.1 * rng.standard_normal(X.shape)
    assert 0.02 < procrustes_error(X, noisy) < 0.2


def test_metric_bad_input(rng):
    X = rng.standard_normal((20, 3))
    with pytest.raises(ValueError, match="rows"):
        rnx(X, X[:10])
    with pytest.raises(ValueError, match="k_max"):
        rnx(X, X, k_max=19)
    with pytest.raises(ValueError, match="NaN"):
        auc_rnx(np.full_like(X, np.nan), X)
    with pytest.raises(ValueError, match="max_n"):
        coranking(X, X, max_n=10)
    with pytest.raises(ValueError, match="shape"):
        procrustes_error(X, X[:, :2])
    with pytest.raises(ValueError, match="not all one point"):
        procrustes_error(X, np.ones_like(X))
    with pytest.raises(ValueError, match="R contains NaN"):
        log_k_auc(np.array([np.nan, 1.0]))
    with pytest.raises(ValueError, match="R must be a non-empty 1-D array"):
        log_k_auc(np.ones((2, 2)))


@pytest.mark.parametrize("block_rows", [None, 7])
def test_rnx_with_ties_and_duplicates_against_brute_force(rng, backend, monkeypatch, block_rows):
    """Integer coordinates make many distances equal (and some points coincide):
    ranks break ties by index, in the full sort and across the k-th place of
    the partial one (k_max = 10: a partition of the 59 others first), in any
    blocking of the rows."""
    import gpuembed.metrics as metrics

    if block_rows:
        monkeypatch.setattr(metrics, "BLOCK_BYTES", 8 * 60 * block_rows)
    Xh = rng.integers(0, 3, (60, 4)).astype(float)
    Xl = rng.integers(0, 4, (60, 2)).astype(float)
    Q = coranking(Xh, Xl)
    np.testing.assert_array_equal(Q, brute_coranking(Xh, Xl))
    R = rnx_from_coranking(Q)
    np.testing.assert_allclose(rnx(Xh, Xl, backend=backend), R, rtol=1e-12, atol=1e-12)
    for k_max in (10, 20):
        np.testing.assert_allclose(rnx(Xh, Xl, k_max=k_max, backend=backend), R[:k_max],
                                   rtol=1e-12, atol=1e-12)


def test_rnx_does_not_depend_on_the_number_of_threads():
    """The ranks' distance products of float32 rows in fixed tiles
    (_sparse.BlockProducts): on OpenBLAS's 1 and 2 threads R_NX differed by 3e-6
    on these data, through ties in the ranks."""
    import numba
    import threadpoolctl

    rng = np.random.default_rng(0)
    X = rng.random((1500, 300)).astype(np.float32) ** 4
    Y = rng.standard_normal((1500, 2))
    threads = numba.get_num_threads()
    curves = []
    try:
        for numba_threads, blas_threads in ((threads, 2), (threads, 1), (1, 2)):
            numba.set_num_threads(numba_threads)
            with threadpoolctl.threadpool_limits(blas_threads, user_api="blas"):
                curves.append(rnx(X, Y))
    finally:
        numba.set_num_threads(threads)
    for curve in curves[1:]:
        np.testing.assert_array_equal(curve, curves[0])


@pytest.mark.parametrize("space", ["high", "low"])
def test_rnx_of_float32_rows_far_from_the_origin(rng, backend, space):
    """Distances by GEMM round to eps |x|^2: float32 rows 1e4 from the origin
    (float64 ones 1e7) lose the differences of neighbours 1 apart.  The rows are
    centred first, so moving either space changes nothing beyond the rounding
    of the rows themselves."""
    Xh = rng.standard_normal((400, 8))
    Xl = Xh[:, :2] + 0.5 * rng.standard_normal((400, 2))
    exact = rnx(Xh, Xl)
    for offset, dtype, atol in ((1e4, np.float32, 0.01), (1e7, np.float64, 1e-3)):
        moved = (Xh + offset, Xl) if space == "high" else (Xh, Xl + offset)
        far = rnx(*(X.astype(dtype) for X in moved), backend=backend)
        np.testing.assert_allclose(far, exact, atol=atol)


@pytest.mark.parametrize("space", ["high", "low"])
@pytest.mark.parametrize("offset,dtype", [(3e3, np.float32), (3e9, np.float64)])
def test_rnx_of_groups_far_apart_against_brute_force(rng, backend, space, offset, dtype):
    """Two groups of unit spread ``offset`` from their mean on either side, which
    centring cannot bring nearer: GEMM distances round to eps |x|^2, more than the
    groups' own neighbour distances, and ranked the rows wrongly (R_NX off by 0.015
    to 0.56).  Such rows are computed again in float64, and where float64 cannot vouch
    for them either, coordinate by coordinate: the ranks of the rows as given."""
    def groups(dim):
        return np.concatenate([c + rng.standard_normal((60, dim)) for c in (offset, -offset)])
    Xh, Xl = groups(8), groups(2)
    if space == "high":
        Xh = Xh.astype(dtype)
    else:
        Xl = Xl.astype(dtype)
    R = rnx_from_coranking(brute_coranking(Xh.astype(np.float64), Xl.astype(np.float64)))
    np.testing.assert_allclose(rnx(Xh, Xl, backend=backend), R, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rnx(Xh, Xl, k_max=5, backend=backend), R[:5], rtol=0, atol=1e-12)


def test_rnx_of_sparse_rows_far_from_the_origin(rng):
    """Sparse rows stay uncentred: stored 3e3 from the origin in two groups (every
    value stored), their float32 GEMM ranks come out wrong as dense ones' do, and
    the float64 GEMM of the rows answers."""
    import scipy.sparse

    Xh = np.concatenate([c + rng.standard_normal((60, 8)) for c in (3e3, -3e3)])
    Xl = rng.standard_normal((120, 2))
    R = rnx_from_coranking(brute_coranking(Xh.astype(np.float32).astype(np.float64), Xl))
    sparse = scipy.sparse.csr_matrix(Xh.astype(np.float32))
    np.testing.assert_allclose(rnx(sparse, Xl), R, rtol=0, atol=1e-12)


def test_rnx_of_ordinary_rows_takes_the_gemm_alone(rng, monkeypatch):
    """Float32 rows whose spread is not small against their neighbour distances
    (and a float32 layout), with two outliers 1e4 away: no row but the outliers'
    goes again (their far norms bound the rounding only of points as far)."""
    import gpuembed.metrics as metrics

    precise_rows = metrics._Space.precise_rows

    def only_outliers(self, rows):
        assert (rows < 2).all(), f"rows {rows} computed again"
        return precise_rows(self, rows)
    monkeypatch.setattr(metrics._Space, "precise_rows", only_outliers)
    Xh = (rng.standard_normal((400, 30)) + 5).astype(np.float32)
    Xh[:2] = 1e4
    rnx(Xh, (Xh[:, :2] + rng.standard_normal((400, 2))).astype(np.float32))
