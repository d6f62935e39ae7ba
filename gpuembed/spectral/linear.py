"""LLL for linear and kernel spectral problems (dissertation 4.6.2-4.6.4): PCA, LDA and
kernel PCA restricted to X = Z X_L, with reduced L x L matrices that never form an
N x N product.  Also the landmark baselines of section 4.8: LE(Z) and Nystrom.
Each LLL function takes ``n_landmarks`` (and kz, landmarks, random_state) to build
its Z, or a ``basis`` made once by ``landmark_basis`` and shared (section 4.5)."""
from __future__ import annotations

import numpy as np

from .._checks import check_data, check_float, check_int, check_labels
from .._params import fill_doc
from ..backend import get_backend
from ..nbody.exact import centred, squared_distances
from .embedding import points_suit_shift_invert, spectral_embedding
from .laplacian import affinity_graph
from .lll import _choose_landmarks, default_kz, dense_generalized_eigh, reconstruction_weights


# The parameters the functions share (filled in by fill_doc).
_LANDMARK_PARAMETERS = """
Y : (N, D) array, the data (copied to the host).
n_components : the output dimension d.
n_landmarks : L, required unless ``basis`` is given.
kz : landmarks each point is reconstructed from (default d + 1; LE(Z): min(d + 1, 6)).
landmarks : "random", "random-pruned" or "kmeans" (:func:`choose_landmarks`).
random_state : seed of the landmarks.
backend : where Z's k-NN search (and kernel PCA's kernel blocks) run.
basis : a :func:`landmark_basis` of Y made before, used instead of n_landmarks,
    kz, landmarks and random_state.
"""
_DOCUMENTED = fill_doc(landmark_parameters=_LANDMARK_PARAMETERS)


def _landmark_setup(Y, n_landmarks, kz, landmarks, random_state, d, backend, basis,
                    laplacian=False, validate=None):
    """(Y on the host, landmark indices, Z); Z's k-NN search runs on ``backend``.
    Default kz: d + 1 (the dissertation's K_Z = K + 1 for the linear methods), or
    LLL's for Laplacian eigenmaps (``laplacian``: :func:`default_kz`).  ``basis``:
    a :func:`~gpuembed.spectral.lll.landmark_basis` of Y made before, whose
    landmarks and Z are used instead (section 4.5's algorithm selection: one Z
    for every method compared).  ``validate(Y)``: the caller's checks that need
    the data, run before the landmarks and Z."""
    Y = np.asarray(check_data(Y, get_backend("cpu"), name="Y", min_samples=3))
    if validate is not None:
        validate(Y)
    n = Y.shape[0]
    if basis is not None:
        idx, Z, _ = basis
        if Z.shape[0] != n:
            raise ValueError(f"basis was made for {Z.shape[0]} points, but Y has {n}")
        check_int(d, "n_components", 1, Z.shape[1] - 1)
        return Y, idx, Z
    if n_landmarks is None:
        raise ValueError("n_landmarks is required unless a basis is given")
    L = check_int(n_landmarks, "n_landmarks", d + 1, n)
    if kz is None:
        kz = default_kz(d) if laplacian else d + 1
    kz = check_int(kz, "kz", 1, L)
    idx = _choose_landmarks(Y, L, landmarks, random_state)
    return Y, idx, reconstruction_weights(Y, Y[idx], kz, backend=backend)


def _leading_generalized(A, B, d):
    """d leading eigenvectors of A u = lambda B u (dense, small), largest first."""
    ridge = 1e-12 * np.trace(B) / len(B)
    vals, vecs = dense_generalized_eigh(A, B, ridge, [len(A) - d, len(A) - 1])
    return vals[::-1], vecs[:, ::-1]


@_DOCUMENTED
def pca_lll(Y, n_components, *, n_landmarks=None, kz=None, landmarks="random",
            random_state=None, backend="auto", basis=None):
    """PCA by LLL: A~ = (Z^T Yc)(Z^T Yc)^T, B~ = Z^T Z, maximized (cost O(N kz D + L^2 D)).
    Returns the (N, d) projection, scaled like the unit-norm eigenvectors of Yc Yc^T.

    Parameters
    ----------
    {landmark_parameters}
    """
    d = check_int(n_components, "n_components", 1)
    # A~ has rank at most D: further "components" would be a null space's basis.
    Y, _, Z = _landmark_setup(Y, n_landmarks, kz, landmarks, random_state, d, backend,
                              basis, validate=lambda Y: check_int(d, "n_components", 1,
                                                                  Y.shape[1]))
    M = Z.T @ (Y - Y.mean(axis=0))                      # (L, D)
    _, U = _leading_generalized(M @ M.T, (Z.T @ Z).toarray(), d)
    return Z @ U


