"""Search directions B p = -g with B a positive definite partial Hessian (seed 002, section 2).

Each direction is a class built once per optimization from the objective and
the initial X, called as ``direction(X, G) -> P`` every iteration, and told the
accepted step through ``update(X_old, X_new, G_old, G_new)`` (L-BFGS and CG keep
memory).  ``initial_step(previous, grow)`` is the line search's first trial:
the previously accepted step (seed 002's adaptive strategy), doubled when the
last searches accepted their first trial (optim/loop.py, GROW_AFTER), and never
beyond the direction's natural step (1 for the Hessian-scaled ones and for
L-BFGS once it holds a curvature pair, none for GD and nonlinear CG); where
that trial is rejected, ``retry_step()`` may offer one longer step before the
halving (SD after a rebuild of B: the step accepted with the old B says nothing
of the new direction's scale).  The paper's rule never lets the step grow
again; from a small initialization EE's
first SD steps must be short (the repulsion expands the layout), which then
capped every later step: Fashion-MNIST 2,000, EE, step 0.008 for 300
iterations and objective 15.1 against 13.1 for GD, where growing reaches 13.0
by iteration 50 with steps 0.06-0.125.  L-BFGS always starting at 1 cost ~35
backtracks per iteration on EE from a small PCA initialization.

For t-SNE the attractive curvature 4 L+ of FP, SD and SD- is taken at X = 0,
where it is largest (the Laplacian weights p K shrink with distance), so a
unit step is short everywhere else: those directions get no step cap there
(``objective.attractive_curvature_is_bound``).  With the cap, SD on
rotating_objects stayed at step 1 and ended at KL 0.958 (10-NN accuracy 0.83)
after 1,000 iterations, worse than gradient descent's 0.798; uncapped it ends
at 0.772 (accuracy 1.0), and on Fashion-MNIST 5k at 1.257 against 1.295
(benchmarks/results/embedding.json at the time).
"""
from __future__ import annotations

import collections
import math

import numpy as np
import scipy.linalg
import scipy.sparse
import scipy.sparse.csgraph
import scipy.sparse.linalg

from .._checks import check_choice, check_int
from .sparse_cpu import (aggregate, cholesky_solve, component_join, component_split,
                         csr_times, csr_times_csr_dense, csr_transpose, degrees, jacobi_pcg,
                         laplacian_rows, largest_per_row, smoothed_prolongator,
                         two_level_apply)
from .sparse_cpu import connected_components as connected_components_cpu
from .sparse_gpu import CGWorkspace, connected_components_gpu, largest_per_row_gpu

try:
    import cholespy as _cholespy
except ImportError:     # no wheel for this platform: SuperLU instead
    _cholespy = None


def laplacian(be, W):
    """L = D - W of a symmetric sparse weight matrix (backend sparse)."""
    W = be.sparse.csr_matrix(W)
    degree = be.xp.asarray(W.sum(axis=1)).ravel()
    return (be.sparse.diags(degree) - W).tocsr()


def banded_system(B, diag):
    """(order, its inverse, B and diag in that order) for the CPU's CG: the points
    in reverse Cuthill-McKee order of B's graph, which puts each row's columns
    near the row, so that the products' gathers of the iterate hit the cache.
    On t-SNE's B of Fashion-MNIST 70k (20.6 entries per row) a product took
    1.21 ms against 1.51 ms in the data's order, and the solves of a
    200-iteration fit 13.4 s against 16.1 s; the ordering and the permuted copy
    cost about 40 ms per build of B (every 50 iterations)."""
    order = scipy.sparse.csgraph.reverse_cuthill_mckee(B, symmetric_mode=True)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size, dtype=order.dtype)
    permuted = B[order]
    permuted.indices = inverse[permuted.indices].astype(B.indices.dtype)
    permuted.has_sorted_indices = False     # the renumbered columns are out of order
    permuted.sort_indices()
    return order, inverse, permuted, np.ascontiguousarray(diag[order])


def sparsify(be, W, kappa):
    """Keep each row's kappa largest weights of the CSR W (the backend's), then
    symmetrize by the maximum."""
    xp = be.xp
    lengths = xp.diff(W.indptr)
    if kappa is None or kappa >= int(lengths.max()):
        return W
    keep = (largest_per_row_gpu(be, W.indptr, W.data, kappa) if be.is_gpu
            else largest_per_row(W.indptr, W.data, kappa))
    # Row n keeps min(its length, kappa) entries, in W's order; W's index type
    # (cupyx: int32, as its indices).
    indptr = xp.concatenate([xp.zeros(1, dtype=W.indptr.dtype),
                             xp.cumsum(xp.minimum(lengths, kappa), dtype=W.indptr.dtype)])
    S = be.sparse.csr_matrix((W.data[keep], W.indices[keep], indptr), shape=W.shape)
    return S.maximum(S.T.tocsr())          # cupyx's maximum takes no CSC matrix


def connected_components(be, G):
    """(number, labels) of the connected components of the symmetric graph G,
    numbered by their first points (SciPy's numbering on both backends)."""
    if be.is_gpu:
        return connected_components_gpu(be, G)
    G = scipy.sparse.csr_matrix(G)
    return connected_components_cpu(G.indptr, G.indices)


def connected_sparsify(be, W, kappa, grow):
    """(kept weights, kappa, (number of components, labels)) of the CSR W (the
    backend's) sparsified by :func:`sparsify`; with ``grow`` kappa doubles until
    the kept graph has no more connected components than W's own.  On the GPU
    all of it stays on the device (kernels/graph.cu)."""
    kept = sparsify(be, W, kappa)
    split = connected_components(be, kept)
    if grow and split[0] > 1:
        whole = connected_components(be, W)[0]
        while split[0] > whole:
            kappa *= 2
            kept = sparsify(be, W, kappa)
            split = connected_components(be, kept)
    return kept, kappa, split


