import numpy as np
import scipy.linalg
import scipy.sparse

import gpuembed as ge
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
        cos = abs(Y[:, j] @ D @ ref[:, j]) / np.sqrt((Y[:, j] @ D @ Y[:, j]) * (ref[:, j] @ D @ ref[:, j]))
        assert cos > 1 - 1e-8


def test_bad_graph():
    dense = np.ones((5, 5)) - np.eye(5)
    dense[4, :] = dense[:, 4] = 0          # point 4 has no affinity at all
    W = scipy.sparse.csr_matrix(dense)
    try:
        spectral_embedding(W, 2, backend="cpu")
    except ValueError as exc:
        assert "isolated" in str(exc)
    else:
        raise AssertionError("an isolated point must raise")
