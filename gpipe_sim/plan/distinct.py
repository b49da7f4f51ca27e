"""Sorted distinct values of a 1-D array, as `np.unique` gives them, without importing numpy.ma.

NumPy's `np.unique` without index outputs asks `np.ma.is_masked`, which imports numpy.ma (about
10 ms, a thirtieth of a `gpipe-sim simulate`'s start-up) the first time; the start-up path uses this
instead.
"""

from __future__ import annotations

import numpy as np


def distinct_sorted(values: np.ndarray) -> np.ndarray:
    """`np.unique(values)` for a 1-D array without NaN: its values sorted, repeats dropped (a new array)."""
    out = np.sort(values)
    if len(out) < 2:
        return out
    return out[np.concatenate(([True], out[1:] != out[:-1]))]
