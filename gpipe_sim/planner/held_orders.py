"""The held-activation events of a registered schedule read from its generator's pass orders, without lowering them into programs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpipe_sim.plan.held import INPUT_ONLY, KEPT, RECOMPUTED, local_chunks
from gpipe_sim.schedule.actions import Kind
from gpipe_sim.schedule.lower import saves_activations
from gpipe_sim.schedule.registry import generated_orders, rank_chunks, schedule_family

_F, _B, _I, _W = int(Kind.FORWARD), int(Kind.BACKWARD), int(Kind.BACKWARD_INPUT), int(Kind.BACKWARD_WEIGHT)
_NONE = -1  # no event in that slot

# Per pass kind and whether its micro-batch's forward kept its activations: the (category, sign)
# of the up to three events the pass makes, in program order (`gpipe_sim.schedule.lower` puts the
# re-computation just before the first backward pass of a forward that did not keep them):
#   forward: + kept, or + input only;
#   full backward: - kept, or (re-computation) + re-computed, then - input only, - re-computed;
#   input-gradient pass: nothing, or (re-computation) + re-computed;
#   weight pass (the last): - kept, or - input only, - re-computed.
_SLOTS: dict[tuple[int, bool], tuple[tuple[int, float], ...]] = {
    (_F, True): ((KEPT, 1.0),), (_F, False): ((INPUT_ONLY, 1.0),),
    (_B, True): ((KEPT, -1.0),), (_B, False): ((RECOMPUTED, 1.0), (INPUT_ONLY, -1.0), (RECOMPUTED, -1.0)),
    (_I, True): (), (_I, False): ((RECOMPUTED, 1.0),),
    (_W, True): ((KEPT, -1.0),), (_W, False): ((INPUT_ONLY, -1.0), (RECOMPUTED, -1.0)),
}


def _slot_tables() -> tuple[np.ndarray, np.ndarray]:
    """[2 x pass kind + kept] -> three slots of category (-1: none) and sign."""
    size = max(_F, _B, _I, _W) + 1
    category = np.full((size * 2, 3), _NONE, dtype=np.int64)
    sign = np.zeros((size * 2, 3))
    for (kind, kept), slots in _SLOTS.items():
        for s, (cat, sg) in enumerate(slots):
            category[kind * 2 + int(kept), s], sign[kind * 2 + int(kept), s] = cat, sg
    return category, sign


_CATEGORY, _SIGN = _slot_tables()


@dataclass(frozen=True)
class PassEvents:
    """A schedule's held-activation events, every rank's in one array, rank after rank (rank r's
    from `rank_cuts[r]`): each one's column (3 x its chunk's place among its rank's chunks +
    category), micro-batch, sign and chunk."""

    placement: tuple[int, ...]
    column: np.ndarray
    micro: np.ndarray
    sign: np.ndarray
    chunk: np.ndarray
    rank_cuts: np.ndarray
    kept_only: bool  # every event is a KEPT one (every forward keeps its activations)


def pass_events(name: str, K: int, M: int, v: int, remat: str) -> PassEvents:
    """The events that `gpipe_sim.plan.held.held_events` reads from the lowered programs of
    schedule `name` at (K, M, v, remat), from the family's pass orders alone (the same events in
    the same order: lowering adds transfers, the re-computations and the update around the passes,
    in their order). For a (K, M, v) the family accepts (`ScheduleFamily.problem`)."""
    family = schedule_family(name)
    placement = tuple(int(r) for r in family.placement(K, v))
    local = local_chunks(placement, rank_chunks(placement, K))
    kept = np.array([saves_activations(remat, m, M) for m in range(M)], dtype=np.int64)  # type: ignore[arg-type]
    orders = generated_orders(name, K, M, v)
    passes = np.concatenate(orders)  # every rank's, rank after rank
    op, chunk, micro = passes[:, 0], passes[:, 1], passes[:, 2]
    pass_cuts = np.cumsum([0] + [len(o) for o in orders])
    if kept.all():  # a pass of a kept forward makes at most one event, in its first slot
        category, sign = _CATEGORY[op * 2 + 1, 0], _SIGN[op * 2 + 1, 0]
        present = category != _NONE
        cuts = np.concatenate(([0], np.cumsum(present)))[pass_cuts]
        return PassEvents(placement, (local[chunk] * 3 + category)[present], micro[present], sign[present],
                          chunk[present], cuts, kept_only=True)
    slot = op * 2 + kept[micro]
    category, sign = _CATEGORY[slot], _SIGN[slot]  # [pass, slot]
    present = category != _NONE
    shape = category.shape
    # each rank's events end where its passes do
    cuts = np.concatenate(([0], np.cumsum(present.sum(axis=1))))[pass_cuts]
    return PassEvents(placement, (local[chunk][:, None] * 3 + category)[present],
                      np.broadcast_to(micro[:, None], shape)[present], sign[present],
                      np.broadcast_to(chunk[:, None], shape)[present], cuts, kept_only=False)


def order_events(name: str, K: int, M: int, v: int, remat: str
                 ) -> tuple[tuple[int, ...], tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]]:
    """`pass_events` as the chunk placement and, per rank, its (column, micro-batch, sign) events,
    as `held_events` gives them."""
    events = pass_events(name, K, M, v, remat)
    bounds = zip(events.rank_cuts[:-1], events.rank_cuts[1:])
    return events.placement, tuple((events.column[a:b], events.micro[a:b], events.sign[a:b]) for a, b in bounds)
