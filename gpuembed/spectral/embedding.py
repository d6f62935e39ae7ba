"""Spectral embedding (normalized Laplacian eigenmaps) of a sparse affinity graph."""
from __future__ import annotations

import numpy as np
import scipy.sparse
import scipy.sparse.linalg

from .._checks import check_bool, check_int, make_rng
from ..backend import get_backend
from ..optim.directions import connected_components

# Graphs of points of at most this many coordinates are solved with
# shift_invert=True (see points_suit_shift_invert): their Cholesky factors stay
# sparse (nested dissection).  A Fashion-MNIST 20k graph (784-D) took 3.7 s to
# factorize, against 0.31 s for the plain Lanczos.
SHIFT_INVERT_MAX_DIM = 3
# (1 + SHIFT) I - M is positive definite, and SHIFT lies far below the spectral
# gaps of interest (1e-4 among the segmentation graph's first eigenvalues).
SHIFT = 1e-6
# Restarts of the plain Lanczos on the CPU before a crowded spectrum goes to
# shift-invert.  A narrow Gaussian width leaves the graph nearly disconnected,
# with many of M's eigenvalues within rounding of 1: spectral clustering of 2,000
# points with sigma half the 15th-neighbour distance failed after ARPACK's default
# 20,000 restarts (17 s) and took 0.04 s by shift-invert.  Graphs that converge
# needed 40-160 restarts (Fashion-MNIST 20k on 20 neighbours, digits), 1,280
# with the width a quarter of the 20th-neighbour distance (8.6 s).  At that width
# on Fashion-MNIST 70k (d = 10) the plain Lanczos converged only after 954 s; with
# the cap, 58 s of it and 107 s of shift-invert (1.5 GB at most) give the vectors.
LANCZOS_MAXITER = 1000


def positive_degrees(xp, W):
    """W's row sums, each checked positive: a point without any affinity has no
    place in the normalized problem, exactly or by landmarks (LLL's reduced
    matrices had turned such rows into an embedding 1e50 across)."""
    degree = xp.asarray(W.sum(axis=1)).ravel()
    isolated = xp.flatnonzero(degree <= 0)
    if isolated.size:
        raise ValueError(f"W has {int(isolated.size)} row(s) without any affinity (isolated "
                         f"points; the first is row {int(isolated[0])}): with a Gaussian "
                         "sigma their neighbours' weights exp(-d^2 / (2 sigma^2)) underflow, "
                         "and a larger sigma, or perplexity=, gives every point some")
    return degree


def spectral_embedding(W, n_components, *, backend="auto", random_state=0, drop_first=True,
                       shift_invert=False):
    """Coordinates from the normalized Laplacian of a symmetric affinity matrix.

    Solves L u = lambda D u (L = D - W) for the ``n_components`` smallest
    eigenvalues after the trivial one (all of them from the first if not
    ``drop_first``, as Ng-Jordan-Weiss clustering wants) through the equivalent
    largest eigenvectors of D^-1/2 W D^-1/2, and returns D^-1/2 times them,
    shape (N, n_components).
    A disconnected graph has several zero eigenvalues; the coordinates then
    separate components instead of spreading within them.  The eigensolver runs on
    ``backend`` from a start vector drawn by ``random_state``.

    ``shift_invert=True`` (CPU only): Lanczos on ((1 + SHIFT) I - M)^-1 through
    one sparse Cholesky factor (optim.directions.factorize_cpu) instead of on M.
    On graphs of low-dimensional points M's leading eigenvalues crowd near 1 and
    the plain Lanczos crawls: the 30,602-pixel segmentation graph took 2.14 s,
    against 0.42 s this way (same vectors to 1e-11).  The CPU also switches to
    it when the plain Lanczos has not converged after LANCZOS_MAXITER restarts.
    """
    be = get_backend(backend)
    xp = be.xp
    W = be.sparse.csr_matrix(W)
    n = W.shape[0]
    if W.shape != (n, n):
        raise ValueError(f"W must be square, got shape {W.shape}")
    n_components = check_int(n_components, "n_components", 1, n - 2)
    check_bool(drop_first, "drop_first")
    check_bool(shift_invert, "shift_invert")
    degree = positive_degrees(xp, W)
    d_isqrt = 1.0 / xp.sqrt(degree)
    skip = 1 if drop_first else 0
    k = n_components + skip
    n_comp, labels = connected_components(be, W)
    if k <= n_comp:                    # all of eigenvalue 1: known without a solver
        vecs = _component_basis(xp, degree, be.asarray(labels), k)
    else:
        # Largest eigenvalues of M = smallest of the normalized Laplacian I - M.
        scale = be.sparse.diags(d_isqrt)
        M = scale @ W @ scale
        v0 = be.asarray(make_rng(random_state).random(n), dtype=M.dtype)
        if n_comp == 1:
            vecs = _largest(be, M, k, v0, shift_invert)
        else:                          # those and the rest, with the known ones deflated
            host = get_backend("cpu")  # on the host: cupyx's eigsh is not given an operator
            known = _component_basis(np, be.to_host(degree), be.to_host(labels), n_comp)
            rest = _largest(host, be.to_host(M), k - n_comp, be.to_host(v0), shift_invert,
                            known)
            vecs = be.asarray(np.concatenate([known, rest], axis=1))
    vecs = vecs[:, skip:]              # drop the trivial eigenvector D^1/2 1
    Y = vecs * d_isqrt[:, None]
    # Fix each eigenvector's sign so that the result is reproducible.
    signs = xp.sign(Y[xp.argmax(xp.abs(Y), axis=0), xp.arange(n_components)])
    return Y * signs