# SD's and SD-'s linear CG: relative residual and step limit (seed 002's SD-;
# for SD see Spectral's docstring).
CG_TOL, CG_MAXITER = 0.1, 50
# SD's step limit where B is refreshed (t-SNE) from REFRESHED_CG_MIN_N points up to
# REFRESHED_CG_MAX_N: a B built at an earlier layout takes 40-150 steps to the residual
# there, so 50 truncated nearly every solve, at 35% of an iteration's time
# (Fashion-MNIST 70k: 83 of 239 ms).  With 20 the default fit reached each KL below 2.28
# sooner (2.25 after 59 s against 73 s) and stopped after 85 s against 119 s at 2.244
# against 2.238 (10-NN accuracy 0.846 both); on two 20k subsets KL 1.77 after 10.2 s and
# 8.2 s against 14.3 s and 12.0 s, ending lower (1.762, 1.751 against 1.768, 1.757).
# Early iterations lose a little (KL 2.30 at 70k after 28 s against 26 s); 15 was no
# better than 20, and with 10 a 20k fit stopped at 1.800.  Below, an evaluation costs
# more against the solve, and the shorter solves lost: 5k with exact sums (the
# benchmark's run at 8fdf35e, not kept, against 89e07b4's) KL 1.2492 against 1.2382
# after 4 s, 1.2464 against 1.2344 after 8 s; two 5k and two 10k subsets (Barnes-Hut)
# reached each KL sooner but two of them stopped higher (1.2393 against 1.2317, 1.5055
# against 1.5036).  Beyond, the shorter solves lose more progress per iteration than
# they save in time (shifted Fashion-MNIST, affinities given, Barnes-Hut in groups, Xeon
# VM): at 140k KL 2.539 after 100 iterations and 30.0 s with 50 steps, 2.551 after 200
# and 52.9 s with 20; at 280k 2.779 after 150 iterations and 112 s against 2.888 after
# 91 s (2.828 after 72 s with 50); a 10^6 fit with 20 ended at 3.313 after the
# 1,000-iteration limit, one with 50 at 3.136 (1ab19b5; 5397708, before later loop
# changes and the grouped walk, stopped at 3.133 after 888).  At 70k the two are level
# to KL 2.27 (2.267 at 28.2 s with 50, 2.268 at 26.2 s with 20), and 20 stops sooner (42
# s against 72 s, 2.2514 against 2.2470).
REFRESHED_CG_MAXITER, REFRESHED_CG_MIN_N, REFRESHED_CG_MAX_N = 20, 20_000, 100_000
# SD's CG runs in float32 whatever X's dtype for tolerances from SINGLE_CG_MIN_TOL
# up (the default's 0.1 is far above float32's precision), and its products move
# fewer bytes: t-SNE's refreshed B on Fashion-MNIST 20k (411k nonzeros, 50 steps on
# the CPU) 25.6 ms against 35.6 ms, the same relative residual to 5 digits.  Below
# it, in X's dtype: float32 iterates stall near 1e-7 and broke down (NaN) when
# asked for 1e-12.
SINGLE_CG_MIN_TOL = 1e-4


def pcg(xp, matvec, B, X0, precond, rtol, maxiter):
    """Preconditioned linear CG for A X = B, all columns at once (independent
    systems sharing A), warm-started from X0; ``precond(R)`` applies M^-1.
    SD-'s solver, and the reference of SD's (sparse_cpu.jacobi_pcg on the CPU,
    sparse_gpu.jacobi_pcg_gpu on the GPU)."""
    # Column dot products by einsum: (R * R).sum(axis=0) on an (N, 2) array
    # makes a temporary and reduces across the short axis, 3.5x slower at 70,000.
    coldot = lambda U, V: xp.einsum("ij,ij->j", U, V)
    # Guards for a column that is already solved (0 / 0); 1e-300 would be 0 in float32.
    tiny = np.finfo(B.dtype).tiny
    X = X0.copy()
    R = B - matvec(X)
    Z = precond(R)
    P = Z.copy()
    rz = coldot(R, Z)
    target = rtol * xp.sqrt(coldot(B, B))
    for _ in range(maxiter):
        if bool((xp.sqrt(coldot(R, R)) <= target).all()):
            break
        AP = matvec(P)
        alpha = rz / xp.maximum(coldot(P, AP), tiny)
        X += alpha * P
        R -= alpha * AP
        Z = precond(R)
        rz_new = coldot(R, Z)
        P = Z + (rz_new / xp.maximum(rz, tiny)) * P
        rz = rz_new
    return X


def check_refresh(value):
    """Spectral's ``refresh``: "auto", None (never) or an int >= 1."""
    if value is None:
        return None
    if isinstance(value, str):
        return check_choice(value, "sd_refresh", ("auto",))
    return check_int(value, "sd_refresh", 1)


def secant_pair(be, s, y):
    """(s, y, s.y) of an accepted step s = X_new - X_old with the gradient's change
    y = G_new - G_old, or None where its curvature s.y is not
    clearly positive (L-BFGS keeps only such pairs, so that H stays positive
    definite).  yy > 0 as well: in float32 a tiny y squares to 0 while s.y does
    not, and the pair's scaling s.y / y.y divided by zero (EE on separated
    clusters).  One host read for the three products (on the GPU each read
    waits for the device)."""
    xp = be.xp
    sy, yy, ss = be.host_floats(xp.vdot(s, y), xp.vdot(y, y), xp.vdot(s, s))
    if not (yy > 0 and sy > 1e-10 * math.sqrt(ss * yy)):
        return None
    return s, y, sy


def floor_zero_curvature(xp, diag):
    """The curvatures with zeros (points or components without attractive weights,
    moved by the repulsion alone) replaced by the mean of the others, so that
    dividing by them gives a step of the layout's scale."""
    positive = diag > 0
    count = int(positive.sum())
    fallback = float(diag.sum()) / count if count else 1.0
    return xp.where(positive, diag, diag.dtype.type(fallback))


class Direction:
    natural_step = 1.0
    scaled_by_attractive_curvature = False
    # Whether the direction comes in the gradient's units, so that -G can stand in
    # for it as it is where it is no descent direction (optim/loop.py: the others
    # give way to -G at their own length).
    gradient_units = False
    # Set where the direction changed its scale (a quasi-Newton model begun or
    # dropped): the steps accepted before say nothing of the new one's, and its
    # line search starts at step 1.
    restart = False

    def __init__(self, objective, X):
        self.objective = objective
        self.be = objective.be
        if self.scaled_by_attractive_curvature and objective.attractive_curvature_is_bound:
            self.natural_step = math.inf

    def initial_step(self, previous, grow):
        if self.restart:
            self.restart = False
            return 1.0
        return min(self.natural_step, 2.0 * previous if grow else previous)

    def retry_step(self):
        """A step for the line search to try once, when it is longer than a rejected
        first trial, before halving that trial; None: plain halving."""
        return None

    def update(self, X_old, X_new, G_old, G_new):
        pass

    def renew(self, window):
        """Asked when the loop would stop (slow progress or a failed line search):
        True if the direction rebuilds its curvature model for the next call, False
        if it has none to rebuild or built it within the last ``window`` calls."""
        return False

    def descent_retry(self, X, G):
        """Asked where the direction was no descent direction: another one from the
        same X and G, or None (the loop then falls back to -G)."""
        return None


