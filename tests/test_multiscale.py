"""Multi-scale affinities (../shared/papers/004_13864de36f3612a6.txt, eq. 2.11)."""
import json
import warnings

import numpy as np
import pytest

import gpuembed as ge
from gpuembed.affinities.multiscale import scale_perplexities


def test_scales_follow_powers_of_two():
    np.testing.assert_array_equal(scale_perplexities(100, 2.0, "all"), [2, 4, 8, 16, 32])
    np.testing.assert_array_equal(scale_perplexities(100, 2.0), [2, 4, 8])    # K_H <= N / 8
    np.testing.assert_array_equal(scale_perplexities(100, 3.0, n_scales=2), [3, 6])
    with pytest.raises(ValueError, match="perplexity"):
        scale_perplexities(100, 1.0)
    with pytest.raises(ValueError, match="perplexity"):
        scale_perplexities(10, 6.0)


def test_default_scales_fit_the_neighbour_budget():
    from gpuembed.affinities.multiscale import MIN_LARGEST, NEIGHBOR_BUDGET
    for n in (1797, 4000, 10_000, 70_000, 1_000_000):
        every = scale_perplexities(n, 2.0, n_scales="all")
        kept = scale_perplexities(n, 2.0)
        np.testing.assert_array_equal(kept, every[:kept.size])         # the smallest ones
        assert kept.size <= every.size - 2 and kept[-1] <= n / 8
        k = lambda K: min(n - 1, int(np.ceil(3 * K)))
        assert n * k(kept[-1]) <= NEIGHBOR_BUDGET or kept[-1] <= MIN_LARGEST
        if kept.size < every.size - 2:                                 # one more would not fit
            assert n * k(every[kept.size]) > NEIGHBOR_BUDGET and kept[-1] >= MIN_LARGEST
    assert scale_perplexities(4000, 2.0).size == scale_perplexities(4000, 2.0, "all").size - 2
    np.testing.assert_array_equal(scale_perplexities(70_000, 2.0), [2, 4, 8, 16, 32, 64])
    np.testing.assert_array_equal(scale_perplexities(10**6, 2.0), [2, 4, 8, 16, 32])
    with pytest.raises(ValueError, match="n_scales"):
        scale_perplexities(100, 2.0, n_scales="most")
    # 100 points hold 5 scales from perplexity 2 (up to 32); more is an error, not 5.
    np.testing.assert_array_equal(scale_perplexities(100, 2.0, n_scales=5), [2, 4, 8, 16, 32])
    with pytest.raises(ValueError,
                       match=r"^n_scales \(N = 100, perplexity 2\) must be in \[1, 5\]"):
        scale_perplexities(100, 2.0, n_scales=6)


