"""Objectives of seed 002 section 1 against dense brute-force formulas and finite differences."""
import numpy as np
import pytest
import scipy.sparse

import gpuembed as ge
from gpuembed import objectives
from gpuembed.nbody.exact import blocked_sums, exact_sums, xx_terms


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((60, 10))
    P = ge.entropic_affinities(X, 8.0, backend="cpu").P
    Pc = ge.entropic_affinities(X, 8.0, symmetrize=False, backend="cpu").P
    Y = rng.standard_normal((60, 2)) * 1.5
    return P, Pc, Y


def dense_value(name, Y, P, lam=None):
    """Each objective written out over the dense N x N matrices."""
    P = P.toarray()
    D = ((Y[:, None] - Y[None]) ** 2).sum(-1)
    off = ~np.eye(len(Y), dtype=bool)
    plogp = np.sum(P[P > 0] * np.log(P[P > 0]))
    if name == "ee":
        return np.sum(P * D) + lam * np.sum(np.exp(-D)[off])
    if name == "ssne":
        Q = np.where(off, np.exp(-D), 0)
        Q /= Q.sum()
        return plogp - np.sum(P[P > 0] * np.log(Q[P > 0]))
    if name == "tsne":
        Q = np.where(off, 1 / (1 + D), 0)
        Q /= Q.sum()
        return plogp - np.sum(P[P > 0] * np.log(Q[P > 0]))
    Q = np.where(off, np.exp(-D), 0)           # sne: per-row normalization
    Q /= Q.sum(axis=1, keepdims=True)
    return plogp - np.sum(P[P > 0] * np.log(Q[P > 0]))


def central_differences(f, Y, h):
    """d f(Y)[...] / dY_ij by central differences, for every entry of Y."""
    out = []
    for i in range(Y.shape[0]):
        for j in range(Y.shape[1]):
            Yp, Ym = Y.copy(), Y.copy()
            Yp[i, j] += h
            Ym[i, j] -= h
            out.append((f(Yp, i, j) - f(Ym, i, j)) / (2 * h))
    return np.array(out).reshape(Y.shape)


@pytest.mark.parametrize("name", ["ee", "ssne", "tsne", "sne"])
def test_value_matches_dense_formula(problem, name):
    P, Pc, Y = problem
    PP = Pc if name == "sne" else P
    E, _ = objectives.value_and_grad(name, Y, PP, lambda_=0.3) if name == "ee" else \
        objectives.value_and_grad(name, Y, PP)
    assert E == pytest.approx(dense_value(name, Y, PP, 0.3), rel=1e-12)


@pytest.mark.parametrize("name", ["ee", "ssne", "tsne", "sne"])
def test_gradient_matches_finite_differences(problem, name):
    P, Pc, Y = problem
    PP = Pc if name == "sne" else P
    _, G = objectives.value_and_grad(name, Y, PP)
    num = central_differences(lambda Z, i, j: objectives.value_and_grad(name, Z, PP)[0], Y, 1e-6)
    np.testing.assert_allclose(G, num, rtol=1e-5, atol=1e-7 * np.abs(G).max())
    assert np.abs(G.sum(axis=0)).max() < 1e-10 * np.abs(G).max() * len(Y)   # shift invariance


@pytest.mark.parametrize("name", ["ee", "ssne", "tsne"])
def test_hessian_diagonal_matches_finite_differences(problem, name):
    P, _, Y = problem
    obj = objectives.make_objective(name, P, ge.get_backend("cpu"), np.float64)
    H = obj.hessian_diagonal(Y)
    num = central_differences(lambda Z, i, j: obj.value_and_grad(Z)[1][i, j], Y, 1e-5)
    np.testing.assert_allclose(H, num, rtol=1e-5, atol=1e-6 * np.abs(num).max())


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_compiled_attraction_equals_the_array_code(problem, dtype):
    # The CPU's one-pass sweep against the reference (the GPU's array code), on the
    # conditional affinities (rows differ from columns) and in 3-D.
    _, Pc, _ = problem
    pairs = objectives.base.PairSet(ge.get_backend("cpu"), Pc, dtype)
    Y = np.random.default_rng(5).normal(size=(Pc.shape[0], 3)).astype(dtype) * 2
    for student in (False, True):
        value, G = pairs.attraction(Y, student)
        value0, G0 = pairs.attraction_arrays(Y, student)
        assert G.dtype == dtype
        tol = 1e-12 if dtype == np.float64 else 1e-5
        assert value == pytest.approx(value0, rel=tol)
        np.testing.assert_allclose(G, G0, rtol=tol, atol=tol * np.abs(G0).max())