class GradientDescent(Direction):
    natural_step = math.inf
    gradient_units = True

    def __call__(self, X, G):
        return -G


class FixedPoint(Direction):
    """FP: B = 4 D+ (the degree of the attractive weights) + c I, diagonal; c is
    the objective's ``curvature_shift`` (mu of a MAC penalty (mu/2)|Z - T|^2)."""

    scaled_by_attractive_curvature = True

    def __init__(self, objective, X):
        super().__init__(objective, X)
        W = objective.attractive_weights()
        self.diag = floor_zero_curvature(self.be.xp, 4.0 * self.be.xp.asarray(
            W.sum(axis=1)).ravel() + objective.curvature_shift)

    def __call__(self, X, G):
        return -G / self.diag[:, None]


# DiagH's curvature is floored at this fraction of FP's (4 D+).  Near X = 0 the
# repulsive part of s-SNE's and t-SNE's Hessian diagonal nearly cancels the attractive
# part, leaving entries of 1e-3 D+ and less: with only the non-positive ones replaced
# (by 4 D+), those coordinates took steps a thousand times FP's, the line search cut
# every step to fit them, and fits stopped near their start (t-SNE of 6 Gaussian
# clusters, 600 points: KL 3.21 after 29 iterations, FP 0.858 after 300; s-SNE of
# digits 4.30 after 85, FP 1.39).  Floored at 0.1: 0.862 and 1.386; at 0.3, or with
# |H| floored at 0.1 or 0.3, within 7% of it (either side) on 4 data sets for EE, s-SNE
# and t-SNE.
DIAGH_FLOOR = 0.1


class DiagonalHessian(FixedPoint):
    """DiagH: the diagonal of the full Hessian, floored at DIAGH_FLOOR times the
    FP curvature (4 D+), so B stays positive definite and no coordinate steps
    more than 1 / DIAGH_FLOOR times as far as FP would move it."""

    scaled_by_attractive_curvature = False

    def __call__(self, X, G):
        H = self.objective.hessian_diagonal(X)
        return -G / self.be.xp.maximum(H, DIAGH_FLOOR * self.diag[:, None])


# SD with curvature pairs (sd_memory) drops them where the line search accepted less
# than this fraction of the direction: the pairs' model then misleads.  On 10 separated
# Gaussian clusters (2,000 points in 10-D, perplexity 10) t-SNE's steps fell to 1e-6
# and the stopping test ended it at KL 1.723 after 105 iterations with points 828
# units from their cluster's centre; with the reset 1.288 and none beyond 33 (plain SD
# 1.719 after 1,000, the classic optimizer 1.380).  A higher threshold also resets
# where the pairs still help: on 20 clusters of 20,000 points 1e-3 reset 7 times and
# 1e-2 43 times, ending lower (KL 2.099, 2.130 against 2.173) with points stranded
# 2,300-5,900 units out, against 22 without resets.  The plain direction after a
# reset starts its line search at step 1: from the step accepted along the pairs'
# one (3e-5), s-SNE of 10 rotating objects at perplexity 3 (4 components) crept on
# at such steps, resetting each time, to 0.944 after 1,000 iterations (plain SD
# 0.044); with the restart 0.038.
MEMORY_RESET_STEP = 1e-4
# B with at least N^2 / DENSE_FACTOR_MIN_FILL nonzeros is factorized dense (below).
DENSE_FACTOR_MIN_FILL = 10


def _in_float64(solve64):
    """``solve64`` (float64 in and out) for G of any float dtype, in G's dtype."""
    return lambda G: solve64(np.ascontiguousarray(G, dtype=np.float64)).astype(G.dtype,
                                                                             copy=False)


def factorize_cpu(B):
    """``solve(G)`` for a sparse symmetric positive definite B, factorized once.

    CHOLMOD's supernodal Cholesky (the cholespy wheel) with its fill-reducing
    ordering: on the t-SNE spectral-direction matrix of Fashion-MNIST 20k
    (kappa = 7) it factorizes in 0.60 s and solves two right-hand sides in 7 ms,
    against 3.5 s and 26 ms for SciPy's SuperLU LU with COLAMD (2-core EPYC;
    benchmarks/results/factorization.json).
    SuperLU remains the fallback where cholespy cannot be imported.

    A B with at least N^2 / DENSE_FACTOR_MIN_FILL nonzeros (the full L+ of up to
    about a thousand points) fills most of its factor whatever the ordering, and the
    wheel's CHOLMOD runs the dense blocks on a bundled reference BLAS: LAPACK's
    dense Cholesky factorizes 5-10x faster there, and the dense factor solves
    (sparse_cpu.cholesky_solve) about as fast as CHOLMOD's.  Two columns, 2-core
    EPYC: rotating_objects' matrix (720 points, 82 nonzeros per row at perplexity
    20) 2.3 ms against 16.6 ms, solves 0.096 ms against 0.126 (LAPACK's own potrs
    0.166); Fashion-MNIST 1,000 at perplexity 30 (122 per row): 5.6 against 30 ms,
    0.18 against 0.17 ms (potrs 0.30).  t-SNE's SD refactorizes every 50 iterations,
    and default EE fits of such data stop within 54-165 iterations.  Sparser,
    CHOLMOD's faster solves pay for its factorization over a long fit:
    rotating_objects at perplexity 10 (39 per row, 1/18 full) 7.1 ms against the
    dense 2.3, solves 0.071 against 0.096 ms; Fashion-MNIST 2,000 (1/16 full) 84
    against 44 ms, solves 0.42 against 0.95 ms.
    """
    n = B.shape[0]
    if B.nnz * DENSE_FACTOR_MIN_FILL >= n * n:
        # LAPACK's lower factor is in Fortran order: its transpose is U in C order.
        U = np.ascontiguousarray(
            scipy.linalg.cho_factor(B.toarray(), lower=True, check_finite=False)[0].T)
        solve64 = lambda G: cholesky_solve(U, G)
    elif _cholespy is None:
        solve64 = scipy.sparse.linalg.splu(B.tocsc(), permc_spec="COLAMD").solve
    else:
        B = scipy.sparse.csr_matrix(B)
        factor = _cholespy.CholeskySolverD(n, B.indptr.astype(np.int32),
                                           B.indices.astype(np.int32),
                                           B.data.astype(np.float64), _cholespy.MatrixType.CSR)

        def solve64(G):
            out = np.zeros(G.shape)
            factor.solve(G, out)
            return out

    return _in_float64(solve64)


