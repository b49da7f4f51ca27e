"""Schedule-aware memory: the samples each chunk holds under a schedule, and the partition's memory table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from gpipe_sim.schedule.actions import Kind
from gpipe_sim.schedule.registry import rank_chunks

KEPT, INPUT_ONLY, RECOMPUTED = 0, 1, 2  # what a chunk holds for a micro-batch (see plan/memory_timeline.py)


@dataclass(frozen=True)
class HeldActivations:
    """The samples whose activations each chunk holds over its rank's program, counted in program
    order exactly as the memory accountant (`gpipe_sim.plan.memory_timeline`) counts bytes: a forward adds
    its micro-batch's samples (as KEPT, or INPUT_ONLY under re-materialization) at its start, a
    re-computation adds them as RECOMPUTED, the last backward pass removes them at its end.

    Schedule-agnostic: any schedule's programs give their own counts, no name is special-cased.
    `events[r]` is rank r's sequence of (column, signed samples), column = 3 * (the chunk's place
    among the rank's chunks) + category; `rows[c]` the distinct (kept, input-only, recomputed)
    sample counts chunk c alone holds at some point (dominated rows dropped, the empty row kept);
    `rank_rows[r]` the same over all of rank r's columns (None where too many to list).
    """

    placement: tuple[int, ...]
    rank_chunks: tuple[tuple[int, ...], ...]
    events: tuple[tuple[np.ndarray, np.ndarray], ...]
    rows: tuple[np.ndarray, ...]
    rank_rows: tuple[np.ndarray | None, ...]


def held_activations(schedule: Any, sizes: Sequence[int]) -> HeldActivations:
    """Count, per rank and per chunk, the samples whose activations a `Schedule`'s programs hold."""
    placement = tuple(int(r) for r in schedule.placement)
    held_chunks = rank_chunks(placement, schedule.ranks)
    samples = np.asarray(sizes, dtype=float)
    last = len(samples) - 1
    events = tuple((column, sign * samples[np.minimum(micro, last)]) for column, micro, sign in held_events(schedule))
    local = local_chunks(placement, held_chunks)
    rows = []
    for cc in range(len(placement)):
        col, val = events[placement[cc]]
        mine = (col // 3) == local[cc]
        rows.append(_levels(col[mine] % 3, val[mine], 3, cap=None))
    rank_rows = tuple(
        _levels(col, val, 3 * len(mine)) if len(col) * 3 * len(mine) <= DENSE_LEVELS else None
        for (col, val), mine in zip(events, held_chunks)
    )
    return HeldActivations(placement, held_chunks, events, tuple(rows), rank_rows)


def local_chunks(placement: Sequence[int], held_chunks: Sequence[Sequence[int]]) -> np.ndarray:
    """Each chunk's place among its rank's chunks (in model order)."""
    local = np.zeros(len(placement), dtype=np.int64)
    for mine in held_chunks:
        local[list(mine)] = np.arange(len(mine))
    return local


def held_events(schedule: Any) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
    """Per rank, in program order, the events that change what its chunks hold, as `held_activations`
    counts them: (column, micro-batch, sign), column = 3 * (the chunk's place among the rank's
    chunks) + category (KEPT, INPUT_ONLY, RECOMPUTED): a forward adds its micro-batch (KEPT or
    INPUT_ONLY) at its start, a re-computation adds it as RECOMPUTED, the last backward pass
    removes it at its end. The samples held are the signed micro-batch sizes summed in order."""
    c = schedule.columns
    placement = tuple(int(r) for r in schedule.placement)
    local = local_chunks(placement, rank_chunks(placement, schedule.ranks))
    kind, save = c.kind, c.save.astype(bool)
    chunk = np.clip(c.chunk, 0, max(len(placement) - 1, 0)).astype(np.int64)
    micro = np.clip(c.micro_batch, 0, schedule.micro_batches - 1).astype(np.int64)
    fwd, rec = kind == Kind.FORWARD, kind == Kind.RECOMPUTE
    last = (kind == Kind.BACKWARD) | (kind == Kind.BACKWARD_WEIGHT)
    parts = [  # (selection, order within the action, category, sign)
        (fwd & save, 0, KEPT, 1.0), (fwd & ~save, 0, INPUT_ONLY, 1.0), (rec, 0, RECOMPUTED, 1.0),
        (last & save, 1, KEPT, -1.0), (last & ~save, 1, INPUT_ONLY, -1.0), (last & ~save, 2, RECOMPUTED, -1.0),
    ]
    action = np.concatenate([np.flatnonzero(sel) for sel, *_ in parts])
    order = np.concatenate([np.full(int(sel.sum()), o) for sel, o, *_ in parts])
    category = np.concatenate([np.full(int(sel.sum()), cat) for sel, _, cat, _ in parts])
    sign = np.concatenate([np.full(int(sel.sum()), sg) for sel, _, _, sg in parts])
    sort = np.lexsort((order, action))
    action, category, sign = action[sort], category[sort], sign[sort]
    column = local[chunk[action]] * 3 + category
    mb = micro[action]
    cuts = np.searchsorted(action, c.offsets)
    return tuple((column[cuts[r]:cuts[r + 1]], mb[cuts[r]:cuts[r + 1]], sign[cuts[r]:cuts[r + 1]])
                 for r in range(schedule.ranks))


DENSE_LEVELS = 2_000_000  # entries of a rank's level matrix worth listing
MAX_ROWS = 4096  # undominated rows kept (beyond, the rank is evaluated from its events)


def _levels(col: np.ndarray, val: np.ndarray, width: int, cap: int | None = MAX_ROWS) -> np.ndarray | None:
    """The distinct undominated levels (counts per column) after each event, the empty one
    included; None when there are more than `cap`."""
    return undominated(level_matrix(col, val, width), cap)


def level_matrix(col: np.ndarray, val: np.ndarray, width: int) -> np.ndarray:
    """The levels (counts per column) before the first event and after each: event i adds
    val[i] to column col[i]."""
    level = np.zeros((len(col) + 1, width))
    if len(col):
        steps = np.zeros((len(col), width))
        steps[np.arange(len(col)), col] = val
        level[1:] = np.cumsum(steps, axis=0)
    return level


_BLOCK = 2**20  # entries of one block of the pairwise comparison


def undominated(rows: np.ndarray, cap: int | None) -> np.ndarray | None:
    """The rows no other row dominates (every count >=): only they can be the peak; by total
    count, largest first (ties in `np.unique`'s order); None when more than `cap`. Rows are made
    distinct first, so a row is dominated exactly when another row is >= it everywhere (compared
    pairwise, a block of rows at a time)."""
    if len(rows) > 1:  # np.unique(rows, axis=0), faster: rows in lexicographic order, repeats dropped
        rows = rows[np.lexsort(rows.T[::-1])]
        rows = rows[np.concatenate(([True], (rows[1:] != rows[:-1]).any(axis=1)))]
    rows = rows[np.argsort(-rows.sum(axis=1), kind="stable")]
    compared = rows[:, rows.any(axis=0)]  # a column zero in every row decides nothing
    n, width = compared.shape
    if width <= 1:  # distinct rows of one count: the largest dominates the others
        kept = rows[:1] if width == 0 else rows[compared[:, 0] == compared[:, 0].max()]
    else:
        dominated = np.zeros(n, dtype=bool)
        step = max(1, _BLOCK // max(1, n * width))
        for lo in range(0, n, step):
            part = compared[lo:lo + step]
            covers = (compared[None, :, :] >= part[:, None, :]).all(axis=2)  # [part row, other row]
            dominated[lo:lo + step] = covers.sum(axis=1) > 1  # beyond the row itself
        kept = rows[~dominated]
    if cap is not None and len(kept) > cap:
        return None
    return kept


@dataclass(frozen=True)
class MemoryTable:
    """What the partition needs to know about memory: per layer, its static bytes (parameters,
    gradients, optimizer states), the activation bytes it saves per sample and the bytes per sample
    a chunk starting at it keeps as its input; the schedule's held samples; ranks' devices; and
    the usable memory of one device. Optionally per layer the most transient bytes one of its
    passes allocates on the largest micro-batch: a rank is then charged, on top of its held
    activations, the largest of its layers' (an upper bound of the simulator's peak, which adds
    the running pass's transient to the activations held at that moment; equal when the peak
    falls in the pass with the largest transient, as at a backward's start). Optionally per layer
    the optimizer update's temporaries: a rank's is the sum of its layers' `update_bytes` plus the
    largest of their `update_largest_bytes`, charged on its static bytes alone (the update runs
    when no activation is held)."""

    static_bytes: Sequence[float]
    activation_bytes: Sequence[float]
    input_bytes: Sequence[float]
    held: HeldActivations
    device_map: Sequence[int]
    capacity_bytes: float = float("inf")
    transient_bytes: Sequence[float] = ()
    update_bytes: Sequence[float] = ()
    update_largest_bytes: Sequence[float] = ()