@pytest.mark.gpu
@pytest.mark.parametrize("d", [1, 2, 3])
def test_gpu_attraction_kernel_equals_the_array_code(d):
    # kernels/attraction.cu (a warp per row) against the array code on the device:
    # symmetric and conditional affinities whose rows hold 40-110 entries (more than
    # a warp's 32 lanes), float64 to rounding, float32 as the CPU's sweep.
    gpu = ge.get_backend("gpu")
    rng = np.random.default_rng(7)
    X = rng.standard_normal((300, 10))
    for symmetrize in (True, False):
        P = ge.entropic_affinities(X, 20.0, symmetrize=symmetrize, backend="cpu").P
        assert np.diff(P.indptr).max() > 32
        Y = rng.normal(size=(300, d)) * 2
        for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-5)):
            pairs = objectives.base.PairSet(gpu, gpu.sparse.csr_matrix(P), dtype)
            for student in (False, True):
                value, G = pairs.attraction(gpu.asarray(Y, dtype), student)
                value0, G0 = pairs.attraction_arrays(gpu.asarray(Y, dtype), student)
                G, G0 = gpu.to_host(G), gpu.to_host(G0)
                assert value.shape == () and G.dtype == dtype    # left on the device
                value, = gpu.host_floats(value)
                assert value == pytest.approx(value0, rel=tol)
                np.testing.assert_allclose(G, G0, rtol=tol, atol=tol * np.abs(G0).max())