# The two-level solve's aggregates (points each) and prolongator smoothing (omega:
# 4/3 over the bound 2 on the spectral radius of D^-1 B for a Laplacian).
AGGREGATE_SIZE = 8
PROLONGATOR_OMEGA = 2.0 / 3.0
# The prolongator keeps a row's entries of at least this fraction of its largest
# (smoothed_prolongator's ``drop``).  Smoothing spreads each row over every aggregate
# its row of B reaches, 19-20 of 96 on t-SNE's rotating_objects at perplexity 20, but
# a few hold the weight: 1.9 entries per row reach 3% of the largest in B refreshed at
# a layout, 4.9 in B at X = 0.  The build's product B R and each solve's products with
# R shrink with them (build 2.6 -> 1.5 ms, solve 0.09 -> 0.02-0.04 ms).  Over 15 t-SNE
# problems side by side (as in Spectral's docstring) SD reached gradient descent's
# 1,000-iteration KL in about as many iterations (10 within 2; 28 fewer to 9 more),
# and its time went from a median 17.9x less than gd's to 21.6x (13.3x to 20.0x before
# e13ce89); the default fits' final KL was 0.4% higher on geometric mean over the 10
# problems with 50 or more entries per row (0.5% before e13ce89, as with 1% kept).
# (The sparser ones stop at other minima either way: rotating objects at perplexity 5
# ended at KL 0.26 with it and 0.60 without, before e13ce89 at 0.22 and 0.24.)
PROLONGATOR_DROP = 0.03


def two_level_cpu(B, diag):
    """``solve(G)``: the two-level approximation D^-1 G + R C^-1 R^T G of B^-1 G,
    D = diag(B) (``diag``, which the caller holds), R the smoothed-aggregation
    prolongator of B's graph (sparse_cpu.aggregate, AGGREGATE_SIZE points per
    aggregate; its entries below PROLONGATOR_DROP of their row's largest
    dropped), C = R^T B R factorized dense.  Additive: no product with B per
    solve, so a solve costs two sparse products with R and a triangular pair of
    order N / 8 (sparse_cpu.two_level_apply).

    The fine level is FP's diagonal; the coarse one moves groups of strongly
    linked points together by B's own curvature between them, the slow modes
    that set SD apart from FP.  For t-SNE, whose B is only a bound on the
    attractive curvature, it reached gradient descent's KL sooner than the
    exact solve, and ended higher on some sets (see Spectral)."""
    B = scipy.sparse.csr_matrix(B)
    order = np.argsort(-diag, kind="stable")
    labels, m = aggregate(B.indptr, B.indices, B.data, order, AGGREGATE_SIZE)
    R = smoothed_prolongator(B.indptr, B.indices, B.data, diag, labels, m, PROLONGATOR_OMEGA,
                             PROLONGATOR_DROP)
    RT = csr_transpose(*R, m)
    C = csr_times(*RT, csr_times_csr_dense(B.indptr, B.indices, B.data, *R, m))
    U = np.ascontiguousarray(
        scipy.linalg.cho_factor((C + C.T) / 2.0, lower=True, check_finite=False)[0].T)
    inverse_diag = 1.0 / diag
    return _in_float64(lambda G: two_level_apply(inverse_diag, *R, *RT, U, G))


