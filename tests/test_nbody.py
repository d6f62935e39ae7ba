"""N-body engines against brute-force N x N sums.

Relative errors stated per engine: exact ~ machine precision (1e-11 here,
GEMM distances; 1e-14 for the compiled CPU kernel's Gaussian); FGT below its bound
(5.5)-(5.7) relative to sum |q| and decreasing with p (about 1e-8 at p = 10);
Barnes-Hut equal to exact at
theta = 0, error growing with theta.
"""
import types

import numpy as np
import pytest

import gpuembed as ge
from gpuembed.backend import get_backend
from gpuembed.nbody import (bh_sums, check_accuracy, engine_sums, error_bound, exact_sums,
                            fgt_sums, resolve_method)
from gpuembed.nbody import barneshut_cpu
from gpuembed.nbody.barneshut import MAX_DEPTH, Tree, _spread_bits, vectorized_bh_sums
from gpuembed.nbody.exact import KERNEL_CODES, blocked_sums
from gpuembed.nbody.fgt import order_for_tolerance
from gpuembed.objectives import make_objective
from gpuembed.optim import accuracy_schedule, minimize

CPU = get_backend("cpu")
KERNEL_FUNCTIONS = {"gaussian": lambda t: np.exp(-t), "student": lambda t: 1 / (1 + t),
                    "student2": lambda t: 1 / (1 + t) ** 2}


