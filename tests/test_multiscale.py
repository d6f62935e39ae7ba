"""Multi-scale affinities (../shared/papers/004_13864de36f3612a6.txt, eq. 2.11)."""
import numpy as np
import pytest

import gpuembed as ge
from gpuembed.affinities.multiscale import scale_perplexities


def test_scales_follow_powers_of_two():
    np.testing.assert_array_equal(scale_perplexities(100, 2.0), [2, 4, 8, 16, 32])
    np.testing.assert_array_equal(scale_perplexities(100, 3.0, n_scales=2), [3, 6])
    with pytest.raises(ValueError, match="perplexity"):
        scale_perplexities(100, 1.0)
    with pytest.raises(ValueError, match="perplexity"):
        scale_perplexities(10, 6.0)


def test_average_of_single_scale_conditional_rows(rng):
    X = rng.standard_normal((150, 4))
    M = ge.multiscale_affinities(X, 2.0, symmetrize=False, backend="cpu")
    assert list(M.perplexities) == [2, 4, 8, 16, 32, 64]
    singles = [ge.entropic_affinities(X, K, n_neighbors=149, symmetrize=False,
                                      backend="cpu").P.toarray() for K in M.perplexities]
    np.testing.assert_allclose(M.P.toarray(), np.mean(singles, axis=0), rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(M.entropy, np.log(M.perplexities)[None, :].repeat(150, 0),
                               atol=1e-10)
    J = ge.multiscale_affinities(X, 2.0, backend="cpu").P
    assert abs(J.sum() - 1) < 1e-12 and abs(J - J.T).max() < 1e-15


def test_too_few_neighbours(rng):
    X = rng.standard_normal((100, 3))
    with pytest.raises(ValueError, match="n_neighbors"):
        ge.multiscale_affinities(X, 2.0, n_neighbors=20, backend="cpu")
    M = ge.multiscale_affinities(X, 2.0, n_neighbors=20, n_scales=3, backend="cpu")
    assert M.beta.shape == (100, 3)
