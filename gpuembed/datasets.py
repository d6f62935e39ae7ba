"""Datasets: synthetic generators and loaders for real data.

Every function returns NumPy arrays ``(X, y)``; generators are deterministic
for a given ``random_state`` (rotating_objects is always the same set).
"""
from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from ._checks import check_float, check_int, make_rng

__all__ = ["swiss_roll", "gaussian_clusters", "rotating_objects", "digits", "fashion_mnist",
           "FASHION_MNIST_PATH"]

# Where Debian's `dataset-fashion-mnist` package installs the IDX files.
FASHION_MNIST_PATH = Path("/usr/share/datasets/fashion-mnist")


def swiss_roll(n, noise=0.0, random_state=None):
    """3-D swiss roll: a rolled-up 2-D sheet of ``n`` points drawn by
    ``random_state``, with Gaussian ``noise`` of that standard deviation added.

    Returns X (n, 3) and t (n,), the position along the roll
    (t in [1.5 pi, 4.5 pi]); height is uniform in [0, 21].
    """
    n = check_int(n, "n", 1)
    noise = check_float(noise, "noise", 0.0)
    rng = make_rng(random_state)
    t = 1.5 * np.pi * (1.0 + 2.0 * rng.random(n))
    height = 21.0 * rng.random(n)
    X = np.column_stack([t * np.cos(t), height, t * np.sin(t)])
    X += noise * rng.standard_normal(X.shape)
    return X, t


def gaussian_clusters(n, n_clusters, dim, random_state=None):
    """``n`` points in ``n_clusters`` isotropic unit-variance Gaussian clusters in
    ``dim`` dimensions, drawn by ``random_state``; returns X (n, dim) and labels (n,).

    Centres are drawn with standard deviation ``4 * n_clusters ** (1 / dim) + 4``
    per coordinate, so clusters are mostly well separated.  Labels are
    balanced (point i gets label i % n_clusters before shuffling).
    """
    n = check_int(n, "n", 1)
    n_clusters = check_int(n_clusters, "n_clusters", 1, n)
    dim = check_int(dim, "dim", 1)
    rng = make_rng(random_state)
    spread = 4.0 * n_clusters ** (1.0 / dim) + 4.0
    centres = spread * rng.standard_normal((n_clusters, dim))
    labels = rng.permutation(np.arange(n) % n_clusters)
    X = centres[labels] + rng.standard_normal((n, dim))
    return X, labels


def rotating_objects(n_objects=10, n_views=72, size=64):
    """A COIL-20-like set: grey-level objects, each seen at ``n_views`` angles.

    Object ``o`` is a round body of its own size and brightness plus a fixed,
    asymmetric arrangement of elliptical Gaussian blobs and a bar inside the
    image's inscribed disc; view ``v`` renders it
    rotated in-plane by ``2 pi v / n_views`` (evaluated analytically, no
    interpolation).  Each object therefore traces a closed loop in pixel space,
    like a COIL object on its turntable.

    Returns X (n_objects * n_views, size * size) with values in [0, 1] and the
    object label of each row.  Always the same data (seeded by object index).
    """
    n_objects = check_int(n_objects, "n_objects", 1)
    n_views = check_int(n_views, "n_views", 1)
    size = check_int(size, "size", 8)
    coords = (np.arange(size) - (size - 1) / 2.0) / (size / 2.0)   # in [-1, 1]
    gx, gy = np.meshgrid(coords, coords)
    angles = 2.0 * np.pi * np.arange(n_views) / n_views
    images = np.empty((n_objects, n_views, size * size))
    for obj in range(n_objects):
        shapes = _object_shapes(np.random.default_rng(1000 + obj))
        for v, a in enumerate(angles):
            # Rotating the object by +a = evaluating it at coordinates rotated by -a.
            c, s = np.cos(a), np.sin(a)
            u = c * gx + s * gy
            w = -s * gx + c * gy
            images[obj, v] = _render(shapes, u, w).ravel()
    X = images.reshape(n_objects * n_views, size * size)
    labels = np.repeat(np.arange(n_objects), n_views)
    return X, labels


