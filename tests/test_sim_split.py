"""Split backward (gpipe_sim.schedule.split_backward) and a plan run with other programs (gpipe_sim.plan.rescheduled)."""

from __future__ import annotations

import pytest

from gpipe_sim import parse_scenario, simulate
from gpipe_sim.api import simulate_plan
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.plan.rescheduled import with_schedule
from gpipe_sim.schedule import Kind, build_schedule
from gpipe_sim.schedule.split_backward import pass_orders, split_backward

B, I, W = Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT


def test_each_backward_becomes_its_input_pass_then_its_weight_pass():
    schedule = build_schedule(3, 4, "1f1b", "none", 1)
    for weights in ("adjacent", "deferred"):
        split = split_backward(schedule, weights)
        assert split.name == f"1f1b+split_{weights}" and split.placement == schedule.placement
        for before, after in zip(pass_orders(schedule), pass_orders(split)):
            inputs = [(p.chunk, p.micro_batch) for p in after if p.kind == I]
            weight = [(p.chunk, p.micro_batch) for p in after if p.kind == W]
            assert inputs == weight == [(p.chunk, p.micro_batch) for p in before if p.kind == B]
            # the backward's place goes to its input pass; the forwards keep their order
            assert [p for p in after if p.kind != W] == [p._replace(kind=I) if p.kind == B else p for p in before]
            if weights == "adjacent":
                assert all(after[i + 1] == p._replace(kind=W) for i, p in enumerate(after) if p.kind == I)
            else:
                assert all(p.kind == W for p in after[len(after) - len(weight):])


def test_a_plan_with_split_programs_keeps_its_costs_and_refuses_other_chunks():
    scenario = parse_scenario({"model": {"preset": "uniform", "layers": 8}, "hardware": {"preset": "ideal"},
                               "pipeline": {"stages": 2, "micro_batches": 4, "batch_size": 8, "remat": "none",
                                            "schedule": "1f1b"}})
    plan = compile_plan(scenario)
    adjacent = with_schedule(plan, split_backward(plan.schedule, "adjacent"))
    assert adjacent.chunks == plan.chunks and adjacent.schedule.count(B) == 0
    # the uniform preset's backward splits into halves that add up to it: each rank as busy as before,
    # and no later, as the input gradient leaves after the input pass instead of the whole backward
    split, whole = simulate_plan(adjacent), simulate(scenario)
    assert [s.busy_s for s in split.stages] == pytest.approx([s.busy_s for s in whole.stages], rel=1e-12)
    assert split.step_time_s < whole.step_time_s
    with pytest.raises(ValueError, match="place the plan's chunks alike"):
        with_schedule(plan, build_schedule(2, 5, "1f1b", "none", 1))