@_DOCUMENTED
def lda_lll(Y, labels, n_components, *, n_landmarks=None, kz=None, landmarks="random",
            random_state=None, backend="auto", basis=None):
    """LDA by LLL through the kernel form (eqs 4.16-4.17): with M = Z^T Yc,
    A~ = M S_b M^T and B~ = M S_t M^T, S_b and S_t the between-class and total
    scatter (D x D), maximized over the range of M.  Returns the (N, d) projection
    Yc m of the data on the discriminant directions m = Yc^T Z p~.

    Parameters
    ----------
    {landmark_parameters}
    labels : (N,) the classes (d at most their number - 1).
    """
    d = check_int(n_components, "n_components", 1)
    labels = check_labels(labels)
    classes, codes = np.unique(labels, return_inverse=True)

    def validate(Y):
        if labels.shape[0] != Y.shape[0]:
            raise ValueError(f"labels must have one entry per row of Y, got {labels.shape[0]}")
        if d > len(classes) - 1:
            raise ValueError(f"n_components must be at most n_classes - 1 = {len(classes) - 1}")
    Y, _, Z = _landmark_setup(Y, n_landmarks, kz, landmarks, random_state, d, backend,
                              basis, validate=validate)
    Yc = Y - Y.mean(axis=0, dtype=np.float64)      # float32 rows' own sum drifts (column_means)
    counts = np.bincount(codes)
    means = np.stack([Yc[codes == c].mean(axis=0) for c in range(len(classes))])
    S_b = (means * counts[:, None]).T @ means
    S_t = Yc.T @ Yc
    M = Z.T @ Yc
    # A~ and B~ share the null space of M^T (landmark combinations with no feature
    # content, dimension L - rank(M) when L > D): solve in the range of M, where B~ > 0.
    Us, S, _ = np.linalg.svd(M, full_matrices=False)
    V = Us[:, S > 1e-10 * S.max()]
    MV = V.T @ M
    _, U = _leading_generalized(MV @ S_b @ MV.T, MV @ S_t @ MV.T, d)
    # The variable is the kernel coefficient vector p = Z p~; the projection is the
    # linear map m = Yc^T p applied to the data: X = Yc m = Yc M^T p~.
    return Yc @ (M.T @ (V @ U))


@_DOCUMENTED
def kernel_pca_lll(Y, n_components, *, sigma, n_landmarks=None, kz=None, landmarks="random",
                   random_state=None, block=2048, backend="auto", basis=None):
    """Gaussian kernel PCA by LLL: A~ = Z^T Kc Z with Kc the centred kernel matrix,
    B~ = Z^T Z; K Z is accumulated in blocks of ``block`` rows on ``backend``, so no
    N x N matrix is stored: each block's kernel, K's columns for those rows (K is
    symmetric), times the sparse Z^T.  With Z dense, the products cost N^2 L: on
    Fashion-MNIST 10k with 2,000 landmarks 8.4 s in all, against 3.3 s now (the
    kernel's N^2 D distances are the rest).

    Parameters
    ----------
    {landmark_parameters}
    sigma : the Gaussian kernel's width, exp(-|y - y'|^2 / (2 sigma^2)).
    block : rows of the kernel per block.
    """
    d = check_int(n_components, "n_components", 1)
    sigma = check_float(sigma, "sigma", 0.0, low_open=True)
    block = check_int(block, "block", 1)
    Y, _, Z = _landmark_setup(Y, n_landmarks, kz, landmarks, random_state, d, backend,
                              basis)
    be = get_backend(backend)
    xp = be.xp
    n = Y.shape[0]
    Y_dev = be.asarray(centred(np, Y))
    ZT = Z.T.tocsr()                                    # float64, as K Z is summed
    ZT = be.sparse.csr_matrix(ZT) if be.is_gpu else ZT
    KZ = xp.empty((n, Z.shape[1]))
    for start in range(0, n, block):
        K = squared_distances(xp, Y_dev, Y_dev[start:start + block])   # K's columns, in place
        K *= -1.0 / (2 * sigma ** 2)
        xp.exp(K, out=K)
        KZ[start:start + block] = (ZT @ K.astype(ZT.dtype, copy=False)).T
    KZ = be.to_host(KZ)
    # Kc = K - 1K - K1 + 1K1 with 1 = ones / N:  Z^T Kc Z from K Z and column sums.
    col = KZ.sum(axis=0) / n                            # 1^T K Z / N
    z = np.asarray(Z.sum(axis=0)).ravel()               # Z^T 1
    total = col.sum() / n                               # 1^T K 1 / N^2
    A = Z.T @ KZ - np.outer(z, col) - np.outer(col, z) + total * np.outer(z, z)
    _, U = _leading_generalized(A, (Z.T @ Z).toarray(), d)
    return Z @ U