def test_average_of_single_scale_conditional_rows(rng):
    X = rng.standard_normal((150, 4))
    M = ge.multiscale_affinities(X, 2.0, n_scales="all", symmetrize=False, backend="cpu")
    assert list(M.perplexities) == [2, 4, 8, 16, 32, 64]
    singles = [ge.entropic_affinities(X, K, n_neighbors=149, symmetrize=False,
                                      backend="cpu").P.toarray() for K in M.perplexities]
    np.testing.assert_allclose(M.P.toarray(), np.mean(singles, axis=0), rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(M.entropy, np.log(M.perplexities)[None, :].repeat(150, 0),
                               atol=1e-10)
    J = ge.multiscale_affinities(X, 2.0, backend="cpu").P
    assert abs(J.sum() - 1) < 1e-12 and abs(J - J.T).max() < 1e-15


def test_scales_share_one_sorted_pattern(rng):
    """Each scale's conditionals on one canonical pattern (columns sorted per row),
    equal to the single-scale affinities on the same k-NN graph; the objectives
    average them by their data arrays, which needs that pattern."""
    from gpuembed.affinities.multiscale import mean_on_pattern
    X = rng.standard_normal((200, 4))
    M = ge.multiscale_affinities(X, 2.0, n_scales=3, symmetrize=False, backend="cpu")
    first = M.conditionals[0]
    for K, C in zip(M.perplexities, M.conditionals):
        assert C.has_canonical_format and C.nnz == 200 * 24
        np.testing.assert_array_equal(C.indices, first.indices)
        single = ge.entropic_affinities(X, K, n_neighbors=24, symmetrize=False, backend="cpu")
        np.testing.assert_allclose(C.toarray(), single.P.toarray(), rtol=1e-9, atol=1e-15)
    be = ge.get_backend("cpu")
    np.testing.assert_allclose(mean_on_pattern(be, M.conditionals).toarray(), M.P.toarray(),
                               rtol=1e-14)
    other = ge.multiscale_affinities(X[::-1], 2.0, n_scales=3, symmetrize=False, backend="cpu")
    with pytest.raises(ValueError, match="one sparsity pattern"):
        mean_on_pattern(be, [first, other.conditionals[1]])


def test_too_few_neighbours(rng):
    X = rng.standard_normal((100, 3))
    with pytest.raises(ValueError, match="n_neighbors"):
        ge.multiscale_affinities(X, 2.0, n_neighbors=20, n_scales="all", backend="cpu")
    M = ge.multiscale_affinities(X, 2.0, n_neighbors=20, n_scales=3, backend="cpu")
    assert M.beta.shape == (100, 3)


from gpuembed.objectives.msne import MultiscaleObjective, intrinsic_exponent, ld_precisions  # noqa


def dense_multiscale_cost(Y, sigmas, p, cost, kappa):
    """Eqs 2.3 / 2.7 with 2.10-2.11 over the dense N x N matrices."""
    n = len(Y)
    D = ((Y[:, None] - Y[None]) ** 2).sum(-1)
    S = sum(s.toarray() for s in sigmas) / len(sigmas)
    s = 0
    for ph in p:
        e = np.exp(-ph * D / 2)
        np.fill_diagonal(e, 0)
        s = s + e / e.sum(1, keepdims=True)
    s /= len(p)
    off = ~np.eye(n, dtype=bool)
    m = S > 0
    if cost == "kl":
        return np.sum(S[m] * np.log(S[m] / s[m]))
    z = kappa * S + (1 - kappa) * s
    return (kappa * np.sum(S[m] * np.log(S[m] / z[m]))
            + (1 - kappa) * np.sum(s[off] * np.log(s[off] / z[off]))) / (kappa * (1 - kappa))


def random_objective(rng, n, p_max, cost, kappa, chained=False):
    """Multi-scale affinities of n random 6-D points, LD precisions from 0.5 to
    p_max (``chained``: from 0.5 8^(H-1) down to 0.5, factors of 8, so that
    msne_cpu.squaring_plan squares kernels), and a random 2-D layout."""
    X = rng.standard_normal((n, 6))
    Y = rng.standard_normal((n, 2))
    M = ge.multiscale_affinities(X, 2.0, symmetrize=False, backend="cpu")
    H = len(M.perplexities)
    p = 0.5 * 8.0 ** np.arange(H)[::-1] if chained else np.geomspace(0.5, p_max, H)
    obj = MultiscaleObjective(M.conditionals, ge.get_backend("cpu"), np.float64, p, cost, kappa)
    return Y, M, p, obj


@pytest.mark.parametrize("cost,kappa", [("kl", 0.5), ("js", 0.3)])
def test_multiscale_cost_and_gradient(rng, cost, kappa):
    Y, M, p, obj = random_objective(rng, 50, 8.0, cost, kappa)
    E, G = obj.value_and_grad(Y)
    assert E == pytest.approx(dense_multiscale_cost(Y, M.conditionals, p, cost, kappa), rel=1e-10)
    h = 1e-6
    num = np.zeros_like(Y)
    for i in range(len(Y)):
        for j in range(2):
            a, b = Y.copy(), Y.copy()
            a[i, j] += h
            b[i, j] -= h
            num[i, j] = (obj.value_and_grad(a)[0] - obj.value_and_grad(b)[0]) / (2 * h)
    np.testing.assert_allclose(G, num, rtol=1e-5, atol=1e-7 * np.abs(G).max())


@pytest.mark.parametrize("cost,kappa", [("kl", 0.5), ("js", 0.3)])
def test_floored_similarities_do_not_pull(rng, cost, kappa):
    """A layout spread 10x beyond its fine scales' reach: HD neighbours whose LD
    similarity underflows at every scale sit on the floor, where the cost is
    flat.  The compiled sweep once pulled them with exp(-708) kernels (one
    point's gradient 50x too large); it must equal the array code."""
    Y, M, p, obj = random_objective(rng, 300, 5e4, cost, kappa)
    Y = 10.0 * Y
    E, G = obj.value_and_grad(Y)
    obj.compiled = False
    E_array, G_array = obj.value_and_grad(Y)
    assert E == pytest.approx(E_array, rel=1e-10)
    np.testing.assert_allclose(G, G_array, rtol=1e-6, atol=1e-7 * np.abs(G).max())


@pytest.mark.gpu
@pytest.mark.parametrize("cost,kappa", [("kl", 0.5), ("js", 0.3)])
def test_gpu_objective_equals_cpu(rng, cost, kappa):
    """The GPU path (array edge terms, CuPy exact sums with shifts) against the CPU's
    compiled one, float64, with fine scales where unshifted kernels underflow."""
    Y, M, p, obj = random_objective(rng, 300, 5e4, cost, kappa)
    gpu = ge.get_backend("gpu")
    obj_gpu = MultiscaleObjective(M.conditionals, gpu, np.float64, p, cost, kappa)
    E, G = obj.value_and_grad(Y)
    E_gpu, G_gpu = obj_gpu.value_and_grad(gpu.asarray(Y))
    assert E_gpu == pytest.approx(E, rel=1e-10)
    np.testing.assert_allclose(gpu.to_host(G_gpu), G, rtol=1e-8, atol=1e-11 * np.abs(G).max())
    # float32 (the GPU's default) on a spread layout: evaluated in float64 inside,
    # since float32 cannot resolve the fine scales' shifted exponents.
    Y32 = (10.0 * Y).astype(np.float32)
    E, G = obj.value_and_grad(Y32.astype(np.float64))
    obj32 = MultiscaleObjective(M.conditionals, gpu, np.float32, p, cost, kappa)
    E_gpu, G_gpu = obj32.value_and_grad(gpu.asarray(Y32))
    assert G_gpu.dtype == np.float32 and E_gpu == pytest.approx(E, rel=1e-6)
    np.testing.assert_allclose(gpu.to_host(G_gpu), G, rtol=1e-4, atol=1e-6 * np.abs(G).max())


@pytest.mark.gpu
@pytest.mark.parametrize("cost,kappa", [("kl", 0.5), ("js", 0.3)])
@pytest.mark.parametrize("d,n_scales", [(2, "all"), (3, 3), (1, 2)])
def test_gpu_fused_kernels_match_array_code(rng, cost, kappa, d, n_scales):
    """kernels/msne.cu (msne_gpu.fused_exact: shifts found inside the row-sum pass,
    warp-per-row edge sweep, dense gradient) against the GPU's array code (shifted
    exact sums per scale) and the CPU's fused sweep, on dense and sparse patterns,
    with fine scales where unshifted kernels underflow and a duplicated point
    (a shift of 0); then spread 10x, where HD neighbours fall on the floor."""
    n = 200
    X = rng.standard_normal((n, 6))
    Y = rng.standard_normal((n, d))
    Y[7] = Y[3]
    M = ge.multiscale_affinities(X, 2.0, n_scales=n_scales, symmetrize=False, backend="cpu")
    p = np.geomspace(0.5, 5e4, len(M.perplexities))
    gpu = ge.get_backend("gpu")
    obj = MultiscaleObjective(M.conditionals, gpu, np.float64, p, cost, kappa)
    cpu = MultiscaleObjective(M.conditionals, ge.get_backend("cpu"), np.float64, p, cost, kappa)
    for layout in (Y, 10.0 * Y):
        obj.compiled = True
        E, G = obj.value_and_grad(gpu.asarray(layout))
        obj.compiled = False
        E0, G0 = obj.value_and_grad(gpu.asarray(layout))
        assert E == pytest.approx(E0, rel=1e-11)
        G, G0 = gpu.to_host(G), gpu.to_host(G0)
        # At the spread layout the two differ by up to 5e-11 of the largest entry
        # (js, 3-D; 3e-11 with the k-NN distances of brute force instead of the
        # k-d tree, which now serves this 6-D X), as the CPU's sweep does below.
        np.testing.assert_allclose(G, G0, rtol=1e-8, atol=1e-10 * np.abs(G0).max())
        E1, G1 = cpu.value_and_grad(layout)      # fastexp's exps and logs
        assert E == pytest.approx(E1, rel=1e-11)
        np.testing.assert_allclose(G, G1, rtol=1e-8, atol=1e-10 * np.abs(G1).max())


@pytest.mark.parametrize("chained", [False, True])
@pytest.mark.parametrize("cost,kappa", [("kl", 0.5), ("js", 0.3)])
def test_compiled_edge_sweep_matches_array_code(rng, cost, kappa, chained):
    """msne_cpu.edge_terms (the CPU's sweep beside the FGT and Barnes-Hut) against
    the array code (the GPU path), with fine scales where every unshifted kernel
    would underflow, or kernels squared from coarser scales; then the CPU's whole
    exact evaluation against the array code."""
    from gpuembed.objectives.msne_cpu import squaring_plan

    Y, _, p, obj = random_objective(rng, 300, 5e4, cost, kappa, chained)
    scales = obj._scales(Y)
    shifts = np.stack([m for *_, m in scales])
    assert squaring_plan(0.5 * p, shifts).any() == chained
    assert not squaring_plan(0.5 * p, shifts * (1 + 1e-15 * np.arange(len(p)))[:, None]).any()
    assert obj.compiled
    E, w, g = obj._edge_terms(Y, scales)
    obj.compiled = False
    E0, w0, g0 = obj._edge_terms(Y, scales)
    assert E == pytest.approx(E0, rel=1e-12)
    np.testing.assert_allclose(g, g0, rtol=1e-10, atol=1e-13 * np.abs(g0).max())
    w, w0 = np.array(w), np.array(w0)                       # JS: r of both signs, sums cancel
    np.testing.assert_allclose(w, w0, rtol=1e-11, atol=1e-13 * np.abs(w0).max())
    obj.compiled = False
    E1, G1 = obj.value_and_grad(Y)
    obj.compiled = True
    E2, G2 = obj.value_and_grad(Y)
    assert E1 == pytest.approx(E2, rel=1e-12)
    np.testing.assert_allclose(G1, G2, rtol=1e-9, atol=1e-12 * np.abs(G1).max())


def test_squaring_plan_chains_exact_powers_of_two_within_its_limit():
    """Kernels are squared from the next coarser scale only where the precisions
    differ by exactly 2^m (m >= 1; descending, as the scales' perplexities
    ascend), and never more than CHAIN_SQUARINGS (10) times since an exp."""
    from gpuembed.objectives.msne_cpu import squaring_plan

    assert squaring_plan(np.array([64.0, 16.0, 4.0, 1.0])).tolist() == [2, 2, 2, 0]
    assert squaring_plan(4.0 ** np.arange(8)[::-1]).tolist() == [2, 0, 2, 2, 2, 2, 2, 0]
    assert squaring_plan(np.array([2.0 ** 11, 1.0])).tolist() == [0, 0]     # 11 > 10
    assert squaring_plan(np.array([1024.0, 1.0])).tolist() == [10, 0]
    assert squaring_plan(np.array([1.0, 4.0, 16.0])).tolist() == [0, 0, 0]  # ascending
    assert squaring_plan(np.array([12.0, 4.0, 4.0, 1.0 + 1e-15])).tolist() == [0, 0, 0, 0]
    assert squaring_plan(np.array([3.0])).tolist() == [0]


@pytest.mark.parametrize("cost,kappa", [("kl", 0.5), ("js", 0.3)])
@pytest.mark.parametrize("n_scales,chained", [("all", False), ("all", True), (3, False),
                                              (3, True)])
def test_fused_exact_sweep_matches_the_split_computation(rng, cost, kappa, n_scales, chained):
    """msne_cpu.fused_exact (the CPU's exact engine: every kernel computed once)
    against the exact sums plus the compiled edge sweep, on a dense pattern (all
    scales) and a sparse one (3 scales), with fine scales where unshifted kernels
    underflow, each scale's kernels an exp or (``chained``: precisions falling by
    factors of 8, as ld_precisions' do by powers of two) the coarser scale's
    squared 3 times, from an exp again after 9 squarings; and against the array
    code in float32."""
    from gpuembed.objectives.msne_cpu import squaring_plan

    X = rng.standard_normal((300, 6))
    Y = rng.standard_normal((300, 2))
    M = ge.multiscale_affinities(X, 2.0, n_scales=n_scales, symmetrize=False, backend="cpu")
    H = len(M.perplexities)
    p = 0.5 * 8.0 ** np.arange(H)[::-1] if chained else np.geomspace(0.5, 5e4, H)
    plan = squaring_plan(0.5 * p)
    assert plan.tolist() == ([3, 3, 0, 3, 3, 3, 0][-H:] if chained else [0] * H)
    be = ge.get_backend("cpu")
    obj = MultiscaleObjective(M.conditionals, be, np.float64, p, cost, kappa)
    assert (obj.pairs.P.nnz == 300 * 299) == (n_scales == "all")
    E, G = obj.value_and_grad(Y)
    split = MultiscaleObjective(M.conditionals, be, np.float64, p, cost, kappa)
    E0 = split._edge_terms(Y, split._scales(Y))[0]
    assert E == pytest.approx(E0, rel=1e-12)
    split.compiled = False
    E1, G1 = split.value_and_grad(Y)
    assert E == pytest.approx(E1, rel=1e-12)
    np.testing.assert_allclose(G, G1, rtol=1e-9, atol=1e-11 * np.abs(G1).max())
    obj32 = MultiscaleObjective(M.conditionals, be, np.float32, p, cost, kappa)
    E32, G32 = obj32.value_and_grad(Y.astype(np.float32))
    assert G32.dtype == np.float32
    assert E32 == pytest.approx(E, rel=1e-6)
    np.testing.assert_allclose(G32, G, rtol=1e-3, atol=1e-5 * np.abs(G).max())


def clustered_with_outlier(rng):
    """Two clusters of 300 points and an outlier at (40, -40) that every fine
    scale isolates, multi-scale affinities of random 8-D data, LD precisions."""
    X = rng.standard_normal((600, 8))
    Y = np.concatenate([rng.standard_normal((300, 2)), rng.standard_normal((300, 2)) + 6.0])
    Y[0] = (40.0, -40.0)
    M = ge.multiscale_affinities(X, 2.0, symmetrize=False, backend="cpu")
    return Y, M, ld_precisions(M.perplexities, Y)


@pytest.mark.parametrize("cost", ["kl", "js"])
def test_multiscale_fgt_matches_exact(rng, cost):
    """The FGT path (unshifted sums, rescaled; isolated rows summed exactly) gives
    the exact engine's cost and gradient on a clustered layout with an outlier
    that every fine scale isolates."""
    from gpuembed.objectives import msne
    Y, M, p = clustered_with_outlier(rng)
    be = ge.get_backend("cpu")
    nearest = msne._nearest_sqdist(Y, be)
    assert (0.5 * p[0] * nearest > msne.ISOLATED).sum() >= 1      # the fallback runs
    np.testing.assert_allclose(nearest, ge.knn(Y, 1, backend="cpu")[0][:, 0], rtol=1e-9)
    E0, G0 = MultiscaleObjective(M.conditionals, be, np.float64, p, cost).value_and_grad(Y)
    E, G = MultiscaleObjective(M.conditionals, be, np.float64, p, cost,
                               nbody="fgt").value_and_grad(Y)
    assert E == pytest.approx(E0, rel=1e-5)
    assert np.linalg.norm(G - G0) <= 1e-3 * np.linalg.norm(G0)


@pytest.mark.gpu
@pytest.mark.parametrize("cost,kappa", [("kl", 0.5), ("js", 0.3)])
def test_gpu_fgt_path_edge_kernel(rng, cost, kappa):
    """The GPU's FGT path with its pattern's part from kernels/msne.cu's
    msne_edges against its array code, and against the CPU's FGT path, on a
    clustered layout with an outlier that every fine scale isolates."""
    Y, M, p = clustered_with_outlier(rng)
    gpu = ge.get_backend("gpu")
    obj = MultiscaleObjective(M.conditionals, gpu, np.float64, p, cost, kappa, nbody="fgt")
    E, G = obj.value_and_grad(gpu.asarray(Y))
    obj.compiled = False
    E0, G0 = obj.value_and_grad(gpu.asarray(Y))
    G, G0 = gpu.to_host(G), gpu.to_host(G0)
    assert E == pytest.approx(E0, rel=1e-11)
    np.testing.assert_allclose(G, G0, rtol=1e-8, atol=1e-11 * np.abs(G0).max())
    E1, G1 = MultiscaleObjective(M.conditionals, ge.get_backend("cpu"), np.float64, p, cost,
                                 kappa, nbody="fgt").value_and_grad(Y)
    assert E == pytest.approx(E1, rel=1e-9)
    np.testing.assert_allclose(G, G1, rtol=1e-6, atol=1e-9 * np.abs(G1).max())


@pytest.mark.parametrize("d", [2, 3])
def test_isolated_rows_summed_over_their_balls(rng, d):
    """The CPU's sums of isolated rows and sources over their k-d tree balls
    (msne._Balls) equal the exact shifted sums over all points, at a fine scale
    that isolates most rows (and a far outlier) and a coarse one that isolates few."""
    from gpuembed.objectives import msne
    Y = np.concatenate([rng.standard_normal((400, d)), 0.3 * rng.standard_normal((400, d)) + 5])
    Y[0] = 60.0
    X = rng.standard_normal((800, 5))
    M = ge.multiscale_affinities(X, 2.0, n_scales=2, symmetrize=False, backend="cpu")
    be = ge.get_backend("cpu")
    obj = MultiscaleObjective(M.conditionals, be, np.float64, [1.0, 1.0], nbody="fgt")
    balls = msne._Balls(Y)
    nearest = balls.nearest_sqdist()
    w = rng.standard_normal(len(Y))
    for p in (2e3, 20.0):
        c = np.sqrt(p / 2)
        m = 0.5 * p * nearest
        isolated = m > msne.ISOLATED
        assert 0 < isolated.sum() < len(Y) and isolated[0]
        # Both round the squared distances t (the tree from Y, the exact sums from
        # c Y) to eps |c y|^2, and exp(-(t - m)) inherits that error.
        rtol = max(1e-13, 8 * np.finfo(float).eps * (c * np.abs(Y)).sum(axis=1).max() ** 2)
        Z, SX = obj._row_sums(c * Y, m, c, balls)
        Z0, SX0 = obj._row_sums(c * Y, m)                   # exact sums for isolated rows
        np.testing.assert_allclose(Z[isolated], Z0[isolated], rtol=rtol)
        np.testing.assert_allclose(SX[isolated], SX0[isolated], rtol=rtol,
                                   atol=rtol * np.abs(SX0).max())
        S, SXw = obj._column_sums(c * Y, m, w, c, balls)
        S0, SXw0 = obj._column_sums(c * Y, m, w)
        np.testing.assert_allclose(S, S0, rtol=rtol, atol=rtol * np.abs(S0).max())
        np.testing.assert_allclose(SXw, SXw0, rtol=rtol, atol=rtol * np.abs(SXw0).max())


@pytest.mark.parametrize("d", [1, 2, 3, 4])
def test_ball_kernels_find_exactly_the_points_in_each_ball(rng, d):
    """msne._ball_kernels' grid walk returns each query's pairs with exactly the
    points inside its ball c^2 |x - q|^2 - m_q < tail (brute force), itself
    left out, and their shifted kernels: for rows of X and for other targets,
    with duplicates, an outlier, grids held to 4 N cells (the finest scale's
    balls a fraction of a cell) and balls that take the whole layout."""
    from gpuembed.objectives import msne
    X = np.concatenate([rng.standard_normal((300, d)), 0.2 * rng.standard_normal((200, d)) + 4])
    X[10:15] = X[9]                                     # duplicates
    X[0] = 12.0
    targets = np.concatenate([rng.standard_normal((40, d)) * 3, X[100:110]])
    tail = msne.TAIL + np.log(len(X))
    for c in (40.0, 3.0, 0.3, 0.01):
        for own in (True, False):
            Q = X if own else targets
            rows = rng.choice(len(Q), 40, replace=False)
            sq = ((Q[rows, None] - X[None]) ** 2).sum(axis=2)
            # Shifts up to the nearest kernel's, as the sums take (so e <= 1).
            nearest = np.sort(sq, axis=1)[:, 1 if own else 0]
            m = rng.uniform(0.0, 1.0, rows.size) * c * c * nearest
            inside = c * c * sq - m[:, None] < tail
            if own:
                inside[np.arange(rows.size), rows] = False
            pos, nbr, e = msne._ball_kernels(X, Q[rows], rows if own else np.full(40, -1),
                                             m, c, tail)
            assert np.all(np.diff(pos) >= 0)           # in query order
            found = np.zeros_like(inside)
            found[pos, nbr] = True
            assert len(pos) == inside.sum() and np.array_equal(found, inside)
            np.testing.assert_allclose(e, np.exp(m[pos] - c * c * sq[pos, nbr]), rtol=1e-12)
    # One point over and over: a grid of one cell.
    same = np.ones((20, d))
    pos, nbr, e = msne._ball_kernels(same, same[:3], np.arange(3), np.zeros(3), 1.0, tail)
    assert len(pos) == 3 * 19 and np.all(e == 1.0) and not np.any(nbr == pos)


# LD precisions of the out-of-sample cases, both spanning 0.05 to ~5e3 (the finest
# isolate most new points): a geometric range, each scale's kernels an exp, and
# descending factors of 16 as ld_precisions makes them (factors of 2^(2U/P)),
# each kernel the next coarser one's squared 4 times, the chain starting again
# from an exp after 8 squarings (msne_cpu.squaring_plan).
PRECISIONS = {"geometric": np.geomspace(0.05, 5e3, 4),
              "chained": 0.05 * 16.0 ** np.arange(4)[::-1]}


def out_of_sample_case(rng, cost, kappa, nbody="exact", backend="cpu", precisions="geometric"):
    """New points against a fixed clustered training layout with a far outlier,
    at the LD PRECISIONS: the per-point objective of MultiscaleSNE.transform,
    with random affinities to 40 of each point's 60 nearest training points,
    some of them 0."""
    import types

    from gpuembed.out_of_sample import MultiscaleOutOfSample
    Y = np.concatenate([rng.standard_normal((300, 2)), rng.standard_normal((300, 2)) + 6.0])
    Y[0] = (40.0, -40.0)
    X = np.concatenate([rng.standard_normal((12, 2)) * 3.0, [[38.0, -41.0], [3.0, 3.0]]])
    near = np.argsort(((X[:, None] - Y[None]) ** 2).sum(-1), axis=1)[:, :60]
    idx = np.stack([rng.choice(row, 40, replace=False) for row in near])
    W = rng.random(idx.shape) * (rng.random(idx.shape) > 0.2)
    W /= W.sum(axis=1, keepdims=True)
    fitted = types.SimpleNamespace(p=PRECISIONS[precisions], cost=cost, kappa=kappa,
                                   nbody=nbody, accuracy={})
    be = ge.get_backend(backend)
    mapping = MultiscaleOutOfSample(be.asarray(Y), be.asarray(idx), be.asarray(W), fitted, be)
    return X, Y, idx, W, fitted.p, mapping


def dense_row_cost(x, Y, idx, w, p, cost, kappa):
    """One new point's cost over all training points, densely: s_n the mean over
    scales of its normalized Gaussian kernels, sigma = w on its neighbours."""
    d = ((Y - x) ** 2).sum(axis=1)
    s = sum(np.exp(-ph * (d - d.min()) / 2) / np.exp(-ph * (d - d.min()) / 2).sum()
            for ph in p) / len(p)
    sigma = np.zeros(len(Y))
    sigma[idx] = w
    m = sigma > 0
    if cost == "kl":
        return np.sum(sigma[m] * np.log(sigma[m] / s[m]))
    z = kappa * sigma + (1 - kappa) * s
    return (kappa * np.sum(sigma[m] * np.log(sigma[m] / z[m]))
            + (1 - kappa) * np.sum(s * np.log(s / z))) / (kappa * (1 - kappa))


@pytest.mark.parametrize("compiled,precisions", [(True, "geometric"), (True, "chained"),
                                                  (False, "geometric")])
@pytest.mark.parametrize("cost,kappa", [("kl", 0.5), ("js", 0.3)])
def test_out_of_sample_cost_and_gradient(rng, cost, kappa, compiled, precisions):
    """MultiscaleSNE.transform's per-point cost (the CPU's compiled pass and the
    array code) against the dense formula, its gradient against central
    differences, and its curvature (KL: sum_j sigma_j times the
    responsibility-weighted precision, positive)."""
    X, Y, idx, W, p, mapping = out_of_sample_case(rng, cost, kappa, precisions=precisions)
    mapping.compiled = compiled
    rows = np.arange(len(X))
    E, G, curvature = mapping.evaluate(X, rows)
    expected = [dense_row_cost(x, Y, i, w, p, cost, kappa) for x, i, w in zip(X, idx, W)]
    np.testing.assert_allclose(E, expected, rtol=1e-10)
    np.testing.assert_allclose(mapping.evaluate(X, rows, grad=False), E, rtol=1e-14)
    h = 1e-6
    num = np.zeros_like(X)
    for j in range(2):
        step = np.zeros_like(X)
        step[:, j] = h
        num[:, j] = (mapping.evaluate(X + step, rows, grad=False)
                     - mapping.evaluate(X - step, rows, grad=False)) / (2 * h)
    np.testing.assert_allclose(G, num, rtol=1e-5, atol=1e-6 * np.abs(G).max())
    assert np.all(curvature >= p.min()) and np.all(curvature <= p.max())
    # The per-point descent (BFGS, line search, trust region) lowers every cost;
    # the outlier's neighbours sit on the floor, where only the repulsion acts.
    Z = mapping.minimize(X, 30)
    assert np.all(np.isfinite(Z))
    assert np.all(mapping.evaluate(Z, rows, grad=False) <= E)


@pytest.mark.parametrize("precisions", sorted(PRECISIONS))
@pytest.mark.parametrize("cost,kappa", [("kl", 0.5), ("js", 0.3)])
def test_out_of_sample_compiled_rows_match_array_code(rng, cost, kappa, precisions):
    """msne_cpu.out_of_sample_rows against the array code, on every row and on a
    subset (the line search's trials), with the layout spread 10x so that
    neighbours fall on the floor."""
    from gpuembed.objectives.msne_cpu import squaring_plan

    X, _, _, _, p, mapping = out_of_sample_case(rng, cost, kappa, precisions=precisions)
    assert squaring_plan(0.5 * p).tolist() == ([0, 4, 4, 0] if precisions == "chained"
                                               else [0] * 4)
    for Xe, rows in ((X, np.arange(len(X))), (10.0 * X[3:9], np.arange(3, 9))):
        mapping.compiled = True
        E, G, c = mapping.evaluate(Xe, rows)
        E1 = mapping.evaluate(Xe, rows, grad=False)
        mapping.compiled = False
        E0, G0, c0 = mapping.evaluate(Xe, rows)
        np.testing.assert_allclose(E, E0, rtol=1e-10)
        np.testing.assert_array_equal(E1, E)
        np.testing.assert_allclose(G, G0, rtol=1e-7, atol=1e-10 * np.abs(G0).max())
        np.testing.assert_allclose(c, c0, rtol=1e-9)


@pytest.mark.parametrize("precisions", sorted(PRECISIONS))
def test_target_sums_match_dense_sums(rng, precisions):
    """msne_cpu.target_sums (transform's exact sums, every scale in one pass
    over blocks of the sources) against the dense shifted sums, with new points
    on the sources, between them and 6 units from all of them, at geometric
    precisions (exps) and chained ones (kernels squared from the next coarser
    scale's).  (Far points' arguments p d / 2 - m round to eps p d, 1e-11.)"""
    from numba import get_num_threads

    from gpuembed.objectives.msne_cpu import squaring_plan, target_sums

    Y = np.concatenate([rng.standard_normal((200, 2)), rng.standard_normal((200, 2)) + 6.0])
    X = np.concatenate([Y[:3], rng.standard_normal((5, 2)) * 3.0, [[-10.0, 1.0], [16.0, 2.0]]])
    half_p = 0.5 * PRECISIONS[precisions]
    d = ((X[:, None] - Y[None]) ** 2).sum(axis=2)
    nearest = d.min(axis=1)
    Z, SX = np.empty((4, len(X))), np.empty((4, len(X), 2))
    target_sums(X, np.ascontiguousarray(Y.T), half_p, squaring_plan(half_p), nearest, Z, SX,
                np.empty((get_num_threads(), 5, 150)))     # 3 blocks, the last one short
    e = np.exp(-half_p[:, None, None] * (d - nearest[:, None])[None])
    np.testing.assert_allclose(Z, e.sum(axis=2), rtol=1e-10)
    np.testing.assert_allclose(SX, e @ Y, rtol=1e-10, atol=1e-12 * np.abs(Y).max())


@pytest.mark.parametrize("cost", ["kl", "js"])
def test_out_of_sample_fgt_matches_exact(rng, cost):
    """The fast engine's path of the per-point objective (unshifted FGT sums at
    the new points, isolated ones summed over their k-d tree balls, msne._Balls
    with other targets) gives the exact engine's values and gradients."""
    from gpuembed.objectives import msne
    X, Y, _, _, p, exact = out_of_sample_case(rng, cost, 0.5)
    *_, fast = out_of_sample_case(np.random.default_rng(0), cost, 0.5, nbody="fgt")
    fast.Y, fast.idx, fast.W, fast.entropy = exact.Y, exact.idx, exact.W, exact.entropy
    from scipy.spatial import cKDTree
    fast.tree = cKDTree(exact.Y)
    fast.FAST_ROWS = 1                  # the FGT for every evaluation
    rows = np.arange(len(X))
    nearest = msne._Balls(Y, X).nearest_sqdist()
    np.testing.assert_allclose(nearest, ((X[:, None] - Y[None]) ** 2).sum(-1).min(axis=1))
    assert 0 < (0.5 * p.max() * nearest > msne.ISOLATED).sum() < len(X)  # both paths run
    E0, G0, _ = exact.evaluate(X, rows)
    E, G, _ = fast.evaluate(X, rows)
    np.testing.assert_allclose(E, E0, rtol=5e-5)        # the FGT's order 8
    assert np.linalg.norm(G - G0) <= 1e-3 * np.linalg.norm(G0)


def test_multiscale_sne_transform_places_held_out_digits():
    """New digits land among their class (10-NN accuracy against the training
    labels), a training point given again lands next to its fitted position,
    and a point's position does not depend on the points transformed with it."""
    pytest.importorskip("sklearn")
    from sklearn.neighbors import KNeighborsClassifier
    X, y = ge.datasets.digits()
    rng = np.random.default_rng(0)
    order = rng.permutation(len(X))
    train, test = order[:700], order[700:900]
    model = ge.MultiscaleSNE(max_iter=30, backend="cpu").fit(X[train])
    Z = model.transform(X[test])
    acc = KNeighborsClassifier(10).fit(model.embedding_, y[train]).score(Z, y[test])
    fitted_acc = ge.metrics.knn_accuracy(model.embedding_, y[train])
    print(f"MultiscaleSNE.transform: held-out 10-NN accuracy {acc:.3f} (training layout "
          f"{fitted_acc:.3f})")
    assert acc >= 0.9 and acc >= fitted_acc - 0.03
    again = model.transform(X[train[:20]])
    spread = np.ptp(model.embedding_, axis=0).max()
    assert np.median(np.linalg.norm(again - model.embedding_[:20], axis=1)) < 0.02 * spread
    for i in (0, 13):       # up to the k-NN's last bits (see test_params.py's test)
        np.testing.assert_allclose(model.transform(X[test[i:i + 1]])[0], Z[i], rtol=1e-7,
                                   atol=1e-7 * spread)


@pytest.mark.gpu
@pytest.mark.parametrize("cost,kappa", [("kl", 0.5), ("js", 0.3)])
def test_gpu_out_of_sample_objective_equals_cpu(rng, cost, kappa):
    """The per-point objective of MultiscaleSNE.transform on the GPU (CuPy array
    code, shifted exact sums, the k-NN for each new point's shift) against the CPU."""
    X, Y, idx, W, _, cpu = out_of_sample_case(rng, cost, kappa)
    *_, gpu_mapping = out_of_sample_case(np.random.default_rng(rng.integers(1 << 30)), cost,
                                         kappa, backend="gpu")
    gpu = ge.get_backend("gpu")
    gpu_mapping.Y, gpu_mapping.idx, gpu_mapping.W = gpu.asarray(Y), gpu.asarray(idx), \
        gpu.asarray(W)
    gpu_mapping.entropy = gpu.asarray(cpu.entropy)
    rows = np.arange(len(X))
    E, G, curvature = cpu.evaluate(X, rows)
    E1, G1, c1 = (gpu.to_host(a) for a in gpu_mapping.evaluate(gpu.asarray(X),
                                                                 gpu.asarray(rows)))
    np.testing.assert_allclose(E1, E, rtol=1e-10)
    np.testing.assert_allclose(G1, G, rtol=1e-8, atol=1e-11 * np.abs(G).max())
    np.testing.assert_allclose(c1, curvature, rtol=1e-10)
    # A few iterations: later, last bits can send a point on a flat stretch of its
    # cost to another local minimum.
    np.testing.assert_allclose(gpu.to_host(gpu_mapping.minimize(gpu.asarray(X), 5)),
                               cpu.minimize(X, 5), rtol=1e-8, atol=1e-10)


@pytest.mark.gpu
def test_gpu_multiscale_sne_transform_equals_cpu(rng):
    """MultiscaleSNE.transform on the GPU (k-NN to the training points, each
    scale's conditional affinities, the per-point BFGS on device arrays) lands
    where the CPU's does from the same fitted layout."""
    X = np.concatenate([rng.standard_normal((150, 5)), rng.standard_normal((150, 5)) + 6.0])
    model = ge.MultiscaleSNE(max_iter=10, n_scales=3, backend="gpu").fit(X[:250])
    gpu, cpu = ge.get_backend("gpu"), ge.get_backend("cpu")
    _, X_train, Y_train, fitted = model._fitted
    twin = ge.MultiscaleSNE(max_iter=10, n_scales=3, backend="cpu")
    twin.__dict__.update(model.__dict__)
    twin._fitted = (cpu, gpu.to_host(X_train), gpu.to_host(Y_train), fitted)
    Z = model.transform(X[250:])
    assert isinstance(Z, np.ndarray) and Z.shape == (50, 2)
    spread = np.ptp(model.embedding_)
    np.testing.assert_allclose(Z, twin.transform(X[250:]), atol=1e-4 * spread)


def test_multiscale_sne_fgt_and_n_scales(rng):
    X = np.concatenate([rng.standard_normal((150, 5)), rng.standard_normal((150, 5)) + 8.0])
    fits = {nbody: ge.MultiscaleSNE(cost="kl", nbody=nbody, n_scales=4, max_iter=20,
                                    backend="cpu").fit(X) for nbody in ("fgt", "exact")}
    ms = fits["fgt"]
    np.testing.assert_allclose(ms.perplexities_, [2.0, 4.0, 8.0, 16.0])
    assert ge.metrics.knn_accuracy(ms.embedding_, np.repeat([0, 1], 150)) == 1.0
    assert ms.objective_ == pytest.approx(fits["exact"].objective_, rel=0.02)
    with pytest.raises(ValueError, match="nbody"):
        ge.MultiscaleSNE(nbody="fgt", n_components=4, backend="cpu").fit(X)


def test_ld_precisions_and_exponent(rng):
    Y = rng.standard_normal((100, 2)) * 3
    K = np.array([2.0, 4.0, 8.0, 16.0])
    p = ld_precisions(K, Y)
    assert np.all(np.diff(p) < 0)                      # larger scale, wider kernel
    assert p[-1] == pytest.approx(2.0 ** 2 / np.mean(np.var(Y, axis=0, ddof=1)))
    np.testing.assert_allclose(p[:-1] / p[1:], 2.0)    # K^(-2U/P) with U = 1, P = 2
    # tau = 1 / beta doubling per doubled perplexity: D = 2 / log2(2) = 2, U = D / P
    beta = 2.0 ** -np.outer(np.ones(30), np.arange(4.0))
    assert intrinsic_exponent(beta, 2) == pytest.approx(1.0)
    assert intrinsic_exponent(beta, 1) == pytest.approx(2.0)
    assert intrinsic_exponent(beta ** (2.0 / 3.0), 2) == pytest.approx(1.5)   # D = 3
    assert intrinsic_exponent(beta ** 2, 2) == pytest.approx(1.0)              # D = 1, clipped
    # Rows of duplicates (beta = inf at the small scales) add nothing to the mean
    # estimate, without a warning: a third of the rows so leaves 2/3 of D = 4.
    dup = beta ** 0.5
    dup[:10, :3] = np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert intrinsic_exponent(dup, 2) == pytest.approx(4.0 * 2.0 / 3.0 / 2.0)


def test_multiscale_sne_beats_single_scale_on_digits():
    """Thesis 004 ch. 5: multi-scale similarities preserve neighbourhoods at all
    scales better (log-K AUC of R_NX) than single-scale SNE (perplexity 30) and t-SNE.
    A 600-point subset of scikit-learn's digits keeps the test short."""
    pytest.importorskip("sklearn")
    X, y = ge.datasets.digits()
    X = X[:600]
    ms = ge.MultiscaleSNE(backend="cpu").fit(X)
    auc_ms = ge.metrics.auc_rnx(X, ms.embedding_)
    sne = ge.SNE(perplexity=30, optimizer="lbfgs", backend="cpu").fit(X)
    auc_sne = ge.metrics.auc_rnx(X, sne.embedding_)
    tsne = ge.TSNE(perplexity=30, optimizer="tsne", backend="cpu").fit(X)
    auc_tsne = ge.metrics.auc_rnx(X, tsne.embedding_)
    print(f"AUC of R_NX on digits[:600]: multiscale SNE {auc_ms:.4f}, SNE(30) {auc_sne:.4f}, "
          f"t-SNE(30) {auc_tsne:.4f}")
    assert auc_ms >= auc_sne and auc_ms >= auc_tsne
    assert len(ms.history_) > 1 and ms.history_[-1]["smallest_perplexity"] == 2.0
    # The stages (one per added scale) count on: each starts at the iteration where
    # the last ended (they had each counted from 0).
    scales = [h["smallest_perplexity"] for h in ms.history_]
    iterations = [h["iter"] for h in ms.history_]
    assert all(iterations[i] == iterations[i - 1] + (scales[i] == scales[i - 1])
               for i in range(1, len(iterations)))
    assert iterations[-1] == ms.n_iter_ and len(set(scales)) > 1


@pytest.mark.parametrize("kwargs,match", [
    (dict(perplexity=0.5), "perplexity"),
    (dict(cost="hellinger"), "cost"),
    (dict(kappa=1.0), "kappa"),
    (dict(optimizer="sd"), "optimizer"),
    (dict(nbody="fmm"), "nbody"),
    (dict(n_scales=0), "n_scales"),
])
def test_multiscale_sne_bad_arguments(kwargs, match):
    X = np.random.default_rng(0).standard_normal((60, 4))
    with pytest.raises(ValueError, match=match):
        ge.MultiscaleSNE(backend="cpu", **kwargs).fit(X)


def test_fused_sweep_gives_the_same_bits_compiled_or_loaded_from_the_cache(numba_cache_runs):
    """msne_cpu.fused_exact, edge_terms (the FGT path's), out_of_sample_rows and
    target_sums (transform's) are cached on disk; compiled in a process or loaded from numba's
    cache they must give the same bits (with fastmath's reassociation the two once
    differed in the last bits, so a first run would not have repeated later)."""
    script = """
import hashlib, json, numpy as np, scipy.sparse
from numba import get_num_threads
from gpuembed.objectives.msne_cpu import (edge_terms, fused_exact, out_of_sample_rows,
                                          squaring_plan, target_sums)
rng = np.random.default_rng(0)
n, H, d = 300, 4, 2
half_p = np.array([30.0, 7.5, 1.875, 0.5])        # chained (factors of 4), then an exp
plan = squaring_plan(half_p)
P = scipy.sparse.random(n, n, density=0.1, format="csr", random_state=1)
P.setdiag(0.0); P.eliminate_zeros(); P.sort_indices()
XT = rng.standard_normal((d, n))
sq = ((XT[:, :, None] - XT[:, None, :]) ** 2).sum(axis=0) + np.diag(np.full(n, np.inf))
T, longest = get_num_threads(), int(np.diff(P.indptr).max())
grad = np.empty((n, d))
out = fused_exact(P.indptr, P.indices, XT, P.data, half_p, plan, sq.min(axis=1), True, 0.3,
                  np.empty((T, H, n)), np.empty((T, 2, n)), np.empty((T, H + 4, longest)), grad)
m = half_p[:, None] * sq.min(axis=1)                # the rows' shifts, chained as in a fit
edge_plan = squaring_plan(half_p, m)
rs, edge_grad = np.empty((H, n)), np.empty((n, d))
edge_out = edge_terms(P.indptr, P.indices, XT, P.data, half_p, edge_plan, m,
                      rng.random((H, n)) + 1.0, True, 0.3, rs, edge_grad)
M, k = 40, 30
X, Y = rng.standard_normal((M, d)), XT.T.copy()
idx = np.stack([rng.choice(n, k, replace=False) for _ in range(M)])
W = rng.random((M, k)); W /= W.sum(axis=1, keepdims=True)
rows = [np.empty(M), np.empty(M), np.empty((M, d)), np.empty(M)]
out_of_sample_rows(X, Y, idx, W, half_p, plan, np.zeros(M), np.full((H, M), 7.0),
                   rng.standard_normal((H, M, d)), True, 0.3, True, *rows, np.empty((T, H + 3, k)))
Zt, SXt = np.empty((H, M)), np.empty((H, M, d))
nearest = ((X[:, None, :] - Y[None]) ** 2).sum(axis=2).min(axis=1)
target_sums(X, XT, half_p, plan, nearest, Zt, SXt, np.empty((T, H + 1, n)))
digest = hashlib.sha1(b"".join(np.asarray(a).tobytes() for a in
                              (grad, out, rs, edge_grad, edge_out, *rows, Zt, SXt))).hexdigest()
hits = sum(f.stats.cache_hits.get(f.signatures[0], 0)
           for f in (fused_exact, edge_terms, out_of_sample_rows, target_sums))
print(json.dumps({"hits": hits, "digest": digest}))
"""
    from gpuembed.objectives import msne_cpu

    first, second = (json.loads(line) for line in numba_cache_runs(script))
    # Before numba 0.68 edge_terms, which reassociates, is compiled in each process.
    assert (first["hits"], second["hits"]) == (0, 3 + msne_cpu.CACHE_REASSOCIATED)
    assert first["digest"] == second["digest"]