def _largest(be, M, k, v0, shift_invert, known=None):
    """The k eigenvectors of the largest eigenvalues of the symmetric sparse M,
    in their order; on the CPU, orthogonal to the orthonormal eigenvectors
    ``known`` of eigenvalue 1 (M's largest), which the solver's operator moves to
    the bottom of its spectrum (the Lanczos then need not find the copies of a
    multiple eigenvalue: on M itself it returned bases 0.49-0.97 off in
    Procrustes error on graphs of 3-5 separated clusters)."""
    if be.is_gpu:
        vals, vecs = be.sparse_linalg.eigsh(M, k=k, which="LA", v0=v0)
    elif shift_invert:
        vals, vecs = _shift_invert_eigsh(M, k, v0, known)
    else:
        try:
            vals, vecs = scipy.sparse.linalg.eigsh(_deflated(M, known, 2.0), k=k, which="LA",
                                                   v0=v0, maxiter=LANCZOS_MAXITER)
        except scipy.sparse.linalg.ArpackNoConvergence:
            vals, vecs = _shift_invert_eigsh(M, k, v0, known)
    return vecs[:, be.xp.argsort(-vals)]


def _deflated(A, known, drop):
    """A - drop known known^T as an operator (A where ``known`` is None)."""
    if known is None:
        return A
    return scipy.sparse.linalg.LinearOperator(
        A.shape, matvec=lambda x: A @ x - drop * (known @ (known.T @ x)), dtype=np.float64)


def _component_basis(xp, degree, labels, m):
    """m orthonormal eigenvectors (N, m) of M of eigenvalue 1 on a graph of at
    least m components (``labels``, numbered by their first points), whose
    indicators times D^1/2 span them all.  Lanczos from one start vector finds a
    multiple eigenvalue's vectors only through rounding: on 5 separated clusters
    (a 15-NN graph of 5 components) ARPACK returned 4 of them and a mixture, and
    k-means split a cluster (ARI 0.82).  The first column is the trivial D^1/2 1
    (normalized), the others Gram-Schmidt's from the first m - 1 components.
    Where more vectors are wanted than there are components, the host's solver
    finds the rest with these deflated (_largest; on the host for the GPU too): in
    tests/test_lll.py's model selection at sigma 2 (3 components, 5 vectors)
    ARPACK on M had returned two of the three and a vector beyond the wanted
    ones, clustering better by that accident.

    Each vector is D^1/2 times a value per component (:func:`component_values`)."""
    volume = xp.bincount(labels, weights=degree, minlength=int(labels.max()) + 1)
    return xp.sqrt(degree)[:, None] * component_values(xp, volume, m)[labels]


def component_values(xp, volume, m):
    """(c, m) values, one row per component, of m vectors constant on each of c
    components of these volumes (their sums of degrees) and orthonormal in the
    degree's inner product: the trivial all-ones vector normalized first, then
    Gram-Schmidt's from the first m - 1 components.  From a QR of the c x m
    volumes, not of the N x m vectors, whose rounding divided by a tiny degree's
    root (1e-31 in a test) scattered a component's coordinates."""
    volume_root = xp.sqrt(volume)
    # Column 0: the trivial vector's values (all ones); column j: component j - 1's.
    parts = xp.zeros((len(volume), m), dtype=volume.dtype)
    parts[:, 0] = 1.0
    parts[xp.arange(m - 1), xp.arange(1, m)] = 1.0
    Q = xp.linalg.qr(volume_root[:, None] * parts)[0]
    return Q / volume_root[:, None]


def points_suit_shift_invert(X):
    """Whether the graph of the points X (None: unknown) is solved by shift-invert."""
    return X is not None and X.shape[1] <= SHIFT_INVERT_MAX_DIM


def _shift_invert_eigsh(M, k, v0, known=None):
    """The k largest eigenpairs of the symmetric sparse M (host), from the
    largest of ((1 + SHIFT) I - M)^-1, whose eigenvalues 1 / (1 + SHIFT - lambda)
    spread M's crowded leading ones apart; orthogonal to ``known`` (as in
    :func:`_largest`)."""
    from ..optim.directions import factorize_cpu

    n = M.shape[0]
    solve = factorize_cpu(((1.0 + SHIFT) * scipy.sparse.identity(n, format="csr") - M).tocsr())
    op = scipy.sparse.linalg.LinearOperator(
        (n, n), matvec=lambda x: solve(x.reshape(n, 1))[:, 0], dtype=np.float64)
    try:
        mu, vecs = scipy.sparse.linalg.eigsh(_deflated(op, known, 2.0 / SHIFT), k=k,
                                             which="LA", v0=v0, maxiter=LANCZOS_MAXITER)
    except scipy.sparse.linalg.ArpackNoConvergence:
        raise ValueError(
            "the eigensolver did not converge: the affinity graph is numerically "
            "disconnected (its weights between groups vanish against those within), "
            "so the wanted eigenvectors are not determined; a wider sigma or more "
            "neighbours connect it") from None
    return 1.0 + SHIFT - 1.0 / mu, vecs
