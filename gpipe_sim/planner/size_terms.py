"""One cost table's figures per micro-batch size, stacked over the sizes it priced so that many M read them at once."""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from gpipe_sim.planner.bounds import CostTable
from gpipe_sim.planner.segments import cumulative_rows

_RECOMPUTES = (0.0, 1.0)


def _stacked(rows: Iterable[np.ndarray]) -> np.ndarray:
    """The rows as one C-ordered read-only array (each row contiguous, as the array it was)."""
    out = np.array(list(rows), dtype=float)
    out.flags.writeable = False
    return out


class SizeTerms:
    """For the micro-batch sizes `sizes` (ascending) of one cost table, row s of each array the
    table's own figure for sizes[s], bit for bit: `per_pass[r]` and `weight[r]` its
    `CostTable.pass_terms(b, r)` (r = 0.0 kept, 1.0 re-computed); `forward` and `backward` one
    micro-batch's forward and the cheaper of its full and input-gradient backward per layer
    (`candidate_work`'s), `chain` their sum over the layers (each row summed alone, as a copy) and
    `forward_cum`, `backward_cum` their running sums (`segments.cumulative` of each row)."""

    def __init__(self, table: CostTable, sizes: Sequence[int]) -> None:
        table.price(sizes)  # each twin at every size in one array pass
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.per_pass: dict[float, np.ndarray] = {}
        self.weight: dict[float, np.ndarray] = {}
        for r in _RECOMPUTES:
            terms = [table.pass_terms(b, r) for b in sizes]
            self.per_pass[r], self.weight[r] = _stacked(t[0] for t in terms), _stacked(t[1] for t in terms)
        times = [table.times(b) for b in sizes]
        self.forward = _stacked(t[:, 0] for t in times)
        self.backward = _stacked(np.minimum(t[:, 1], t[:, 2]) for t in times)
        self.chain = np.array([float(f.sum() + b.sum()) for f, b in zip(self.forward, self.backward)])
        self.forward_cum, self.backward_cum = cumulative_rows(self.forward), cumulative_rows(self.backward)

    def has(self, sizes: Iterable[int]) -> bool:
        """Whether every one of `sizes` has its row."""
        wanted = np.fromiter(sizes, dtype=np.int64)
        return bool(np.isin(wanted, self.sizes).all())

    def rows(self, sizes: np.ndarray) -> np.ndarray:
        """The row of each of `sizes` (any index, in range, for a size without one: read it masked)."""
        return np.minimum(np.searchsorted(self.sizes, sizes), len(self.sizes) - 1)
