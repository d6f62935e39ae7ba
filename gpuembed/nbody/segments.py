"""Expanding groups into their items, the same way on NumPy and CuPy."""
from __future__ import annotations

import numpy as np


def expand(xp, counts):
    """For groups of sizes ``counts``: (group of each item, rank within its group)."""
    ends = xp.cumsum(counts)
    total = int(ends[-1]) if len(counts) else 0
    item = xp.arange(total)
    if xp is np:
        group = np.repeat(np.arange(len(counts)), counts)
    else:       # CuPy's repeat takes no array of counts
        group = xp.searchsorted(ends, item, side="right")
    return group, item - (ends - counts)[group]
