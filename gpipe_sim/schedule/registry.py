"""The schedule registry: a schedule family is a generator of per-rank pass orders plus its rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence, Union

import numpy as np

from gpipe_sim.errors import ScheduleError
from gpipe_sim.kept import Kept
from gpipe_sim.schedule.actions import Pass

# A generator's output: for each rank, its passes in order, as (kind, chunk, micro_batch) rows
# (`Pass` tuples, plain tuples, or an (n, 3) integer array).
RankOrders = list[Union[Sequence[Pass], Sequence[tuple[int, int, int]], np.ndarray]]
Generator = Callable[[int, int, int], RankOrders]  # (ranks K, micro-batches M, chunks per rank v)
Placement = Callable[[int, int], tuple[int, ...]]  # (K, v) -> the rank of each chunk 0 .. K*v-1
Check = Callable[[int, int, int], "str | None"]  # (K, M, v) -> one line naming the field, or None


def looped(ranks: int, chunks: int) -> tuple[int, ...]:
    """Chunk c on rank c mod K (Megatron's virtual stages; one chunk per rank when v = 1)."""
    return tuple(c % ranks for c in range(ranks * chunks))


def v_shape(ranks: int, chunks: int) -> tuple[int, ...]:
    """Two chunks per rank in a V: rank r holds chunks r and 2K-1-r (ZB-V, DualPipeV)."""
    return tuple(c if c < ranks else 2 * ranks - 1 - c for c in range(ranks * chunks))


def rank_chunks(placement: Sequence[int], ranks: int) -> tuple[tuple[int, ...], ...]:
    """The placement read the other way: per rank of `ranks`, the chunks it holds (placement[c]
    is chunk c's rank), in model order."""
    held: list[list[int]] = [[] for _ in range(ranks)]
    for chunk, owner in enumerate(placement):
        held[int(owner)].append(chunk)
    return tuple(tuple(chunks) for chunks in held)


def one_chunk(name: str) -> Check:
    """The check of a family that runs one chunk per rank."""

    def check(ranks: int, micro_batches: int, chunks: int) -> str | None:
        if chunks != 1:
            return (f"pipeline.chunks: the {name} schedule runs one chunk per rank, got {chunks} "
                    f"(interleaved_1f1b and looped_bfs run several)")
        return None

    check.chunks_per_rank = 1  # type: ignore[attr-defined]
    return check


def fixed_chunks(name: str, count: int) -> Check:
    """The check of a family that needs exactly `count` chunks per rank."""

    def check(ranks: int, micro_batches: int, chunks: int) -> str | None:
        if chunks != count:
            return f"pipeline.chunks: the {name} schedule runs {count} chunks per rank, got {chunks}"
        return None

    check.chunks_per_rank = count  # type: ignore[attr-defined]
    return check


def fill_drain_bubble(ranks: int, micro_batches: int, chunks: int = 1) -> float:
    """(K-1)/(v*M+K-1): the idle share of a fill-drain pipeline of v*M chunk passes per rank
    (GPipe's (K-1)/(M+K-1) at v = 1); the default analytic bubble of a registered family."""
    return (ranks - 1) / (chunks * micro_batches + ranks - 1)


@dataclass(frozen=True)
class ScheduleFamily:
    """A registered schedule: how it orders passes, where its chunks live, what it accepts."""

    name: str
    generate: Generator
    placement: Placement = looped
    check: Check | None = None
    analytic_bubble: Callable[[int, int, int], float] = fill_drain_bubble
    description: str = ""
    chunks_per_rank: int | None = None  # the chunks per rank it runs; None: any v (interleaved families)

    @property
    def default_chunks(self) -> int:
        """The chunks per rank to run when none is given: its fixed count, or
        MULTI_CHUNK_DEFAULT for a family whose point is running several."""
        return self.chunks_per_rank if self.chunks_per_rank is not None else MULTI_CHUNK_DEFAULT

    def problem(self, ranks: int, micro_batches: int, chunks: int) -> str | None:
        """Why (K, M, v) cannot run this schedule, as one line naming the field; None if it can."""
        return self.check(ranks, micro_batches, chunks) if self.check is not None else None


SCHEDULES: dict[str, ScheduleFamily] = {}
MULTI_CHUNK_DEFAULT = 2  # v for an interleaved family when none is given (v = 1 is not interleaving)


def register(name: str, *, placement: Placement = looped, check: Check | None = None,
             analytic_bubble: Callable[[int, int, int], float] = fill_drain_bubble,
             description: str = "", chunks_per_rank: int | None = None) -> Callable[[Generator], Generator]:
    """Register a generator under `name`; it becomes valid in `pipeline.schedule`.

    `chunks_per_rank` is the fixed v the family runs (None: any v); by default the count its
    `check` states (`one_chunk`, `fixed_chunks`), or 2 for a V-shaped placement.

    The generator returns, for each of the K ranks, the passes (forward, backward, or the split
    backward_input / backward_weight) of the chunks `placement` puts on that rank, in the order
    the rank runs them. Transfers, re-computation and the update are added by the lowering.
    """

    def add(fn: Generator) -> Generator:
        doc = (fn.__doc__ or "").strip().splitlines()
        chunks = chunks_per_rank if chunks_per_rank is not None else getattr(check, "chunks_per_rank", None)
        if chunks is None and placement is v_shape:
            chunks = 2
        SCHEDULES[name] = ScheduleFamily(name, fn, placement, check, analytic_bubble,
                                         description or (doc[0] if doc else name), chunks)
        return fn

    return add


def schedule_family(name: str) -> ScheduleFamily:
    """The registered family, or ScheduleError naming the choices."""
    if name not in SCHEDULES:
        raise ScheduleError(f"pipeline.schedule: unknown schedule {name!r} (choose from {', '.join(SCHEDULES)})")
    return SCHEDULES[name]


# (family, K, M, v) -> its generated orders as read-only (n, 3) arrays; the planner's bounds ask a
# few in turn (K = 64, M = 128, v = 2 hold 49,152 passes, 1.2 MB)
_GENERATED: Kept[list[np.ndarray]] = Kept(32)


def generated_orders(name: str, ranks: int, micro_batches: int, chunks: int) -> list[np.ndarray]:
    """The registered family `name`'s passes for (K, M, v), rank by rank, each rank's an (n, 3)
    int64 array of (kind, chunk, micro_batch) rows in its order, read-only; kept for the next
    calls per family object (a family registered anew under the name is asked anew). For a (K,
    M, v) the family accepts (`ScheduleFamily.problem`)."""
    family = schedule_family(name)

    def make() -> list[np.ndarray]:
        orders = [np.asarray(order, dtype=np.int64).reshape(-1, 3)
                  for order in family.generate(ranks, micro_batches, chunks)]
        for order in orders:
            order.flags.writeable = False
        return orders
    return _GENERATED.get((family, ranks, micro_batches, chunks), make)
