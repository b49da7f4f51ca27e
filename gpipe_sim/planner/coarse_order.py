"""The coarse queue's (bound, index) order, sorted a chunk at a time as the search reads it: most of it is pruned unread."""

from __future__ import annotations

import numpy as np

FIRST_CHUNK = 1 << 16  # pairs sorted before the search reads the first (each later chunk twice the last)


class CoarseOrder:
    """The pairs (bounds[j], indices[j]) (indices ascending) in the order of (bound, index), as a
    stable argsort of the bounds gives them (NaN last), read from the front: `bounds` and `indices`
    are lists of the pairs sorted so far, `more()` sorts the next chunk onto them, and `rest(p)`
    gives the pairs from the p-th on in any order. A chunk is every pair whose bound is at most the
    chunk's largest, so no pair left unsorted precedes one sorted."""

    def __init__(self, bounds: np.ndarray, indices: np.ndarray) -> None:
        self._bounds, self._indices = bounds, indices  # not sorted yet, in index order
        self.bounds: list[float] = []
        self.indices: list[int] = []
        self._chunk = FIRST_CHUNK
        self._len = len(indices)

    def __len__(self) -> int:
        return self._len

    def more(self) -> None:
        """Sort the next chunk of pairs (at least one, while any is left) onto `bounds` and `indices`."""
        bounds, indices = self._bounds, self._indices
        if len(bounds) > self._chunk:
            cut = np.partition(bounds, self._chunk - 1)[self._chunk - 1]  # the chunk's largest bound
            if cut == cut:  # not NaN: every bound up to it (the NaN, never at most, sort last)
                chosen = bounds <= cut
                self._bounds, self._indices = bounds[~chosen], indices[~chosen]
                bounds, indices = bounds[chosen], indices[chosen]
                self._chunk *= 2
            else:
                self._bounds, self._indices = bounds[:0], indices[:0]
        else:
            self._bounds, self._indices = bounds[:0], indices[:0]
        order = np.argsort(bounds, kind="stable")  # ties in index order
        self.bounds += bounds[order].tolist()
        self.indices += indices[order].tolist()

    def rest(self, p: int) -> tuple[np.ndarray, np.ndarray]:
        """(bounds, indices) of the pairs from the p-th on (p <= the pairs sorted so far), in any order."""
        return (np.concatenate((np.array(self.bounds[p:], dtype=float), self._bounds)),
                np.concatenate((np.array(self.indices[p:], dtype=np.int64), self._indices)))