def _object_shapes(rng):
    """A round body (radius, brightness), random blobs (centre, axes,
    orientation, intensity) and one bar."""
    body = np.array([0.35 + 0.5 * rng.random(), 0.15 + 0.45 * rng.random()])
    n_blobs = rng.integers(3, 7)
    radius = 0.65 * np.sqrt(rng.random(n_blobs))
    phi = 2.0 * np.pi * rng.random(n_blobs)
    blobs = np.column_stack([
        radius * np.cos(phi), radius * np.sin(phi),       # centre
        0.12 + 0.25 * rng.random(n_blobs),                # axis 1
        0.08 + 0.12 * rng.random(n_blobs),                # axis 2
        np.pi * rng.random(n_blobs),                      # orientation
        0.4 + 0.6 * rng.random(n_blobs),                  # intensity
    ])
    bar = np.array([0.55 * rng.random(), 2.0 * np.pi * rng.random(), 0.3 + 0.5 * rng.random()])
    return body, blobs, bar


def _render(shapes, u, w):
    body, blobs, bar = shapes
    # The body is rotation invariant: it sets the object apart, like a COIL
    # object's overall shape, while the blobs and the bar turn with the view.
    radius, brightness = body
    img = brightness * np.exp(-((u ** 2 + w ** 2) / radius ** 2) ** 2)
    for cx, cy, a1, a2, theta, intensity in blobs:
        c, s = np.cos(theta), np.sin(theta)
        du, dw = u - cx, w - cy
        p, q = c * du + s * dw, -s * du + c * dw
        img += intensity * np.exp(-0.5 * ((p / a1) ** 2 + (q / a2) ** 2))
    # A bar from the centre towards angle bar[1]: breaks any rotational symmetry.
    length, angle, intensity = bar
    along = np.cos(angle) * u + np.sin(angle) * w
    across = -np.sin(angle) * u + np.cos(angle) * w
    inside = (along > 0) & (along < length) & (np.abs(across) < 0.08)
    img += intensity * inside
    img *= (u ** 2 + w ** 2) <= 1.0      # keep everything inside the disc
    return np.clip(img, 0.0, 1.0)


def digits():
    """scikit-learn's real handwritten digits: X (1797, 64) in [0, 16], labels 0-9."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise ImportError(
            "gpuembed.datasets.digits() needs scikit-learn: pip install scikit-learn "
            "(or pip install 'gpuembed[test]')"
        ) from exc
    data = load_digits()
    return data.data.astype(np.float64), data.target.astype(np.int64)


def fashion_mnist(path=None):
    """Fashion-MNIST, training and test sets together: X (70000, 784) float32 in [0, 1].

    Reads the four IDX files (optionally gzipped) from ``path``, by default the
    folder named by the environment variable ``GPUEMBED_FASHION_MNIST``, else
    ``/usr/share/datasets/fashion-mnist`` where Debian's ``dataset-fashion-mnist``
    package installs them.
    """
    if path is None:
        path = os.environ.get("GPUEMBED_FASHION_MNIST") or FASHION_MNIST_PATH
    folder = Path(path)
    parts = []
    for prefix in ("train", "t10k"):
        images = _read_idx(_find_idx(folder, f"{prefix}-images-idx3-ubyte"))
        labels = _read_idx(_find_idx(folder, f"{prefix}-labels-idx1-ubyte"))
        if images.shape[0] != labels.shape[0]:
            raise ValueError(f"{folder}: {prefix} images and labels differ in length")
        parts.append((images.reshape(images.shape[0], -1), labels))
    X = np.concatenate([p[0] for p in parts]).astype(np.float32) / 255.0
    y = np.concatenate([p[1] for p in parts]).astype(np.int64)
    return X, y


def _find_idx(folder, stem):
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(
        f"Fashion-MNIST file {stem}[.gz] not found in {folder}. Install it with "
        "'apt-get install dataset-fashion-mnist' (Debian/Ubuntu), or download the four IDX "
        "files from the Fashion-MNIST repository and pass path=<their folder>."
    )


_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _read_idx(path):
    """Parse an IDX file: magic (0, 0, type, ndim), ndim big-endian sizes, data."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise ValueError(f"{path} is not an IDX file")
    ndim = raw[3]
    shape = tuple(int(s) for s in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    count = int(np.prod(shape))
    offset = 4 + 4 * ndim
    if len(raw) - offset != count * dtype.itemsize:
        raise ValueError(f"{path}: size does not match its header shape {shape}")
    return np.frombuffer(raw, dtype, count=count, offset=offset).reshape(shape)
