"""A chunk placement's and a partition's index arrays, made once each (the bounds ask for them per candidate)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=1024)
def placement_arrays(placement: tuple[int, ...], ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """(each chunk's rank, each of the `ranks` ranks' lowest chunk) for a chunk placement, as
    read-only arrays (a rank with no chunk: the number of chunks)."""
    owner = np.asarray(placement)
    lowest = np.full(ranks, len(placement))
    np.minimum.at(lowest, owner, np.arange(len(placement)))
    owner.flags.writeable = lowest.flags.writeable = False
    return owner, lowest


@lru_cache(maxsize=4096)
def partition_edges(counts: tuple[int, ...]) -> np.ndarray:
    """The first layer of each chunk, then the number of layers: 0 and the running sums of the
    layer counts per chunk, as a read-only array."""
    edges = np.concatenate(([0], np.cumsum(counts))).astype(int)
    edges.flags.writeable = False
    return edges