class Spectral(Direction):
    """SD: B = 4 L+ + (c + mu) I, L+ the attractive Laplacian (at X = 0 for t-SNE),
    sparsified to each point's kappa largest affinities; c the objective's
    ``curvature_shift`` (MAC's Z step: L + (mu/2) I in the paper's scaling);
    mu = 1e-10 min diag.

    ``kappa=None``: the full L+ up to FULL_LAPLACIAN_MAX_N points (on small
    manifold-like data it converges much better and costs little), AUTO_KAPPA
    beyond, where the full L+ fills the factor (t-SNE on Fashion-MNIST 20k: 26.7 s
    against 4.3 s to factorize), doubled at the first build of B until the kept
    graph is as connected as the whole one.  A graph that the sparsification
    splits has relative motions of its pieces without curvature, and SD stalled
    there (40 rotating objects kept 3 components at 15, 1 at 30).

    ``solver="cholesky"``: one factorization cached for all iterations
    (:func:`factorize_cpu`; on the GPU cupyx's ``factorized``).  ``solver="cg"``:
    Jacobi-preconditioned CG warm-started from the previous direction (compiled
    on the CPU, kernels/cg.cu on the GPU), to relative residual ``cg_tol`` (0.1,
    as SD-'s in seed 002; float32 products from SINGLE_CG_MIN_TOL up) or
    ``cg_maxiter`` steps (None: CG_MAXITER, or REFRESHED_CG_MAXITER where B is
    refreshed, from REFRESHED_CG_MIN_N points below REFRESHED_CG_MAX_N).  An
    inexact direction costs little progress and saves most of the solve
    (Fashion-MNIST 20k, 200 t-SNE iterations: KL 1.860 in 12.3 s against 1.857 in
    20.5 s with the factor).  "auto": the factor on the CPU up to CHOLESKY_MAX_N points,
    CG beyond and on the GPU; for t-SNE, whose curvature at X = 0 is only a bound,
    the factor only for the full L+: an exact solve with a sparsified L+ follows
    its near-null modes (weakly linked groups) all the way and stalled once B was
    refreshed at a spread layout, where CG's truncated solve resolves the stiff
    modes first (100 rotating objects: KL 1.913 against 1.462; at d3ef4c5 that fit no
    longer stalls, 1.398 against the default's 1.324: benchmarks/README.md); and of
    the full L+, the two-level solve where P's rows hold TWO_LEVEL_MIN_ROW_ENTRIES
    or more entries on average, the factor on sparser graphs (TSNE also on split
    ones).

    ``solver="twolevel"`` (CPU): :func:`two_level_cpu`'s additive two-level
    approximation of B^-1, B refreshed every TWO_LEVEL_REFRESH iterations for
    t-SNE (at 720 points its build takes 1.5 ms against 5-8 ms for the dense
    factor, its solve 0.02-0.04 ms against 0.15-0.3; with PROLONGATOR_DROP).
    Over 15 connected t-SNE problems of up to 2,000 points (rotating objects at
    perplexities 5-50, 20 objects, digits, Fashion-MNIST subsets; side runs at
    d4fb4b5, benchmarks/README.md) it reached gradient descent's 1,000-iteration
    KL sooner on all but one (median 13.3x gd's time against 6.0x; 21.6x since
    PROLONGATOR_DROP), and default fits took 12% less time.  Their
    final KL was 1.3% lower on geometric mean over the 10 problems with 59 or
    more entries per row (4.8% lower to 1.4% higher), 5.6% higher over the 5
    sparser ones (0.1% to 22%: rotating objects at perplexity 5, 0.251 against
    0.206).  It also ended higher on six separated clusters (0.555 after 460
    iterations against 0.535 after 220).

    ``refresh=R`` (``sd_refresh``): every R iterations B is rebuilt and
    refactorized from the attractive weights at the current layout, and where the
    loop would stop with a B older than its stopping window after steps the line
    search cut, earlier (:meth:`renew`).  "auto" means REFRESH for objectives whose
    curvature at X = 0 is only a bound (t-SNE: p / (1 + d^2), d^2 capped by
    REFRESH_SQDIST_CAP in objectives/tsne.py), never for the others, whose
    weights do not depend on X.  It cut the default t-SNE of Fashion-MNIST 70k
    from 1,000 iterations to about 170 for a lower KL.  After a rebuild a
    rejected first trial is followed by a unit step (:meth:`retry_step`): the
    KL along a rebuilt direction can rise for short steps and fall at 1.

    ``memory=m`` (``sd_memory``, default 0): L-BFGS's two-loop recursion over the
    last m curvature pairs, with the solve by B as the initial inverse Hessian,
    gathered after the first ``memory_start`` iterations; a refresh drops them,
    and so does a step accepted at under MEMORY_RESET_STEP of the direction.  B
    has no curvature for the relative placement of a split graph's components
    (which the FP step of :meth:`_split` only guesses) nor for the repulsion,
    which the pairs pick up: 20 separated Gaussian clusters (20,000 points)
    reached t-SNE's KL 2.18 in 20.5 s with 10 pairs against 2.71 in 38.5 s
    without.  The estimators' defaults are in their SD_MEMORY and
    TSNE.SPLIT_GRAPH_PARAMS.

    The runs behind each of these choices: "Optimizers in detail" in
    benchmarks/README.md.
    """

    CHOLESKY_MAX_N = 20000
    FULL_LAPLACIAN_MAX_N = 2000
    rebuilt = False                   # whether this call rebuilt B (see retry_step)
    warm_started = False              # whether CG started from the previous direction
    single_precision_cg = True        # see SINGLE_CG_MIN_TOL
    AUTO_KAPPA = 15
    REFRESH = 50
    scaled_by_attractive_curvature = True
    TWO_LEVEL_REFRESH = 25
    # "auto" takes the two-level solve for t-SNE's full L+ where P's rows hold this
    # many entries on average (perplexity 15 and up with 3 perplexity neighbours:
    # 59-64 entries per row; perplexity 10: 38-43).  An aggregate of 8 points is
    # then a small part of each neighbourhood; on sparser graphs the exact factor
    # ended lower (see solver="twolevel" above).
    TWO_LEVEL_MIN_ROW_ENTRIES = 50
    SOLVERS = ("auto", "cholesky", "cg", "twolevel")

    def __init__(self, objective, X, kappa=None, solver="auto", cg_tol=CG_TOL,
                 cg_maxiter=None, refresh="auto", memory=0, memory_start=0):
        super().__init__(objective, X)
        check_choice(solver, "sd_solver", self.SOLVERS)
        self.memory = check_int(memory, "sd_memory", 0)
        self.memory_start = check_int(memory_start, "sd_memory_start", 0)
        self.pairs = collections.deque(maxlen=max(self.memory, 1))
        grow_kappa = kappa is None and X.shape[0] > self.FULL_LAPLACIAN_MAX_N
        if kappa is not None:
            kappa = check_int(kappa, "kappa", 1)
        elif grow_kappa:
            kappa = self.AUTO_KAPPA
        self.kappa = kappa
        self._full_components = None        # (number, labels) of the full L+'s graph
        if solver == "auto":
            P = objective.pairs.P
            solver = self.auto_solver(X.shape[0], self.kappa,
                                      objective.attractive_curvature_is_bound, self.be.is_gpu,
                                      P.nnz / P.shape[0])
        elif solver == "twolevel" and self.be.is_gpu:
            raise ValueError("sd_solver='twolevel' runs on the CPU backend only; on the GPU "
                             "take 'cg' or 'cholesky'")
        self.solver = solver
        self.refresh = check_refresh(refresh)
        if self.refresh == "auto":
            self.refresh = self.auto_refresh(solver, objective.attractive_curvature_is_bound)
        self.calls = self.built_at = 0
        self.renewing = False
        if cg_maxiter is None:
            short = REFRESHED_CG_MIN_N <= X.shape[0] < REFRESHED_CG_MAX_N
            cg_maxiter = REFRESHED_CG_MAXITER if self.refresh and short else CG_MAXITER
        self.cg_tol, self.cg_maxiter = cg_tol, cg_maxiter
        self.cg_dtype = np.dtype(np.float32 if self.single_precision_cg
                                 and cg_tol >= SINGLE_CG_MIN_TOL else X.dtype)
        self.previous = None
        # With refreshes, from the start layout's weights too (MAC builds one
        # direction per mu at a spread layout; a new fit starts near X = 0).
        # kappa is chosen from these first weights only: a refresh at a spread t-SNE
        # layout weakens the links between separated clusters by design, and
        # growing kappa to keep them (40 rotating objects: 15 -> 30 -> 60; 100:
        # 30 -> 120) took 12.7 s to KL 0.998 and 15.6 s to 1.359, against 10.9 s
        # to 1.004 and 12.1 s to 1.333 with kappa kept at 30.
        self._build(objective.attractive_weights(X if self.refresh else None), X, grow_kappa)

    def _build(self, W, X, grow_kappa=False):
        """B, its diagonal and solver from the attractive weights W (``grow_kappa``:
        see :func:`connected_sparsify`)."""
        be = self.be
        W = be.sparse.csr_matrix(W)
        if self.kappa is None and self._full_components is not None:
            # The full L+ keeps P's pattern at every refresh, and so its components.
            n_comp, labels = self._full_components
        else:
            W, self.kappa, (n_comp, labels) = connected_sparsify(be, W, self.kappa, grow_kappa)
            if self.kappa is None:
                self._full_components = n_comp, labels
        # Assembled in float64 whatever X's dtype: mu = 1e-10 min diag vanishes
        # against the diagonal in float32, and the factor of a Laplacian without
        # it is singular (CHOLMOD: "not positive definite").
        if W.dtype != np.float64:               # CuPy 13's sparse astype has no copy=
            W = W.astype(np.float64)
        shift = self.objective.curvature_shift
        if be.is_gpu:
            L4 = 4.0 * laplacian(be, W)
            if shift:
                L4 = L4 + shift * be.sparse.identity(L4.shape[0], dtype=L4.dtype, format="csr")
            self.diag = L4.diagonal()
        else:
            # The array code's values (the degrees to rounding), B in one compiled
            # pass below (SciPy's Laplacian and sums took 0.8 ms of a 4-ms build at
            # 720 points).  Sorted in a copy where it is not: W may share P's index
            # arrays (PairSet.weights), which an in-place sort would scramble.
            if not W.has_sorted_indices:
                W = W.sorted_indices()
            self.diag = 4.0 * degrees(W.indptr, W.indices, W.data)
            if shift:
                self.diag = self.diag + shift
        # Each connected component of the graph can translate without attractive
        # curvature; those modes get the FP (mean degree) curvature instead of mu
        # (_split).
        self.labels = be.asarray(labels)
        self.counts = be.xp.bincount(self.labels, minlength=n_comp).astype(np.float64)
        # On the GPU the sums over components are a product with their (n_comp, N)
        # indicator (_component_sum), one per dtype.
        self._indicators = {}
        self.component_curvature = floor_zero_curvature(
            be.xp, self._component_mean(self.diag[:, None])[:, 0])
        # mu over the smallest positive degree: a point without affinities has 0.
        mu = 1e-10 * float(self.diag[self.diag > 0].min())
        if be.is_gpu:
            self.B = (L4 + mu * be.sparse.identity(L4.shape[0], dtype=L4.dtype,
                                                   format="csr")).tocsr()
        else:
            self.B = scipy.sparse.csr_matrix(
                laplacian_rows(W.indptr, W.indices, W.data, 4.0, self.diag + mu)[::-1],
                shape=W.shape)
        self.diag = self.diag + mu
        # Each point's share of its component's curvature (see _split).
        self.share = (self.diag / self._per_point(self._component_sum(self.diag[:, None]))[:, 0]
                      ).astype(X.dtype)
        if self.solver == "cholesky":
            self.solve = (be.sparse_linalg.factorized(self.B) if be.is_gpu
                          else factorize_cpu(self.B))
        elif self.solver == "twolevel":
            self.solve = two_level_cpu(self.B, self.diag)
        else:
            self.B, self.diag = self.B.astype(self.cg_dtype), self.diag.astype(self.cg_dtype)
            # Made by the first solve: banded_system(B) on the CPU, a CGWorkspace on the GPU.
            self.cg_system = None
        self.component_curvature = self.component_curvature.astype(X.dtype)
        self.pairs.clear()      # gathered with the old B as initial inverse Hessian

    def times_B(self, V):
        """B V, on all cores on the CPU (SciPy's product runs on one).  With it and
        pcg's einsum dot products the CG of EE on Fashion-MNIST 20k (27 products
        per iteration) took 3.0 s per 100 iterations instead of 6.1 s."""
        if self.be.is_gpu:
            return self.B @ V
        return csr_times(self.B.indptr, self.B.indices, self.B.data, V)

    def _component_sum(self, V):
        """The sum of V's rows over each component, (n_comp, V's columns).  On the
        GPU by the (n_comp, N) indicator's sparse product, not a scatter: cuSPARSE's
        product without transpose sums in a fixed order, where the scatter's atomic
        additions come in another order at every run, and two fits of one seed on a
        graph of 3 components ended apart (EE 2.7 after 50 iterations on an H200)."""
        be, n_comp = self.be, self.counts.shape[0]
        if n_comp == 1:                     # a connected graph: no scatter (see _per_point)
            return V.sum(axis=0, keepdims=True)
        if not be.is_gpu:
            sums = np.zeros((n_comp, V.shape[1]), dtype=V.dtype)
            return be.scatter_add(sums, self.labels, V)
        indicator = self._indicators.get(V.dtype)
        if indicator is None:
            n = self.labels.shape[0]
            indicator = self._indicators[V.dtype] = be.sparse.csr_matrix(
                (be.xp.ones(n, dtype=V.dtype), (self.labels, be.xp.arange(n))),
                shape=(n_comp, n))
        return indicator @ V

    def _per_point(self, A):
        """Row labels[n] of A (one row per component) for every point n; for one
        component A itself, which broadcasts: on rotating_objects (720 points) the
        gathers and scatters took 0.15 ms of t-SNE's 1.3-ms SD iterations."""
        return A if A.shape[0] == 1 else A[self.labels]

    def _component_mean(self, V):
        return (self._component_sum(V) / self.counts[:, None]).astype(V.dtype, copy=False)

    def _split(self, G):
        """(G without the part that moves each component as a whole, that part's FP
        step).  The part is the component's total of G spread over its points in
        proportion to their curvature (``share``), which the FP step turns into one
        translation: the exact solve of B + a rank-one term in D 1 that makes B
        positive definite.  Spread evenly (G minus its component mean), it reached
        a weakly linked point as a force of the component's mean size that the
        point does not feel, and the solve multiplied that by the inverse of its
        small curvature.  On well-separated clusters (gaussian_clusters, 20,000
        points, 20 clusters in 10-D: 20 components) t-SNE's refreshed B weakens
        the links of a point that drifts from its cluster, so the step grew as the
        point left: pairs of points flew off at 45 units per iteration, the
        layout reached 3.7e7 units across clusters of radius 2, and Barnes-Hut
        slowed 5x with the spread (1,000 iterations in 251 s).  Spread by
        curvature, a point's share of the force and its curvature shrink
        together; that fit stays within 32 units, in 45-49 s.  Over a connected graph
        the embedding objectives' G sums to zero (they do not change under
        translation), and nothing changes there; MAC's penalty does not.  The FP
        step moves separated components orders of magnitude too little, but an
        L-BFGS over their translations (64d67f1, reverted in d74d05e) let them
        drift apart where the objective is flat, at any distance for t-SNE, and
        parametric fits of such layouts came out worse (s-SNE + RBF network on 6
        clusters: P(F) 2.97 against 1.57)."""
        if not self.be.is_gpu:
            return component_split(G, self.labels, self.share, self.counts,
                                   self.component_curvature)
        return self._split_arrays(G)

    def _split_arrays(self, G):
        """:meth:`_split` by array code (the GPU's; the compiled CPU code's
        reference), its translation per point."""
        total = self._component_sum(G)
        mean = (total / self.counts[:, None]).astype(G.dtype, copy=False)
        return (G - self.share[:, None] * self._per_point(total),
                self._per_point(-mean / self.component_curvature[:, None]))

    def _join(self, P, translation):
        """P moved by ``translation`` (:meth:`_split`'s) in place of its components'
        means."""
        if not self.be.is_gpu:
            return component_join(P, self.labels, self.counts, translation)
        return self._join_arrays(P, translation)

    def _join_arrays(self, P, translation):
        return P - self._per_point(self._component_mean(P)) + translation

    @classmethod
    def auto_refresh(cls, solver, curvature_is_bound):
        """The refresh period that ``refresh="auto"`` takes with ``solver``: None
        where the attractive curvature does not depend on the layout."""
        if not curvature_is_bound:
            return None
        return cls.TWO_LEVEL_REFRESH if solver == "twolevel" else cls.REFRESH

    @classmethod
    def auto_solver(cls, n, kappa, curvature_is_bound, is_gpu, row_entries=0.0):
        """The solver that ``solver="auto"`` takes for n points, ``kappa`` (None:
        the full L+ up to FULL_LAPLACIAN_MAX_N points) and affinities with
        ``row_entries`` stored entries per row on average."""
        if is_gpu:
            return "cg"
        if curvature_is_bound:
            if kappa is not None or n > cls.FULL_LAPLACIAN_MAX_N:
                return "cg"
            return "twolevel" if row_entries >= cls.TWO_LEVEL_MIN_ROW_ENTRIES else "cholesky"
        return "cholesky" if n <= cls.CHOLESKY_MAX_N else "cg"

    def __call__(self, X, G):
        self.rebuilt = bool(self.refresh and (self.renewing
                                              or self.calls - self.built_at >= self.refresh))
        if self.rebuilt:
            self._build(self.objective.attractive_weights(X), X)
            self.built_at, self.renewing = self.calls, False
        self.calls += 1
        return self._quasi_newton(X, G)

    def renew(self, window):
        # A B built at an earlier layout slows the steps before its refresh (see
        # STOP_WINDOW in optim/loop.py); one built within the window is the new model.
        # The steps that the old B's line search cut say nothing of the new one's: its
        # search starts at step 1 and halves from there.
        self.renewing = bool(self.refresh and self.calls - self.built_at > window)
        self.restart = self.restart or self.renewing
        return self.renewing

    def descent_retry(self, X, G):
        # Each CG iterate x from a zero start is a descent direction (-G.x = x.B x > 0);
        # from the previous direction, no: late in t-SNE fits with exact sums
        # (Fashion-MNIST 5k, |G| ~ 5e-5, B's eigenvalues 2e-10 to 3e-4) that start met the
        # relative residual 0.1 and still climbed, the same |P| = 184 over 14 iterations.
        if not (self.solver == "cg" and self.warm_started):
            return None
        self.previous = self.be.xp.zeros_like(G)
        return self._quasi_newton(X, G)

    def _start(self, G, diag):
        """CG's start: the previous direction where there is one (a warm start),
        else the Jacobi guess."""
        self.warm_started = self.previous is not None
        return self.previous if self.warm_started else -G / diag

    def retry_step(self):
        # The step accepted with the old B says nothing of the scale of a direction
        # from a rebuilt one: where it fails, the new B's own step 1 comes next.
        return 1.0 if self.rebuilt else None

    def _quasi_newton(self, X, G):
        """-H G by L-BFGS's two-loop recursion over the held curvature pairs with
        the solve by B as the initial inverse Hessian (the plain direction
        while there are none)."""
        if not self.pairs:
            return self._solve(X, G)
        xp = self.be.xp
        q = G.copy()
        alphas = []
        for s, y, rho in reversed(self.pairs):
            alphas.append(rho * float(xp.vdot(s, q)))
            q -= alphas[-1] * y
        # From CG's Jacobi guess: warm-started from the previous solve for another
        # q, CG left a few weakly linked points' entries as they were (their
        # residual weighs nothing), and those points flew off (20 clusters:
        # 2,785 units out against 21 for the rest, in 12.8 s; cold, 21 in 28.5 s
        # for a lower KL, 2.181 against 2.220).
        self.previous = None
        r = -self._solve(X, q)
        for (s, y, rho), alpha in zip(self.pairs, reversed(alphas)):
            r += (alpha - rho * float(xp.vdot(y, r))) * s
        self.direction = -r                 # for update's step length
        return self.direction

    def update(self, X_old, X_new, G_old, G_new):
        if not self.memory or self.calls <= self.memory_start:
            return
        step = X_new - X_old
        if self.pairs and self._step_length(step) < MEMORY_RESET_STEP:
            self.pairs.clear()
            self.restart = True
            return
        pair = secant_pair(self.be, step, G_new - G_old)
        if pair is not None:
            s, y, sy = pair
            self.pairs.append((s, y, 1.0 / sy))

    def _step_length(self, step):
        """The accepted step in units of the last (quasi-Newton) direction."""
        xp, P = self.be.xp, self.direction
        sp, pp = self.be.host_floats(xp.vdot(step, P), xp.vdot(P, P))
        return sp / pp if pp > 0 else 0.0

    def _solve(self, X, G):
        """The spectral direction -B^-1 G, each component moved as a whole by
        _split's translation."""
        # B is singular up to mu along each component's translation: solve for
        # the component-mean-free gradient, whose solution 1/mu cannot blow up,
        # and move each component as a whole by its FP step.
        G, translation = self._split(G)
        if self.solver in ("cholesky", "twolevel"):
            if self.be.is_gpu:
                P = self.be.xp.stack([-self.solve(G[:, j]) for j in range(G.shape[1])],
                                     axis=1).astype(G.dtype, copy=False)
            else:
                P = -self.solve(np.ascontiguousarray(G))
        else:
            x0 = self._start(G, self.diag[:, None])
            tail = (self.cg_tol, self.cg_maxiter, np.finfo(self.cg_dtype).tiny)
            if self.be.is_gpu:
                if self.cg_system is None:
                    self.cg_system = CGWorkspace(self.be, self.B.indptr, self.B.indices,
                                                 self.B.data, self.diag, G.shape[1], *tail)
                cast = lambda A: self.be.xp.ascontiguousarray(A, dtype=self.cg_dtype)
                P = self.cg_system.solve(cast(-G), cast(x0))
            else:
                if self.cg_system is None:
                    self.cg_system = banded_system(self.B, self.diag)
                order, inverse, B, diag = self.cg_system
                # np.take: fancy indexing took 3.8 ms per solve at 70,000 points
                banded = lambda A: np.take(A, order, axis=0).astype(self.cg_dtype, copy=False)
                P = np.take(jacobi_pcg(B.indptr, B.indices, B.data, diag, -banded(G),
                                       banded(x0), *tail), inverse, axis=0)
            P = P.astype(G.dtype, copy=False)
        self.previous = P = self._join(P, translation)
        return P


