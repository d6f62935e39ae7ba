import gzip

import numpy as np
import pytest

from gpuembed import datasets


def test_swiss_roll_shape_range_and_determinism():
    X, t = datasets.swiss_roll(500, random_state=3)
    assert X.shape == (500, 3) and t.shape == (500,)
    assert t.min() >= 1.5 * np.pi and t.max() <= 4.5 * np.pi
    np.testing.assert_allclose(X[:, 0], t * np.cos(t))       # noise=0: exactly on the roll
    X2, _ = datasets.swiss_roll(500, random_state=3)
    np.testing.assert_array_equal(X, X2)
    X3, _ = datasets.swiss_roll(500, noise=0.5, random_state=3)
    assert not np.allclose(X, X3)


def test_gaussian_clusters():
    X, y = datasets.gaussian_clusters(600, 4, 5, random_state=1)
    assert X.shape == (600, 5) and set(np.unique(y)) == {0, 1, 2, 3}
    assert np.bincount(y).tolist() == [150] * 4
    # Each cluster has unit variance around its own mean.
    for c in range(4):
        assert 0.7 < X[y == c].std(axis=0).mean() < 1.3
    np.testing.assert_array_equal(X, datasets.gaussian_clusters(600, 4, 5, random_state=1)[0])


def test_rotating_objects_are_closed_loops():
    X, y = datasets.rotating_objects(n_objects=4, n_views=36, size=32)
    assert X.shape == (144, 1024) and X.min() >= 0 and X.max() <= 1
    assert np.bincount(y).tolist() == [36] * 4
    np.testing.assert_array_equal(X, datasets.rotating_objects(n_objects=4, n_views=36, size=32)[0])
    for o in range(4):
        views = X[y == o]
        step = np.linalg.norm(np.diff(views, axis=0, append=views[:1]), axis=1)  # closes the loop
        far = np.linalg.norm(views - views[18], axis=1)
        # Consecutive views (including last -> first) are close; opposite views are far.
        assert step.max() < 0.5 * far[0]
    # Objects differ from one another.
    assert np.linalg.norm(X[0] - X[36]) > 0.1 * np.linalg.norm(X[0])


def test_digits_are_real():
    pytest.importorskip("sklearn")
    X, y = datasets.digits()
    assert X.shape == (1797, 64) and X.max() == 16 and set(y) == set(range(10))


def _write_idx(path, array, code):
    header = bytes([0, 0, code, array.ndim]) + b"".join(
        int(s).to_bytes(4, "big") for s in array.shape)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as f:
        f.write(header + array.tobytes())


def test_fashion_mnist_reader(tmp_path):
    rng = np.random.default_rng(0)
    train = rng.integers(0, 256, (5, 28, 28), dtype=np.uint8)
    test = rng.integers(0, 256, (3, 28, 28), dtype=np.uint8)
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", train, 0x08)
    _write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.arange(5, dtype=np.uint8), 0x08)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte", test, 0x08)          # plain, not gzipped
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.arange(3, dtype=np.uint8), 0x08)
    X, y = datasets.fashion_mnist(tmp_path)
    assert X.shape == (8, 784) and X.dtype == np.float32
    np.testing.assert_array_equal(X[:5] * 255, train.reshape(5, -1))
    np.testing.assert_array_equal(y, [0, 1, 2, 3, 4, 0, 1, 2])


def test_fashion_mnist_folder_from_the_environment(tmp_path, monkeypatch):
    for prefix, n in (("train", 2), ("t10k", 1)):
        _write_idx(tmp_path / f"{prefix}-images-idx3-ubyte", np.zeros((n, 28, 28), np.uint8), 0x08)
        _write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte", np.arange(n, dtype=np.uint8), 0x08)
    monkeypatch.setenv("GPUEMBED_FASHION_MNIST", str(tmp_path))
    X, y = datasets.fashion_mnist()
    assert X.shape == (3, 784) and y.tolist() == [0, 1, 0]


def test_fashion_mnist_missing_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        datasets.fashion_mnist(tmp_path)


def test_fashion_mnist_corrupt_file(tmp_path):
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        (tmp_path / name).write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x09abc")
    with pytest.raises(ValueError, match="size does not match"):
        datasets.fashion_mnist(tmp_path)


@pytest.mark.skipif(not datasets.FASHION_MNIST_PATH.is_dir(),
                    reason="dataset-fashion-mnist not installed")
def test_fashion_mnist_real_files():
    X, y = datasets.fashion_mnist()
    assert X.shape == (70000, 784) and np.bincount(y).tolist() == [7000] * 10
    assert 0.0 <= X.min() and X.max() == 1.0


@pytest.mark.parametrize("call,match", [
    (lambda: datasets.swiss_roll(0), "n"),
    (lambda: datasets.swiss_roll(10, noise=-1), "noise"),
    (lambda: datasets.gaussian_clusters(10, 11, 2), "n_clusters"),
    (lambda: datasets.rotating_objects(size=4), "size"),
])
def test_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()
