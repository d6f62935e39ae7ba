"""The benchmark scripts still run: each at a toy size, in its own process, its
JSON written to a temporary folder (``GPUEMBED_BENCH_OUTPUT``).  The scripts
reach into internals (solve_rows, Spectral, the k-NN's selections), so a
refactor can break one unseen until a long run or a scarce GPU session finds
it: bench_factorization.py did (CG's B became float32, and SuperLU's float32
factor refused float64 right-hand sides).  Timings at these sizes mean nothing."""
import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

# (script and arguments, the JSON it writes, keys its figures must hold, what it
# needs beyond the test extra: Fashion-MNIST, Pillow for scikit-learn's sample image)
RUNS = [
    (["bench_factorization.py", "--n", "600"], "factorization", ["runs"], ["fashion_mnist"]),
    (["bench_sd_solvers.py", "--datasets", "rotating_objects_p20", "--max-iter", "30"],
     "sd_two_level", ["runs"], []),
    (["bench_entropic.py", "--n", "1500", "--no-sequential"], "entropic_n1500",
     ["cpu", "anchors", "fastest_cpu"], ["fashion_mnist"]),
    (["bench_knn.py", "--float64", "--n", "1500", "--repeat", "1"], "knn_float64_n1500", [],
     ["fashion_mnist"]),
    (["bench_knn.py", "--offset", "--n", "1500", "--repeat", "1"], "knn_offset_n1500", ["runs"],
     ["fashion_mnist"]),
    (["bench_knn.py", "--split", "0", "300", "--n", "1500", "--repeat", "1"], "knn_split_n1500",
     ["runs"], ["fashion_mnist"]),
    (["bench_knn.py", "--split", "1e8", "--split-dtype", "float64", "--split-queries", "--n",
      "1500", "--repeat", "1"], "knn_split_queries_float64_n1500", ["runs"], ["fashion_mnist"]),
    (["bench_lll.py", "--n", "2000", "--d", "4", "--landmarks", "100", "200"], "lll_n2000",
     ["d4", "kmeans"], ["fashion_mnist"]),
    (["bench_lll.py", "--swiss-roll", "--n", "3000"], "lll_swiss_roll", ["exact_seconds", "runs"],
     []),
    (["bench_msne.py", "--scaling", "--max-n", "2000", "--exact-max-n", "2000"],
     "msne_scaling", ["rows"], ["fashion_mnist"]),
    (["bench_spectral_anchors.py", "--n", "1500", "--d", "4", "--landmarks", "100", "--step",
      "16"], "spectral_anchors", ["laplacian_eigenmaps", "segmentation"],
     ["fashion_mnist", "PIL"]),
    (["profile_fit.py", "--n", "1500", "--top", "5"], "profile_cpu_n1500", ["tsne_fit"],
     ["fashion_mnist"]),
    (["bench_nbody.py", "--parts", "scaling,accuracy,tree", "--max-n", "1500",
      "--exact-max-n", "1500"], "nbody", ["scaling", "accuracy", "tree"], []),
    (["bench_mac.py", "--parts", "cost,linear,mlp-kernels", "--max-n", "1000",
      "--exact-max-n", "500", "--linear-n", "300", "--chain-iter", "3", "--kernel-calls", "1"],
     "mac", ["cost", "linear_ee_rotating_objects", "mlp_kernels"], []),
    (["bench_segmentation.py", "--step", "16"], "segmentation", ["pixels"], ["PIL"]),
    (["bench_embedding.py", "--coil", "1"], "embedding_coil1", ["coil"], []),
    (["bench_embedding.py", "--datasets", "rotating_objects", "--max-iter", "20", "--paired",
      "1"], "embedding", ["runs", "targets", "paired_targets"], []),
    (["bench_embedding.py", "--precomputed", "700"], "embedding_precomputed_n700",
     ["tsne_precomputed"], ["fashion_mnist"]),
    (["bench_embedding.py", "--graph", "700"], "embedding_graph_n700", ["tsne_graph"],
     ["fashion_mnist"]),
    (["bench_embedding.py", "--large", "700", "--subsets", "1", "--repeats", "1"],
     "embedding_n700", ["tsne_large_subsets"], ["fashion_mnist"]),
]


@functools.lru_cache(maxsize=None)
def available(need):
    if need == "PIL":
        return importlib.util.find_spec("PIL") is not None
    import gpuembed as ge

    try:
        ge.datasets.fashion_mnist()
    except (FileNotFoundError, OSError):
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("args,name,keys,needs", RUNS, ids=[run[0][0] for run in RUNS])
def test_benchmark_script_runs(tmp_path, args, name, keys, needs):
    missing = [need for need in needs if not available(need)]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    env = {**os.environ, "GPUEMBED_BENCH_OUTPUT": str(tmp_path), "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, *args], cwd=BENCHMARKS, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    record = json.loads((tmp_path / "results" / f"{name}.json").read_text())
    assert record["benchmark"] and record["commit"]
    assert set(keys) <= set(record["figures"])
