import numpy as np
import pytest
import scipy.sparse
import scipy.spatial

import gpuembed as ge


def brute_knn(X, k):
    """Full N x N reference in float64, self excluded, ties ordered by index."""
    X = np.asarray(X, dtype=np.float64)
    D = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(D, np.inf)
    return best_by_distance_then_index(D, k)


def best_by_distance_then_index(D, k):
    """(distances, columns) of each row's k smallest entries of D, ties by column."""
    order = np.lexsort((np.broadcast_to(np.arange(D.shape[1]), D.shape), D), axis=1)[:, :k]
    return np.take_along_axis(D, order, axis=1), order


def assert_same_neighbours(X, idx, ref_d, ref_i, dtype):
    """idx equals brute_knn's ref_i; in float32, two neighbours whose float64
    distances differ by less than float32 resolves (a few ulps) may come in either
    order: every returned index must then lie, in float64, at its rank's reference
    distance, and no index may repeat or be the row itself."""
    if dtype == np.float64:
        np.testing.assert_array_equal(idx, ref_i)
        return
    X = np.asarray(X, dtype=np.float64)
    rows = np.arange(len(idx))[:, None]
    true = ((X[idx] - X[rows]) ** 2).sum(-1)
    np.testing.assert_allclose(true, ref_d, rtol=4 * np.finfo(np.float32).eps, atol=0)
    assert (np.sort(idx, axis=1)[:, 1:] != np.sort(idx, axis=1)[:, :-1]).all()
    assert (idx != rows).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,d,k", [(50, 3, 5), (300, 20, 17), (257, 2, 1), (40, 5, 39),
                                   (300, 10, 17), (200, 11, 9)])
def test_knn_matches_brute_force(backend, rng, dtype, n, d, k):
    """The exact k-NN, which leaves the points as they were (the search centres,
    permutes and scales its own copy of them in place)."""
    X = rng.standard_normal((n, d)).astype(dtype) * 3 + 10  # offset: cancellation matters
    ref_d, ref_i = brute_knn(X, k)
    X_dev = be_x(backend, X)
    sqdist, idx = ge.knn(X_dev, k, backend=backend)
    sqdist, idx = backend.to_host(sqdist), backend.to_host(idx)
    assert sqdist.dtype == dtype and idx.dtype == np.int64 and sqdist.shape == (n, k)
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(sqdist, ref_d, rtol=rtol)
    np.testing.assert_array_equal(idx, ref_i)
    ge.neighbors.knn_query(X_dev[:5], X_dev, k, backend=backend)
    np.testing.assert_array_equal(backend.to_host(X_dev), X)


def be_x(backend, X):
    return backend.asarray(X)


@pytest.mark.parametrize("d,n", [(2, 200), (12, 200), (12, 1500)])   # the k-d tree, the GEMM
def test_small_blocks_give_the_same_answer(rng, d, n):
    """Many blocks, the last one partial; at 1,500 points the strips' transposed
    halves span several of offer_strip's column chunks (COLUMN_CHUNK).  The same
    neighbours; the distances to the GEMM's rounding, which moves with the block."""
    X = rng.standard_normal((n, d))
    X[150] = X[3]                               # a copy: self must go wherever it lies
    full = ge.knn(X, 7, backend="cpu")
    # 8 rows per block (the tree: 25 for d = 2).
    blocked = ge.knn(X, 7, backend="cpu", block_bytes=n * 8 * 8)
    np.testing.assert_array_equal(full[1], blocked[1])
    np.testing.assert_allclose(full[0], blocked[0], rtol=1e-12)
    ref_d, ref_i = brute_knn(X, 7)
    np.testing.assert_array_equal(blocked[1], ref_i)


