"""approx_knn: the inverted-file search against the exact k-NN."""
import pickle
from unittest import mock

import numpy as np
import pytest
import scipy.sparse

import gpuembed as ge
from gpuembed import neighbors, neighbors_ivf
from test_neighbors import (assert_same_neighbours, best_by_distance_then_index, brute_knn,
                            far_apart_groups)


def clusters(rng, n_clusters=6, per=60, dim=20, spread=50.0):
    centres = rng.standard_normal((n_clusters, dim)) * spread
    return np.repeat(centres, per, axis=0) + rng.standard_normal((n_clusters * per, dim))


def on_host(backend, result):
    return tuple(backend.to_host(a) for a in result)


def recall(idx, ref_idx):
    return float((idx[:, :, None] == ref_idx[:, None, :]).any(axis=2).mean())


def check_well_formed(X, sqdist, idx):
    """Each row: its own distances to the indices it names, ascending, no repeat, not itself."""
    X = np.asarray(X, dtype=np.float64)
    rows = np.arange(len(idx))[:, None]
    true = ((X[idx] - X[rows]) ** 2).sum(axis=2)
    np.testing.assert_allclose(sqdist, true, rtol=1e-4, atol=1e-6)
    assert (np.diff(sqdist, axis=1) >= 0).all()
    assert (np.sort(idx, axis=1)[:, 1:] != np.sort(idx, axis=1)[:, :-1]).all()
    assert (idx != rows).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_approx_knn_is_exact_where_the_probed_lists_hold_every_neighbour(backend, rng, dtype):
    """Six clusters far apart, six lists, each list's own and nearest list
    probed: each point's neighbours all lie in its cluster, which those lists
    cover, so the result is the exact one (indices, ties by index, distances)."""
    X = clusters(rng).astype(dtype)
    ref_d, ref_i = brute_knn(X, 10)
    sqdist, idx = on_host(backend, ge.approx_knn(backend.asarray(X), 10, n_lists=6, n_probe=2,
                                                 backend=backend))
    assert sqdist.dtype == dtype and idx.dtype == np.int64 and idx.shape == (360, 10)
    np.testing.assert_array_equal(idx, ref_i)
    np.testing.assert_allclose(sqdist, ref_d, rtol=1e-4 if dtype == np.float32 else 1e-10)


def test_approx_knn_of_groups_far_apart_is_exact(backend, rng):
    """Two float32 groups 3e3 from their mean, a list each, its own list probed:
    every neighbour is in it, but float32's GEMM rounding, about 4e2 in squared
    distances, exceeds the neighbours' (about 20), and chose them blindly (94% of
    the 10-NN wrong).  Such rows get the exact search's answer."""
    X = far_apart_groups(rng, 3e3, np.float32)
    ref_d, ref_i = brute_knn(X, 10)
    sqdist, idx = on_host(backend, ge.approx_knn(backend.asarray(X), 10, n_lists=2, n_probe=1,
                                                 backend=backend))
    assert_same_neighbours(X, idx, ref_d, ref_i, np.float32)
    np.testing.assert_allclose(sqdist, ref_d, rtol=1e-4)
    Q = X[::30] + np.float32(0.25)
    sqdist, idx = on_host(backend, ge.approx_knn_query(
        backend.asarray(Q), backend.asarray(X), 10, n_lists=2, n_probe=1, backend=backend))
    Q64, X64 = Q.astype(np.float64), X.astype(np.float64)
    ref_d, order = best_by_distance_then_index(((Q64[:, None] - X64[None]) ** 2).sum(-1), 10)
    np.testing.assert_array_equal(idx, order)
    np.testing.assert_allclose(sqdist, ref_d, rtol=1e-4)


def test_approx_knn_finds_more_neighbours_with_more_probes(backend):
    """rotating_objects (720 images of 32 x 32 pixels): every probe count gives a
    well-formed result; recall grows with the probes (each list's candidates are
    a superset of those of fewer probes), to the exact neighbours with 20 of the 27
    lists probed (0.61 / 0.76 / 0.93 with 1 / 3 / 8)."""
    X, _ = ge.datasets.rotating_objects(size=32)
    X = X.astype(np.float32)
    ref_i = ge.knn(X, 15, backend="cpu")[1]        # test_neighbors checks it by brute force
    recalls = []
    for n_probe in (1, 3, 8, 20):
        sqdist, idx = on_host(backend, ge.approx_knn(backend.asarray(X), 15, n_lists=27,
                                                     n_probe=n_probe, backend=backend))
        check_well_formed(X, sqdist, idx)
        recalls.append(recall(idx, ref_i))
    assert recalls == sorted(recalls)
    assert recalls[0] < 0.9 < recalls[2] and recalls[-1] == 1.0


