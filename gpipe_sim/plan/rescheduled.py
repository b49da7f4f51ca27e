"""A compiled plan run with other programs for the same chunks: what a schedule transform gives the engines and the executor."""

from __future__ import annotations

import dataclasses

from gpipe_sim.plan.compile import Plan
from gpipe_sim.schedule.program import Schedule


def with_schedule(plan: Plan, schedule: Schedule) -> Plan:
    """The plan with other programs for the same chunks and placement (costs, partition and devices
    unchanged), for the simulator to predict and the executor to run; ValueError where `schedule`
    places the chunks otherwise or runs other micro-batches."""
    if schedule.placement != plan.schedule.placement or schedule.micro_batches != plan.schedule.micro_batches:
        raise ValueError("the programs must place the plan's chunks alike and run its micro-batches")
    return dataclasses.replace(plan, schedule=schedule)
