"""Laplacian eigenmaps and spectral clustering, exact or with Locally Linear Landmarks
(dissertation sections 4.6.1 and 4.7).

Both solve min tr(X L X^T) s.t. X D X^T = I, X D 1 = 0 (eqs 4.9, 4.19) on a
k-NN affinity graph W (Gaussian with a given sigma, or entropic affinities of
perplexity n_neighbors / 3, symmetrized).  Exactly (n_landmarks=None) through a
sparse eigensolver, or with LLL through the L x L reduced problem.  A graph
with c connected components has c zero eigenvalues: the trailing
eigenvectors then indicate components (constant on each) instead of spreading
points within them, which is what spectral clustering wants and what a
visualization of disconnected data shows as separate tight groups.
"""
from __future__ import annotations

import itertools

import numpy as np
import scipy.sparse

from .._checks import (check_choice, check_data, check_features, check_fitted, check_float,
                       check_int, check_random_state)
from .._params import FeatureNamesIn, Params, TransformerOutput, fill_doc
from ..affinities import entropic_affinities
from ..affinities.entropic import checked_neighbors
from ..backend import get_backend
from ..neighbors import METRICS, is_graph, metric_rows, search_metric
from ..neighbors_ivf import SEARCHES, QuerySearch
from ..optim.directions import connected_components
from .embedding import points_suit_shift_invert, positive_degrees, spectral_embedding
from .kmeans import kmeans, nearest_centers
from .lll import (LANDMARK_METHODS, Z_NEIGHBORS, _landmark_basis, default_kz,
                  graph_landmark_neighbours, laplacian_reduced, reconstruction_weights,
                  smoothed_embedding, trailing_generalized)

GRID_PARAMETERS = ("n_neighbors", "sigma", "perplexity")   # what fit_grid may vary

# The numpydoc sections both estimators share (filled in by fill_doc).
_GRAPH_PARAMETERS = """
n_neighbors : int
    Neighbours of each point in the k-NN affinity graph (2 to N - 1).
sigma : float or None
    Width of Gaussian affinities exp(-|x_n - x_m|^2 / (2 sigma^2)) on the graph;
    None: entropic affinities instead (give at most one of sigma and perplexity).
perplexity : float or None
    The entropic affinities' perplexity (None: n_neighbors / 3).
neighbors : {"auto", "exact", "approx"}, default "auto"
    The graph's k-NN search ("auto": approximate from 50,000 points on the CPU),
    as in :func:`gpuembed.entropic_affinities`.
metric : {"euclidean", "cosine", "precomputed"}, default "euclidean"
    "cosine": the rows (and new points' rows) scaled to unit length first, so
    the graph, sigma and the reconstruction weights are those of unit rows;
    "precomputed": X an (N, N) distance matrix and new points' rows their
    distances to the training points, whose reconstruction weights come from
    distances alone (exact only: no landmarks); or X a sparse k-NN graph of
    distances, each row's stored entries (fit only: the weights need the
    distances between a new point's neighbours).
n_landmarks : int or None
    None: the exact eigenproblem; L: Locally Linear Landmarks (Algorithm 3) with
    L landmarks, solving an L x L reduced problem.
kz : int or None
    LLL: landmarks each point is reconstructed from (None: min(d + 1, 6)).
landmarks : {"random", "random-pruned", "kmeans", "spread"}, default "random"
    LLL: how the landmarks are chosen (:func:`gpuembed.spectral.choose_landmarks`;
    "spread": at random, none among another's nearest neighbours on the affinity
    graph, which lowers the error of few landmarks).
z_neighbors : {"input", "graph"}, default "input"
    LLL: each point's kz landmarks are its nearest in the input space
    ("input", the dissertation's), or those closest to it along the affinity
    graph, by paths of at most 2 edges scored by their affinities' product, 3
    where fewer lie that close ("graph", dense X; a new point takes those of its
    nearest training point), which keeps them along the manifold: on
    Fashion-MNIST 70k less error at every number of landmarks, and at d = 10
    less time too (at 2,000 random landmarks: 0.095 against 0.127, in 0.55 s
    against 3.6 s); on an image's pixels (3 features) no gain.
refine : int, default 0
    LLL: steps of the random walk D^-1 W over the whole affinity graph applied to
    the embedding, each followed by the Rayleigh-Ritz vectors of the full
    problem in their span (:func:`gpuembed.spectral.lll.smoothed_embedding`): 0
    is Algorithm 3; 1 costs 2 sparse products with the graph and on
    Fashion-MNIST 70k about halves the error against exact LE, so that fewer
    landmarks and a smaller kz reach an error.  New points then map as exact
    LE's do, from their nearest training points' rows of the embedding.
random_state : None, int, numpy Generator or RandomState
    Seeds the landmarks, the eigensolver's start and k-means.
backend : {"auto", "cpu", "gpu"}, default "auto"
"""
_LANDMARK_ATTRIBUTES = """
landmarks_ : (L,) int array or None
    Indices of the landmarks (None when exact).
Z_ : (N, L) sparse matrix or None
    The points' reconstruction weights from the landmarks.
landmark_embedding_ : (L, d) array, d the embedding's dimension
    LLL: the landmarks' embedding (embedding_ = Z_ @ landmark_embedding_; with
    ``refine``, the landmarks' rows of embedding_).
n_features_in_ : int
"""
_DOCUMENTED = fill_doc(graph_parameters=_GRAPH_PARAMETERS,
                       landmark_attributes=_LANDMARK_ATTRIBUTES)