@pytest.mark.parametrize("b", [37, 600])
def test_offer_strip_keeps_each_points_nearest(rng, b):
    """After the strips of all blocks of b rows, every point's heap holds exactly
    its m nearest other points: the strips' rows offer to their own heaps, their
    transposed halves (several COLUMN_CHUNKs wide) to the columns'."""
    from gpuembed.neighbors_cpu import COLUMN_CHUNK, offer_strip
    n, m = 1500, 20
    assert n - b > COLUMN_CHUNK
    Y = rng.standard_normal((n, 5))
    sq = (Y * Y).sum(axis=1)
    values, indices = np.full((n, m), np.inf), np.full((n, m), -1, dtype=np.int64)
    for start in range(0, n, b):
        offer_strip(Y[start:start + b] @ Y[start:].T, sq, start, values, indices)
    D = ((Y[:, None] - Y[None]) ** 2).sum(axis=-1)
    np.fill_diagonal(D, np.inf)
    want = np.sort(np.argsort(D, axis=1)[:, :m], axis=1)
    np.testing.assert_array_equal(np.sort(indices, axis=1), want)
    np.testing.assert_allclose(np.sort(values, axis=1), np.sort(D, axis=1)[:, :m], atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_all_points_knn_equals_the_query_path(rng, dtype):
    # knn on the CPU selects from the upper triangle of the distance matrix (both
    # rows of each strip entry); knn_query from full rows.  Points on a line in
    # increasing order: every earlier point is farther than the later ones, the
    # order that would keep a candidate heap busiest without knn's shuffle.
    line = np.sort(rng.random(500))[:, None] * np.ones((1, 3))
    blobs = rng.standard_normal((700, 30)) * 2 + 5
    for X in (line, blobs):
        X = X.astype(dtype)
        k = 12
        got = ge.knn(X, k, backend="cpu", block_bytes=X.shape[0] * 37 * X.dtype.itemsize)
        d, i = ge.neighbors.knn_query(X, X, k + 1, backend="cpu")
        ref_d, ref_i = brute_knn(X, k)
        np.testing.assert_array_equal(got[1], ref_i)
        np.testing.assert_allclose(got[0], ref_d, rtol=1e-4 if dtype == np.float32 else 1e-10,
                                   atol=1e-6)
        np.testing.assert_allclose(got[0], d[:, 1:], rtol=1e-4 if dtype == np.float32 else 1e-10,
                                   atol=1e-6)


def test_duplicates_are_neighbours_at_distance_zero(backend, rng):
    base = rng.standard_normal((30, 6)) * 100 + 1000
    X = np.concatenate([base, base[:10], base[:10]])  # points 0-9 appear three times
    sqdist, idx = (backend.to_host(a) for a in ge.knn(backend.asarray(X), 3, backend=backend))
    for i in range(10):
        assert sqdist[i, 0] == 0.0 and sqdist[i, 1] == 0.0
        assert list(idx[i, :2]) == [30 + i, 40 + i]   # ties ordered by index, self excluded
        assert sqdist[i, 2] > 0
    assert (idx != np.arange(len(X))[:, None]).all()


def test_ties_on_a_grid(backend):
    # Integer grid: many exactly equal distances; order must be (distance, index).
    g = np.arange(6.0)
    X = np.array([(a, b) for a in g for b in g])
    ref_d, ref_i = brute_knn(X, 8)
    sqdist, idx = (backend.to_host(a) for a in ge.knn(backend.asarray(X), 8, backend=backend))
    np.testing.assert_array_equal(sqdist, ref_d)
    np.testing.assert_array_equal(idx, ref_i)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [1, 7, 40])
