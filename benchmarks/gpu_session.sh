#!/usr/bin/env bash
# The GPU checks and benchmarks, in parts that each fit one 10-minute device call:
#
#   bash benchmarks/gpu_session.sh tests    # the gpu-marked tests (kernels vs NumPy references)
#   bash benchmarks/gpu_session.sh bench    # k-NN, entropic affinities, N-body engines up to 1e6
#   bash benchmarks/gpu_session.sh large    # EE of 1e6 points with the FGT (the 50 ms / 60 s targets)
#   bash benchmarks/gpu_session.sh embedding  # the optimizers on Fashion-MNIST 70k, exact engine
#
# Before spending device time, the same scripts' GPU branches can run here on the
# CUDA emulator at small sizes, e.g.
#   python3 benchmarks/emulated_gpu.py bench_nbody.py --backend gpu --parts large --large-n 4000
# (every part ran that way before its first GPU call; see the README).
#
# Fashion-MNIST travels with the working tree: before the first call, here,
#   mkdir -p .fmnist && cp /usr/share/datasets/fashion-mnist/*.gz .fmnist/
# and name .fmnist in the call's carry (it is git-ignored, 31 MB).
# Logs and result JSON go to $OUT when it is set (the device tool), else to /tmp.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
[ -d .fmnist ] && export GPUEMBED_FASHION_MNIST=$PWD/.fmnist
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"

case "${1:-}" in
tests)
    python3 -m pytest -m gpu -q -rs -p no:cacheprovider 2>&1 | tee "$out/gpu_tests.log"
    ;;
bench)
    (cd benchmarks &&
     python3 bench_knn.py --gpu-only &&
     python3 bench_entropic.py --gpu-only &&
     python3 bench_nbody.py --backend gpu --parts scaling,accuracy,crossover \
         --max-n 1000000 --exact-max-n 200000 --suffix _gpu) 2>&1 | tee "$out/gpu_bench.log"
    cp benchmarks/results/knn_gpu.json benchmarks/results/entropic_gpu.json \
       benchmarks/results/nbody_gpu.json benchmarks/results/nbody_scaling_gpu.png "$out/"
    ;;
large)
    (cd benchmarks &&
     python3 bench_nbody.py --backend gpu --parts large --suffix _gpu) 2>&1 \
        | tee "$out/gpu_large.log"
    cp benchmarks/results/nbody_gpu.json "$out/"
    ;;
embedding)
    (cd benchmarks &&
     python3 bench_embedding.py --backend gpu --n 70000 --suffix _gpu) 2>&1 \
        | tee "$out/gpu_embedding.log"
    cp benchmarks/results/embedding_gpu.json benchmarks/results/embedding_*70000*_gpu.png "$out/"
    ;;
*)
    echo "usage: $0 tests|bench|large|embedding" >&2
    exit 2
    ;;
esac
