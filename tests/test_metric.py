"""metric="cosine": every entry point that compares rows of data compares their
unit-length versions, so it equals the same call on those rows, and the
neighbours are the cosine distance's (checked against the brute-force cosine)."""
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse

import gpuembed as ge
from gpuembed.neighbors import metric_rows
from gpuembed.parametric import ParametricEmbedding

CPU = ge.get_backend("cpu")


def data(n=240, d=30, seed=0):
    """Positive rows (counts-like, as text) of varied lengths, 3 directions."""
    rng = np.random.default_rng(seed)
    centres = rng.random((3, d)) ** 4
    labels = np.arange(n) % 3
    X = (centres[labels] + 0.05 * rng.random((n, d))) * rng.uniform(0.1, 10, (n, 1))
    return X, labels


def unit(X):
    """The reference normalization, written out."""
    return X / np.sqrt(np.einsum("ij,ij->i", X, X))[:, None]


def test_cosine_rows_have_unit_length_and_sparse_stays_sparse():
    X, _ = data()
    for A in (X, X.astype(np.float32)):
        U = metric_rows(CPU, A, "cosine")
        assert U.dtype == A.dtype
        np.testing.assert_array_equal(U, unit(A))
    assert metric_rows(CPU, X, "euclidean") is X
    S = scipy.sparse.csr_matrix(np.where(X > np.median(X, axis=1, keepdims=True), X, 0.0))
    U = metric_rows(CPU, S, "cosine")
    assert scipy.sparse.issparse(U) and U.nnz == S.nnz
    np.testing.assert_allclose(U.toarray(), unit(S.toarray()), rtol=1e-14)


def test_cosine_on_each_backend(backend):
    """Dense and sparse rows scaled on the backend's device and its k-NN: as the
    CPU's for the unit rows; a t-SNE fit there as the backend's of the unit rows
    (scaled on the host, so to rounding)."""
    X = data()[0].astype(np.float32)
    for A in (backend.asarray(X), backend.sparse.csr_matrix(backend.asarray(X))):
        U = backend.to_host(metric_rows(backend, A, "cosine"))
        np.testing.assert_allclose(U.toarray() if scipy.sparse.issparse(U) else U, unit(X),
                                   rtol=1e-6)
    sq, idx = (backend.to_host(a) for a in ge.knn(backend.asarray(X), 8, metric="cosine",
                                                    backend=backend))
    ref_sq, ref_idx = ge.knn(unit(X.astype(np.float64)), 8, backend=CPU)
    assert (idx == ref_idx).mean() > 0.99
    np.testing.assert_allclose(sq, ref_sq, rtol=1e-3, atol=1e-6)
    model = ge.TSNE(perplexity=10, max_iter=5, random_state=0, metric="cosine",
                    backend=backend).fit(backend.asarray(X))
    ref = ge.TSNE(perplexity=10, max_iter=5, random_state=0,
                  backend=backend).fit(backend.asarray(unit(X)))
    np.testing.assert_allclose(model.embedding_, ref.embedding_, rtol=1e-3,
                               atol=1e-3 * np.abs(ref.embedding_).max())
    np.testing.assert_allclose(model.transform(3 * X[:10]), ref.transform(unit(X[:10])),
                               rtol=1e-3, atol=1e-3 * np.abs(ref.embedding_).max())


def test_cosine_neighbours_are_the_cosine_distances():
    """ge.knn, knn_query, approx_knn and a ListIndex's query against 1 - cos by
    brute force: the same neighbours in the same order, at 2 (1 - cos)."""
    X, _ = data(400)
    Q = data(50, seed=1)[0]
    k = 8

    def brute(A, B, exclude_self):
        cos = unit(A) @ unit(B).T
        if exclude_self:
            np.fill_diagonal(cos, -np.inf)
        order = np.argsort(-cos, axis=1, kind="stable")[:, :k]
        return 2 * (1 - np.take_along_axis(cos, order, axis=1)), order

    for (sq, idx), (ref_sq, ref_idx) in [
            (ge.knn(X, k, metric="cosine", backend=CPU), brute(X, X, True)),
            (ge.approx_knn(X, k, n_lists=4, n_probe=4, metric="cosine", backend=CPU),
             brute(X, X, True)),
            (ge.neighbors.knn_query(Q, X, k, metric="cosine", backend=CPU), brute(Q, X, False)),
            (ge.ListIndex(X, 4, metric="cosine", backend=CPU).query(Q, k, n_probe=4),
             brute(Q, X, False)),
            (ge.approx_knn_query(Q, X, k, n_lists=4, n_probe=4, metric="cosine", backend=CPU),
             brute(Q, X, False))]:
        np.testing.assert_array_equal(idx, ref_idx)
        np.testing.assert_allclose(sq, ref_sq, rtol=1e-8, atol=1e-12)
    # Sparse rows: the dense rows' neighbours.
    S = scipy.sparse.csr_matrix(X)
    np.testing.assert_array_equal(ge.knn(S, k, metric="cosine", backend=CPU)[1],
                                  brute(X, X, True)[1])


def test_affinities_and_quality_equal_those_of_unit_rows():
    X, _ = data()
    A = ge.entropic_affinities(X, 10.0, metric="cosine", backend=CPU)
    B = ge.entropic_affinities(unit(X), 10.0, backend=CPU)
    assert (A.P != B.P).nnz == 0
    M = ge.multiscale_affinities(X, 2.0, metric="cosine", backend=CPU)
    assert (M.P != ge.multiscale_affinities(unit(X), 2.0, backend=CPU).P).nnz == 0
    Y = np.random.default_rng(0).standard_normal((X.shape[0], 2))
    np.testing.assert_array_equal(ge.metrics.rnx(X, Y, 20, metric="cosine"),
                                  ge.metrics.rnx(unit(X), Y, 20))
    assert ge.metrics.auc_rnx(X, Y, metric="cosine") == ge.metrics.auc_rnx(unit(X), Y)
    np.testing.assert_array_equal(ge.metrics.coranking(X[:60], Y[:60], metric="cosine"),
                                  ge.metrics.coranking(unit(X[:60]), Y[:60]))