def affinity_graph(X, n_neighbors, sigma=None, perplexity=None, *, neighbors=None,
                   metric="euclidean", backend="auto"):
    """Symmetric sparse affinities on the k-NN graph, as a host scipy CSR (float64):
    Gaussian of width ``sigma``, or entropic of ``perplexity`` (default
    n_neighbors / 3) where sigma is None.
    The neighbour search (and the entropic calibration) runs on ``backend`` in X's
    dtype (integers: the backend's default float).  ``neighbors``: X's k-NN
    ``(sqdist, indices)`` for some k >= n_neighbors, of which the first
    n_neighbors columns are used (a sweep over n_neighbors searches once), or the
    search that finds them: "auto" (None), "exact" or "approx" (as in
    :func:`gpuembed.entropic_affinities`), with ``metric`` as there."""
    be = get_backend(backend)
    X = check_data(X, be, sparse=True)
    n = X.shape[0]
    k, sigma, K = _graph_parameters(n, n_neighbors, sigma, perplexity)
    given = not (neighbors is None or isinstance(neighbors, str))
    if not given:
        sqdist, idx = SEARCHES[check_choice(neighbors or "auto", "neighbors", tuple(SEARCHES))](
            X, k, metric=metric, backend=be)
    elif neighbors[0].shape[0] != n or neighbors[0].shape[1] < k:
        raise ValueError(f"neighbors must hold at least n_neighbors = {k} columns for each "
                         f"of the {n} points, got shape {neighbors[0].shape}")
    else:
        sqdist, idx = (a[:, :k] for a in neighbors)
    if sigma is None:                       # entropic_affinities checks given lists
        W = be.to_host(entropic_affinities(None, max(K, 1.01), neighbors=(sqdist, idx),
                                           symmetrize=False, backend=be).P
                       ).astype(np.float64, copy=False)
    else:
        if given:                           # as entropic_affinities checks them
            sqdist, idx = checked_neighbors((sqdist, idx), be)
        sqdist, idx = be.to_host(sqdist), be.to_host(idx)
        values = np.exp(-sqdist.astype(np.float64, copy=False) / (2 * sigma ** 2))
        W = scipy.sparse.csr_matrix((values.ravel(), (np.repeat(np.arange(n), k), idx.ravel())),
                                    shape=(n, n))
    return ((W + W.T) / 2).tocsr()


