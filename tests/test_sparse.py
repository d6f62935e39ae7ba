"""Sparse input (scipy / cupyx CSR, CSC, COO): the neighbour searches, the
affinities, the estimators and the metrics take it and give what the same data
given dense gives; the entry points that need dense rows refuse it by name."""
import numpy as np
import pytest
import scipy.sparse

import gpuembed as ge
from gpuembed.initialization import pca
from gpuembed.neighbors import knn_query
from gpuembed.spectral.kmeans import kmeans
from test_neighbors import assert_same_neighbours, brute_knn


def sparse_data(n=300, d=2000, density=0.02, seed=1, duplicate=True):
    """Bag-of-words-like rows: few nonzeros, continuous values (no distance ties),
    a duplicated row (3 = 7, unless ``duplicate`` is False) and an empty one (11)."""
    rng = np.random.default_rng(seed)
    X = scipy.sparse.random(n, d, density=density, random_state=seed, format="csr")
    X.data = rng.random(X.nnz) * 3
    X = X.tolil()
    if duplicate:
        X[3] = X[7]
    X[11] = 0
    X = X.tocsr()
    X.eliminate_zeros()
    return X


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "csr_array"])
def test_sparse_knn_matches_brute_force(backend, dtype, fmt):
    X = sparse_data().astype(dtype)
    X = scipy.sparse.csr_array(X) if fmt == "csr_array" else X.asformat(fmt)
    dense = X.toarray()
    ref_d, ref_i = brute_knn(dense, 9)
    given = be_sparse(backend, X) if fmt == "csr" else X
    sqdist, idx = (backend.to_host(a) for a in ge.knn(given, 9, backend=backend))
    assert sqdist.dtype == dtype and idx.dtype == np.int64
    np.testing.assert_allclose(sqdist, ref_d, rtol=1e-4 if dtype == np.float32 else 1e-10,
                               atol=1e-6 if dtype == np.float32 else 1e-12)
    # Row 48's 6th and 7th neighbours lie 4e-8 apart relatively (float32's
    # resolution): the H100 returned them swapped.
    assert_same_neighbours(dense, idx, ref_d, ref_i, dtype)
    assert idx[3, 0] == 7 and sqdist[3, 0] == 0.0      # the duplicate, at exactly 0


def be_sparse(backend, X):
    return backend.sparse.csr_matrix(X) if backend.is_gpu else X


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_sparse_gram_equals_scipy(dtype):
    from gpuembed.neighbors_cpu import sparse_gram

    from gpuembed.neighbors_cpu import FREQUENT_MAX

    A = sparse_data(n=60, d=300, density=0.1).astype(dtype)
    rare = sparse_data(n=90, d=300, density=0.01, seed=2).astype(dtype)
    common = rare.tolil()
    common[:, :FREQUENT_MAX + 20] = 1.0        # in every row: more than the GEMM takes
    common[11] = 0
    for B in (rare, common.tocsr()):
        got = sparse_gram(A, B)
        assert got.dtype == dtype and got.shape == (60, 90) and got.flags.c_contiguous
        np.testing.assert_allclose(got, (A @ B.T).toarray(), rtol=1e-5 if dtype == np.float32
                                   else 1e-13, atol=1e-5 if dtype == np.float32 else 1e-13)
        assert not got[11].any() and not got[:, 11].any()          # the empty rows


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_rows_product_is_the_product_bit_for_bit(threads, monkeypatch):
    """_sparse.rows_product: A @ B by spans of A's rows on threads, the same
    entries and bits as SciPy's product on any number of threads (also with rows
    of A that are empty and spans that end on them)."""
    import numba

    from gpuembed._sparse import rows_product

    monkeypatch.setattr(numba, "get_num_threads", lambda: threads)
    A = sparse_data(n=301, d=400, density=0.05)
    B = sparse_data(n=400, d=250, density=0.05, seed=2)
    product = rows_product(A, B)
    expected = (A @ B).tocsr()
    assert product.format == "csr" and product.shape == (301, 250)
    assert (product != expected).nnz == 0
    np.testing.assert_array_equal(product.toarray(), expected.toarray())