def test_compiled_sort_orders_candidates_by_distance_then_index(rng, dtype, k):
    """neighbors_cpu.best_sorted against a lexsort: unordered candidates at a few
    distinct distances, so that runs of ties cross the k-th place; all 40 kept."""
    from gpuembed.neighbors_cpu import best_sorted
    dist = rng.integers(0, 4, (300, 40)).astype(dtype)
    cand = np.stack([rng.permutation(1000)[:40] for _ in range(300)])
    order = np.lexsort((cand, dist), axis=1)[:, :k]
    got_dist, got_cand = best_sorted(dist, cand, k)
    assert got_dist.dtype == dtype and got_cand.dtype == np.int64
    np.testing.assert_array_equal(got_dist, np.take_along_axis(dist, order, axis=1))
    np.testing.assert_array_equal(got_cand, np.take_along_axis(cand, order, axis=1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ties_before_rounding_on_a_grid_in_many_dimensions(backend, dtype, rng):
    # Integer points in 12-D (the GEMM path): dozens tied at each distance, which
    # the GEMM rounds apart.  The order within a tie and the cut through one follow
    # that rounding (module doc); each neighbour is still at its rank's distance.
    X = rng.integers(0, 3, (300, 12)).astype(dtype)
    ref_d, _ = brute_knn(X, 20)
    sqdist, idx = (backend.to_host(a) for a in ge.knn(backend.asarray(X), 20, backend=backend))
    true = ((X[idx].astype(np.float64) - X[:, None]) ** 2).sum(-1)
    np.testing.assert_array_equal(true, ref_d)
    np.testing.assert_allclose(sqdist, ref_d, rtol=1e-4 if dtype == np.float32 else 1e-10)
    assert (np.diff(np.sort(idx, axis=1), axis=1) > 0).all()
    assert (idx != np.arange(300)[:, None]).all()


def test_integer_input_becomes_float64():
    X = np.arange(20).reshape(10, 2)
    sqdist, idx = ge.knn(X, 2, backend="cpu")
    assert sqdist.dtype == np.float64
    np.testing.assert_array_equal(sqdist[0], [8.0, 32.0])


@pytest.mark.parametrize("k", [0, -1, 10, 11])
def test_bad_k(k):
    with pytest.raises(ValueError, match="n_neighbors"):
        ge.knn(np.random.default_rng(0).random((10, 2)), k, backend="cpu")


def test_k_not_integer():
    with pytest.raises(TypeError, match="n_neighbors"):
        ge.knn(np.zeros((10, 2)), 2.5, backend="cpu")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input(bad):
    X = np.random.default_rng(0).random((10, 2))
    X[3, 1] = bad
    with pytest.raises(ValueError, match="NaN or infinite"):
        ge.knn(X, 2, backend="cpu")


def test_spread_beyond_the_dtype():
    """Squared distances past the dtype's range were inf, and the entropic
    affinities then failed inside numba (SystemError); a shifted but narrow set
    is fine, since distances are taken about the mean."""
    X = np.random.default_rng(0).standard_normal((50, 3))
    for Z in ((X * 1e20).astype(np.float32), X * 1e160):
        with pytest.raises(ValueError, match="rescale"):
            ge.knn(Z, 5, backend="cpu")
        with pytest.raises(ValueError, match="rescale"):
            ge.TSNE(perplexity=5, backend="cpu").fit(Z)
    sqdist, _ = ge.knn((X * 1e16 + 1e20).astype(np.float32), 5, backend="cpu")
    assert np.isfinite(sqdist).all() and sqdist.max() > 1e30


@pytest.mark.parametrize("shape", [(10,), (2, 3, 4)])
def test_not_2d(shape):
    with pytest.raises(ValueError, match="2-D"):
        ge.knn(np.zeros(shape), 2, backend="cpu")


def test_one_point():
    with pytest.raises(ValueError, match="at least 2 samples"):
        ge.knn(np.zeros((1, 3)), 1, backend="cpu")



@pytest.fixture
def mixed_precision(monkeypatch):
    """The float64 search by float32 candidates (neighbors._mixed_precision_knn)
    at any size; returns the list of the row sets it searched again in float64."""
    monkeypatch.setattr(ge.neighbors, "MIXED_MIN_RATIO", 0)
    monkeypatch.setattr(ge.neighbors, "MIXED_MIN_QUERIES", 1)
    searched_again = []
    again = ge.neighbors._rows_in_float64

    def spy(be, Q, X, rows, *args):
        searched_again.append(rows.copy())
        return again(be, Q, X, rows, *args)
    monkeypatch.setattr(ge.neighbors, "_rows_in_float64", spy)
    return searched_again


@pytest.mark.parametrize("n,d,k", [(300, 20, 17), (200, 11, 9), (400, 64, 30)])
def test_mixed_precision_matches_brute_force(mixed_precision, rng, n, d, k):
    X = rng.standard_normal((n, d)) * 3 + 10
    X[n // 2] = X[7]                            # a copy: at distance 0, self still left out
    ref_d, ref_i = brute_knn(X, k)
    sqdist, idx = ge.knn(X, k, backend="cpu")
    assert sqdist.dtype == np.float64 and idx.dtype == np.int64
    np.testing.assert_array_equal(idx, ref_i)
    np.testing.assert_allclose(sqdist, ref_d, rtol=1e-13)
    assert sqdist[7, 0] == 0.0 and idx[7, 0] == n // 2
    Q = np.concatenate([rng.standard_normal((30, d)) * 3 + 10, X[:5]])
    sqdist, idx = ge.neighbors.knn_query(Q, X, k, backend="cpu")
    ref_d, order = best_by_distance_then_index(((Q[:, None] - X[None]) ** 2).sum(-1), k)
    np.testing.assert_array_equal(idx, order)
    np.testing.assert_allclose(sqdist, ref_d, rtol=1e-13)
    assert (sqdist[-5:, 0] == 0).all() and list(idx[-5:, 0]) == [0, 1, 2, 3, 4]
    assert not mixed_precision          # float32 settles every row of such points


def test_mixed_precision_searches_unsettled_rows_again(mixed_precision, rng):
    # Two groups 2e4 apart in 12-D: float32 rounds the centred coordinates (about
    # 1e4) by about 1e-3, the spread of the tight group, so float32 cannot rank
    # its points' neighbours, and the bound must send those rows (and only those)
    # to the float64 search: the loose group's spread, 1e3, is well above the
    # float32 GEMM's rounding (about 2e3 in squared distances at these norms).  12
    # copies of one point, more than k + 1, put the row's own index beyond the
    # k + 1 nearest for the later copies.
    tight = 1e4 + 1e-3 * rng.standard_normal((60, 12))
    tight[48:] = tight[0]
    loose = -1e4 + 1e3 * rng.standard_normal((140, 12))
    X = np.concatenate([tight, loose])
    k = 5
    ref_d, ref_i = brute_knn(X, k)
    sqdist, idx = ge.knn(X, k, backend="cpu")
    np.testing.assert_array_equal(idx, ref_i)
    np.testing.assert_allclose(sqdist, ref_d, rtol=1e-9, atol=1e-12)
    (rows,) = mixed_precision
    np.testing.assert_array_equal(rows, np.arange(60))
    assert list(idx[59]) == [0, 48, 49, 50, 51] and (sqdist[59] == 0).all()
    # The same for queries: new points in the tight group, and one in the loose.
    Q = np.concatenate([tight[:3] + 1e-4, loose[:1]])
    sqdist, idx = ge.neighbors.knn_query(Q, X, k, backend="cpu")
    _, order = best_by_distance_then_index(((Q[:, None] - X[None]) ** 2).sum(-1), k)
    np.testing.assert_array_equal(idx, order)
    np.testing.assert_array_equal(mixed_precision[1], [0, 1, 2])


def test_mixed_precision_on_ties(mixed_precision, rng):
    # Points of a 0/1/2 grid in 12-D: integer squared distances, dozens of points
    # tied at each.  The distances come recomputed, so exactly; a row whose k-th
    # distance ties past its candidates is searched again, and there, as in the
    # float64 search, which of a tie larger than the candidate margin make the
    # cut is up to rounding: every index must lie at its rank's distance.
    X = rng.integers(0, 3, (300, 12)).astype(np.float64)
    ref_d, ref_i = brute_knn(X, 20)
    sqdist, idx = ge.knn(X, 20, backend="cpu")
    np.testing.assert_array_equal(sqdist, ref_d)
    np.testing.assert_array_equal(((X[idx] - X[:, None]) ** 2).sum(-1), ref_d)
    assert (np.diff(np.sort(idx, axis=1), axis=1) > 0).all()
    assert (idx != np.arange(300)[:, None]).all()
    (rows,) = mixed_precision
    settled = np.setdiff1d(np.arange(300), rows)
    assert 0 < len(rows) < 300
    np.testing.assert_array_equal(idx[settled], ref_i[settled])


def test_float64_points_take_the_mixed_search_by_default(rng, monkeypatch):
    # From MIXED_MIN_RATIO points per candidate (5 + 8 candidates: 2,600 points)
    # and MIXED_MIN_QUERIES queries.
    calls = []
    mixed = ge.neighbors._mixed_precision_knn
    monkeypatch.setattr(ge.neighbors, "_mixed_precision_knn",
                        lambda *args: calls.append(1) or mixed(*args))
    X = rng.standard_normal((2700, 16)) * 3 + 10
    D = scipy.spatial.distance.cdist(X, X, "sqeuclidean")
    np.fill_diagonal(D, np.inf)
    ref_d, ref_i = best_by_distance_then_index(D, 5)
    sqdist, idx = ge.knn(X, 5, backend="cpu")
    assert calls == [1]
    np.testing.assert_array_equal(idx, ref_i)
    np.testing.assert_allclose(sqdist, ref_d, rtol=1e-13)
    for few in (X[:2500], X.astype(np.float32)):     # too few points; float32 already
        ge.knn(few, 5, backend="cpu")
    assert calls == [1]
    ge.neighbors.knn_query(X[:500], X, 5, backend="cpu")    # from MIXED_MIN_QUERIES queries
    assert calls == [1, 1]
    ge.neighbors.knn_query(X[:499], X, 5, backend="cpu")
    ge.neighbors.knn_query(X, X[:2500], 5, backend="cpu")
    assert calls == [1, 1]


@pytest.mark.parametrize("scale", [1e19, 1.5e18])   # past float32's squares; within 2x
def test_mixed_precision_leaves_float32_range_alone(mixed_precision, rng, scale):
    # Squared distances past (or within rounding of) float32's range: the float64
    # search, as before, and no error from the float32 one.
    X = rng.standard_normal((100, 12)) * scale
    ref_d, ref_i = brute_knn(X, 4)
    sqdist, idx = ge.knn(X, 4, backend="cpu")
    np.testing.assert_array_equal(idx, ref_i)
    np.testing.assert_allclose(sqdist, ref_d, rtol=1e-10)
    assert not mixed_precision

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_equals_cpu(rng, dtype):
    X = rng.standard_normal((3000, 30)).astype(dtype)
    cpu = ge.knn(X, 25, backend="cpu")
    be = ge.get_backend("gpu")
    gpu = [be.to_host(a) for a in ge.knn(be.asarray(X), 25, backend=be)]
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-4 if dtype == np.float32 else 1e-10)
    assert (gpu[1] == cpu[1]).mean() > 0.999


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_knn_with_segmented_rows(rng, dtype, monkeypatch):
    """Blocks of 64 rows split into 4 column segments each (segments as short as
    4 columns per selected one, so that 600 points need them), the points
    themselves excluded and ties ordered by index as on the CPU."""
    from gpuembed import neighbors

    monkeypatch.setattr(neighbors, "SEGMENT_COLUMNS", 4)
    X = rng.standard_normal((600, 10)).astype(dtype)
    X[500:510] = X[:10]                                    # duplicates: ties at distance 0
    cpu = ge.knn(X, 25, backend="cpu")
    be = ge.get_backend("gpu")
    gpu = [be.to_host(a) for a in ge.knn(be.asarray(X), 25, backend=be,
                                         block_bytes=64 * X.shape[0] * X.itemsize)]
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-4 if dtype == np.float32 else 1e-10)
    assert (gpu[1] == cpu[1]).mean() > 0.999
    assert gpu[1][5, 0] == 505 and gpu[1][505, 0] == 5


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m", [1, 7, 40])
def test_cpu_query_selection_against_sorting(rng, m, dtype):
    """The query path's compiled selection (a heap per row) against a full sort of
    D + offset: the m smallest values, their columns (any m of a tie at the m-th
    value), never the row's left-out column, the best one in row 0."""
    from gpuembed.neighbors import _select_cpu

    D = rng.random((7, 300)).astype(dtype)
    D[1] = np.round(D[1] * 4) / 4                         # ties
    offset = (np.round(rng.random(300) * 4) / 16).astype(dtype)
    skip = rng.integers(0, 300, 7)
    skip[-1] = -1
    skip[0] = np.argmin(D[0] + offset)
    full = D + offset
    full[np.arange(6), skip[:6]] = np.inf
    values, columns = _select_cpu(ge.get_backend("cpu"), D, offset, skip, m)
    assert values.dtype == dtype and columns.shape == (7, m)
    np.testing.assert_array_equal(values, np.take_along_axis(full, columns, 1))
    np.testing.assert_array_equal(np.sort(values, 1), np.sort(full, 1)[:, :m])
    assert not (columns == skip[:, None]).any()
    for r in range(7):
        if (full[r] == np.sort(full[r])[m - 1]).sum() == 1:
            assert set(columns[r]) == set(np.argsort(full[r], kind="stable")[:m])


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 7, 40])
def test_gpu_selection_kernel_equals_cpu_selection(rng, m):
    """kernels/knn_select.cu against _select_cpu, with rows whose m smallest
    entries all sit in one lane's columns (j = 5 mod 32), so that one lane's
    list supplies every winner, rows with ties, and columns fewer than 32 m; with
    enough columns the rows are split into segments (all sizes here but the
    smallest for m = 1 and 7, the largest for m = 40).  The column offsets are
    added as the kernel reads, and each row but the last leaves out one column,
    the best one in rows 0 and 2."""
    from gpuembed.neighbors import SEGMENT_COLUMNS, _select_cpu, _select_gpu

    be = ge.get_backend("gpu")
    for n in (2000, 20 * m + 3, 3 * SEGMENT_COLUMNS * m + 17):
        D = rng.random((9, n))
        D[0, 5::32][:m] = -1.0 - rng.random(min(m, len(D[0, 5::32])))
        D[1] = np.round(D[1] * 4) / 4                     # ties, broken by column
        offset = np.round(rng.random(n) * 4) / 16
        skip = rng.integers(0, n, 9)
        skip[-1] = -1
        for r in (0, 2):
            skip[r] = np.argmin(D[r] + offset)
        values, columns = (be.to_host(a) for a in _select_gpu(
            be, be.asarray(D), be.asarray(offset), be.asarray(skip), m))
        full = D + offset
        full[np.arange(8), skip[:8]] = np.inf
        want_values, want = _select_cpu(be, D.copy(), offset, skip, m)
        np.testing.assert_array_equal(values, np.take_along_axis(full, columns, 1))
        np.testing.assert_array_equal(values, np.sort(values, axis=1))
        np.testing.assert_array_equal(values, np.sort(want_values, axis=1))
        got, want = np.sort(columns, axis=1), np.sort(want, axis=1)
        assert not (got == skip[:, None]).any()
        if (full[1] == np.sort(full[1])[m - 1]).sum() > 1:   # CPU keeps any m of a tie
            got, want = got[[0, *range(2, 9)]], want[[0, *range(2, 9)]]
        np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("m,dtype,warps", [(600, np.float64, 3), (1500, np.float32, 1),
                                           (2100, np.float32, 0)])