def _graph_parameters(n, n_neighbors, sigma, perplexity):
    """(k, sigma, K) checked, before any search: K the entropic perplexity (default
    k / 3) where sigma is None."""
    k = check_int(n_neighbors, "n_neighbors", 2, n - 1)
    if sigma is not None and perplexity is not None:
        raise ValueError("give sigma (Gaussian width) or perplexity (entropic affinities), "
                         "not both")
    if sigma is not None:
        return k, check_float(sigma, "sigma", 0.0, low_open=True), None
    K = k / 3.0 if perplexity is None else check_float(perplexity, "perplexity", 1.0,
                                                        low_open=True)
    return k, None, K


def lll_spectral(X, W, d, n_landmarks, kz=None, landmarks="random", random_state=None,
                 drop_first=True, backend="auto", basis=None, z_neighbors="input", refine=0):
    """Algorithm 3 for eq. 4.9 on affinities W: returns the embedding (N, d), the
    landmark indices, Z (N, L), the landmarks' embedding (L, d) and kz used.  The
    landmarks' k-NN runs on ``backend``, the rest on the host.  ``basis``: a
    :func:`landmark_basis` of X computed before (its parameters then unused);
    ``z_neighbors``, ``refine``: see the estimators' parameters (with ``refine``
    the embedding is no longer Z times the landmarks' one)."""
    check_choice(z_neighbors, "z_neighbors", Z_NEIGHBORS)
    refine = check_int(refine, "refine", 0)
    degree = positive_degrees(np, W)
    idx, Z, kz = basis or _landmark_basis(X, d, n_landmarks, kz, landmarks, random_state,
                                          backend, W, z_neighbors)
    A_r, B_r = laplacian_reduced(Z, W, degree)
    # A landmark that reconstructs no point (a copy of a duplicated point that took
    # another copy) has a zero row and column: an eigenvalue 0 of no data, whose
    # vectors took the place of the embedding's.  It takes its point's coordinates.
    used = B_r.diagonal() > 0
    skip, n_used = int(drop_first), int(used.sum())
    if n_used < d + skip:
        # Fewer distinct landmarks than vectors: LAPACK's message named none of ours.
        raise ValueError(
            f"n_landmarks: {n_used} of the {len(idx)} landmarks reconstruct any point "
            f"(the others copy them: the data repeat points), fewer than the {d + skip} "
            "eigenvectors wanted; give data with more distinct points, "
            "z_neighbors='graph', or exact LE (n_landmarks=None)")
    if not used.all():
        A_r, B_r = (M[used][:, used] for M in (A_r, B_r))
    # skip: the constant solution; a split graph's components in exact LE's order
    components = lambda: connected_components(get_backend("cpu"), W)[1][idx[used]]
    vals, U_used = trailing_generalized(A_r, B_r, d, skip=skip,
                                        sparse_factor=points_suit_shift_invert(X),
                                        data_components=components, loose=refine > 0)
    U = np.zeros((len(idx), d))
    U[used] = U_used
    Y = Z @ U
    U[~used] = Y[idx[~used]]
    # The components' indicators come first, their eigenvalues set to exactly 0.
    known = int(np.argmax(vals != 0)) if (vals != 0).any() else len(vals)
    return smoothed_embedding(W, degree, Y, refine, known), idx, Z, U, kz


