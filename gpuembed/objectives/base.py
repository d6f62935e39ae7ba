"""Shared machinery of the embedding objectives in Laplacian form (seed 002, section 1).

An objective E(X) = E+(X) + lambda E-(X) is evaluated from

- the attractive term over the sparse affinities P (O(nnz) per evaluation), with
  gradients written as Laplacian products sum_m w_nm (x_n - x_m);
- the repulsive term over all pairs through the N-body engine (nbody/).

X is (N, d), one row per point (the papers' X is its transpose).
"""
from __future__ import annotations

import functools

import numba
import numpy as np

from ..nbody import engine_sums
from ..nbody.exact import xx_terms
from .attraction_cpu import attraction, edge_sqdist
from .attraction_gpu import attraction_gpu


class PairSet:
    """The edges (n, m, p_nm) of a sparse matrix, fixed over the optimization."""

    def __init__(self, be, P, dtype, owned=False):
        # A copy: sum_duplicates sorts the indices in place, and with a new dtype
        # the caller's matrix would share only its indices, whose reordering then
        # scrambled it (SNE in float32 on its row-conditional P: a second fit with
        # the same affinities ended at 833 instead of 338).  A matrix ``owned`` by
        # the objective (made for it) in canonical form is taken as it is: multi-scale
        # SNE's 15M pairs (Fashion-MNIST 10k) took 0.4 s per stage to copy.
        copy = not (owned and P.has_canonical_format)
        P = be.sparse.csr_matrix(P, dtype=dtype, copy=copy)
        P.sum_duplicates()
        self.be, self.P = be, P
        self.n = P.shape[0]
        self.p = P.data

    # Each edge's row and column (int64, in the canonical CSR order), for the
    # array code: built on first use, as the compiled CPU sweeps read P itself.
    @functools.cached_property
    def rows(self):
        return self.P.tocoo().row.astype(self.be.xp.int64)

    @functools.cached_property
    def cols(self):
        return self.P.indices.astype(self.be.xp.int64)

    def sqdist(self, X):
        """|x_n - x_m|^2 of every edge, in X's dtype: compiled on the CPU
        (attraction_cpu.edge_sqdist), array code on the GPU."""
        if self.be.is_gpu:
            return self.sqdist_arrays(X)
        return edge_sqdist(self.P.indptr, self.P.indices, np.ascontiguousarray(X.T))

    def sqdist_arrays(self, X):
        # Column by column: a (nnz, d) difference summed over its short axis is
        # about 8x slower in NumPy for d = 2.
        out = 0.0
        for i in range(X.shape[1]):
            x = X[:, i]
            diff = x[self.rows] - x[self.cols]
            out = out + diff * diff
        return out

    def attraction(self, X, student=False):
        """(sum_nm p_nm phi(d_nm^2), G) with G_n = sum_m w_nm (x_n - x_m): phi = d^2
        and w = p, or with ``student`` phi = log(1 + d^2) and w = p / (1 + d^2).
        Compiled on the CPU (attraction_cpu.py), a kernel on the GPU (attraction_gpu.py),
        whose value stays on the device (a 0-d array): the objectives read it with their
        normalization in one host read (Backend.host_floats)."""
        if self.be.is_gpu:
            return attraction_gpu(self.be, self.P, self.p, X, student)
        grad = np.zeros(X.shape)
        value = attraction(self.P.indptr, self.P.indices, self._p64,
                           np.ascontiguousarray(X.T, dtype=np.float64), student, grad,
                           np.empty((numba.get_num_threads(), 2 + X.shape[1],
                                     self._longest_row)))
        return float(value), grad.astype(X.dtype, copy=False)

    @functools.cached_property
    def _longest_row(self):
        """Edges in P's longest row (the compiled pass's buffers)."""
        return int(np.diff(self.P.indptr).max(initial=0))

    @functools.cached_property
    def _p64(self):
        """The edge values in float64, for the compiled pass (float32 objectives)."""
        return self.p.astype(np.float64, copy=False)

    def attraction_arrays(self, X, student=False):
        """:meth:`attraction` by NumPy/CuPy array code (the reference of both)."""
        d2 = self.sqdist_arrays(X)
        if student:
            value, w = (self.p * self.be.xp.log1p(d2)).sum(), self.p / (1.0 + d2)
        else:
            value, w = (self.p * d2).sum(), self.p
        return float(value), self.laplacian_times(w, X)

    def weights(self, w):
        """Sparse matrix with edge values w on P's pattern."""
        return self.be.sparse.csr_matrix((w, self.P.indices, self.P.indptr), shape=self.P.shape)

    def row_sums(self, w):
        """sum_m w_nm for every n."""
        return self.be.xp.asarray(self.weights(w).sum(axis=1)).ravel()

    def laplacian_times(self, w, X, transpose=False):
        """sum_m w_nm (x_n - x_m) for edge weights w on P's pattern, or with W^T
        (sum_m w_mn (x_n - x_m)) if ``transpose``."""
        if not transpose:
            W = self.weights(w)
        elif self.be.is_gpu:
            # W^T in CSR from the transposed pattern: cuSPARSE's product with a
            # transposed matrix sums in another order at every run.
            order, indices, indptr = self._transposed
            W = self.be.sparse.csr_matrix((w[order], indices, indptr), shape=self.P.shape)
        else:
            W = self.weights(w).T
        degree = self.be.xp.asarray(W.sum(axis=1)).ravel()
        return degree[:, None] * X - W @ X

    @functools.cached_property
    def _transposed(self):
        """(order, indices, indptr): the CSR pattern of P^T, whose k-th entry is the
        edge order[k] of P."""
        xp, nnz = self.be.xp, self.p.size
        ids = self.be.sparse.csr_matrix((xp.arange(1, nnz + 1, dtype=xp.float64),
                                         self.P.indices, self.P.indptr), shape=self.P.shape)
        T = ids.T.tocsr()
        T.sort_indices()
        return T.data.astype(xp.int64) - 1, T.indices, T.indptr

    def xx_diagonal(self, w, X):
        """sum_m w_nm (x_in - x_im)^2 over the edges, for every n and dimension i: row
        sums on P's pattern, whose order is fixed (a scatter's atomic additions on
        the GPU come in another order at every run)."""
        out = self.be.xp.empty_like(X)
        for i in range(X.shape[1]):
            x = X[:, i]
            diff = x[self.rows] - x[self.cols]
            out[:, i] = self.row_sums(w * diff * diff)
        return out

    def entropy_term(self):
        """sum p log p (the constant part of KL(P || Q)), by NumPy's pairwise sum:
        OpenBLAS's dot product gave other last bits on 1 and 2 threads.  In place in
        one temporary: each fresh array of multi-scale SNE's 15M pairs (Fashion-MNIST
        10k) took up to 0.27 s of page faults on the 2-core VM, 0.56 s per stage."""
        xp = self.be.xp
        terms = xp.where(self.p > 0, self.p, 1.0)
        xp.log(terms, out=terms)
        terms *= self.p
        return float(terms.sum())


