"""A schedule's backward passes split in two: a program the built-in families do not generate, made from theirs.

`split_backward` turns every full backward pass of a schedule into an input-gradient pass
(backward_input, at the backward's place) and a weight-gradient pass (backward_weight), either
right after it or deferred to the end of the rank's program, and lowers the result with the one
lowering (transfers, re-computation and the update placed the usual way).
"""

from __future__ import annotations

from typing import Literal

from gpipe_sim.schedule.actions import PASS_KINDS, Kind, Pass
from gpipe_sim.schedule.lower import lower
from gpipe_sim.schedule.program import Schedule

WeightPlacement = Literal["adjacent", "deferred"]


def pass_orders(schedule: Schedule) -> list[list[Pass]]:
    """Each rank's passes (forward, backward, backward_input, backward_weight), in program order."""
    return [[Pass(a.kind, a.chunk, a.micro_batch) for a in schedule.rank_actions(r) if a.kind in PASS_KINDS]
            for r in range(schedule.ranks)]


def split_backward(schedule: Schedule, weights: WeightPlacement = "adjacent") -> Schedule:
    """The schedule with each backward split into backward_input then backward_weight: the weight
    pass right after its input pass ("adjacent") or all of a rank's weight passes at the end of its
    program, in the order of their input passes ("deferred"). Named "<name>+split_<weights>"."""
    orders = []
    for passes in pass_orders(schedule):
        order: list[Pass] = []
        later: list[Pass] = []
        for p in passes:
            if p.kind != Kind.BACKWARD:
                order.append(p)
                continue
            order.append(Pass(Kind.BACKWARD_INPUT, p.chunk, p.micro_batch))
            weight = Pass(Kind.BACKWARD_WEIGHT, p.chunk, p.micro_batch)
            (later if weights == "deferred" else order).append(weight)
        orders.append(order + later)
    return lower(f"{schedule.name}+split_{weights}", orders, schedule.placement, schedule.micro_batches,
                 schedule.remat, schedule.chunks)