def test_gpu_selection_of_many_columns(rng, m, dtype, warps):
    """Lists of m pairs leave room in 48 KiB of shared memory for fewer warps per
    block (3 or 1 here); where not even one fits (2,100 pairs) whole rows are
    sorted.  Ties at 1/8 spacing are broken by column index; row 0 leaves out
    column 7."""
    from gpuembed.neighbors import _select_gpu, _warps_per_block

    assert _warps_per_block(m) == warps
    be = ge.get_backend("gpu")
    D = (np.round(rng.random((6, 3 * m)) * 8) / 8).astype(dtype)
    offset = np.zeros(3 * m, dtype)
    offset[::2] = 0.125
    skip = np.full(6, -1)
    skip[0] = 7
    values, got = (be.to_host(a) for a in _select_gpu(
        be, be.asarray(D), be.asarray(offset), be.asarray(skip), m))
    full = D + offset
    full[0, 7] = np.inf
    want = np.lexsort((np.broadcast_to(np.arange(3 * m), D.shape), full), axis=1)[:, :m]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(values, np.take_along_axis(full, want, 1))


def test_knn_query_matches_brute_force(backend, rng):
    X = rng.standard_normal((300, 7))
    Q = np.concatenate([rng.standard_normal((40, 7)), X[:5]])   # includes training points
    sqdist, idx = (backend.to_host(a) for a in ge.neighbors.knn_query(
        backend.asarray(Q), backend.asarray(X), 6, backend=backend))
    D = ((Q[:, None] - X[None]) ** 2).sum(-1)
    order = np.lexsort((np.broadcast_to(np.arange(300), D.shape), D), axis=1)[:, :6]
    np.testing.assert_array_equal(idx, order)
    np.testing.assert_allclose(sqdist, np.take_along_axis(D, order, 1), rtol=1e-10, atol=1e-12)
    assert (sqdist[-5:, 0] == 0).all() and list(idx[-5:, 0]) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_knn_query_centres_its_queries_in_blocks(backend, rng, dtype, monkeypatch):
    """Dense queries in more than TREE_MAX_DIM features are centred a block of
    QUERY_BLOCK_BYTES at a time (no centred copy of them all): blocks of 3 rows,
    the last one partial, give the default's one block's neighbours, and its
    distances up to the GEMM's last bits, those of the centred norms it adds (BLAS
    may round a block's edge rows apart: 1 ulp on 3 of LLL's 70,000 queries of
    Fashion-MNIST; cuBLAS on an H200, 8 ulp of a distance of 4 beside norms of
    about 20)."""
    X = rng.standard_normal((300, 16)).astype(dtype) + 5.0
    Q = np.concatenate([rng.standard_normal((40, 16)), X[:4]]).astype(dtype) + 0.5
    search = lambda: [backend.to_host(a) for a in ge.neighbors.knn_query(
        backend.asarray(Q), backend.asarray(X), 6, backend=backend)]
    whole = search()
    monkeypatch.setattr(ge.neighbors, "QUERY_BLOCK_BYTES", 3 * 16 * np.dtype(dtype).itemsize)
    blocked = search()
    np.testing.assert_array_equal(blocked[1], whole[1])
    # A pair's GEMM distance rounds at eps (|q|^2 + |x|^2), its centred norms.
    centre = X.mean(axis=0, dtype=np.float64)
    sq_q, sq_x = ((Q - centre) ** 2).sum(1), ((X - centre) ** 2).sum(1)
    bound = 4 * np.finfo(dtype).eps * (whole[0] + sq_q[:, None] + sq_x[whole[1]])
    assert (np.abs(blocked[0] - whole[0]) <= bound).all()
    D = ((Q[:, None].astype(np.float64) - X[None]) ** 2).sum(-1)
    order = np.lexsort((np.broadcast_to(np.arange(300), D.shape), D), axis=1)[:, :6]
    np.testing.assert_array_equal(blocked[1], order)
    np.testing.assert_allclose(blocked[0], np.take_along_axis(D, order, 1), rtol=1e-4)