def brute(X, kernel, Y=None, w=None, target_shift=0.0, source_shift=0.0, exclude=None):
    targets = X if Y is None else Y
    D = ((targets[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    with np.errstate(over="ignore"):                  # excluded pairs, zeroed below
        K = KERNEL_FUNCTIONS[kernel](D - np.reshape(target_shift, (-1, 1)) - source_shift)
    if Y is None:
        np.fill_diagonal(K, 0.0)
    if exclude is not None:
        rows = np.flatnonzero(exclude >= 0)
        K[rows, exclude[rows]] = 0.0
    if w is not None:
        K = K * w[None, :]
    return K.sum(1), K @ X


def rel(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


@pytest.mark.parametrize("d", [1, 2, 3, 5])
@pytest.mark.parametrize("spread", [0.3, 3.0, 30.0])
def test_exact_engine_matches_brute_force(d, spread, rng):
    X = rng.normal(size=(300, d)) * spread
    w = rng.uniform(0.5, 2.0, 300)
    kernels = ("gaussian", "student", "student2")
    for (S, SX), kernel in zip(exact_sums(CPU, X, kernels, weights=w), kernels):
        S0, SX0 = brute(X, kernel, w=w)
        assert rel(S, S0) < 1e-11 and rel(SX, SX0) < 1e-11


@pytest.mark.parametrize("d", [1, 2, 3, 5])
@pytest.mark.parametrize("kernels", list(KERNEL_CODES))
def test_compiled_cpu_kernel_matches_brute_force(d, kernels, rng):
    X = rng.normal(size=(700, d)) * 3
    X[:50] *= 0.01                                   # a tight clump: large sums
    T = rng.normal(size=(123, d)) * 3
    w = rng.uniform(0.5, 2.0, 700)
    for Y in (None, T):
        out = exact_sums(CPU, X, kernels, Y=Y, weights=w)
        assert len(out) == len(kernels)
        for (S, SX), kernel in zip(out, kernels):
            S0, SX0 = brute(X, kernel, Y=Y, w=w)
            # The Gaussian's exp is within 2 ulp (fastexp.expneg): 2e-15 here,
            # where the form before it, q(-t / 1024)^1024, gave 3.5e-14.
            tol = 1e-14 if kernel == "gaussian" else 1e-12
            assert rel(S, S0) < tol and rel(SX, SX0) < tol
    (S, SX), = exact_sums(CPU, X.astype(np.float32), ("student",))
    assert S.dtype == SX.dtype == np.float32
    assert rel(S, brute(X, "student")[0]) < 1e-6


@pytest.mark.parametrize("d", [1, 2, 3])
def test_shifted_sums_and_exclusions_stay_accurate(d, rng):
    """Multi-scale SNE's finest scales: Gaussian sums at a precision where every
    unshifted kernel underflows, each row (or source) shifted by its
    nearest-neighbour distance; and excluded self pairs between two point sets.
    The array code (the GPU's path for shifted sums) must be as accurate: its
    distances are coordinate-wise there, GEMM's would give 1e-10 errors."""
    side = round(400 ** (1 / d))
    grid = np.stack(np.meshgrid(*[np.arange(side)] * d), axis=-1).reshape(-1, d)
    X = grid + rng.uniform(-0.2, 0.2, size=(side ** d, d))       # 343-400 points
    X *= 50.0                               # nearest squared distances 900-4900
    n = len(X)
    D = ((X[:, None] - X[None]) ** 2).sum(-1)
    np.fill_diagonal(D, np.inf)
    m = D.min(axis=1)
    assert np.exp(-m).max() == 0.0
    w = rng.uniform(0.5, 2.0, n)
    some = rng.choice(n, 60, replace=False)
    own = np.full(n, -1)
    own[some] = np.arange(60)
    for sums in (exact_sums, blocked_sums):
        (S, SX), = sums(CPU, X, ("gaussian",), weights=w, target_shift=m)
        S0, SX0 = brute(X, "gaussian", w=w, target_shift=m)
        # t - m cancels at each nearest pair: absolute error ~ eps m, m up to 4900,
        # which the exp resolves (its kernel is 1 to within 1e-12, not exactly).
        assert S.min() >= w.min() * (1 - 1e-12) and rel(S, S0) < 1e-11 and rel(SX, SX0) < 1e-11
        (S, SX), = sums(CPU, X[some], ("gaussian",), Y=X, weights=w[some],
                        source_shift=m[some], exclude=own)
        S0, SX0 = brute(X[some], "gaussian", Y=X, w=w[some], source_shift=m[some],
                        exclude=own)
        assert rel(S, S0) < 1e-11 and rel(SX, SX0) < 1e-11


def test_blocked_sums_take_numbas_number_of_threads(rng, monkeypatch):
    """The reference's row blocks run on numba's number of threads, which
    numba.set_num_threads bounds as it does the compiled loops (os.cpu_count()
    had ignored it): on one, in the calling thread, the same sums."""
    import numba

    from gpuembed.nbody import exact as exact_module

    X = rng.standard_normal((600, 2))
    (S, SX), = blocked_sums(CPU, X, ("student",), block_bytes=8 * 600 * 50)   # 12 blocks
    threads = numba.get_num_threads()

    def no_pool(*args, **kwargs):
        raise AssertionError("a thread pool on one numba thread")

    monkeypatch.setattr(exact_module, "ThreadPoolExecutor", no_pool)
    numba.set_num_threads(1)
    try:
        (S1, SX1), = blocked_sums(CPU, X, ("student",), block_bytes=8 * 600 * 50)
    finally:
        numba.set_num_threads(threads)
    np.testing.assert_array_equal(S1, S)
    np.testing.assert_array_equal(SX1, SX)


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("spread", [0.5, 3.0, 20.0])
def test_fgt_error_below_bound_and_decreasing_with_p(d, spread, rng):
    n = 800
    X = rng.normal(size=(n, d)) * spread
    S0, SX0 = brute(X, "gaussian")
    charge_total = [n] + list(np.abs(X).sum(0))
    errors = []
    for p in (2, 4, 6, 8, 10):
        (S, SX), = fgt_sums(CPU, X, ("gaussian",), p=p)
        err = max(np.abs(S - S0).max() / charge_total[0],
                  max(np.abs(SX[:, i] - SX0[:, i]).max() / charge_total[i + 1] for i in range(d)))
        assert err <= error_bound(p, d), (p, err)
        errors.append(err)
    assert errors[-1] < 1e-7
    assert errors[-1] < errors[1] / 100
    assert all(b <= a * 1.01 for a, b in zip(errors, errors[1:]))


def test_fgt_order_from_tolerance():
    for d in (1, 2, 3):
        p = order_for_tolerance(1e-6, d)
        assert error_bound(p, d) <= 1e-6 < error_bound(p - 1, d)
    with pytest.raises(ValueError, match="tol"):
        order_for_tolerance(1e-30, 2)
    S, _ = ge.nbody.kernel_sums(np.random.default_rng(0).normal(size=(200, 2)), "gaussian",
                                "fgt", tol=1e-8, backend="cpu")
    S0, _ = brute(np.random.default_rng(0).normal(size=(200, 2)), "gaussian")
    assert np.abs(S - S0).max() / 200 < 1e-8


def test_fgt_boxes_are_sparse_over_a_huge_extent(rng):
    # Two clusters 1e6 kernel widths apart in 3-D: a dense grid would need ~1e18 boxes.
    X = np.concatenate([rng.normal(size=(200, 3)), rng.normal(size=(200, 3)) + 1e6])
    (S, SX), = fgt_sums(CPU, X, ("gaussian",), p=10)
    S0, SX0 = brute(X, "gaussian")
    assert np.abs(S - S0).max() / len(X) < 1e-7
    assert np.abs(SX - SX0).max() / np.abs(X).sum(0).max() < 1e-7


def test_fgt_case_mix_dense_and_sparse_regions(rng):
    # A dense core (Hermite / Taylor / Hermite->Taylor boxes) inside a sparse halo
    # (direct boxes) exercises all four cases together.
    X = np.concatenate([rng.normal(size=(1500, 2)) * 0.8, rng.uniform(-15, 15, (500, 2))])
    (S, SX), = fgt_sums(CPU, X, ("gaussian",), p=10)
    S0, SX0 = brute(X, "gaussian")
    assert np.abs(S - S0).max() / len(X) < 1e-7
    assert rel(S, S0) < 1e-6 and rel(SX, SX0) < 1e-6


def _fgt_every_case(rng, d, monkeypatch, sizes, halo):
    """Sources in a dense cluster, a wider one and a sparse halo of half-width
    ``halo`` (``sizes``: their counts and the separate targets'), so that with
    the dissertation's cutoff every FGT case has many box pairs; charges for 3
    columns; and the list the compiled case IV appends its pair counts to."""
    from gpuembed.nbody import fgt as fgt_module
    dense, wide, sparse, n_targets = sizes
    X = np.concatenate([rng.normal(size=(dense, d)), rng.normal(size=(wide, d)) * 3.0 + 4.0,
                        rng.uniform(-halo, halo, (sparse, d))])
    Y = rng.uniform(-6, 8, (n_targets, d))
    q = rng.normal(size=(len(X), 3))
    pairs = []
    compiled = fgt_module._hermite_to_taylor_compiled
    monkeypatch.setattr(fgt_module, "_hermite_to_taylor_compiled",
                        lambda *args: (pairs.append(len(args[4])), compiled(*args)))
    return X, Y, q, pairs


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("p", [1, 3, 8])
def test_fgt_compiled_cases_match_array_code(d, p, rng, monkeypatch):
    """fgt_cpu (Hermite coefficients; cases I and II per target; case III; case IV
    with the offsets' table, pairs grouped by box and first-dimension offset;
    Taylor series at the targets) against the array code (the NumPy reference),
    on a dense cluster, a wider one and a sparse halo, so that every case has
    many box pairs with the dissertation's cutoff of 5 points (the default's
    p^d / 5 leaves few big boxes here); with separate targets too."""
    from gpuembed.nbody import fgt as fgt_module
    X, Y, q, pairs = _fgt_every_case(rng, d, monkeypatch, (1500, 500, 300, 400), 20)
    for cutoff in (None, fgt_module.CUTOFF):
        for targets in (None, Y):
            G = fgt_module.fgt(CPU, X, q, Y=targets, p=p, cutoff=cutoff)
            G0 = fgt_module.fgt(CPU, X, q, Y=targets, p=p, reference=True, cutoff=cutoff)
            np.testing.assert_allclose(G, G0, rtol=1e-11, atol=1e-12 * np.abs(G0).max())
    assert sum(pairs) > 100


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("p", [1, 8, 14])
def test_fgt_offset_rows_cover_exactly_the_offsets(d, p):
    """The per-target searches walk rows of offsets along the last dimension:
    together the rows must list every offset once and nothing else."""
    from gpuembed.nbody.fgt import _neighbourhood
    offsets, rows = _neighbourhood(p, d)
    expanded = [(*row[:d - 1], last) for row in rows for last in range(row[d - 1], row[d] + 1)]
    assert sorted(expanded) == sorted(map(tuple, offsets))
    assert len(rows) < len(offsets)


@pytest.mark.parametrize("d", [1, 2, 3])
def test_barnes_hut_theta_zero_is_exact_and_error_grows_with_theta(d, rng):
    X = rng.normal(size=(600, d)) * 4.0
    w = rng.uniform(0.5, 2.0, 600)
    kernels = ("gaussian", "student", "student2")
    reference = [brute(X, k, w=w) for k in kernels]
    for (S, SX), (S0, SX0) in zip(bh_sums(CPU, X, kernels, weights=w, theta=0.0), reference):
        assert rel(S, S0) < 1e-11 and rel(SX, SX0) < 1e-11
    errors = []
    for theta in (0.2, 0.6, 1.5):
        (S, _), = bh_sums(CPU, X, ("student",), weights=w, theta=theta)
        errors.append(rel(S, reference[1][0]))
    assert 0 < errors[0] < errors[1] < errors[2]
    assert errors[0] < 5e-3


@pytest.mark.parametrize("d", [1, 2, 3])
def test_compiled_barnes_hut_equals_the_vectorized_traversal(d, backend, rng, monkeypatch):
    # The compiled depth-first walks (kernels/barneshut.cu on the GPU, numba on the
    # CPU with groups of one target) must take every decision the array code takes:
    # same leaves, same opened cells, same far-field terms.  The clump 0.01 wide
    # makes deep cells, the duplicates multi-point leaves at the deepest level.
    monkeypatch.setattr(barneshut_cpu, "GROUP_SIZE", 1)
    X = np.concatenate([rng.normal(size=(700, d)) * 4, rng.normal(size=(100, d)) * 0.01])
    X = np.concatenate([X, X[690:710]])
    w = rng.uniform(0.5, 2.0, len(X))
    Y = rng.normal(size=(90, d)) * 4
    dev = backend.asarray
    for kernels in [("gaussian",), ("student",), ("student", "student2"), ("student2",)]:
        for theta in (0.0, 0.5, 1.5):
            for targets in (None, Y):
                ref = vectorized_bh_sums(CPU, X, kernels, Y=targets, weights=w, theta=theta)
                # float64 to 1e-12: the walks add in another order (1.2e-13 apart in 3-D
                # on an H100), one cell opened differently moves a sum by far more.
                # float32 (the GPU's default) to 1e-4 of the largest sum: its rounded
                # distances may flip an opening test at the threshold.
                for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-4)):
                    fast = bh_sums(backend, dev(X, dtype), kernels,
                                   Y=None if targets is None else dev(targets, dtype),
                                   weights=dev(w, dtype), theta=theta)
                    assert len(fast) == len(ref) == len(kernels)
                    for (S, SX), (S0, SX0) in zip(fast, ref):
                        assert S.dtype == dtype
                        S, SX = backend.to_host(S), backend.to_host(SX)
                        assert rel(S, S0) < tol and rel(SX, SX0) < tol


def grouped_reference(X, kernels, Y, w, theta, size):
    """Barnes-Hut sums with targets in groups, in plain Python: the groups are the
    largest cells of the targets' tree (the sources' for Y None) of at most
    ``size`` points (new targets Y: 1), or leaves; a group walks the sources'
    tree once, summing a leaf exactly and an inner cell (not holding a target of the group) by its
    mass and centre of mass when side < theta times the distance from the centre
    to the group's bounding box, which bounds the distance to each target."""
    src = Tree(CPU, X, w, reference=True)
    tgt = src if Y is None else Tree(CPU, Y, reference=True)
    size = size if Y is None else 1
    children = lambda tree, c: list(tree.first_child[c] + np.arange(tree.n_children[c]))
    groups, stack = [], [0]
    while stack:
        c = stack.pop()
        if tgt.count[c] <= size or tgt.n_children[c] == 0:
            groups.append(c)
        else:
            stack += children(tgt, c)
    out = [(np.zeros(len(tgt.points)), np.zeros(tgt.points.shape)) for _ in kernels]
    for g in groups:
        lo, hi = tgt.start[g], tgt.start[g] + tgt.count[g]
        T = tgt.points[lo:hi]
        far, near, stack = [], [], [0]
        while stack:
            c = stack.pop()
            a, b = src.start[c], src.start[c] + src.count[c]
            if src.n_children[c] == 0:
                near += range(a, b)
                continue
            if Y is not None or b <= lo or a >= hi:
                gap = np.maximum(np.maximum(T.min(0) - src.com[c], src.com[c] - T.max(0)), 0)
                if src.side[c] ** 2 < theta**2 * (gap @ gap):
                    # The per-target opening test holds for every target of the group.
                    assert (src.side[c] ** 2 < theta**2 * ((T - src.com[c]) ** 2).sum(1)).all()
                    far.append(c)
                    continue
            stack += children(src, c)
        points = np.concatenate([src.com[far], src.points[near]])
        mass = np.concatenate([src.mass[far], src.weights[near]])
        own = np.concatenate([np.full(len(far), -1), near])
        for i in range(lo, hi):
            D = ((tgt.points[i] - points) ** 2).sum(1)
            keep = own != i if Y is None else slice(None)
            for (S, SX), kernel in zip(out, kernels):
                K = mass[keep] * KERNEL_FUNCTIONS[kernel](D[keep])
                S[i], SX[i] = K.sum(), K @ points[keep]
    return [(S[tgt.rank], SX[tgt.rank]) for S, SX in out]


@pytest.mark.parametrize("d", [1, 2, 3])
def test_grouped_barnes_hut_walk_equals_its_reference(d, rng, monkeypatch):
    """The CPU's walk of target groups against the plain Python one: the same groups,
    cells and far-field terms, with weights, for the tree's own points and for new
    targets (one by one), in groups of up to 16 and of the default size, with
    first lists that overflow and that do not (the last data set is the deepest
    tree, whose walk nears its stack bound)."""
    X = np.concatenate([rng.normal(size=(500, d)) * 4, rng.normal(size=(80, d)) * 0.01])
    X = np.concatenate([X, X[490:510]])
    sets = [(X, rng.uniform(0.5, 2.0, len(X)), rng.normal(size=(150, d)) * 4)]
    if d == 3:
        sets.append((deepest_tree_points(), None, deepest_tree_points()))
    default_capacity = barneshut_cpu.LIST_CAPACITY
    for size in (16, barneshut_cpu.GROUP_SIZE):
        monkeypatch.setattr(barneshut_cpu, "GROUP_SIZE", size)
        for X, w, Y in sets:
            for targets in (None, Y):
                for kernels, theta in ((("student", "student2"), 0.5), (("gaussian",), 1.5)):
                    ref = grouped_reference(X, kernels, targets, w, theta, size)
                    # First lists of 8 entries overflow: each group walks again.
                    for capacity in (8, default_capacity):
                        monkeypatch.setattr(barneshut_cpu, "LIST_CAPACITY", capacity)
                        fast = bh_sums(CPU, X, kernels, Y=targets, weights=w, theta=theta)
                        for (S, SX), (S0, SX0) in zip(fast, ref):
                            assert rel(S, S0) < 1e-12 and rel(SX, SX0) < 1e-12


def test_grouped_barnes_hut_is_more_accurate_than_per_target(rng, monkeypatch):
    """Groups apply the opening test at the distance to their bounding box, so
    they open at least the cells each target would: at theta = 0.5 the default
    groups' largest error is below that of single targets."""
    X = np.concatenate([rng.normal(size=(3000, 2)) * 4, rng.normal(size=(1000, 2)) + 20])
    (S0, SX0), = exact_sums(CPU, X, ("student",))
    errors = []
    for size in (1, barneshut_cpu.GROUP_SIZE):
        monkeypatch.setattr(barneshut_cpu, "GROUP_SIZE", size)
        (S, SX), = bh_sums(CPU, X, ("student",), theta=0.5)
        errors.append(max(rel(S, S0), rel(SX, SX0)))
    assert 1e-4 < errors[1] < 0.7 * errors[0]


def test_fixed_sources_build_their_tree_once(backend, rng):
    """engine_sums' ``sources`` dict (fixed sources, new targets at every call, as
    in the out-of-sample mapping) keeps Barnes-Hut's tree: the sums equal those
    with a tree built per call, and the second call reuses the first's tree."""
    X, w = backend.asarray(rng.normal(size=(800, 2)) * 4), backend.asarray(rng.uniform(1, 2, 800))
    sources, trees = {}, []
    for size in (50, 120):
        Y = backend.asarray(rng.normal(size=(size, 2)) * 4)
        kept = engine_sums(backend, "bh", X, ("student", "student2"), Y=Y, weights=w,
                           sources=sources)
        trees.append(sources["tree"])
        fresh = engine_sums(backend, "bh", X, ("student", "student2"), Y=Y, weights=w)
        for (S, SX), (S0, SX0) in zip(kept, fresh):
            np.testing.assert_array_equal(backend.to_host(S), backend.to_host(S0))
            np.testing.assert_array_equal(backend.to_host(SX), backend.to_host(SX0))
    assert trees[0] is trees[1] and list(sources) == ["tree"]


TREE_ARRAYS = ("order", "points", "weights", "start", "count", "first_child", "n_children",
               "side", "mass", "wx", "com", "rank")


def tree_test_points(rng, d):
    """Spread points, duplicates (deepest-level leaves of several points) and scales
    1e9 apart (long single-child chains)."""
    return (rng.normal(size=(3000, d)), np.repeat(rng.normal(size=(300, d)), 4, axis=0),
            np.concatenate([rng.normal(size=(500, d)) * 1e-7, rng.normal(size=(500, d)) * 100]))


@pytest.mark.parametrize("d", [1, 2, 3])
def test_compiled_tree_equals_the_array_code(d, rng):
    # barneshut_cpu.build_tree against Tree's array code (the reference): every array
    # equal, on spread points, duplicates (deepest-level leaves) and scales 1e9
    # apart (long single-child chains), with and without weights.
    for X in tree_test_points(rng, d):
        for w in (None, rng.uniform(0.5, 2.0, len(X))):
            fast, ref = Tree(CPU, X, w), Tree(CPU, X, w, reference=True)
            assert fast.depth == ref.depth
            for name in TREE_ARRAYS:
                np.testing.assert_array_equal(getattr(fast, name), getattr(ref, name), name)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [1, 2, 3])
def test_gpu_tree_kernels_equal_the_array_code(d, rng):
    # kernels/bh_tree.cu against Tree's array code on the same device: every array
    # equal.  The kernels compute in float64 whatever X's type (as the compiled CPU
    # build), so float32 points give the array code's tree of their float64 values.
    gpu = get_backend("gpu")
    for X in tree_test_points(rng, d) + (np.zeros((1, d)), rng.normal(size=(2, d))):
        for w in (None, rng.uniform(0.5, 2.0, len(X))):
            wd = None if w is None else gpu.asarray(w)
            for dtype in (np.float64, np.float32):
                ref = Tree(gpu, gpu.asarray(X.astype(dtype).astype(np.float64)), wd,
                           reference=True)
                tree = Tree(gpu, gpu.asarray(X, dtype), wd)
                assert tree.depth == ref.depth
                for name in TREE_ARRAYS:
                    np.testing.assert_array_equal(gpu.to_host(getattr(tree, name)),
                                                  gpu.to_host(getattr(ref, name)), name)
    # New targets are visited in the array code's Morton order.
    X, Y = gpu.asarray(rng.normal(size=(400, d))), gpu.asarray(rng.normal(size=(300, d)) * 2)
    visit, rank = Tree(gpu, X).walk_order(Y, self_pairs=False)
    np.testing.assert_array_equal(gpu.to_host(visit),
                                  gpu.to_host(Tree(gpu, Y, reference=True).order))
    assert (gpu.to_host(rank) == -1).all()


def deepest_tree_points():
    """An octree of the full depth (test_barnes_hut_walk_on_the_deepest_tree)."""
    offsets = np.array(np.meshgrid(*[[0.5, 1.5]] * 3, indexing="ij")).reshape(3, -1).T[:-1]
    return np.concatenate([1.0 - 2.0**-s + offsets * 2.0**-(s + 1) for s in range(MAX_DEPTH)]
                          + [np.zeros((1, 3)), np.ones((2, 3))])


def test_barnes_hut_walk_on_the_deepest_tree(backend, monkeypatch):
    # An octree of the full depth whose every level has 8 children, the last in
    # Morton order (walked last) holding the deeper levels: a depth-first walk
    # from that corner keeps 7 waiting siblings per level, close to its stack
    # bound (barneshut.cu's BH_STACK).  (1, 1, 1) twice ends in the deepest leaf.
    # The CPU's walk in groups of one target takes the array code's decisions.
    monkeypatch.setattr(barneshut_cpu, "GROUP_SIZE", 1)
    X = deepest_tree_points()
    assert (Tree(CPU, X).n_children == 8).sum() == MAX_DEPTH
    for theta, (S0, SX0) in ((0.0, brute(X, "student")),
                             (0.5, vectorized_bh_sums(CPU, X, ("student",), theta=0.5)[0])):
        (S, SX), = bh_sums(backend, backend.asarray(X), ("student",), theta=theta)
        assert rel(backend.to_host(S), S0) < 1e-12 and rel(backend.to_host(SX), SX0) < 1e-12


def test_morton_code_bit_spreading(rng):
    cells = rng.integers(0, 2**MAX_DEPTH, size=(2000, 3))
    cells[0], cells[1] = 0, 2**MAX_DEPTH - 1
    for d in (1, 2, 3):
        loop = np.zeros(len(cells), dtype=np.int64)
        spread = np.zeros(len(cells), dtype=np.int64)
        for i in range(d):
            for bit in range(MAX_DEPTH):
                loop |= ((cells[:, i] >> bit) & 1) << (bit * d + d - 1 - i)
            spread |= _spread_bits(cells[:, i], d) << (d - 1 - i)
        np.testing.assert_array_equal(spread, loop)


def test_barnes_hut_with_duplicate_points(rng):
    # Exact duplicates end in deepest-level leaves, summed exactly (self excluded).
    X = np.repeat(rng.normal(size=(50, 2)), 3, axis=0)
    for theta in (0.0, 0.5):
        (S, SX), = bh_sums(CPU, X, ("student",), theta=theta)
        S0, SX0 = brute(X, "student")
        assert rel(S, S0) < (1e-11 if theta == 0 else 2e-2)


@pytest.mark.parametrize("method,accuracy,tol", [("exact", {}, 1e-11), ("fgt", {"p": 10}, 1e-6),
                                                 ("bh", {"theta": 0.0}, 1e-11)])
def test_separate_targets(method, accuracy, tol, rng):
    # Out-of-sample sums: M new targets against N sources, no self pair.
    X = rng.normal(size=(400, 2)) * 3
    Y = rng.normal(size=(150, 2)) * 3
    (S, SX), = engine_sums(CPU, method, X, ("gaussian",), Y=Y, accuracy=accuracy)
    S0, SX0 = brute(X, "gaussian", Y=Y)
    assert rel(S, S0) < tol and rel(SX, SX0) < tol


def test_engine_choice_and_bad_input():
    assert resolve_method("auto", 1000, 2, "gaussian", CPU) == "exact"
    assert resolve_method("auto", 10**6, 2, "gaussian", CPU) == "fgt"
    assert resolve_method("auto", 10**6, 2, "student", CPU) == "bh"
    # the compiled Barnes-Hut walk overtakes the exact Student-t pair sooner than the
    # FGT the exact Gaussian
    assert resolve_method("auto", 4_000, 2, "student", CPU) == "exact"
    assert resolve_method("auto", 8_000, 2, "student2", CPU) == "bh"
    assert resolve_method("auto", 4_000, 2, "gaussian", CPU) == "exact"
    assert resolve_method("auto", 8_000, 2, "gaussian", CPU) == "fgt"
    assert resolve_method("auto", 8_000, 2, "gaussian", CPU, exact_below=10_000) == "exact"
    assert resolve_method("auto", 20_000, 2, "gaussian", CPU) == "fgt"
    assert resolve_method("auto", 10**6, 5, "gaussian", CPU) == "exact"
    # The GPU's thresholds (the H200's crossover): Barnes-Hut for t-SNE from 40,000
    # points, the FGT from 120,000; the choice reads the backend's name alone.
    gpu = types.SimpleNamespace(name="gpu")
    assert resolve_method("auto", 39_999, 2, "student", gpu) == "exact"
    assert resolve_method("auto", 40_000, 2, "student", gpu) == "bh"
    assert resolve_method("auto", 70_000, 2, "gaussian", gpu) == "exact"
    assert resolve_method("auto", 120_000, 2, "gaussian", gpu) == "fgt"
    with pytest.raises(ValueError, match="n_components"):
        resolve_method("fgt", 1000, 4, "gaussian", CPU)
    with pytest.raises(ValueError, match="Gaussian"):
        resolve_method("fgt", 1000, 2, "student", CPU)
    with pytest.raises(ValueError, match="nbody"):
        resolve_method("fmm", 1000, 2, "gaussian", CPU)
    with pytest.raises(ValueError, match="p must be"):
        check_accuracy("fgt", {"p": 0})
    with pytest.raises(ValueError, match="theta"):
        check_accuracy("bh", {"theta": -1.0})
    with pytest.raises(TypeError, match="theta"):
        check_accuracy("fgt", {"theta": 0.5})
    with pytest.raises(TypeError, match="either p or tol"):
        check_accuracy("fgt", {"p": 4, "tol": 1e-3})
    with pytest.raises(ValueError, match="too many FGT boxes"):
        ge.nbody.kernel_sums(np.array([[0.0, 0.0], [1e12, 1e12], [5.0, 1.0]]), "gaussian",
                             "fgt", backend="cpu")
    X = np.random.default_rng(0).normal(size=(50, 2))
    with pytest.raises(ValueError, match="kernel"):
        ge.nbody.kernel_sums(X, "cauchy", backend="cpu")
    with pytest.raises(ValueError, match="NaN"):
        ge.nbody.kernel_sums(np.full((5, 2), np.nan), "gaussian", backend="cpu")
    with pytest.raises(ValueError, match="shift"):
        engine_sums(CPU, "fgt", X, ("gaussian",), target_shift=np.zeros(50))


def test_accuracy_schedules_ramp_log_spaced():
    fgt = accuracy_schedule("fgt", 100)
    assert [fgt(i)["p"] for i in (0, 99, 500)] == [1, 10, 10]
    ps = [fgt(i)["p"] for i in range(100)]
    assert ps == sorted(ps) and ps[50] == round(10 ** 0.5050505)
    bh = accuracy_schedule("bh", 100)
    assert bh(0)["theta"] == pytest.approx(2.0) and bh(99)["theta"] == pytest.approx(0.1)
    assert bh(50)["theta"] == pytest.approx(2.0 * (0.05 ** (50 / 99)))
    assert accuracy_schedule("exact") is None
    with pytest.raises(ValueError, match="accuracy_schedule"):
        accuracy_schedule("fgt", 0)


def _ee_final(P, X0, nbody, schedule=None, accuracy=None):
    """Exact EE objective after 100 fixed-step GD iterations with engine ``nbody``."""
    objective = make_objective("ee", P, CPU, np.float64, nbody=nbody)
    objective.accuracy = accuracy or {}
    result = minimize(objective, X0, "gd", max_iter=100, tol=0.0, step_size=0.5,
                      schedule=schedule)
    return make_objective("ee", P, CPU, np.float64).value(result.X)


def test_ee_with_fgt_follows_the_exact_path():
    # Dissertation fig. 5.7: fixed-step GD on EE with approximate gradients
    # follows the exact run: objective (evaluated exactly) within 1% after 100
    # iterations with the FGT at fixed p and with the p = 1 -> 10 ramp (measured:
    # 0.0004% and 0.3%); Barnes-Hut at theta = 0.5 within 3% (measured 1.7%).
    X, _ = ge.datasets.swiss_roll(2000, random_state=0)
    P = ge.entropic_affinities(X, 20, backend="cpu").P
    X0 = ge.initialization.initial_layout("pca", X, 2, CPU, np.float64, 1.0, 0)
    exact = _ee_final(P, X0, "exact")
    assert exact < 0.5 * make_objective("ee", P, CPU, np.float64).value(X0)   # it optimized
    assert abs(_ee_final(P, X0, "fgt") - exact) <= 1e-4 * exact
    assert abs(_ee_final(P, X0, "fgt", accuracy_schedule("fgt", 50)) - exact) <= 0.01 * exact
    assert abs(_ee_final(P, X0, "bh", accuracy={"theta": 0.5}) - exact) <= 0.03 * exact


def test_estimators_run_with_every_engine():
    X, labels = ge.datasets.gaussian_clusters(600, 3, 5, random_state=0)
    reference = ge.EE(nbody="exact", max_iter=60, random_state=0, backend="cpu").fit(X)
    for nbody in ("fgt", "bh"):
        est = ge.EE(nbody=nbody, max_iter=60, random_state=0, backend="cpu").fit(X)
        assert abs(est.objective_ - reference.objective_) < 0.01 * abs(reference.objective_)
        assert ge.metrics.knn_accuracy(est.embedding_, labels) > 0.95
        new = est.transform(X[:20])
        assert np.abs(new - est.embedding_[:20]).max() < 0.1 * np.ptp(est.embedding_)
    for cls in (ge.SSNE, ge.SNE):                 # SNE's column sums use source weights
        exact = cls(nbody="exact", max_iter=60, random_state=0, backend="cpu").fit(X)
        fgt = cls(nbody="fgt", max_iter=60, random_state=0, backend="cpu").fit(X)
        assert fgt.objective_ == pytest.approx(exact.objective_, rel=1e-5)   # measured 6e-7
    est = ge.TSNE(nbody="bh", max_iter=60, random_state=0, backend="cpu",
                  accuracy_schedule=30).fit(X)
    assert ge.metrics.knn_accuracy(est.embedding_, labels) > 0.95
    with pytest.raises(ValueError, match="Gaussian"):
        ge.TSNE(nbody="fgt", backend="cpu").fit(X)
    with pytest.raises(ValueError, match="n_components"):
        ge.EE(n_components=4, nbody="bh", backend="cpu").fit(X)
    with pytest.raises(TypeError, match="accuracy"):
        ge.EE(nbody="fgt", accuracy={"theta": 1.0}, backend="cpu").fit(X)


def test_out_of_sample_with_fgt_matches_exact():
    X, _ = ge.datasets.swiss_roll(1200, random_state=1)
    est = ge.EE(nbody="exact", max_iter=100, random_state=0, backend="cpu",
                transform_max_iter=50).fit(X[:1000])
    exact_map = est.transform(X[1000:])
    objective = est._fitted[3]
    objective.nbody, objective.accuracy = "fgt", {"p": 10}
    fgt_map = est.transform(X[1000:])
    assert np.abs(fgt_map - exact_map).max() < 1e-4 * np.ptp(est.embedding_)   # measured 3e-6


# -- GPU kernels against the CPU references --------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("d", [1, 2, 3, 5])
@pytest.mark.parametrize("kernels", [("gaussian",), ("student",), ("student2",),
                                     ("student", "student2")])
def test_exact_gpu_kernel_matches_numpy(d, kernels, rng):
    # float32 GPU (tile sums in float32, totals in float64) vs float64 CPU: 1e-5 relative.
    gpu = get_backend("gpu")
    X = rng.normal(size=(3001, d)) * 3
    Y = rng.normal(size=(517, d)) * 3
    w = rng.uniform(0.5, 2.0, 3001)
    for targets in (None, Y):
        ref = blocked_sums(CPU, X, kernels, Y=targets, weights=w)
        out = exact_sums(gpu, gpu.asarray(X, np.float32), kernels,
                         Y=None if targets is None else gpu.asarray(targets, np.float32),
                         weights=gpu.asarray(w, np.float32))
        for (S, SX), (S0, SX0) in zip(out, ref):
            assert rel(gpu.to_host(S), S0) < 1e-5 and rel(gpu.to_host(SX), SX0) < 1e-5
        out64 = exact_sums(gpu, gpu.asarray(X), kernels, Y=None if targets is None else
                           gpu.asarray(targets), weights=gpu.asarray(w))
        for (S, SX), (S0, SX0) in zip(out64, ref):
            assert rel(gpu.to_host(S), S0) < 1e-12 and rel(gpu.to_host(SX), SX0) < 1e-12


@pytest.mark.gpu
@pytest.mark.parametrize("d", [1, 2, 3])
def test_exact_gpu_kernel_shifts_and_exclusions(d, rng):
    """The NBODY_SHIFTED variant (multi-scale SNE's fine scales on the GPU):
    per-target or per-source shifts, excluded pairs between two point sets.
    float64 where every unshifted kernel underflows (nearest squared distances
    900-4900), as accurate as the CPU (1e-11); float32 ten times closer (9-49),
    within the rounding of t - m from float32 coordinates (up to 2,000 in 1-D:
    ulp 1e-4, so t errs by about 1e-3)."""
    gpu = get_backend("gpu")
    side = round(400 ** (1 / d))
    grid = np.stack(np.meshgrid(*[np.arange(side)] * d), axis=-1).reshape(-1, d)
    grid = grid + rng.uniform(-0.2, 0.2, size=(side ** d, d))
    n = len(grid)
    w = rng.uniform(0.5, 2.0, n)
    some = rng.choice(n, 60, replace=False)
    own = np.full(n, -1)
    own[some] = np.arange(60)
    for spacing, dtype, tol in ((50.0, np.float64, 1e-11), (5.0, np.float32, 5e-3)):
        X = grid * spacing
        D = ((X[:, None] - X[None]) ** 2).sum(-1)
        np.fill_diagonal(D, np.inf)
        m = D.min(axis=1)
        cases = [  # (sources, targets, weights, target_shift, source_shift, exclude)
            (X, None, w, m, None, None),
            (X[some], X, w[some], None, m[some], own),
            (X, X[some], w, m[some], None, some),
        ]
        for sources, targets, weights, t_shift, s_shift, exclude in cases:
            S0, SX0 = brute(sources, "gaussian", Y=targets, w=weights,
                            target_shift=0.0 if t_shift is None else t_shift,
                            source_shift=0.0 if s_shift is None else s_shift, exclude=exclude)

            def dev(a):
                return None if a is None else gpu.asarray(a, dtype)
            (S, SX), = exact_sums(gpu, dev(sources), ("gaussian",), Y=dev(targets),
                                  weights=dev(weights), target_shift=dev(t_shift),
                                  source_shift=dev(s_shift),
                                  exclude=None if exclude is None else gpu.asarray(exclude))
            assert rel(gpu.to_host(S), S0) < tol and rel(gpu.to_host(SX), SX0) < tol


@pytest.mark.gpu
@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("p", [3, 8])
def test_fgt_gpu_kernels_match_array_code(d, p, rng, monkeypatch):
    """kernels/fgt.cu's Hermite coefficients and cases III and IV (as well as the
    per-target passes) against the NumPy array code, with the dissertation's
    cutoff of 5 points so that every case has many box pairs in 1-3 D, with
    separate targets too; float64 to 1e-10, float32 to 1e-4 of the largest sum."""
    from gpuembed.nbody import fgt as fgt_module
    gpu = get_backend("gpu")
    X, Y, q, pairs = _fgt_every_case(rng, d, monkeypatch, (600, 200, 150, 150), 15)
    for targets in (None, Y):
        G0 = fgt_module.fgt(CPU, X, q, Y=targets, p=p, reference=True, cutoff=fgt_module.CUTOFF)
        for dtype, tol in ((np.float64, 1e-10), (np.float32, 1e-4)):
            G = fgt_module.fgt(gpu, gpu.asarray(X, dtype), gpu.asarray(q, dtype),
                               Y=None if targets is None else gpu.asarray(targets, dtype),
                               p=p, cutoff=fgt_module.CUTOFF)
            assert np.abs(gpu.to_host(G) - G0).max() < tol * np.abs(G0).max()
    assert sum(pairs) > 100


@pytest.mark.gpu
@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("method,accuracy", [("fgt", {"p": 8}), ("bh", {"theta": 0.5})])
def test_fast_engines_gpu_match_cpu(d, method, accuracy, rng, monkeypatch):
    # The FGT's per-target kernels (kernels/fgt.cu) and the CuPy paths against
    # NumPy: float64 to 1e-10, float32 to 1e-4 (relative to the largest sum).
    # Barnes-Hut's per-target walk (kernels/barneshut.cu) against the CPU's in
    # groups of one target, which take the same decisions.
    monkeypatch.setattr(barneshut_cpu, "GROUP_SIZE", 1)
    gpu = get_backend("gpu")
    X = np.concatenate([rng.normal(size=(1500, d)), rng.uniform(-20, 20, (1500, d))])
    Y = rng.normal(size=(300, d)) * 3
    for targets in (None, Y):
        (S0, SX0), = engine_sums(CPU, method, X, ("gaussian",), Y=targets, accuracy=accuracy)
        for dtype, tol in ((np.float64, 1e-10), (np.float32, 1e-4)):
            (S, SX), = engine_sums(gpu, method, gpu.asarray(X, dtype), ("gaussian",),
                                   Y=None if targets is None else gpu.asarray(targets, dtype),
                                   accuracy=accuracy)
            assert rel(gpu.to_host(S), S0) < tol and rel(gpu.to_host(SX), SX0) < tol
