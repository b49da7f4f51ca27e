"""The samples each chunk and each rank of several chunks hold under a schedule, at one batch, from its events in a few array passes."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from gpipe_sim.plan.held import DENSE_LEVELS, MAX_ROWS, level_matrix, undominated
from gpipe_sim.planner.held_orders import pass_events
from gpipe_sim.schedule.registry import rank_chunks


@dataclass(frozen=True)
class EventTable:
    """Every rank's events (`pass_events`) in one array, rank after rank (rank r's from
    `rank_cuts[r]`), each event's chunk, and the permutation `by_chunk` that groups them by chunk,
    each chunk's in program order (chunk c's from `chunk_starts[c]`)."""

    placement: np.ndarray  # (chunks,) each one's rank
    owned_matrix: np.ndarray  # (K, width) each rank's chunks in model order, -1 past its own
    column: np.ndarray  # 3 x (the chunk's place among its rank's chunks) + category
    micro: np.ndarray
    sign: np.ndarray
    chunk: np.ndarray
    rank_cuts: np.ndarray
    by_chunk: np.ndarray
    chunk_starts: np.ndarray
    kept_only: bool  # only KEPT events: a chunk holds its running sum


@lru_cache(maxsize=4096)
def event_table(name: str, K: int, M: int, v: int, remat: str) -> EventTable:
    """The `EventTable` of schedule `name` at (K, M, v, remat), made once."""
    events = pass_events(name, K, M, v, remat)
    chunks = len(events.placement)
    # a stable sort of small integers is a radix sort
    by_chunk = np.argsort(events.chunk.astype(np.int16 if chunks < 2**15 else np.int64), kind="stable")
    starts = np.searchsorted(events.chunk[by_chunk], np.arange(chunks))
    owned = rank_chunks(events.placement, K)
    owned_matrix = np.full((K, max(len(mine) for mine in owned)), -1, dtype=np.int64)
    for r, mine in enumerate(owned):
        owned_matrix[r, :len(mine)] = mine
    return EventTable(np.asarray(events.placement, dtype=np.int64), owned_matrix, events.column, events.micro,
                      events.sign, events.chunk, events.rank_cuts, by_chunk, starts, events.kept_only)


@dataclass(frozen=True)
class HeldSamples:
    """What a schedule's chunks hold at one batch, in whole-activation samples: per chunk, the most
    it holds at once; per listed rank (of several chunks, whose moments are few enough to list),
    rows of what each of its chunks holds at once, covering every undominated moment (each
    undominated moment is <= some row, each row <= some moment: the same most for any non-negative
    weights). Rows are grouped by rank, in rank order; column j is the rank's j-th chunk in model
    order (`owned[r, j]`, -1 and 0 samples past a rank's own chunks)."""

    per_chunk: np.ndarray  # (chunks,)
    placement: np.ndarray  # (chunks,) each one's rank
    owned: np.ndarray  # (K, width) of chunk indices
    rows: np.ndarray  # (rows, width)
    row_rank: np.ndarray  # (rows,)
    row_starts: np.ndarray  # where each listed rank's rows start
    listed: np.ndarray  # (listed ranks,) in rank order, one per row_starts

    def rank_rows(self, r: int) -> np.ndarray | None:
        """Rank r's rows over its own chunks, or None where not listed."""
        if r not in self.listed:
            return None
        return self.rows[self.row_rank == r][:, :int((self.owned[r] >= 0).sum())]


def held_levels(table: EventTable, samples: np.ndarray) -> HeldSamples:
    """The `HeldSamples` of a schedule's events for micro-batches of `samples` each. A chunk holds,
    after each of its events, the running sums of its kept, input-only and re-computed samples:
    kept + the lesser of the other two count whole. A rank of several chunks is listed unless
    its level matrix is too large (`DENSE_LEVELS`) or, where it has more moments than `MAX_ROWS`,
    more undominated levels than that (as `held_activations` lists ranks); its rows are then the
    empty one and the moments after a rise of a chunk not followed by another rise (every other
    moment is below the one before or the one after it), or, where it has more than `MAX_ROWS`
    moments, its undominated levels."""
    value = table.sign * samples[table.micro]
    sorted_eff = _effective_after(table, value)
    # every chunk has events (each runs every micro-batch's forward), so each segment is non-empty
    per_chunk = np.maximum(np.maximum.reduceat(sorted_eff, table.chunk_starts), 0.0)
    owned = table.owned_matrix
    width = owned.shape[1]
    counts, widths = np.diff(table.rank_cuts), (owned >= 0).sum(axis=1)
    dense = (widths > 1) & (counts * 3 * widths <= DENSE_LEVELS)
    small = dense & (counts + 1 <= MAX_ROWS)  # no more undominated rows than moments
    parts = [_peak_rows(table, sorted_eff, small)] if small.any() else []
    for r in np.flatnonzero(dense & ~small):
        lo, hi = int(table.rank_cuts[r]), int(table.rank_cuts[r + 1])
        rows = undominated(level_matrix(table.column[lo:hi], value[lo:hi], 3 * int(widths[r])), MAX_ROWS)
        if rows is not None:
            level = np.zeros((len(rows), width))
            level[:, :widths[r]] = rows[:, 0::3] + np.minimum(rows[:, 1::3], rows[:, 2::3])
            parts.append((level, np.full(len(rows), r)))
    if not parts:
        return HeldSamples(per_chunk, table.placement, owned, np.zeros((0, width)), _NO_RANKS, _NO_RANKS, _NO_RANKS)
    rows = np.concatenate([p[0] for p in parts])
    row_rank = np.concatenate([p[1] for p in parts])
    order = np.argsort(row_rank, kind="stable")
    rows, row_rank = rows[order], row_rank[order]
    starts = np.flatnonzero(np.concatenate(([True], row_rank[1:] != row_rank[:-1])))
    return HeldSamples(per_chunk, table.placement, owned, rows, row_rank, starts, row_rank[starts])


_NO_RANKS = np.zeros(0, dtype=np.int64)


def _effective_after(table: EventTable, value: np.ndarray) -> np.ndarray:
    """Per event, grouped by chunk (`by_chunk`): the whole-activation samples its chunk holds after it."""
    sorted_value = value[table.by_chunk]
    lengths = np.diff(np.append(table.chunk_starts, len(value)))

    def running(category_value: np.ndarray) -> np.ndarray:
        total = np.cumsum(category_value)
        base = np.concatenate(([0.0], total))[table.chunk_starts]  # the sum before each chunk's first event
        return total - np.repeat(base, lengths)

    if table.kept_only:  # input-only and re-computed stay 0: kept + min(0, 0) is kept
        return running(sorted_value)
    category = table.column[table.by_chunk] % 3
    kept, held_input, recomputed = (running(np.where(category == k, sorted_value, 0.0)) for k in range(3))
    return kept + np.minimum(held_input, recomputed)


def _peak_rows(table: EventTable, sorted_eff: np.ndarray, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of the `ranks` (a mask) listed from their moments, with each row's rank: the empty
    row, then what each chunk holds after each event that raises its chunk and is the rank's last
    or followed by one that does not (a moment after a fall or no change is below the one before,
    one followed by a rise below the one after)."""
    n, owned = len(sorted_eff), table.owned_matrix
    before = np.concatenate(([0.0], sorted_eff[:-1]))
    before[table.chunk_starts] = 0.0  # each chunk holds nothing before its first event
    rises = np.empty(n, dtype=bool)
    rises[table.by_chunk] = sorted_eff > before
    event_rank = np.repeat(np.arange(len(owned)), np.diff(table.rank_cuts))
    last = np.zeros(n, dtype=bool)
    last[table.rank_cuts[1:][table.rank_cuts[1:] > 0] - 1] = True
    followed = np.concatenate((rises[1:], [False])) & ~last
    peaks = np.flatnonzero(rises & ~followed & ranks[event_rank])
    # after event i, chunk c holds what its last event at or before i left: found by (chunk, place)
    keys = table.chunk[table.by_chunk] * n + table.by_chunk
    chunks = owned[event_rank[peaks]]  # (peaks, width)
    found = np.searchsorted(keys, chunks * n + peaks[:, None], side="right") - 1
    mine = (chunks >= 0) & (found >= table.chunk_starts[np.maximum(chunks, 0)])
    rows = np.where(mine, sorted_eff[np.maximum(found, 0)], 0.0)
    listed = np.flatnonzero(ranks)
    return (np.concatenate((np.zeros((len(listed), owned.shape[1])), rows)),
            np.concatenate((listed, event_rank[peaks])))
