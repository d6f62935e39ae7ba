"""Run benchmark scripts by name: ``python benchmarks/run.py [knn ...]`` (default: all).

Each ``bench_<name>.py`` writes ``benchmarks/results/<name>.json``.
"""
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv):
    available = sorted(p.stem[len("bench_"):] for p in HERE.glob("bench_*.py"))
    names = argv or available
    unknown = [n for n in names if n not in available]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; available: {available}", file=sys.stderr)
        return 2
    status = 0
    for name in names:
        print(f"== {name}")
        status |= subprocess.call([sys.executable, str(HERE / f"bench_{name}.py")], cwd=HERE)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