@pytest.mark.gpu
def test_gpu_transposed_laplacian_product_equals_the_cpu_one():
    """sum_m w_mn (x_n - x_m) on a conditional (non-symmetric) pattern, with rows and
    columns of uneven lengths and an empty row: on the GPU from the transposed
    pattern built once (cuSPARSE's transposed product sums in another order at
    every run), the CPU's W^T product to rounding."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((200, 5))
    P = ge.entropic_affinities(X, 10.0, symmetrize=False, backend="cpu").P.tolil()
    P[7, :] = 0.0
    P = P.tocsr()
    P.eliminate_zeros()
    w = rng.uniform(0.5, 2.0, P.nnz)
    Y = rng.standard_normal((200, 2))
    cpu, gpu = ge.get_backend("cpu"), ge.get_backend("gpu")
    expected = objectives.base.PairSet(cpu, P, np.float64).laplacian_times(w, Y, transpose=True)
    pairs = objectives.base.PairSet(gpu, gpu.sparse.csr_matrix(P), np.float64)
    got = gpu.to_host(pairs.laplacian_times(gpu.asarray(w), gpu.asarray(Y), transpose=True))
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())
    W = scipy.sparse.csr_matrix((w, P.indices, P.indptr), shape=P.shape)
    reference = np.asarray(W.sum(axis=0)).ravel()[:, None] * Y - W.T @ Y
    np.testing.assert_allclose(expected, reference, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
def test_objectives_read_the_device_once_per_evaluation(problem):
    """Each host read waits for all the device's queued work: the attraction's value
    and the normalization come back together.  Counted on the CUDA emulator (exact
    sums, which read nothing): one read per evaluation for t-SNE, s-SNE and EE, two
    for SNE (its validity test first); the values as on the CPU."""
    emulated_cupy = pytest.importorskip("emulated_cupy")
    gpu = ge.get_backend("gpu")
    if gpu.xp is not emulated_cupy.cupy:
        pytest.skip("counts the host reads of the CUDA emulator")
    P, Pc, Y = problem
    for name, reads in (("tsne", 1), ("ssne", 1), ("ee", 1), ("sne", 2)):
        A = Pc if name == "sne" else P
        on = {be.name: objectives.make_objective(name, be.sparse.csr_matrix(A), be, np.float64)
              for be in (gpu, ge.get_backend("cpu"))}
        with emulated_cupy.counting() as (counts, _):
            value, _ = on["gpu"].value_and_grad(gpu.asarray(Y))
        assert counts["reads"] == reads, name
        assert value == pytest.approx(on["cpu"].value_and_grad(Y)[0], rel=1e-12), name


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_compiled_edge_distances_equal_the_array_code_and_brute_force(problem, dtype):
    # Same bits as the array code (same operations in the same order), and each
    # edge's value is |y_n - y_m|^2 of its own (row, column) pair.
    _, Pc, _ = problem
    pairs = objectives.base.PairSet(ge.get_backend("cpu"), Pc, dtype)
    rng = np.random.default_rng(6)
    for d in (1, 2, 3):
        Y = (rng.normal(size=(Pc.shape[0], d)) * 3).astype(dtype)
        d2 = pairs.sqdist(Y)
        assert d2.dtype == dtype
        np.testing.assert_array_equal(d2, pairs.sqdist_arrays(Y))
        coo = pairs.P.tocoo()
        brute = ((Y[coo.row].astype(np.float64) - Y[coo.col]) ** 2).sum(axis=1)
        np.testing.assert_allclose(d2, brute, rtol=1e-12 if dtype == np.float64 else 1e-6)


def test_pair_set_copies_affinities_unless_owned_and_canonical():
    """PairSet keeps a matrix it owns in canonical form as it is (multi-scale SNE's
    mean affinities, made for it); any other it copies, so that summing duplicates
    and sorting indices never reach the caller's arrays."""
    be = ge.get_backend("cpu")
    canonical = scipy.sparse.random(30, 30, density=0.3, format="csr", random_state=0)
    owned = objectives.base.PairSet(be, canonical, np.float64, owned=True)
    assert np.shares_memory(owned.P.data, canonical.data)
    assert np.shares_memory(owned.P.indices, canonical.indices)
    for own in (False, True):
        unsorted = scipy.sparse.csr_matrix(
            (canonical.data[::-1].copy(), canonical.indices.copy(), canonical.indptr.copy()),
            shape=canonical.shape)
        unsorted.indices = np.concatenate([unsorted.indices[a:b][::-1] for a, b in
                                           zip(unsorted.indptr[:-1], unsorted.indptr[1:])])
        before = (unsorted.data.copy(), unsorted.indices.copy())
        pairs = objectives.base.PairSet(be, unsorted, np.float64, owned=own)
        assert pairs.P.has_canonical_format
        np.testing.assert_array_equal(pairs.P.toarray(), unsorted.toarray())
        np.testing.assert_array_equal(unsorted.data, before[0])
        np.testing.assert_array_equal(unsorted.indices, before[1])
        assert not np.shares_memory(pairs.P.indices, unsorted.indices)
    copied = objectives.base.PairSet(be, canonical, np.float64)
    assert not np.shares_memory(copied.P.data, canonical.data)


def test_exact_engine_against_brute_force(rng):
    be = ge.get_backend("cpu")
    for d in (1, 2, 3, 7):
        X = rng.standard_normal((150, d)) * rng.choice([0.1, 1.0, 10.0])
        D = ((X[:, None] - X[None]) ** 2).sum(-1)
        np.fill_diagonal(D, np.inf)
        w = rng.random(150)
        kernels = {"gaussian": np.exp(-D), "student": 1 / (1 + D), "student2": 1 / (1 + D) ** 2}
        out = blocked_sums(be, X, tuple(kernels), weights=w, block_bytes=150 * 8 * 16)
        for (S, SX), K in zip(out, kernels.values()):
            np.testing.assert_allclose(S, (K * w).sum(1), rtol=1e-10, atol=1e-300)
            np.testing.assert_allclose(SX, (K * w) @ X, rtol=1e-9, atol=1e-12 * np.abs(X).max())
        S, SX = ge.nbody.kernel_sums(X, "student", backend="cpu")
        np.testing.assert_allclose(S, kernels["student"].sum(1), rtol=1e-10)


