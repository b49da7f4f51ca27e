"""The contention-relaxed step: exact on contention-free plans, below the SimPy engine's elsewhere."""

from __future__ import annotations

import pytest

from gpipe_sim.api import simulate_plan
from gpipe_sim.engines.fast import contention_free
from gpipe_sim.engines.relaxed import relaxed_plan, relaxed_step
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.scenario.scenario import parse_scenario

# two nodes of 2 V100s, one 2 GB/s NIC a node: both pipeline ranks' all-reduce rings cross it
SHARED_NIC = {
    "model": {"preset": "uniform", "layers": 8, "params_per_layer": 20_000_000},
    "hardware": {"preset": "v100", "devices_per_node": 2,
                 "network": {"bandwidth": "2 GB/s", "latency_s": 1.0e-5, "per": "node", "nics": 1}},
    "pipeline": {"stages": 2, "data_parallel": 2, "micro_batches": 4, "batch_size": 8},
}


@pytest.mark.parametrize("schedule, chunks", [("gpipe", 1), ("1f1b", 1), ("zb_h1", 1), ("interleaved_1f1b", 2),
                                              ("zbv", 2)])
def test_relaxed_step_is_below_the_contended_simulation(schedule, chunks):
    """Where rings share a NIC, the relaxed program is contention-free and its step is at most the
    SimPy engine's (below it where the rings overlap in time)."""
    scenario = parse_scenario({**SHARED_NIC, "pipeline": {**SHARED_NIC["pipeline"], "schedule": schedule,
                                                          "chunks": chunks}})
    plan = compile_plan(scenario).simulated()
    assert not contention_free(plan)
    assert contention_free(relaxed_plan(plan))
    simulated = simulate_plan(plan).step_time_s
    assert relaxed_step(plan) <= simulated * (1 + 1e-12)
    assert relaxed_step(plan) > 0.9 * simulated  # the rings' contention is the only difference


def test_relaxed_step_is_the_step_of_a_contention_free_plan():
    scenario = parse_scenario({**SHARED_NIC, "hardware": {"preset": "v100", "devices_per_node": 2,
                                                          "network": {"bandwidth": "2 GB/s"}}})
    plan = compile_plan(scenario).simulated()
    assert contention_free(plan) and relaxed_plan(plan) is plan
    assert relaxed_step(plan) == simulate_plan(plan).step_time_s


def test_some_contended_plan_is_relaxed_strictly_below():
    """The relaxation drops a real wait: with one chunk a rank under GPipe both rings start together."""
    scenario = parse_scenario({**SHARED_NIC, "pipeline": {**SHARED_NIC["pipeline"], "schedule": "gpipe"}})
    plan = compile_plan(scenario).simulated()
    assert relaxed_step(plan) < simulate_plan(plan).step_time_s