ESTIMATORS = {
    "tsne": lambda **kw: ge.TSNE(perplexity=10, max_iter=40, random_state=0, backend=CPU, **kw),
    "ee": lambda **kw: ge.EE(perplexity=10, max_iter=20, random_state=0, backend=CPU, **kw),
    "msne": lambda **kw: ge.MultiscaleSNE(max_iter=10, random_state=0, backend=CPU, **kw),
    "le": lambda **kw: ge.LaplacianEigenmaps(2, n_neighbors=10, backend=CPU, **kw),
    "lll": lambda **kw: ge.LaplacianEigenmaps(2, n_neighbors=10, n_landmarks=40,
                                              random_state=0, backend=CPU, **kw),
    "clustering": lambda **kw: ge.SpectralClustering(3, n_neighbors=10, n_landmarks=40,
                                                     random_state=0, backend=CPU, **kw),
}


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_estimators_fit_and_map_the_unit_rows(name):
    """The fit equals the fit of the unit rows, bit for bit, and a new point's
    image does not depend on its length (scaled by 3: its unit row to rounding)."""
    X, labels = data()
    X_new = data(20, seed=2)[0]
    make = ESTIMATORS[name]
    cosine, plain = make(metric="cosine").fit(X), make().fit(unit(X))
    if name == "clustering":
        np.testing.assert_array_equal(cosine.labels_, plain.labels_)
        assert ge.metrics.clustering_error(labels, cosine.labels_) == 0
        np.testing.assert_array_equal(cosine.predict(3 * X_new), plain.predict(unit(X_new)))
        return
    np.testing.assert_array_equal(cosine.embedding_, plain.embedding_)
    scale = np.abs(plain.embedding_).max()
    np.testing.assert_allclose(cosine.transform(3 * X_new), plain.transform(unit(X_new)),
                               rtol=1e-6, atol=1e-6 * scale)


def test_parametric_mapping_takes_the_unit_rows():
    """F is fitted to the unit rows, and maps new rows as they are scaled."""
    X, _ = data(150)
    model = ParametricEmbedding(ge.EE(perplexity=10, max_iter=20, random_state=0,
                                      backend=CPU, metric="cosine"),
                                mapping="linear", n_mu=3).fit(X)
    plain = ParametricEmbedding(ge.EE(perplexity=10, max_iter=20, random_state=0,
                                      backend=CPU), mapping="linear", n_mu=3).fit(unit(X))
    np.testing.assert_array_equal(model.embedding_, plain.embedding_)
    np.testing.assert_allclose(model.transform(5 * X), model.embedding_, rtol=1e-6,
                               atol=1e-9 * np.abs(model.embedding_).max())


@pytest.mark.parametrize("call", [
    lambda X: ge.knn(X, 5, metric="cos"),
    lambda X: ge.approx_knn(X, 5, metric="cos"),
    lambda X: ge.entropic_affinities(X, 5.0, metric="cos"),
    lambda X: ge.TSNE(metric="cos").fit(X),
    lambda X: ge.MultiscaleSNE(metric="cos").fit(X),
    lambda X: ge.LaplacianEigenmaps(2, n_neighbors=5, metric="cos").fit(X),
    lambda X: ge.metrics.auc_rnx(X, X[:, :2], metric="cos"),
])
def test_an_unknown_metric_is_named(call):
    with pytest.raises(ValueError, match="metric must be one of"):
        call(data(60)[0])


def test_a_zero_row_has_no_cosine_distance():
    X, _ = data(60)
    X[17] = 0
    for call in (lambda: ge.knn(X, 5, metric="cosine"),
                 lambda: ge.TSNE(metric="cosine").fit(X),
                 lambda: ge.knn(scipy.sparse.csr_matrix(X), 5, metric="cosine")):
        with pytest.raises(ValueError, match=r"1 row\(s\) of X are all zeros \(the first is "
                                             r"row 17\)"):
            call()
    model = ge.TSNE(perplexity=10, max_iter=5, metric="cosine", backend=CPU).fit(data(60)[0])
    with pytest.raises(ValueError, match="row\\(s\\) of X_new are all zeros"):
        model.transform(np.zeros((2, X.shape[1])))


def test_metric_needs_data_to_compare():
    """Given neighbours are distances already, and fit(None) has no rows: a
    metric there would be ignored, so it raises."""
    X, _ = data(60)
    neighbors = ge.knn(X, 15)
    with pytest.raises(ValueError, match="metric='cosine' applies to the search in X"):
        ge.entropic_affinities(neighbors=neighbors, perplexity=5.0, metric="cosine")
    P = ge.entropic_affinities(X, 5.0).P
    with pytest.raises(ValueError, match="metric='cosine' applies to the data X"):
        ge.TSNE(affinities=P, init="random", metric="cosine").fit(None)


def test_command_line_metric(tmp_path):
    X, _ = data(120)
    np.save(tmp_path / "x.npy", X)
    out = subprocess.run([sys.executable, "-m", "gpuembed.cli", "embed", str(tmp_path / "x.npy"),
                          "-o", str(tmp_path / "y.npy"), "--backend", "cpu", "--perplexity",
                          "10", "--max-iter", "20", "--random-state", "1", "--metric", "cosine"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    expected = ge.TSNE(2, 10.0, max_iter=20, random_state=1, backend="cpu").fit_transform(unit(X))
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expected)
