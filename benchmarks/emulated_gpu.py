"""Run a benchmark script's GPU branches on the CPU emulator of CUDA, at sizes
the emulator can manage, to catch a crash before it costs device time:

    python benchmarks/emulated_gpu.py bench_nbody.py --backend gpu --parts scaling --max-n 3000

The "gpu" backend becomes tests/emulated_cuda.py's (NumPy arrays, kernels/*.cu
compiled by g++ and run with every CUDA thread a fiber).  Its timings mean
nothing, so results and plots go to a temporary folder, not benchmarks/results.
"""
import runpy
import sys
import tempfile
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path[:0] = [str(here), str(here.parent / "tests"), str(here.parent)]

import common  # noqa: E402
from emulated_cuda import install  # noqa: E402

install()
common.RESULTS = Path(tempfile.mkdtemp(prefix="gpuembed-emulated-results-"))
print(f"results of this emulated run go to {common.RESULTS}")
script, sys.argv = here / sys.argv[1], sys.argv[1:]
runpy.run_path(str(script), run_name="__main__")