def test_knn_query_rejects_queries_beyond_the_dtypes_squared_distances(backend):
    """The spread test of queries centred a block at a time (after their search)."""
    X = np.ones((50, 16), dtype=np.float32)
    X[::2] = -1.0
    Q = np.full((3, 16), 1e19, dtype=np.float32)
    with pytest.raises(ValueError, match="spreads too far"):
        ge.neighbors.knn_query(backend.asarray(Q), backend.asarray(X), 3, backend=backend)


def test_knn_query_bad_input():
    with pytest.raises(ValueError, match="features"):
        ge.neighbors.knn_query(np.zeros((3, 2)), np.zeros((10, 3)), 2, backend="cpu")


def test_column_means_of_float32_rows_far_from_the_origin(backend):
    """The centre of the k-NN searches' rows: NumPy sums a float32 array's rows one
    after another in float32, and over 40,000 integer rows moved 1e5 from the
    origin (exact in float32) its mean is more than a unit off, which the
    centred rows' norms then carry (Fashion-MNIST moved 1e4: the exact 30-NN took
    65 s instead of 24 s, the same neighbours).  column_means sums in float64 and
    rounds once."""
    from gpuembed._sparse import column_means

    be = ge.get_backend(backend)
    X = np.random.default_rng(0).integers(0, 4, (40000, 20)) + 1e5
    exact = X.mean(axis=0)
    X32 = X.astype(np.float32)
    assert np.abs(X32.mean(axis=0) - exact).max() > 1.0         # the drift it avoids
    means = be.to_host(column_means(be.xp, be.asarray(X32)))
    assert means.dtype == np.float32
    np.testing.assert_array_equal(means, exact.astype(np.float32))