class _SpectralBase(FeatureNamesIn, Params):
    def __init__(self, *, n_neighbors, sigma, perplexity, neighbors, metric, n_landmarks, kz,
                 landmarks, z_neighbors, refine, random_state, backend):
        self.n_neighbors = n_neighbors
        self.neighbors = neighbors
        self.metric = metric
        self.sigma = sigma
        self.perplexity = perplexity
        self.n_landmarks = n_landmarks
        self.kz = kz
        self.landmarks = landmarks
        self.z_neighbors = z_neighbors
        self.refine = refine
        self.random_state = random_state
        self.backend = backend

    def _data(self, X):
        """(backend, X on the host), X checked before the parameters that depend on N."""
        check_choice(self.landmarks, "landmarks", LANDMARK_METHODS)
        check_choice(self.neighbors, "neighbors", tuple(SEARCHES))
        check_choice(self.metric, "metric", METRICS)
        check_choice(self.z_neighbors, "z_neighbors", Z_NEIGHBORS)
        check_int(self.refine, "refine", 0)
        check_random_state(self.random_state)
        be = get_backend(self.backend)
        X = be.to_host(metric_rows(be, check_data(X, be, min_samples=3, sparse=True),
                                   self.metric))
        if self.metric == "precomputed" and self.n_landmarks is not None:
            raise ValueError("metric='precomputed' embeds exactly (n_landmarks=None): the "
                             "landmarks' choice and reconstruction need the points' coordinates")
        if self._graph_z() and scipy.sparse.issparse(X):
            raise ValueError("z_neighbors='graph' computes distances between dense rows; X "
                             "is sparse: take z_neighbors='input'")
        return be, X

    def _graph_z(self):
        return self.n_landmarks is not None and self.z_neighbors == "graph"

    def _basis_of_graph(self):
        """Whether the landmark basis depends on the affinity graph."""
        return self._graph_z() or self.landmarks == "spread"

    def _embed(self, be, X, d, drop_first=True, shared=None):
        """Embedding (N, d) exactly or by LLL; records landmarks_, Z_, landmark_embedding_.
        ``drop_first=False`` keeps the trivial solution (Ng-Jordan-Weiss clustering).
        ``shared``: (neighbors, basis) of :func:`fit_grid`'s sweep."""
        neighbors, basis = shared or (None, None)
        W = affinity_graph(X, self.n_neighbors, self.sigma, self.perplexity,
                           neighbors=neighbors or self.neighbors,
                           metric=search_metric(self.metric), backend=be)
        self._X = X
        self._queries = QuerySearch(X, self.neighbors, be, self.metric)
        self._graph = W if self._graph_z() else None     # for transform's landmarks
        self.n_features_in_ = X.shape[1]
        if self.n_landmarks is None:
            self.landmarks_ = self.Z_ = None
            return be.to_host(spectral_embedding(
                W, d, backend=be, drop_first=drop_first, random_state=self.random_state or 0,
                shift_invert=points_suit_shift_invert(X)))
        Y, self.landmarks_, self.Z_, self.landmark_embedding_, self._kz = lll_spectral(
            X, W, d, self.n_landmarks, self.kz, self.landmarks, self.random_state, drop_first, be,
            basis, self.z_neighbors, self.refine)
        self._refined = self.refine > 0     # transform then maps as exact LE's
        if self._refined:
            self.landmark_embedding_ = Y[self.landmarks_]
        return Y

    def fit(self, X, y=None):
        return self._fit(*self._data(X))

    def _shared(self, be, X, d, k):
        """What a sweep over the affinity parameters shares: X's k-NN and, with
        landmarks, the landmark basis (not one that depends on the graph, which
        each graph makes: z_neighbors="graph", landmarks="spread")."""
        basis = None if self.n_landmarks is None or self._basis_of_graph() else _landmark_basis(
            X, d, self.n_landmarks, self.kz, self.landmarks, self.random_state, be)
        return SEARCHES[self.neighbors](X, k, metric=search_metric(self.metric), backend=be), basis

    def _map(self, X_new, embedding, method="transform"):
        """Out-of-sample: locally linear reconstruction from landmarks (LLL) or from
        the nearest training points (exact, and LLL with ``refine``), applied to
        their embedding."""
        check_fitted(self, hasattr(self, "_X"), method)
        if is_graph(self._X, self.metric):
            raise ValueError(f"{method} with metric='precomputed' needs the training points' "
                             "full distance matrix (a new point's weights solve Gram systems "
                             "of the distances between its nearest training points), and X "
                             "was a sparse k-NN graph: fit the dense (N, N) matrix to map "
                             "new points")
        cpu = get_backend("cpu")
        X_new = check_data(X_new, cpu, name="X_new", min_samples=1, sparse=True)
        check_features(X_new, self)
        X_new = metric_rows(cpu, X_new, self.metric, "X_new", square=False)
        if self.landmarks_ is None or self._refined:
            kz = default_kz(embedding.shape[1])
            return reconstruction_weights(X_new, self._X, kz, backend=self.backend,
                                          search=self._queries,
                                          metric=search_metric(self.metric)) @ embedding
        search = None
        if self._graph is not None:        # from each new point's nearest training point
            def search(Y, k):
                nearest = get_backend(self.backend).to_host(self._queries(Y, 1)[1])[:, 0]
                return graph_landmark_neighbours(Y, nearest, self._X, self.landmarks_,
                                                 self._graph, k, backend=self.backend)
        return reconstruction_weights(X_new, self._X[self.landmarks_], self._kz,
                                      backend=self.backend, search=search
                                      ) @ self.landmark_embedding_