def test_exact_engine_with_separate_targets(rng):
    be = ge.get_backend("cpu")
    X, T = rng.standard_normal((80, 2)), rng.standard_normal((13, 2))
    D = ((T[:, None] - X[None]) ** 2).sum(-1)
    (S, SX), = exact_sums(be, X, ("gaussian",), Y=T)
    np.testing.assert_allclose(S, np.exp(-D).sum(1), rtol=1e-12)
    np.testing.assert_allclose(SX, np.exp(-D) @ X, rtol=1e-10, atol=1e-14)


def test_xx_terms_matches_dense(rng):
    be = ge.get_backend("cpu")
    X, V = rng.standard_normal((50, 2)), rng.standard_normal((50, 2))
    D = ((X[:, None] - X[None]) ** 2).sum(-1)
    C = np.exp(-D)
    np.fill_diagonal(C, 0)
    out = xx_terms(be, X, lambda Db: np.exp(-Db), V)
    diag = xx_terms(be, X, lambda Db: np.exp(-Db))
    for i in range(2):
        W = C * (X[:, i, None] - X[None, :, i]) ** 2
        np.testing.assert_allclose(out[:, i], W.sum(1) * V[:, i] - W @ V[:, i], rtol=1e-10)
        np.testing.assert_allclose(diag[:, i], W.sum(1), rtol=1e-10)


def test_bad_arguments(problem):
    P, _, Y = problem
    with pytest.raises(ValueError, match="name"):
        objectives.value_and_grad("umap", Y, P)
    with pytest.raises(ValueError, match="name"):
        objectives.value_and_grad("umap", Y, None)
    with pytest.raises(TypeError, match="P must be an .N, N. sparse or dense matrix, got NoneType"):
        objectives.value_and_grad("tsne", Y, None)
    with pytest.raises(ValueError, match="P must be"):
        objectives.value_and_grad("tsne", Y[:10], P)
    with pytest.raises(ValueError, match=r"P must be a square \(N, N\) matrix"):
        objectives.make_objective("ee", P[:, :-1], ge.get_backend("cpu"), np.float64)
    with pytest.raises(ValueError, match="NaN"):
        objectives.value_and_grad("tsne", np.full_like(Y, np.nan), P)
    with pytest.raises(ValueError, match="lambda_ must be >= 0.0, got -1.0"):
        objectives.value_and_grad("ee", Y, P, lambda_=-1.0)
    # A misspelt parameter named the objective class's __init__, and tsne took the
    # estimators' internal ones (accuracy, owned) as if they were its.
    with pytest.raises(TypeError, match=r"value_and_grad\('ee'\) takes \['lambda_'\] params, "
                                        r"got \['lam'\]"):
        objectives.value_and_grad("ee", Y, P, lam=1.0)
    with pytest.raises(TypeError, match=r"value_and_grad\('tsne'\) takes no params"):
        objectives.value_and_grad("tsne", Y, P, lambda_=1.0)


@pytest.mark.parametrize("name", ["ee", "ssne", "tsne", "sne"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -1.0])
def test_affinities_with_a_bad_entry(problem, name, bad):
    """A NaN made the sum test say "no positive entry"; a negative pair weight
    (symmetric, so every structure test passed) went into EE's value unnoticed."""
    P, Pc, Y = problem
    P = (Pc if name == "sne" else P).tolil()
    P[0, 1] = P[1, 0] = bad * P[0, 1]
    with pytest.raises(ValueError, match="affinities must be finite and non-negative"):
        objectives.value_and_grad(name, Y, P.tocsr())
    with pytest.raises(ValueError, match="kernel"):
        ge.nbody.kernel_sums(Y, "cauchy", backend="cpu")
