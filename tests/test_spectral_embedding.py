import numpy as np
import pytest
import scipy.linalg
import scipy.sparse

import gpuembed as ge
from gpuembed.metrics import procrustes_error
from gpuembed.spectral import spectral_embedding


def test_matches_dense_generalized_eigenproblem(rng, backend):
    X = rng.standard_normal((120, 3))
    W = ge.entropic_affinities(X, 10.0, backend="cpu").P
    Y = backend.to_host(spectral_embedding(W, 2, backend=backend))
    Wd = W.toarray()
    D = np.diag(Wd.sum(1))
    vals, vecs = scipy.linalg.eigh(D - Wd, D)          # L u = lambda D u, ascending
    ref = vecs[:, 1:3]
    for j in range(2):                                  # equal up to sign and scale
        norms = (Y[:, j] @ D @ Y[:, j]) * (ref[:, j] @ D @ ref[:, j])
        cos = abs(Y[:, j] @ D @ ref[:, j]) / np.sqrt(norms)
        assert cos > 1 - 1e-8


@pytest.mark.parametrize("connected", [True, False])
def test_shift_invert_equals_lanczos(rng, connected):
    """The CHOLMOD shift-invert path against the Lanczos one: on a swiss roll's
    graph (small spectral gaps), and with a second component, whose two zero
    eigenvalues make "the trivial one" ambiguous, all vectors kept."""
    X = ge.datasets.swiss_roll(400, random_state=0)[0]
    if not connected:
        X = np.concatenate([X, rng.standard_normal((150, 3)) + 100])
    W = ge.spectral.affinity_graph(X, 10, 2.0, backend="cpu")
    Wd = W.toarray()
    D = np.diag(Wd.sum(1))
    vals, _ = scipy.linalg.eigh(D - Wd, D)
    assert (vals[1] < 1e-12) != connected and vals[2] < 1e-2
    for d in (2, 5):
        kw = dict(n_components=d, backend="cpu", drop_first=connected)
        ref = spectral_embedding(W, **kw)
        got = spectral_embedding(W, shift_invert=True, **kw)
        assert procrustes_error(ref, got) < 1e-8
        np.testing.assert_allclose(np.einsum("ij,ik,i->jk", got, got, D.diagonal()), np.eye(d),
                                   atol=1e-8)               # Y^T D Y = I


def test_graphs_of_low_dimensional_points_take_shift_invert(monkeypatch):
    X, t = ge.datasets.swiss_roll(600, random_state=0)
    calls = []
    real = ge.spectral.embedding._shift_invert_eigsh
    monkeypatch.setattr(ge.spectral.embedding, "_shift_invert_eigsh",
                        lambda *a: calls.append(a[1]) or real(*a))
    ge.LaplacianEigenmaps(2, n_neighbors=10, backend="cpu").fit(X)
    assert calls == [3]
    ge.LaplacianEigenmaps(2, n_neighbors=10, backend="cpu").fit(np.c_[X, X[:, :1]])   # 4-D
    assert calls == [3]
    ge.TSNE(init="spectral", max_iter=2, backend="cpu").fit(X)     # the spectral start too
    assert calls == [3, 3]


def test_bad_graph():
    with pytest.raises(ValueError, match="W must be square"):
        spectral_embedding(scipy.sparse.csr_matrix(np.ones((5, 6))), 2, backend="cpu")
    dense = np.ones((5, 5)) - np.eye(5)
    dense[4, :] = dense[:, 4] = 0          # point 4 has no affinity at all
    W = scipy.sparse.csr_matrix(dense)
    try:
        spectral_embedding(W, 2, backend="cpu")
    except ValueError as exc:
        assert "isolated" in str(exc)
    else:
        raise AssertionError("an isolated point must raise")
    W = scipy.sparse.csr_matrix(np.ones((6, 6)) - np.eye(6))
    for flag in ("drop_first", "shift_invert"):
        with pytest.raises(TypeError, match=f"{flag} must be True or False"):
            spectral_embedding(W, 2, backend="cpu", **{flag: "no"})