class Objective:
    """Base class: subclasses define value_and_grad, attractive_weights and the
    Hessian pieces used by the directions (optim/directions.py)."""

    name = None
    kernel = None           # repulsive kernel of the N-body sums
    divergence = False      # KL-type objectives carry the constant sum p log p
    curvature_shift = 0.0   # c in the directions' B + c I (objectives/penalty.py)
    # True where attractive_weights give the attractive Hessian's upper bound
    # (t-SNE: at X = 0) rather than the exact constant one (optim/directions.py).
    attractive_curvature_is_bound = False
    # X is a layout of points (the line search's trust region, optim/loop.py).
    is_layout = True

    def __init__(self, P, backend, dtype, nbody="exact", accuracy=None, owned=False):
        self.be = backend
        self.dtype = np.dtype(dtype)
        self.pairs = PairSet(backend, P, self.dtype, owned)
        self.n = self.pairs.n
        self.nbody = nbody              # a resolved engine name (nbody/)
        self.accuracy = dict(accuracy or {})   # its accuracy; schedules change it
        if self.divergence:
            self.constant = self.pairs.entropy_term()

    def sums(self, X, kernels, Y=None, weights=None, **shifts):
        """N-body kernel sums (S, SX) for each kernel, by the configured engine."""
        return engine_sums(self.be, self.nbody, X, kernels, Y=Y, weights=weights,
                           accuracy=self.accuracy, **shifts)

    def value(self, X):
        return self.value_and_grad(X)[0]

    def attractive_weights(self, X=None):
        """W+ whose Laplacian gives the attractive Hessian 4 L+ (at X = 0 for t-SNE,
        whose weights depend on the layout: at ``X`` where given)."""
        return self.pairs.P

    def xx_coefficients(self, X):
        """D -> c(D): the psd repulsive part 8 L^xx_ii of the Hessian has pair
        weights c_nm (x_in - x_im)^2 (SD- direction)."""
        raise ValueError(f"optimizer 'sd-' is not available for {self.name}")

    def xx_times(self, X, coef, V=None):
        """8 L^xx_ii V for pair coefficients ``coef`` (see xx_coefficients); its
        diagonal when V is None.  One blocked N-body pass."""
        return 8.0 * xx_terms(self.be, X, coef, V)

    def hessian_diagonal(self, X):
        """Diagonal of the full Hessian, (N, d)."""
        raise ValueError(f"optimizer 'diagh' is not available for {self.name}")