@_DOCUMENTED
class LaplacianEigenmaps(TransformerOutput, _SpectralBase):
    """Laplacian eigenmaps (eq. 4.9), exactly or with Locally Linear Landmarks.

    Parameters
    ----------
    n_components : int, default 2
        Dimension of the embedding: the trailing generalized eigenvectors after
        the constant one.
    {graph_parameters}

    Attributes
    ----------
    embedding_ : (N, n_components) numpy array
    {landmark_attributes}
    """

    def __init__(self, n_components=2, *, n_neighbors, sigma=None, perplexity=None,
                 neighbors="auto", metric="euclidean", n_landmarks=None, kz=None,
                 landmarks="random", z_neighbors="input", refine=0, random_state=None,
                 backend="auto"):
        super().__init__(n_neighbors=n_neighbors, sigma=sigma, perplexity=perplexity,
                         neighbors=neighbors, metric=metric, n_landmarks=n_landmarks, kz=kz,
                         landmarks=landmarks, z_neighbors=z_neighbors, refine=refine,
                         random_state=random_state, backend=backend)
        self.n_components = n_components

    def _dimension(self, X):
        return check_int(self.n_components, "n_components", 1, X.shape[0] - 2)

    def _fit(self, be, X, shared=None):
        self.embedding_ = self._embed(be, X, self._dimension(X), shared=shared)
        return self

    def fit_transform(self, X, y=None):
        """Fit to ``X`` and return ``embedding_``."""
        return self.fit(X).embedding_

    def transform(self, X_new):
        """The embedding of new points ``X_new`` (M, D): each one's locally linear
        reconstruction from its nearest training points (exact, and LLL with
        ``refine``) or landmarks (LLL), applied to their embedding; a training
        point gets its own row."""
        return self._map(X_new, getattr(self, "embedding_", None))