class SpectralMinus(Spectral):
    """SD-: B = 4 L+ + mu I + 8 L^xx_ii (the psd block-diagonal repulsive part),
    solved by warm-started linear CG (relative tolerance 0.1, 50 iterations), in
    X's dtype: its products add the N-body term's, which run in X's dtype."""

    single_precision_cg = False

    def __init__(self, objective, X, kappa=None, cg_tol=CG_TOL, cg_maxiter=CG_MAXITER,
                 memory=0, memory_start=0):
        super().__init__(objective, X, kappa=kappa, solver="cg", cg_tol=cg_tol,
                         cg_maxiter=cg_maxiter, memory=memory, memory_start=memory_start)
        objective.xx_coefficients(X)      # fails early for objectives without the term

    def __call__(self, X, G):
        return self._quasi_newton(X, G)

    def _solve(self, X, G):
        obj = self.objective
        coef = obj.xx_coefficients(X)
        diag = self.diag[:, None] + obj.xx_times(X, coef)
        G, translation = self._split(G)
        x0 = self._start(G, diag)
        P = pcg(self.be.xp, lambda V: self.times_B(V) + obj.xx_times(X, coef, V), -G, x0,
                lambda R: R / diag, self.cg_tol, self.cg_maxiter)
        self.previous = P = self._join(P, translation)
        return P


