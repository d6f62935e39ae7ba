"""The README's Python tour runs as written: a reader copies it whole."""
import re
import warnings
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text):
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_python_blocks_are_found():
    blocks = python_blocks("a\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = 2\n```\n")
    assert blocks == ["x = 1\n", "y = 2\n"]


@pytest.mark.slow
def test_readme_python_tour_runs():
    """Every Python block of the README, in order, in one namespace (it loads
    scikit-learn's digits; about 15 s on 2 cores).  A name reused for another
    value (the k-NN of new points written over the training points' k-NN) broke
    a later line of it once."""
    pytest.importorskip("sklearn")
    blocks = python_blocks(README.read_text())
    assert blocks, "no Python block in README.md"
    namespace = {}
    with warnings.catch_warnings():
        # The tour's perplexity sweep reaches 5 on the digits, where a few images
        # have as many exact duplicates: a warning, by design.
        warnings.simplefilter("ignore", RuntimeWarning)
        for block in blocks:
            exec(compile(block, str(README), "exec"), namespace)
    assert namespace["Y"].shape == (namespace["X"].shape[0], 2)