def test_sparse_knn_in_small_blocks_and_queries(rng):
    X = sparse_data(n=200, d=500, density=0.05)
    full = ge.knn(X, 7, backend="cpu")
    blocked = ge.knn(X, 7, backend="cpu", block_bytes=200 * 8 * 3 * 8)   # 8 rows a block
    np.testing.assert_array_equal(full[1], blocked[1])
    np.testing.assert_allclose(full[0], blocked[0], rtol=1e-12)
    # Queries: sparse or dense against sparse or dense points, all the same.
    Q, Xd = X[::5], X.toarray()
    ref = knn_query(Q.toarray(), Xd, 4, backend="cpu")
    for q, x in ((Q, X), (Q.toarray(), X), (Q, Xd)):
        d, i = knn_query(q, x, 4, backend="cpu")
        np.testing.assert_array_equal(i, ref[1])
        np.testing.assert_allclose(d, ref[0], rtol=1e-10, atol=1e-12)
        assert d[:, 0].max() == 0.0                  # each query is a point of X


def test_sparse_input_is_checked_and_left_alone():
    X = scipy.sparse.coo_matrix(([1.0, 2.0, 5.0], ([0, 0, 2], [1, 1, 0])), shape=(5, 3))
    before = (X.row.copy(), X.col.copy(), X.data.copy())
    A = ge.knn(X, 2, backend="cpu")
    assert A[0][0, 0] == 9.0 + 0.0               # duplicates summed: row 0 is (0, 3, 0)
    np.testing.assert_array_equal(X.data, before[2])        # the caller's copy unchanged
    np.testing.assert_array_equal(X.row, before[0])
    ints = scipy.sparse.csr_matrix(np.eye(4, dtype=np.int64))
    assert ge.knn(ints, 1, backend="cpu")[0].dtype == np.float64
    bad = scipy.sparse.csr_matrix(np.eye(4))
    bad.data[2] = np.nan
    with pytest.raises(ValueError, match="X contains NaN"):
        ge.knn(bad, 1, backend="cpu")
    with pytest.raises(ValueError, match="X: Complex data not supported"):
        ge.knn(scipy.sparse.csr_matrix(np.eye(4) * 1j), 1, backend="cpu")
    with pytest.raises(ValueError, match="Q has 3 features"):
        knn_query(scipy.sparse.csr_matrix(np.eye(3)), scipy.sparse.csr_matrix(np.eye(4)), 1,
                  backend="cpu")
    # Entry points that need dense rows say so, naming the parameter.
    with pytest.raises(TypeError, match="X is a sparse matrix.*toarray"):
        ge.nbody.kernel_sums(scipy.sparse.csr_matrix(np.eye(4)[:, :2]), "gaussian",
                             backend="cpu")
    with pytest.raises(TypeError, match="Y is a sparse matrix.*toarray"):
        ge.ParametricEmbedding(ge.EE(backend="cpu"), mapping="linear").fit(
            scipy.sparse.csr_matrix(np.eye(10)))


@pytest.mark.parametrize("d", [300, 2500])          # eigh of the scatter; svds beyond 2,000
def test_sparse_pca_equals_dense_pca(d):
    X = sparse_data(n=200, d=d, density=0.05)
    np.testing.assert_allclose(pca(X, 3), pca(X.toarray(), 3), rtol=1e-8, atol=1e-10)


def test_sparse_affinities_and_estimators_equal_dense():
    # Without duplicates: a coincident pair's split amplifies the last bits.
    X = sparse_data(duplicate=False)
    Xd = X.toarray()
    A, B = (ge.entropic_affinities(x, 10, backend="cpu") for x in (X, Xd))
    np.testing.assert_array_equal(A.neighbors[1], B.neighbors[1])
    assert abs(A.P - B.P).max() <= 1e-12 * B.P.max()
    for cls in (ge.TSNE, ge.EE):
        sparse = cls(perplexity=10, max_iter=50, random_state=0, backend="cpu").fit(X)
        dense = cls(perplexity=10, max_iter=50, random_state=0, backend="cpu").fit(Xd)
        scale = np.abs(dense.embedding_).max()
        np.testing.assert_allclose(sparse.embedding_, dense.embedding_, atol=1e-9 * scale)
        # New points: the last bits of their distances move where transform's
        # stopping test ends (about 1e-6 of the scale).
        new = X[::10]
        expected = dense.transform(new.toarray())
        for model in (sparse, dense):
            np.testing.assert_allclose(model.transform(new), expected, atol=1e-5 * scale)
    M = ge.multiscale_affinities(X, n_scales=3, backend="cpu")
    Md = ge.multiscale_affinities(Xd, n_scales=3, backend="cpu")
    assert abs(M.P - Md.P).max() <= 1e-12 * Md.P.max()
    sparse, dense = (ge.MultiscaleSNE(n_scales=2, max_iter=10, backend="cpu").fit(x)
                     for x in (X, Xd))
    scale = np.abs(dense.embedding_).max()
    np.testing.assert_allclose(sparse.embedding_, dense.embedding_, atol=1e-9 * scale)
    expected = dense.transform(new.toarray())
    for model in (sparse, dense):
        np.testing.assert_allclose(model.transform(new), expected, atol=1e-5 * scale)


