import numpy as np
import pytest

from gpuembed.metrics import knn_accuracy


def brute_knn_accuracy(Y, labels, k):
    D = ((Y[:, None] - Y[None]) ** 2).sum(-1)
    np.fill_diagonal(D, np.inf)
    correct = 0
    for i in range(len(Y)):
        nb = np.argsort(D[i], kind="stable")[:k]
        counts = np.bincount(labels[nb], minlength=labels.max() + 1)
        correct += counts.argmax() == labels[i]
    return correct / len(Y)


def test_knn_accuracy_matches_brute_force(rng):
    Y = rng.standard_normal((200, 2))
    labels = (Y[:, 0] > 0).astype(int) + 2 * (rng.random(200) < 0.2)
    assert knn_accuracy(Y, labels, k=7) == pytest.approx(brute_knn_accuracy(Y, labels, 7))


def test_knn_accuracy_extremes(rng):
    Y = np.concatenate([rng.standard_normal((50, 2)), rng.standard_normal((50, 2)) + 100])
    labels = np.repeat([0, 1], 50)
    assert knn_accuracy(Y, labels) == 1.0
    odd = labels.copy()
    odd[0] = 1        # one mislabelled point in cluster 0: only it is misclassified
    assert knn_accuracy(Y, odd) == 0.99


def test_knn_accuracy_bad_labels():
    with pytest.raises(ValueError, match="labels"):
        knn_accuracy(np.zeros((10, 2)), np.zeros(9))