@_DOCUMENTED
def le_landmarks_only(Y, n_components, *, n_neighbors, n_landmarks=None, kz=None, sigma=None,
                      landmarks="random", random_state=None, backend="auto", basis=None):
    """Baseline "LE(Z)": Laplacian eigenmaps of the landmarks alone (their own k-NN
    graph), then every point projected with Z.

    Parameters
    ----------
    {landmark_parameters}
    n_neighbors, sigma : the landmarks' graph, as in :func:`affinity_graph`.
    """
    d = check_int(n_components, "n_components", 1)
    Y, idx, Z = _landmark_setup(Y, n_landmarks, kz, landmarks, random_state, d, backend,
                                basis, laplacian=True)
    be = get_backend(backend)
    W = affinity_graph(Y[idx], min(n_neighbors, len(idx) - 1), sigma, backend=be)
    return Z @ be.to_host(spectral_embedding(W, d, backend=be,
                                             shift_invert=points_suit_shift_invert(Y)))


def nystrom_le(Y, n_components, *, n_landmarks, sigma, landmarks="random",
               random_state=None, backend="auto"):
    """Baseline: Nystrom extension of Laplacian eigenmaps from landmarks.

    Of the full Gaussian kernel (no k-NN graph: a sparse one among a few
    landmarks leaves them in pieces, dissertation section 4.8).  The normalized
    Gaussian affinities M = D^-1/2 W D^-1/2 restricted to the landmarks give
    eigenvectors U (leading, the trivial one dropped); every point
    is extended by u(y) = M(y, landmarks) U / lambda, with the degrees estimated
    from the N x L cross-affinities (Fowlkes et al.'s one-shot variant), on
    ``backend`` in Y's dtype.  Returns a host array.

    Y, n_components, n_landmarks, landmarks, random_state: as in :func:`pca_lll`;
    sigma: the kernel's width, exp(-|y - y'|^2 / (2 sigma^2))."""
    d = check_int(n_components, "n_components", 1)
    sigma = check_float(sigma, "sigma", 0.0, low_open=True)
    be = get_backend(backend)
    xp = be.xp
    Y = check_data(Y, be, name="Y", min_samples=3)
    n = Y.shape[0]
    L = check_int(n_landmarks, "n_landmarks", d + 2, n)
    idx = _choose_landmarks(be.to_host(Y), L, landmarks, random_state)
    idx_dev = be.asarray(idx)
    # (N, L) in place: at Fashion-MNIST 70k and 2,000 landmarks each N x L temporary
    # cost about a second, and the three here and two below took 9.1 s in all.
    Yc = centred(xp, Y)
    C = squared_distances(xp, Yc, Yc[idx_dev])
    C *= -1.0 / (2 * sigma ** 2)
    xp.exp(C, out=C)
    C[idx_dev, xp.arange(L)] = 0.0                                           # no self affinity
    W_ll = C[idx_dev]
    # Degrees of all points, approximated through the landmarks (scaled to N points).
    degree = C.sum(axis=1) * (n / L)
    scale = 1.0 / xp.sqrt(xp.maximum(degree, 1e-300))
    M_ll = scale[idx_dev, None] * W_ll * scale[None, idx_dev]
    vals, U = xp.linalg.eigh((M_ll + M_ll.T) / 2)
    vals, U = vals[::-1][1:d + 1], U[:, ::-1][:, 1:d + 1]
    extended = C @ (scale[idx_dev, None] * U / vals)
    return be.to_host(extended * (scale * scale)[:, None])