def test_approx_knn_probes_enough_lists_for_k_neighbours(backend, rng):
    """With 40 lists of about 5 points and k = 30, one probe cannot hold k
    candidates: lists are added nearest first until they do."""
    X = rng.standard_normal((200, 12))
    sqdist, idx = on_host(backend, ge.approx_knn(backend.asarray(X), 30, n_lists=40, n_probe=1,
                                                 backend=backend))
    check_well_formed(X, sqdist, idx)


def test_approx_knn_keeps_duplicates_and_leaves_out_the_point(backend, rng):
    """Copies of a point are neighbours at distance 0; the point itself is not,
    however many copies tie with it."""
    X = np.repeat(rng.standard_normal((50, 16)), 4, axis=0)
    sqdist, idx = on_host(backend, ge.approx_knn(backend.asarray(X), 5, n_lists=7, n_probe=3,
                                                 backend=backend))
    check_well_formed(X, sqdist, idx)
    np.testing.assert_array_equal(sqdist[:, :3], 0.0)
    assert (idx[:, :3] // 4 == np.arange(200)[:, None] // 4).all()


def test_approx_knn_is_exact_where_it_cannot_save(rng):
    """All lists probed, the default lists on few points, sparse rows, or a CPU k-d
    tree's few features: the exact search."""
    X = rng.standard_normal((300, 12))
    for kwargs in ({"n_lists": 5, "n_probe": 5}, {"n_probe": 1}):
        np.testing.assert_array_equal(ge.approx_knn(X, 9, **kwargs, backend="cpu")[1],
                                      ge.knn(X, 9, backend="cpu")[1])
    sparse = scipy.sparse.csr_matrix(X * (rng.random(X.shape) < 0.3))
    np.testing.assert_array_equal(
        ge.approx_knn(sparse, 9, n_lists=20, n_probe=1, backend="cpu")[1],
        ge.knn(sparse, 9, backend="cpu")[1])
    X = rng.standard_normal((300, 3))
    np.testing.assert_array_equal(ge.approx_knn(X, 9, n_probe=1, backend="cpu")[1],
                                  ge.knn(X, 9, backend="cpu")[1])


def test_recall_by_probes_is_the_recall_of_each_probe_count(backend):
    """The sample's recall that n_probe="auto" predicts for p probes, point by
    point, is what approx_knn finds with p probes (same seed, same lists): the
    prediction is exact, not a model."""
    X, _ = ge.datasets.rotating_objects(n_objects=5, size=16)
    X = X.astype(np.float32)
    k, n_lists, seed = 12, 15, 3
    sample = np.arange(0, 360, 7)
    index = ge.ListIndex(backend.asarray(X), n_lists, random_state=seed, backend=backend)
    true = neighbors_ivf.sampled_knn(backend, index.X, sample, k)
    ranked = index._nearest_lists(index.X[backend.asarray(sample)], len(index.filled))
    found = index._recall_by_probes(true, ranked, k + 1)
    filled = len(index.filled)
    assert found.shape == (len(sample), filled + 1) and (found[:, 0] == 0).all()
    ref_i = ge.knn(X, k, backend="cpu")[1][sample]
    for p in (1, 2, 3, 5, 8, filled):
        idx = backend.to_host(ge.approx_knn(backend.asarray(X), k, n_lists=n_lists, n_probe=p,
                                            random_state=seed, backend=backend)[1])[sample]
        np.testing.assert_allclose(found[:, p],
                                   (idx[:, :, None] == ref_i[:, None, :]).any(axis=2).mean(1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_searches_on_the_index_rows_equal_the_exact_search(backend, dtype):
    """The sampled exact search that chooses n_probe takes the index's centred rows
    (in list order, the queries scaled by -2) instead of its own copy of X: the
    same neighbours and distances as knn_query and, each point left out of its
    own, as knn, copies of points included (their ties go by index in float64;
    in float32 a copy's rounding may depend on its row's place)."""
    X, _ = ge.datasets.rotating_objects(n_objects=5, size=16)
    X = np.concatenate([X, X[:40]]).astype(dtype)       # 40 points twice
    index = ge.ListIndex(backend.asarray(X), 15, random_state=2, backend=backend)
    points = (index.rows, backend.asarray(index.order), index.sq, index.mean)
    Q = backend.asarray(X[::9] + 0.01)
    got = neighbors._knn(backend, Q, index.X, 12, False, None, points=points)
    expected = neighbors.knn_query(Q, index.X, 12, backend=backend)
    # In float32 the GEMM may round a row's distance by its place in the product
    # (an AMD EPYC VM: copies 360 rows apart came out in either order), so there
    # copies compare as one point; distances not recomputed hold RTOL (1e-4).
    same = (lambda i: np.where(i >= 360, i - 360, i)) if dtype == np.float32 else (lambda i: i)
    np.testing.assert_array_equal(same(backend.to_host(got[1])),
                                  same(backend.to_host(expected[1])))
    # Distances not recomputed hold RTOL (1e-4 in float32): the GEMM's rounding
    # differs with a row's place in the product on some CPUs.
    np.testing.assert_allclose(backend.to_host(got[0]), backend.to_host(expected[0]),
                               rtol=neighbors.RTOL[np.dtype(dtype)] if dtype == np.float32
                               else 1e-12)
    sample = np.arange(0, X.shape[0], 5)
    on_rows = same(neighbors_ivf.sampled_knn(backend, index.X, sample, 12, points))
    np.testing.assert_array_equal(on_rows,
                                  same(neighbors_ivf.sampled_knn(backend, index.X, sample, 12)))
    np.testing.assert_array_equal(on_rows, same(ge.knn(X, 12, backend="cpu")[1][sample]))


@pytest.mark.parametrize("target", [0.6, 0.8])
def test_auto_probes_reach_the_recall_asked_for(rng, target):
    """n_probe="auto" (the default): the fewest probes whose sampled recall, less
    two standard errors, reaches ``recall``; over all points the recall reached is
    about the target, and a higher target probes more."""
    X, _ = ge.datasets.rotating_objects(size=32)
    ref_i = ge.knn(X, 15, backend="cpu")[1]
    reached = [recall(ge.approx_knn(X, 15, n_lists=27, recall=t, backend="cpu")[1], ref_i)
               for t in (target, target + 0.05)]
    assert target - 0.03 <= reached[0] <= reached[1] < 1.0


def test_auto_probes_search_exactly_data_without_clusters(rng):
    """I.i.d. Gaussian points in 50-D: the lists do not follow the data, a recall of
    0.95 needs most of them probed, and "auto" runs the exact search instead."""
    X = rng.standard_normal((2000, 50))
    with mock.patch.object(neighbors_ivf, "_knn", wraps=neighbors_ivf._knn) as exact:
        idx = ge.approx_knn(X, 10, n_lists=45, backend="cpu")[1]
    self_searches = [c.args for c in exact.call_args_list if c.args[4]]     # exclude_self
    assert len(self_searches) == 1 and self_searches[0][1].shape[0] == X.shape[0]
    np.testing.assert_array_equal(idx, ge.knn(X, 10, backend="cpu")[1])


def test_approx_knn_same_seed_same_result(rng):
    X, _ = ge.datasets.rotating_objects(n_objects=4, size=16)
    a, b = (ge.approx_knn(X, 10, n_lists=17, n_probe=2, random_state=3, backend="cpu")
            for _ in range(2))
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[0], b[0])


@pytest.mark.parametrize("kwargs,match", [
    ({"n_neighbors": 0}, "n_neighbors"), ({"n_neighbors": 100}, "n_neighbors"),
    ({"n_lists": 0}, "n_lists"), ({"n_lists": 101}, "n_lists"), ({"n_probe": 0}, "n_probe"),
    ({"n_probe": "fast"}, "n_probe"), ({"recall": 0.0}, "recall"), ({"recall": 1.5}, "recall"),
    ({"recall": np.nan}, "recall"),
])
def test_approx_knn_bad_parameters(rng, kwargs, match):
    X = rng.standard_normal((100, 20))
    with pytest.raises(ValueError, match=match):
        ge.approx_knn(X, **{"n_neighbors": 5, **kwargs}, backend="cpu")


def test_approx_knn_bad_data(rng):
    X = rng.standard_normal((100, 20))
    X[3, 4] = np.nan
    with pytest.raises(ValueError, match="X"):
        ge.approx_knn(X, 5, backend="cpu")
    with pytest.raises(ValueError, match="X"):
        ge.approx_knn(X[0], 5, backend="cpu")


def test_affinities_search_approximately_when_asked(backend):
    """neighbors="approx": the affinities come from approx_knn's neighbours."""
    X = ge.datasets.digits()[0][:800]
    with mock.patch.object(neighbors_ivf, "MIN_POINTS", 0):
        A = ge.entropic_affinities(X, 10.0, neighbors="approx", backend=backend)
        idx = backend.to_host(ge.approx_knn(X, 30, backend=backend)[1])
    np.testing.assert_array_equal(backend.to_host(A.neighbors[1]), idx)
    assert recall(idx, backend.to_host(ge.knn(X, 30, backend=backend)[1])) < 1.0


def test_tsne_with_approximate_neighbours():
    """t-SNE of the digits on approx_knn's neighbours (42 lists, recall 0.98 there)
    keeps the exact neighbours' 10-NN accuracy (0.987) to within 0.01."""
    X, y = ge.datasets.digits()
    with mock.patch.object(neighbors_ivf, "MIN_POINTS", 0):
        Y = ge.TSNE(neighbors="approx", random_state=0, backend="cpu").fit_transform(X)
    assert ge.metrics.knn_accuracy(Y, y) >= 0.977
    with pytest.raises(ValueError, match="neighbors"):
        ge.TSNE(neighbors="annoy").fit(X[:100])
    with pytest.raises(ValueError, match="neighbors"):
        ge.entropic_affinities(X[:100], 10.0, neighbors="annoy")


def test_spectral_estimators_search_approximately_when_asked():
    """neighbors="approx" in LaplacianEigenmaps and SpectralClustering builds the
    graph on approx_knn's neighbours, in fit_grid's shared search too."""
    from gpuembed.spectral import affinity_graph, fit_grid, spectral_embedding

    X = ge.datasets.digits()[0][:600]
    with mock.patch.object(neighbors_ivf, "MIN_POINTS", 0):
        Y = ge.LaplacianEigenmaps(3, n_neighbors=10, sigma=20.0, neighbors="approx",
                                  backend="cpu").fit_transform(X)
        W = affinity_graph(X, 10, 20.0, neighbors=ge.approx_knn(X, 10, backend="cpu"))
        model = ge.SpectralClustering(5, n_neighbors=10, sigma=20.0, neighbors="approx",
                                      random_state=0)
        sweep = fit_grid(model, X, {"n_neighbors": [5, 10]})
        alone = model.set_params(n_neighbors=5).fit_predict(X)
    np.testing.assert_allclose(Y, spectral_embedding(W, 3, backend="cpu"), rtol=1e-8, atol=1e-12)
    exact = ge.LaplacianEigenmaps(3, n_neighbors=10, sigma=20.0, backend="cpu").fit_transform(X)
    assert not np.allclose(Y, exact)
    np.testing.assert_array_equal(sweep[0][1].labels_, alone)
    with pytest.raises(ValueError, match="neighbors"):
        ge.LaplacianEigenmaps(2, n_neighbors=10, neighbors="annoy").fit(X)


def test_auto_search_is_approximate_from_its_threshold(backend, monkeypatch):
    """neighbors="auto", the default of the affinities, the estimators and the
    spectral graph: approx_knn from AUTO_APPROX_FROM points of the device on
    (here lowered to 900 digits; 50,000 on the CPU), the exact search below it and
    on the GPU (None)."""
    from gpuembed.spectral import affinity_graph

    X = ge.datasets.digits()[0][:900]
    monkeypatch.setattr(neighbors_ivf, "MIN_POINTS", 0)
    monkeypatch.setitem(neighbors_ivf.AUTO_APPROX_FROM, "cpu", len(X))
    approx = ge.approx_knn(X, 30, backend="cpu")[1]
    exact = ge.knn(X, 30, backend="cpu")[1]
    assert recall(approx, exact) < 1.0
    found = approx if backend.name == "cpu" else backend.to_host(ge.knn(X, 30, backend=backend)[1])
    for search in (neighbors_ivf.auto_knn, neighbors_ivf.SEARCHES["auto"]):
        np.testing.assert_array_equal(backend.to_host(search(X, 30, backend=backend)[1]), found)
    A = ge.entropic_affinities(X, 10.0, backend=backend)
    np.testing.assert_array_equal(backend.to_host(A.neighbors[1]), found)
    if backend.name == "cpu":          # the spectral defaults (the GPU's exact search: slow there)
        W = affinity_graph(X, 30, 20.0)
        assert (W != affinity_graph(X, 30, 20.0, neighbors="approx")).nnz == 0
        Y = ge.LaplacianEigenmaps(2, n_neighbors=30, sigma=20.0).fit_transform(X)
        np.testing.assert_array_equal(Y, ge.LaplacianEigenmaps(
            2, n_neighbors=30, sigma=20.0, neighbors="approx").fit_transform(X))
    below = neighbors_ivf.auto_knn(X[:-1], 30, backend=backend)[1]
    np.testing.assert_array_equal(backend.to_host(below),
                                  backend.to_host(ge.knn(X[:-1], 30, backend=backend)[1]))


# -- queries: new points' neighbours among the listed points --------------------------

def split_views(n_objects=5, size=16):
    """rotating_objects as float32: every third view held out as a query."""
    X, y = ge.datasets.rotating_objects(n_objects=n_objects, size=size)
    held = np.arange(len(X)) % 3 == 0
    return X[~held].astype(np.float32), X[held].astype(np.float32), y[~held], y[held]


def brute_query(Q, X, k):
    """Full M x N reference in float64, ties ordered by index."""
    D = ((Q[:, None, :].astype(np.float64) - X[None, :, :]) ** 2).sum(-1)
    return best_by_distance_then_index(D, k)


def test_query_recall_by_probes_is_the_recall_of_each_probe_count(backend):
    """As for the points' own search: the recall that n_probe="auto" predicts for
    p probes, query by query, is what a query with p probes finds, and the queries
    come back well formed (their own distances, ascending, no repeat)."""
    X, Q, _, _ = split_views()
    k, n_lists = 12, 15
    index = ge.ListIndex(backend.asarray(X), n_lists, random_state=3, backend=backend)
    ref_i = brute_query(Q, X, k)[1]
    ranked = index._nearest_lists(backend.asarray(Q), len(index.filled))
    found = index._recall_by_probes(ref_i, ranked, k)
    filled = len(index.filled)
    assert found.shape == (len(Q), filled + 1) and (found[:, 0] == 0).all()
    recalls = []
    for p in (1, 2, 3, 5, 8, filled):
        sqdist, idx = on_host(backend, index.query(backend.asarray(Q), k, n_probe=p))
        found_now = (idx[:, :, None] == ref_i[:, None, :]).any(axis=2).mean(1)
        np.testing.assert_allclose(found[:, p], found_now)
        true = ((Q[:, None, :].astype(np.float64) - X[idx]) ** 2).sum(axis=2)
        np.testing.assert_allclose(sqdist, true, rtol=1e-4, atol=1e-6)
        assert (np.diff(sqdist, axis=1) >= 0).all()
        assert (np.sort(idx, axis=1)[:, 1:] != np.sort(idx, axis=1)[:, :-1]).all()
        recalls.append(found_now.mean())
    assert recalls[0] < 0.9 and recalls[-1] == 1.0 and np.all(np.diff(recalls) >= 0)


@pytest.mark.parametrize("target", [0.6, 0.8])
def test_query_auto_probes_reach_the_recall_asked_for(target):
    """n_probe="auto" for queries: all 240 held-out views are the sample here, so
    the recall reached is at least the target (and, with the two standard errors'
    margin, not far above it), and a higher target probes more."""
    X, Q, _, _ = split_views(n_objects=10, size=32)
    ref_i = brute_query(Q, X, 15)[1]
    index = ge.ListIndex(X, 40, backend="cpu")
    reached = [recall(index.query(Q, 15, recall=t)[1], ref_i) for t in (target, target + 0.1)]
    assert target <= reached[0] < reached[1] < 1.0
    assert reached[0] <= target + 0.12


def test_query_finds_points_of_the_index_themselves(backend, rng):
    """No self exclusion: a query equal to a listed point gets it first, at 0."""
    X = clusters(rng, per=80).astype(np.float32)
    rows = np.arange(0, len(X), 11)
    sqdist, idx = on_host(backend, ge.approx_knn_query(
        backend.asarray(X[rows]), backend.asarray(X), 5, n_lists=12, n_probe=2,
        backend=backend))
    np.testing.assert_array_equal(idx[:, 0], rows)
    np.testing.assert_array_equal(sqdist[:, 0], 0.0)


def test_query_index_kept_gives_the_same_result(rng):
    """A ListIndex queried twice, and approx_knn_query (which builds one), agree:
    the same seed gives the same lists and the same neighbours."""
    X, Q, _, _ = split_views()
    index = ge.ListIndex(X, 15, random_state=4, backend="cpu")
    a, b = (index.query(Q, 10, n_probe=3) for _ in range(2))
    c = ge.approx_knn_query(Q, X, 10, n_lists=15, n_probe=3, random_state=4, backend="cpu")
    for other in (b, c):
        np.testing.assert_array_equal(a[1], other[1])
        np.testing.assert_array_equal(a[0], other[0])


def test_query_is_exact_where_lists_cannot_save(rng):
    """Few points (default lists), the k-d tree's few features, sparse rows and
    every list probed: the exact query search."""
    from gpuembed.neighbors import knn_query

    X, Q = rng.standard_normal((500, 20)), rng.standard_normal((40, 20))
    ref = knn_query(Q, X, 7, backend="cpu")[1]
    for index, kwargs in ((ge.ListIndex(X, backend="cpu"), {"n_probe": 1}),
                          (ge.ListIndex(X, 30, backend="cpu"), {"n_probe": 30}),
                          (ge.ListIndex(scipy.sparse.csr_matrix(X), 30, backend="cpu"),
                           {"n_probe": 1})):
        assert index.exact == (kwargs["n_probe"] == 1)
        np.testing.assert_array_equal(index.query(Q, 7, **kwargs)[1], ref)
    low = ge.ListIndex(X[:, :3], 30, backend="cpu")
    assert low.exact
    np.testing.assert_array_equal(low.query(Q[:, :3], 7, n_probe=1)[1],
                                  knn_query(Q[:, :3], X[:, :3], 7, backend="cpu")[1])


@pytest.mark.parametrize("kwargs,match", [
    ({"n_neighbors": 0}, "n_neighbors"), ({"n_neighbors": 301}, "n_neighbors"),
    ({"n_probe": 0}, "n_probe"), ({"n_probe": "fast"}, "n_probe"), ({"recall": 1.5}, "recall"),
])
def test_query_bad_parameters(rng, kwargs, match):
    X = clusters(rng, per=50)
    index = ge.ListIndex(X, 10, backend="cpu")
    with pytest.raises(ValueError, match=match):
        index.query(X[:5], **{"n_neighbors": 5, **kwargs})


def test_auto_probes_bad_parameters(rng):
    index = ge.ListIndex(clusters(rng, per=50), 10, backend="cpu")
    with pytest.raises(ValueError, match="n_neighbors"):
        index.auto_probes(300)                  # 300 points: each has 299 others
    with pytest.raises(ValueError, match="recall"):
        index.auto_probes(5, recall=0.0)


def test_query_bad_data(rng):
    X = clusters(rng, per=50)
    index = ge.ListIndex(X, 10, backend="cpu")
    Q = X[:5].copy()
    Q[2, 3] = np.nan
    with pytest.raises(ValueError, match="Q"):
        index.query(Q, 5)
    with pytest.raises(ValueError, match="Q has 19 features"):
        index.query(X[:5, :19], 5)
    with pytest.raises(ValueError, match="n_lists"):
        ge.ListIndex(X, 0, backend="cpu")
    X[0, 0] = np.inf
    with pytest.raises(ValueError, match="X"):
        ge.ListIndex(X, 10, backend="cpu")


def test_query_search_follows_the_neighbors_name(backend, monkeypatch):
    """QuerySearch, behind the estimators' transform: "exact" the exact search;
    "approx" a ListIndex of the training points built at the first query and kept,
    probed as the training points' own sample asks; "auto" (and None) approximate
    from AUTO_APPROX_FROM points of the device on (lowered here; the GPU's None:
    always exact).  A query's neighbours do not depend on the batch."""
    from gpuembed.neighbors import knn_query

    X, Q, _, _ = split_views(n_objects=10, size=32)
    X, Q = backend.asarray(X), backend.asarray(Q)
    monkeypatch.setattr(neighbors_ivf, "MIN_POINTS", 0)
    monkeypatch.setattr(neighbors_ivf, "AUTO_EXACT_FRACTION", 1.0)     # 480 points: few lists
    exact = backend.to_host(knn_query(Q, X, 10, backend=backend)[1])
    index = ge.ListIndex(X, backend=backend)
    n_probe = index.auto_probes(10)
    assert 1 <= n_probe < len(index.filled)
    approx = backend.to_host(index.query(Q, 10, n_probe=n_probe)[1])
    assert recall(approx, exact) < 1.0

    def found(search, rows=slice(None)):
        return backend.to_host(search(Q[rows], 10)[1])

    np.testing.assert_array_equal(found(neighbors_ivf.QuerySearch(X, "exact", backend)), exact)
    with mock.patch.object(neighbors_ivf, "ListIndex", wraps=neighbors_ivf.ListIndex) as built:
        search = neighbors_ivf.QuerySearch(X, "approx", backend)
        for rows in (slice(None), slice(None), slice(5, 42), slice(200, 201)):
            np.testing.assert_array_equal(found(search, rows), approx[rows])
    assert built.call_count == 1
    monkeypatch.setitem(neighbors_ivf.AUTO_APPROX_FROM, "cpu", X.shape[0])
    on_cpu = approx if backend.name == "cpu" else exact
    for name in ("auto", None):
        np.testing.assert_array_equal(found(neighbors_ivf.QuerySearch(X, name, backend)), on_cpu)
    monkeypatch.setitem(neighbors_ivf.AUTO_APPROX_FROM, "cpu", X.shape[0] + 1)
    np.testing.assert_array_equal(found(neighbors_ivf.QuerySearch(X, "auto", backend)), exact)


def test_transform_searches_new_points_approximately(monkeypatch):
    """t-SNE's and exact Laplacian eigenmaps' transform find the new points'
    neighbours by the training points' lists where the estimator's search is
    "approx" (one ListIndex, kept across calls), and the held-out views still
    land by their own object."""
    X, Q, y, y_new = split_views(n_objects=10, size=32)
    monkeypatch.setattr(neighbors_ivf, "MIN_POINTS", 0)
    monkeypatch.setattr(neighbors_ivf, "AUTO_EXACT_FRACTION", 1.0)
    with mock.patch.object(neighbors_ivf.ListIndex, "query",
                           autospec=True, side_effect=neighbors_ivf.ListIndex.query) as query:
        model = ge.TSNE(perplexity=10, neighbors="approx", random_state=0,
                        backend="cpu").fit(X)
        Y_new = model.transform(Q)
        # The same neighbours in a smaller batch (the sums' rounding aside: its
        # products of other sizes round the GEMM distances otherwise, by up to 3e-6
        # of them, which moved a new point by up to 1.2e-5 of the layout's extent).
        near = dict(rtol=1e-6, atol=1e-4 * np.abs(Y_new).max())
        np.testing.assert_allclose(model.transform(Q[7:30]), Y_new[7:30], **near)
        assert query.call_count == 2 and model._queries.index is not None
        loaded = pickle.loads(pickle.dumps(model))          # the lists travel with the model
        np.testing.assert_allclose(loaded.transform(Q[:9]), Y_new[:9], **near)
        assert query.call_count == 3
        assert ge.metrics.knn_accuracy(model.embedding_, y, k=1) >= 0.95
        le = ge.LaplacianEigenmaps(5, n_neighbors=10, sigma=30.0, neighbors="approx",
                                   backend="cpu").fit(X)
        Y_le = le.transform(Q)
        assert query.call_count == 4
    from gpuembed.neighbors import knn_query

    nearest = knn_query(Y_new, model.embedding_, 1, backend="cpu")[1][:, 0]
    assert (y[nearest] == y_new).mean() >= 0.95
    nearest = knn_query(Y_le, le.embedding_, 1, backend="cpu")[1][:, 0]
    assert (y[nearest] == y_new).mean() >= 0.95
    # Where a view's 6 nearest training views all came, its reconstruction is exact's
    # (to the float32 distances' rounding, which the Gram solve amplifies to 1e-4).
    le._queries = neighbors_ivf.QuerySearch(le._X, "exact", le._queries.backend)
    exact = le.transform(Q)
    same_rows = (np.abs(Y_le - exact).max(axis=1) <= 2e-4 * np.abs(exact).max()).mean()
    assert 0.85 <= same_rows < 1.0
