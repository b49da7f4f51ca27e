"""The samples each chunk and each rank of several chunks hold under a schedule, at one batch, from its events in a few array passes."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from gpipe_sim.plan.held import DENSE_LEVELS, MAX_ROWS, level_matrix, undominated
from gpipe_sim.planner.held_orders import order_events
from gpipe_sim.schedule.registry import rank_chunks


@dataclass(frozen=True)
class EventTable:
    """Every rank's events (`order_events`) in one array, rank after rank (rank r's from
    `rank_cuts[r]`), and the permutation `by_chunk` that groups them by chunk, each chunk's in
    program order (chunk c's from `chunk_starts[c]`)."""

    owned: tuple[tuple[int, ...], ...]  # per rank, its chunks in model order
    column: np.ndarray  # 3 x (the chunk's place among its rank's chunks) + category
    micro: np.ndarray
    sign: np.ndarray
    rank_cuts: np.ndarray
    by_chunk: np.ndarray
    chunk_starts: np.ndarray


@lru_cache(maxsize=2048)
def event_table(name: str, K: int, M: int, v: int, remat: str) -> EventTable:
    """The `EventTable` of schedule `name` at (K, M, v, remat), made once."""
    placement, events = order_events(name, K, M, v, remat)
    owned = rank_chunks(placement, K)
    column = np.concatenate([col for col, _, _ in events])
    chunk = np.concatenate([np.asarray(mine, dtype=np.int64)[col // 3] for mine, (col, _, _) in zip(owned, events)])
    by_chunk = np.argsort(chunk, kind="stable")
    starts = np.searchsorted(chunk[by_chunk], np.arange(len(placement)))
    return EventTable(owned, column, np.concatenate([m for _, m, _ in events]),
                      np.concatenate([s for _, _, s in events]),
                      np.concatenate(([0], np.cumsum([len(col) for col, _, _ in events]))), by_chunk, starts)


def held_levels(table: EventTable, samples: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray | None, ...]]:
    """(per chunk, the most whole-activation samples it holds at once; per rank of several chunks,
    its moments' samples per chunk as rows, None where its level matrix is too large to list or
    for a rank of one chunk), for micro-batches of `samples` each. A chunk holds, after each of its
    events, the running sums of its kept, input-only and re-computed samples: kept + the lesser of
    the other two counts whole. A rank's rows are, for each of its moments, what each of its chunks
    holds then: at least every undominated row `held_activations` lists (the same most for any
    non-negative weights), exactly those (`undominated`) where the moments are more than it lists."""
    value = table.sign * samples[table.micro]
    effective = _effective_after(table, value)
    # every chunk has events (each runs every micro-batch's forward), so each segment is non-empty
    per_chunk = np.maximum(np.maximum.reduceat(effective[table.by_chunk], table.chunk_starts), 0.0)
    per_rank: list[np.ndarray | None] = []
    for r, mine in enumerate(table.owned):
        lo, hi = int(table.rank_cuts[r]), int(table.rank_cuts[r + 1])
        col, n = table.column[lo:hi], hi - lo
        if len(mine) == 1 or n * 3 * len(mine) > DENSE_LEVELS:
            per_rank.append(None)
        elif n + 1 <= MAX_ROWS:  # no more undominated rows than moments: all listed
            per_rank.append(_rank_rows(col // 3, effective[lo:hi], len(mine)))
        else:
            rows = undominated(level_matrix(col, value[lo:hi], 3 * len(mine)), MAX_ROWS)
            per_rank.append(None if rows is None else rows[:, 0::3] + np.minimum(rows[:, 1::3], rows[:, 2::3]))
    return per_chunk, tuple(per_rank)


def _effective_after(table: EventTable, value: np.ndarray) -> np.ndarray:
    """Per event (rank order): the whole-activation samples its chunk holds after it."""
    order = table.by_chunk
    sorted_value, category = value[order], table.column[order] % 3
    lengths = np.diff(np.append(table.chunk_starts, len(value)))
    running = []
    for k in range(3):
        total = np.cumsum(np.where(category == k, sorted_value, 0.0))
        base = np.concatenate(([0.0], total))[table.chunk_starts]  # the sum before each chunk's first event
        running.append(total - np.repeat(base, lengths))
    effective = np.empty(len(value))
    effective[order] = running[0] + np.minimum(running[1], running[2])
    return effective


def _rank_rows(local: np.ndarray, effective: np.ndarray, width: int) -> np.ndarray:
    """The distinct rows, the empty one included, of what each of a rank's `width` chunks holds
    after each of the rank's events (a chunk's figure changes at its own events only)."""
    n = len(local)
    rows = np.zeros((n + 1, width))
    steps = np.arange(n)
    for j in range(width):
        last = np.maximum.accumulate(np.where(local == j, steps, -1))
        rows[1:, j] = np.where(last >= 0, effective[np.maximum(last, 0)], 0.0)
    rows = rows[np.lexsort(rows.T[::-1])]
    return rows[np.concatenate(([True], (rows[1:] != rows[:-1]).any(axis=1)))]