def test_sparse_metrics_equal_dense(rng):
    X = sparse_data(n=150)
    Y = rng.standard_normal((150, 2))
    np.testing.assert_allclose(ge.metrics.rnx(X, Y, backend="cpu"),
                               ge.metrics.rnx(X.toarray(), Y, backend="cpu"), atol=1e-12)


def test_sparse_spectral_methods_equal_dense():
    X = sparse_data(n=400, d=300, density=0.1)
    Xd = X.toarray()
    for params in ({}, {"n_landmarks": 100}, {"n_landmarks": 100, "landmarks": "random-pruned"}):
        fits = [ge.LaplacianEigenmaps(2, n_neighbors=10, random_state=0, backend="cpu",
                                      **params).fit(x) for x in (X, Xd)]
        assert ge.metrics.procrustes_error(fits[1].embedding_, fits[0].embedding_) < 1e-8
        assert ge.metrics.procrustes_error(fits[1].transform(Xd[:20]),
                                           fits[0].transform(X[:20])) < 1e-8
    # k-means landmarks: k-means itself gives the same clusters on sparse rows.
    labels, centers, inertia = kmeans(X, 8, n_init=2, random_state=0)
    labels_d, centers_d, inertia_d = kmeans(Xd, 8, n_init=2, random_state=0)
    np.testing.assert_array_equal(labels, labels_d)
    np.testing.assert_allclose(centers, centers_d, atol=1e-12)
    assert inertia == pytest.approx(inertia_d, rel=1e-12)
    fit = ge.LaplacianEigenmaps(2, n_neighbors=10, n_landmarks=100, landmarks="kmeans",
                                random_state=0, backend="cpu").fit(X)
    assert fit.embedding_.shape == (400, 2) and np.isfinite(fit.embedding_).all()
    clusters = ge.SpectralClustering(4, n_neighbors=10, random_state=0, backend="cpu")
    np.testing.assert_array_equal(
        clusters.fit_predict(X),
        ge.SpectralClustering(4, n_neighbors=10, random_state=0, backend="cpu").fit_predict(Xd))


@pytest.mark.gpu
def test_gpu_sparse_fit_equals_cpu():
    """A scipy matrix goes to the device as cupyx CSR; t-SNE on it equals t-SNE
    on the same rows given dense to the GPU (float64 both)."""
    X = sparse_data(n=200, d=400, density=0.05)
    be = ge.get_backend("gpu")
    A = ge.entropic_affinities(X, 10, backend=be)
    B = ge.entropic_affinities(X.toarray(), 10, backend="cpu")
    np.testing.assert_array_equal(be.to_host(A.neighbors[1]), B.neighbors[1])
    sparse = ge.TSNE(perplexity=10, max_iter=30, random_state=0, dtype=np.float64,
                     backend=be).fit(be.sparse.csr_matrix(X))
    dense = ge.TSNE(perplexity=10, max_iter=30, random_state=0, dtype=np.float64,
                    backend=be).fit(X.toarray())
    scale = np.abs(dense.embedding_).max()
    np.testing.assert_allclose(sparse.embedding_, dense.embedding_, atol=1e-8 * scale)
    np.testing.assert_allclose(sparse.transform(X[:20]), dense.transform(X[:20].toarray()),
                               atol=1e-5 * scale)          # knn_query on cupyx rows
    np.testing.assert_allclose(
        be.to_host(ge.metrics.rnx(X, sparse.embedding_, backend=be)),
        ge.metrics.rnx(X.toarray(), sparse.embedding_, backend="cpu"), atol=1e-12)