@_DOCUMENTED
class SpectralClustering(_SpectralBase):
    """Normalized spectral clustering (Ng-Jordan-Weiss: the K trailing generalized
    eigenvectors of eq. 4.19, the trivial one included, then k-means on the
    unit-normalized rows), exactly or with Locally Linear Landmarks.

    Parameters
    ----------
    n_clusters : int
        K, the number of clusters.
    {graph_parameters}
    n_init : int, default 20
        k-means restarts (k-means++ seeds); with LLL they run on the landmarks, and
        one run on all points starts from the best landmark centroids (4.7.1).

    Attributes
    ----------
    labels_ : (N,) int array
    cluster_centers_ : (K, K) array
        The centres of the unit-normalized rows.
    embedding_ : (N, K) numpy array
        The eigenvectors' rows.
    {landmark_attributes}
    """

    def __init__(self, n_clusters, *, n_neighbors, sigma=None, perplexity=None,
                 neighbors="auto", metric="euclidean", n_landmarks=None, kz=None,
                 landmarks="random", z_neighbors="input", refine=0, n_init=20,
                 random_state=None, backend="auto"):
        super().__init__(n_neighbors=n_neighbors, sigma=sigma, perplexity=perplexity,
                         neighbors=neighbors, metric=metric, n_landmarks=n_landmarks, kz=kz,
                         landmarks=landmarks, z_neighbors=z_neighbors, refine=refine,
                         random_state=random_state, backend=backend)
        self.n_clusters = n_clusters
        self.n_init = n_init

    def _dimension(self, X):
        return check_int(self.n_clusters, "n_clusters", 1, X.shape[0] - 2)

    def _fit(self, be, X, shared=None):
        K = self._dimension(X)
        n_init = check_int(self.n_init, "n_init", 1)
        # K eigenvectors including the trivial one: with K separated clusters they
        # span all K component indicators.
        self.embedding_ = self._embed(be, X, K, drop_first=False, shared=shared)
        rows = _unit_rows(self.embedding_)
        if self.landmarks_ is None:
            labels, centers, _ = kmeans(rows, K, n_init=n_init, random_state=self.random_state)
        else:
            landmark_rows = _unit_rows(self.landmark_embedding_)
            _, warm, _ = kmeans(landmark_rows, K, n_init=n_init, random_state=self.random_state)
            labels, centers, _ = kmeans(rows, K, init=warm)
        self.labels_, self.cluster_centers_ = labels, centers
        return self

    def fit_predict(self, X, y=None):
        """Fit to ``X`` and return ``labels_``."""
        return self.fit(X).labels_

    def predict(self, X_new):
        """Clusters of new points ``X_new``: the nearest of ``cluster_centers_`` to each one's
        out-of-sample embedding (as :meth:`LaplacianEigenmaps.transform`), its row
        unit-normalized as the training rows were.  A training point gets its
        ``labels_`` entry back."""
        rows = _unit_rows(self._map(X_new, getattr(self, "embedding_", None), "predict"))
        return nearest_centers(rows, self.cluster_centers_)[0]


def fit_grid(estimator, X, grid):
    """Fit ``estimator`` (LaplacianEigenmaps or SpectralClustering) to ``X`` at every
    point of ``grid``, a dict of lists over its affinity parameters "n_neighbors", "sigma" and
    "perplexity" (all combinations, as scikit-learn's ParameterGrid), for model
    selection (dissertation section 4.5).

    The points share one k-NN search (for the largest n_neighbors) and, with
    ``n_landmarks``, one choice of landmarks and one Z, which depend on the data
    alone (unless landmarks="spread" or z_neighbors="graph": then each graph makes
    its own), so each point costs its affinity graph, its (reduced) eigenproblem
    and, for clustering, k-means.  Returns ``[(params, fitted), ...]``, each ``fitted``
    a copy of ``estimator`` with ``params`` set, equal to fitting that copy alone
    (with a fixed ``random_state``; with None all points share one draw of the
    landmarks).
    """
    if not isinstance(estimator, _SpectralBase):
        raise TypeError(f"estimator must be a LaplacianEigenmaps or SpectralClustering, "
                        f"got {type(estimator).__name__}")
    if not isinstance(grid, dict) or not grid:
        raise ValueError("grid must be a non-empty dict of parameter lists")
    values = {}
    for key, given in grid.items():
        check_choice(key, "grid key", GRID_PARAMETERS)
        listed = not isinstance(given, str) and hasattr(given, "__iter__")
        values[key] = list(given) if listed else []
        if not values[key]:
            raise ValueError(f"grid[{key!r}] must be a non-empty list of values, got {given!r}")
    be, X = estimator._data(X)
    keys = sorted(values)
    points = [dict(zip(keys, combination))
              for combination in itertools.product(*(values[key] for key in keys))]
    fitted = [type(estimator)(**{**estimator.get_params(), **params}) for params in points]
    # Every point's parameters before the shared search, not at its turn.
    k = max(_graph_parameters(X.shape[0], f.n_neighbors, f.sigma, f.perplexity)[0]
            for f in fitted)
    shared = estimator._shared(be, X, estimator._dimension(X), k)
    return [(params, f._fit(be, X, shared)) for params, f in zip(points, fitted)]


def _unit_rows(X):
    return X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-300)
