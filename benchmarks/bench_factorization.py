"""Sparse factorization for the spectral direction on the CPU: CHOLMOD (cholespy)
against SciPy's SuperLU (COLAMD), side by side in one run.

The matrix is the spectral direction's B = 4 L+ + mu I for t-SNE's joint P
(perplexity 30) on Fashion-MNIST subsets, L+ sparsified to each point's kappa
largest affinities ("full": all of P).  Reported: factorization seconds, one
solve of two right-hand sides, SuperLU's fill (nnz of L + U) and the agreement
of the two solutions.
"""
from __future__ import annotations

import argparse

import numpy as np
import scipy.sparse.linalg

from common import best_time, fashion_mnist_knn, write_result
import gpuembed as ge
from gpuembed import objectives
from gpuembed.optim import directions


FULL = 2**62        # a kappa no row reaches: the full L+


def run(sizes=(5000, 20000), kappas=(7, 15, FULL)):
    import cholespy  # noqa: F401  (the comparison needs both libraries)

    be = ge.get_backend("cpu")
    rows = []
    for n in sizes:
        _, _, sqdist, indices = fashion_mnist_knn(90, n)
        P = ge.entropic_affinities(None, 30.0, neighbors=(sqdist.astype(np.float64), indices)).P
        for kappa in kappas:
            tsne = objectives.make_objective("tsne", P, be, np.float64)
            # B as the factorizing solver assembles it, in float64: CG keeps its B in
            # float32 from SINGLE_CG_MIN_TOL up.
            B = directions.Spectral(tsne, np.zeros((n, 2)), kappa=kappa, solver="cg",
                                    cg_tol=directions.SINGLE_CG_MIN_TOL / 2).B
            assert B.dtype == np.float64
            G = np.random.default_rng(0).standard_normal((n, 2))
            G -= G.mean(axis=0)              # as the direction does: no translation part
            t_lu, lu = best_time(lambda: scipy.sparse.linalg.splu(B.tocsc(), permc_spec="COLAMD"))
            s_lu, x_lu = best_time(lambda: lu.solve(G))
            t_ch, solve = best_time(lambda: directions.factorize_cpu(B))
            s_ch, x_ch = best_time(lambda: solve(G))
            rows.append({"n": n, "kappa": "full" if kappa == FULL else kappa, "nnz": B.nnz,
                         "superlu_factor_seconds": t_lu, "superlu_solve_seconds": s_lu,
                         "superlu_fill": lu.L.nnz + lu.U.nnz,
                         "cholmod_factor_seconds": t_ch, "cholmod_solve_seconds": s_ch,
                         "relative_difference": float(np.abs(x_lu - x_ch).max()
                                                      / np.abs(x_lu).max())})
            print(rows[-1], flush=True)
    return {"perplexity": 30.0, "runs": rows}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, nargs="+", default=[5000, 20000])
    args = parser.parse_args(argv)
    write_result("factorization", run(args.n))


if __name__ == "__main__":
    main()