class LBFGS(Direction):
    """L-BFGS with memory m (seed 002 found m = 100 best).

    H g by the compact representation (Byrd, Nocedal & Schnabel 1994; Nocedal
    & Wright eq. 7.24) with H0 = gamma I, gamma = s.y / y.y of the newest pair:
    the direction of the two-loop recursion (tests/test_embedding.py keeps that
    as the reference).  The pairs are the rows of one (m, 2, N d) array, and the
    products s_i . y_j and y_i . y_j live on the host as m x m tables, one row
    product per accepted pair; a direction is one product with the rows, an m x m
    triangular solve on the host and one product back.  On the GPU that is 5
    calls and one host read whatever m, where the two-loop recursion made 7
    calls and 3 reads per pair (about 700 and 300 per iteration with 100 pairs).
    """

    def __init__(self, objective, X, m=100):
        super().__init__(objective, X)
        self.m = check_int(m, "m", 1)
        self.pairs = None               # (m, 2, N d): s_i, y_i in slot i % m
        self.n_accepted = 0
        self.used_pairs = False         # whether a direction came from pairs yet
        self.sy = np.zeros((self.m, self.m))    # [i, j] = s_i . y_j, slots
        self.yy = np.zeros((self.m, self.m))

    @property
    def n_pairs(self):
        return min(self.n_accepted, self.m)

    @property
    def natural_step(self):
        # With no curvature pair the direction is the raw gradient, which has no
        # natural step: let it grow as GD's does.  Near t-SNE's X = 0 saddle the
        # curvature is negative and rejects every pair; capped at 1 there, L-BFGS
        # crawled (Fashion-MNIST 5k: KL 4.75 after 1,000 iterations).
        return 1.0 if self.n_pairs else math.inf

    def _rows(self):
        """The held pairs as (2 k, N d) rows s_0, y_0, s_1, ... by slot."""
        return self.pairs[:self.n_pairs].reshape(2 * self.n_pairs, -1)

    def __call__(self, X, G):
        k = self.n_pairs
        # The first direction from pairs follows steps along the raw gradient, in its
        # units: multi-scale SNE's stage of perplexity 4 on Fashion-MNIST 5k took
        # 1.2e-4 along -G (|G| = 320), and that step along the first quasi-Newton
        # direction (|P| = 0.0024) moved the points less than the line search's
        # floor (MIN_MOVE), which ended the stage after one iteration.
        self.restart = k > 0 and not self.used_pairs
        self.used_pairs = self.used_pairs or k > 0
        if not k:
            return -G
        order = np.arange(self.n_accepted - k, self.n_accepted) % self.m   # oldest first
        g = G.reshape(-1)
        ab = self.be.to_host(self._rows() @ g).astype(np.float64).reshape(k, 2)[order]
        SY = self.sy[np.ix_(order, order)]
        newest = order[-1]
        gamma = float(self.sy[newest, newest] / self.yy[newest, newest])
        R = np.triu(SY)
        u = scipy.linalg.solve_triangular(R, ab[:, 0])
        v = (np.diag(SY) * u + gamma * (self.yy[np.ix_(order, order)] @ u - ab[:, 1]))
        coef = np.empty((k, 2))
        coef[order, 0] = scipy.linalg.solve_triangular(R, v, trans="T")
        coef[order, 1] = -gamma * u
        coef = self.be.asarray(coef.reshape(-1), dtype=G.dtype)
        return -(gamma * g + self._rows().T @ coef).reshape(G.shape)

    def update(self, X_old, X_new, G_old, G_new):
        pair = secant_pair(self.be, X_new - X_old, G_new - G_old)
        if pair is None:
            return
        s, y, _ = pair
        xp = self.be.xp
        if self.pairs is None:
            self.pairs = xp.empty((self.m, 2, s.size), dtype=s.dtype)
        slot = self.n_accepted % self.m
        self.pairs[slot, 0] = s.reshape(-1)
        self.pairs[slot, 1] = y.reshape(-1)
        self.n_accepted += 1
        k = self.n_pairs
        dots = self.be.to_host(self._rows() @ y.reshape(-1)).astype(np.float64).reshape(k, 2)
        self.sy[:k, slot] = dots[:, 0]
        self.yy[:k, slot] = self.yy[slot, :k] = dots[:, 1]


class NonlinearCG(Direction):
    """Polak-Ribiere+ nonlinear conjugate gradients (restarts when beta < 0)."""

    natural_step = math.inf
    gradient_units = True

    def __init__(self, objective, X):
        super().__init__(objective, X)
        self.p = None
        self.g = None

    def __call__(self, X, G):
        xp = self.be.xp
        if self.p is None:
            p = -G
        else:
            gg = float(xp.vdot(self.g, self.g))
            # A previous gradient of exactly 0 (underflow in float32): restart.
            beta = max(0.0, float(xp.vdot(G, G - self.g)) / gg) if gg > 0 else 0.0
            p = -G + beta * self.p
        self.p, self.g = p, G
        return p


DIRECTIONS = {"gd": GradientDescent, "fp": FixedPoint, "sd": Spectral, "sd-": SpectralMinus,
              "diagh": DiagonalHessian, "lbfgs": LBFGS, "cg": NonlinearCG}