@pytest.mark.parametrize("kind", ["sparse", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_recomputed_distances_are_taken_a_block_at_a_time(monkeypatch, rng, kind):
    """Candidates whose GEMM distances rounding could dominate are recomputed from
    their coordinates' differences, for sparse rows and on the GPU at most about
    block_bytes of them at a time (all at once, the 90-NN of Fashion-MNIST
    centred 9.9 off its mean was killed for memory at 24 GB; dense on the CPU
    they are compiled pair by pair); the same distances and neighbours as in one
    block.  Groups 2e3 apart whose spread is 1e-3 send every pair within a group
    there (in float64, where the GEMM still ranks them: float32 could not choose
    their candidates).  On the GPU the distances agree to rounding: CuPy's sums over
    a row's 40 squares take an order that depends on the block's row count (H200,
    1827a3e: one of 3,000 distances 2.4e-16 apart)."""
    X = np.concatenate([c + 1e-3 * rng.standard_normal((150, 40)) for c in (1e3, -1e3)])
    be = ge.get_backend("gpu" if kind == "gpu" else "cpu")
    data = scipy.sparse.csr_matrix(X) if kind == "sparse" else be.asarray(X)
    whole = ge.knn(data, 10, backend=be)
    sizes = []
    row_sqnorms = ge.neighbors.row_sqnorms

    def spy(xp, A):
        sizes.append(A.shape[0])
        return row_sqnorms(xp, A)
    monkeypatch.setattr(ge.neighbors, "row_sqnorms", spy)
    block_bytes = 3 * 40 * 8 * 100                 # 100 pairs' differences
    blocked = ge.knn(data, 10, backend=be, block_bytes=block_bytes)
    pairs = [s for s in sizes if s != X.shape[0]]  # the rest: the points' own norms
    assert len(pairs) > 10 and max(pairs) == 100
    rtol = 1e-15 if kind == "gpu" else 0.0          # about 4 units in the last place
    np.testing.assert_allclose(be.to_host(blocked[0]), be.to_host(whole[0]), rtol=rtol, atol=0)
    np.testing.assert_array_equal(be.to_host(blocked[1]), be.to_host(whole[1]))
    np.testing.assert_array_equal(be.to_host(blocked[1]), brute_knn(X, 10)[1])


@pytest.fixture
def searched_again(monkeypatch):
    """The rows the GEMM search could not vouch for, by the way they went again:
    {"recentred": [rows settled, on the host...], "float64": [rows...],
    "exactly": [rows...]} (neighbors._settle)."""
    calls = {"recentred": [], "float64": [], "exactly": []}
    for name, key in (("_rows_in_float64", "float64"), ("_rows_exactly", "exactly")):
        def spy(*args, _key=key, _again=getattr(ge.neighbors, name)):
            calls[_key].append(args[3].copy())
            return _again(*args)
        monkeypatch.setattr(ge.neighbors, name, spy, raising=False)

    def recentred(be, *args, _again=ge.neighbors._recentred):
        left = _again(be, *args)
        settled = np.setdiff1d(be.to_host(args[2]), be.to_host(left))
        if settled.size:
            calls["recentred"].append(settled)
        return left
    monkeypatch.setattr(ge.neighbors, "_recentred", recentred)
    return calls


def assert_queries_exact(backend, Q, X, k):
    """knn_query's k-NN of float32 Q among X: the float64 brute force's, in
    distances to float32's RTOL."""
    sqdist, idx = ge.neighbors.knn_query(backend.asarray(Q), backend.asarray(X), k,
                                         backend=backend)
    Q64, X64 = Q.astype(np.float64), X.astype(np.float64)
    ref_d, order = best_by_distance_then_index(((Q64[:, None] - X64[None]) ** 2).sum(-1), k)
    np.testing.assert_array_equal(backend.to_host(idx), order)
    np.testing.assert_allclose(backend.to_host(sqdist), ref_d, rtol=1e-4)


def far_apart_groups(rng, offset, dtype, n=150, d=20):
    """Two groups of unit spread ``offset`` from the origin on either side."""
    return np.concatenate([c + rng.standard_normal((n, d)) for c in (offset, -offset)]
                          ).astype(dtype)


def test_float32_groups_far_apart_go_again(backend, rng, searched_again):
    """Groups 3e3 from their mean in 20-D: centred squared norms of 1.8e8, which
    float32 resolves to about 2e1 (eps |x|^2), as much as the unit spread's squared
    neighbour distances: the GEMM chose wrong neighbours (95% of them, up to 2.6
    times as far as the true ones).  Every row's bound fails.  On the CPU the
    float64 search of all points answers (half the products of the rows'
    own); on the GPU the rows' search about centres of their own (600 rows,
    two groups).  For ten queries, too few for a group, their float64 search."""
    X = far_apart_groups(rng, 3e3, np.float32, n=300)
    ref_d, ref_i = brute_knn(X, 10)
    sqdist, idx = (backend.to_host(a) for a in ge.knn(backend.asarray(X), 10, backend=backend))
    assert sqdist.dtype == np.float32
    assert_same_neighbours(X, idx, ref_d, ref_i, np.float32)
    np.testing.assert_allclose(sqdist, ref_d, rtol=1e-4)
    if backend.is_gpu:
        (rows,) = searched_again["recentred"]
        np.testing.assert_array_equal(rows, np.arange(len(X)))
        searched_again["recentred"].clear()
    assert searched_again == {"recentred": [], "float64": [], "exactly": []}
    Q = X[::30] + np.float32(0.25)
    assert_queries_exact(backend, Q, X, 10)
    (rows,) = searched_again["float64"]
    np.testing.assert_array_equal(backend.to_host(rows), np.arange(len(Q)))


def test_float64_groups_far_apart_are_searched_exactly(backend, rng, searched_again):
    """Groups 3e9 from their mean: float64 resolves their squared norms (1.8e20) to
    about 4e4, and its GEMM chose wrong neighbours (94% of them).  No row settles,
    and 120 rows are too few for a group about its own centre (_recentred):
    every distance is then computed from the coordinates' differences, a few rows
    at a time."""
    X = far_apart_groups(rng, 3e9, np.float64, n=60)
    ref_d, ref_i = brute_knn(X, 7)
    block_bytes = 5 * 8 * 120 * 4               # four rows of the 120 points' distances
    sqdist, idx = ge.knn(backend.asarray(X), 7, backend=backend, block_bytes=block_bytes)
    np.testing.assert_array_equal(backend.to_host(idx), ref_i)
    np.testing.assert_allclose(backend.to_host(sqdist), ref_d, rtol=1e-10)
    (rows,) = searched_again["exactly"]
    np.testing.assert_array_equal(backend.to_host(rows), np.arange(len(X)))


def test_float32_queries_far_apart_settle_about_their_own_centres(backend, rng,
                                                                  searched_again):
    """600 queries of the groups 3e3 apart above: about the means of two groups
    of them by farthest-point traversal (one in each group far apart), a query's
    norm and its neighbours' are the unit spread, and the float32 search vouches
    for every row: no float64 copy of X and no float64 products, which GPUs
    without float64 units run 32-64 times slower."""
    X = far_apart_groups(rng, 3e3, np.float32)
    Q = np.concatenate([X + np.float32(0.25), X - np.float32(0.25)])
    assert_queries_exact(backend, Q, X, 10)
    (rows,) = searched_again["recentred"]
    np.testing.assert_array_equal(rows, np.arange(len(Q)))
    assert searched_again["float64"] == [] and searched_again["exactly"] == []


def test_queries_too_far_apart_to_recentre_go_to_float64(backend, rng, searched_again):
    """Float32 groups 1.58e18 from their mean in 20-D, of spread 1e13 (75 of
    float32's steps there): squared norms of 5e37, within float32's range for
    the first search (4 x that, below 3.4e38), but about a group's own centre the
    other group lies twice as far, out of that range (the re-centred search
    raised "spreads too far").  Those rows go to the float64 search instead,
    which finds the float64 brute force's neighbours."""
    X = (1.58e18 + 1e13 * rng.standard_normal((600, 20))).astype(np.float32)
    X[300:] *= -1
    Q = np.concatenate([X + np.float32(2.5e12), X - np.float32(2.5e12)])
    assert_queries_exact(backend, Q, X, 10)
    assert searched_again["recentred"] == [] and searched_again["exactly"] == []
    (rows,) = searched_again["float64"]
    np.testing.assert_array_equal(backend.to_host(rows), np.arange(len(Q)))


def test_float64_groups_far_apart_settle_about_their_own_centres(backend, rng,
                                                                  searched_again):
    """The float64 groups 3e9 apart, 600 points: about the means of two groups
    of them the float64 GEMM vouches for every row, where each had taken all N
    distances from the coordinates.  Copies of a point, more of them (10) than
    the k + 1 searched, come in index order without the row's own."""
    X = far_apart_groups(rng, 3e9, np.float64, n=300)
    X[1:6], X[301:310] = X[0], X[300]
    ref_d, ref_i = brute_knn(X, 7)
    sqdist, idx = ge.knn(backend.asarray(X), 7, backend=backend)
    np.testing.assert_array_equal(backend.to_host(idx), ref_i)
    np.testing.assert_allclose(backend.to_host(sqdist), ref_d, rtol=1e-10)
    (rows,) = searched_again["recentred"]
    np.testing.assert_array_equal(rows, np.arange(len(X)))
    assert searched_again["float64"] == [] and searched_again["exactly"] == []


def test_farthest_point_groups_seed_every_group_far_apart(rng):
    """Three groups 1e3 apart get a seed each, and each group one label; identical
    rows all take the first (the other seeds' groups stay empty)."""
    P = np.concatenate([c + rng.standard_normal((40, 5)) for c in rng.standard_normal((3, 5))
                        * 1e3])
    labels = ge.neighbors._farthest_point_groups(np, P, 3)
    assert sorted(len(np.unique(labels[i:i + 40])) for i in (0, 40, 80)) == [1, 1, 1]
    assert len(np.unique(labels)) == 3
    assert (ge.neighbors._farthest_point_groups(np, np.ones((5, 3)), 4) == 0).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ordinary_points_settle_in_their_first_search(rng, dtype, searched_again):
    """Points whose spread is not small against their distance from the mean:
    the bound vouches for every row, and nothing is searched again."""
    X = (rng.standard_normal((2000, 20)) * 3 + 10).astype(dtype)
    X[:40] += 30.0
    ge.knn(X, 15, backend="cpu")
    ge.neighbors.knn_query(X[:300] + 0.5, X, 15, backend="cpu")
    assert searched_again == {"recentred": [], "float64": [], "exactly": []}


def test_far_outliers_leave_the_other_rows_settled(rng, searched_again):
    """Three rows 1e4 from the others set max |x|; the rounding of a distance to a
    point within the k-th distance of an ordinary row is bounded by that point's
    norm of at most |q| + sqrt(k-th distance) instead (by max |x| alone every
    other row went again).  Only the outliers' own rows may."""
    X = rng.standard_normal((2000, 20)).astype(np.float32)
    X[:3] = 1e4
    ref_d, ref_i = brute_knn(X, 15)
    sqdist, idx = ge.knn(X, 15, backend="cpu")
    assert_same_neighbours(X, idx, ref_d, ref_i, np.float32)
    ge.neighbors.knn_query(X[::7] + np.float32(0.25), X, 15, backend="cpu")
    again = np.concatenate([np.empty(0, np.int64), *searched_again["float64"]])
    assert (again < 3).all() and not (searched_again["exactly"] or searched_again["recentred"])


def test_sparse_float32_rows_far_from_the_origin(rng, searched_again):
    """Sparse rows are searched uncentred, and stored as the far-apart groups above
    (every value stored) float32's GEMM cannot rank them either: the float64
    search of the sparse rows answers."""
    X = scipy.sparse.csr_matrix(far_apart_groups(rng, 3e3, np.float32))
    ref_d, ref_i = brute_knn(X.toarray(), 10)
    sqdist, idx = ge.knn(X, 10, backend="cpu")
    assert_same_neighbours(X.toarray(), idx, ref_d, ref_i, np.float32)
    np.testing.assert_allclose(sqdist, ref_d, rtol=1e-4)
    Q = X[::30]
    sqdist, idx = ge.neighbors.knn_query(Q, X, 10, backend="cpu")
    np.testing.assert_array_equal(idx[:, 0], np.arange(0, X.shape[0], 30))   # themselves
    np.testing.assert_array_equal(idx[:, 1:], ref_i[::30, :9])
    (rows,) = searched_again["float64"]
    np.testing.assert_array_equal(rows, np.arange(Q.shape[0]))
