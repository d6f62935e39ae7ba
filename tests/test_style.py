"""Habits of the source that readers rely on."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_source_lines_fit_100_columns():
    """The package, its tests, benchmarks and CUDA kernels, outside hidden folders
    (caches); the README's own prose is kept to the same width by hand, its
    tables run longer."""
    sources = [path for folder in ("gpuembed", "tests", "benchmarks", "kernels")
               for path in sorted((ROOT / folder).rglob("*"))
               if path.suffix in (".py", ".cu", ".h")
               and not any(part.startswith(".") for part in path.relative_to(ROOT).parts)]
    too_long = [f"{path.relative_to(ROOT)}:{number}" for path in sources
                for number, line in enumerate(path.read_text().splitlines(), 1)
                if len(line) > 100]
    assert not too_long, too_long
