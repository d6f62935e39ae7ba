"""Row operations on data that may be a sparse matrix (scipy or cupyx CSR).

The neighbour searches need only inner products and squared norms of rows,
so sparse data (a bag of words, TF-IDF, one-hot features) is never made dense:
a block of distances is a sparse product written into a dense B x N block
(``gram``), and a point's D coordinates stay sparse however large D is.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse


def is_sparse(X):
    """scipy.sparse or cupyx.scipy.sparse matrix (or array)."""
    return hasattr(X, "tocsr")


def to_csr(X, backend, dtype):
    """A canonical CSR copy of sparse ``X`` on ``backend``'s device in ``dtype``
    (duplicates summed, indices sorted); the caller's matrix is left alone.  One
    that is already all of that comes back as it is: the entry points check the
    data they pass on again (fit, entropic_affinities, knn), and each copy was
    a full one."""
    on_host = scipy.sparse.issparse(X)
    if (on_host != backend.is_gpu and X.format == "csr" and X.dtype == dtype
            and X.has_canonical_format):
        return X
    if on_host:
        X = X.tocsr().astype(dtype, copy=True)      # on the host: cupyx has no integers
        if backend.is_gpu:
            X = backend.sparse.csr_matrix(X)
    else:                                           # a cupyx matrix
        X = X.tocsr().astype(dtype, copy=True)
        if not backend.is_gpu:
            X = X.get()
    X.sum_duplicates()
    return X


def column_means(xp, X):
    """X's column means (D,), summed in float64 and returned in X's dtype.  NumPy
    sums the rows of a C-ordered float32 array one after another in float32:
    Fashion-MNIST's 70,000 rows (pixels in [0, 1]) moved 1e4 from the origin had
    means up to 9.9 off, and what is centred on them keeps that offset."""
    return xp.asarray(X.mean(axis=0, dtype=xp.float64)).ravel().astype(X.dtype)


def row_sqnorms(xp, X):
    """Squared Euclidean norm of every row, dense (N,)."""
    if is_sparse(X):
        return xp.asarray(X.multiply(X).sum(axis=1)).ravel()
    return xp.einsum("ij,ij->i", X, X)


def transposed(B):
    """B prepared as the right factor of products A @ B.T with many blocks A (one
    conversion for all of them): a dense view, cupyx's B^T in CSR (cuSPARSE's
    SpGEMM takes CSR times CSR), or for scipy neighbors_cpu.split_features."""
    if scipy.sparse.issparse(B):
        from .neighbors_cpu import split_features

        return split_features(B.tocsr())
    return B.T.tocsr() if is_sparse(B) else B.T


def product(A, Bt):
    """A @ B.T as a dense array, from Bt = transposed(B) (A sparse where B is) or,
    for one product, from B.T."""
    from .neighbors_cpu import FeatureSplit, sparse_gram

    if isinstance(Bt, FeatureSplit):
        return sparse_gram(A.tocsr(), Bt)
    G = A @ Bt
    return G.toarray() if is_sparse(G) else G


# BlockProducts' tiles of a dense product: rows, columns.
TILE_ROWS, TILE_COLS = 1024, 4096


class BlockProducts:
    """The products of a loop whose blocks each feed a compiled parallel pass.
    On the CPU, inside the context, BLAS runs on one thread, and the tiles of a
    dense product (:meth:`__call__`) or the items of :meth:`each` (the
    approximate search's lists) are spread over numba's threads, each on its
    own Python thread (NumPy releases the GIL in BLAS): OpenBLAS's own workers
    busy-wait for a while after each threaded call and took the cores from
    numba's threads.  The exact 90-NN of Fashion-MNIST 70k passed its 74 strips
    of distances to the heaps in 6.7 s after OpenBLAS's threaded products, in
    4.0 s after single-threaded ones (the whole search 22.9 s against 26.0 s;
    the approximate one 3.5-3.7 s against 3.9-4.1 s).

    An entry's last bits depend on how the product is cut (OpenBLAS's kernels
    treat the edges of a block apart: halves of a 958-row block of float32
    Fashion-MNIST gave other bits on 88 rows than the whole), so the cut is
    fixed, tiles of TILE_ROWS x TILE_COLS whatever the number of threads, and
    the k-NN of float32 data is the same on 1 or 2 threads (it was not when
    the rows went in one span per thread, nor on OpenBLAS's threads before).
    Tiles of 1024 x 4096 cost about what halves did on 2 cores (a 958 x 70,000
    strip 0.46-0.47 s, 16,384 queries against 4,000 points 0.44 s; the exact
    90-NN of Fashion-MNIST 70k 22.9-23.5 s against 22.3-22.4 s), and wider
    tiles more (8,192 and 16,384 columns: 1% and 10%).  On the GPU the
    products are :func:`product`'s, in order."""

    def __init__(self, backend):
        import numba

        self.backend = backend
        self.threads = 1 if backend.is_gpu else numba.get_num_threads()

    def __enter__(self):
        self._serial = self.backend.serial_blas()         # a no-op on the GPU
        self._serial.__enter__()
        if self.threads > 1:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self.threads)
        return self

    def __exit__(self, *exc):
        if self.threads > 1:
            self._pool.shutdown()
        self._serial.__exit__(*exc)

    def __call__(self, A, Bt):
        """A @ B.T as a dense array from Bt = transposed(B), as :func:`product`."""
        if self.backend.is_gpu or is_sparse(A) or not isinstance(Bt, np.ndarray):
            return product(A, Bt)
        out = np.empty((A.shape[0], Bt.shape[1]), dtype=np.result_type(A, Bt))
        tiles = [(slice(r, r + TILE_ROWS), slice(c, c + TILE_COLS))
                 for r in range(0, A.shape[0], TILE_ROWS)
                 for c in range(0, Bt.shape[1], TILE_COLS)]
        self.each(lambda t: np.matmul(A[t[0]], Bt[:, t[1]], out=out[t]), tiles)
        return out

    def map(self, fn, items):
        """fn(item) for every item, on the threads; the results in the items' order,
        as they come (in order on one thread)."""
        return map(fn, items) if self.threads == 1 else self._pool.map(fn, items)

    def each(self, fn, items):
        """fn(item) for every item, on the threads."""
        for _ in self.map(fn, items):
            pass


def rows_product(A, B):
    """A @ B for host CSR matrices, A's rows cut into one span per numba thread,
    each span's product on its own Python thread (:class:`BlockProducts`; SciPy's
    sparse products release the GIL): a row of the product depends on that row of
    A alone, so the result has the same bits as A @ B.  LLL's reduced matrices at
    2,500 landmarks of Fashion-MNIST 70k: 0.064 s against 0.094 s on 2 cores."""
    from .backend import get_backend

    with BlockProducts(get_backend("cpu")) as blocks:
        spans = np.linspace(0, A.shape[0], blocks.threads + 1).astype(np.int64)
        parts = list(blocks.map(lambda span: A[span[0]:span[1]] @ B,
                                zip(spans[:-1], spans[1:])))
    return scipy.sparse.vstack(parts, format="csr")


def gram(A, B):
    """A @ B.T as a dense array; A and B dense or sparse, in any mix."""
    return product(A, transposed(B) if is_sparse(A) == is_sparse(B) else B.T)


def same_kind(be, Q, X):
    """Q and X both dense or, when either is sparse, both sparse (a dense one
    becomes CSR), so that their rows can be subtracted and multiplied."""
    if is_sparse(Q) == is_sparse(X):
        return Q, X
    if is_sparse(Q):
        return Q, be.sparse.csr_matrix(X)
    return be.sparse.csr_matrix(Q), X

