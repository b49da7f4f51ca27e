"""The relaxed step (replica 0 standing for alike replicas, only the step's end read) equals, to the
bit, the previous implementation's: the latest end of the per-transfer pass over the relaxed plan."""

from __future__ import annotations

import numpy as np
import pytest

from fast_reference import reference_relaxed_step, reference_timeline
from gpipe_sim.engines.fast import contention_free, evaluate_fast
from gpipe_sim.engines.relaxed import relaxed_links, relaxed_plan, relaxed_step
from gpipe_sim.engines.relaxed_replicas import replica_zero_stands_for_all
from gpipe_sim.engines.simpy_engine import run_simpy
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.scenario.scenario import parse_scenario
from gpipe_sim.schedule import SCHEDULES

K = 4
SETTINGS = {"plain": {}, "overlap-zero1": {"zero": 1, "overlap_grad_reduce": True, "overlap_param_gather": True},
            "zero2": {"zero": 2}, "zero3": {"zero": 3}}


def _plan(schedule: str, D: int, training: dict, devices_per_node: int):
    """K = 4 ranks per replica on nodes of `devices_per_node` devices sharing one slow NIC: a
    node's ranks send over it (interleaved schedules back across the pipeline too) and their
    all-reduce rings cross it; 3 devices a node place the replicas differently (not alike)."""
    family = SCHEDULES[schedule]
    M = 1 if family.problem(K, 8, family.default_chunks) else 8
    return compile_plan(parse_scenario({
        "model": {"preset": "uniform", "layers": 4 * K, "params_per_layer": 2_000_000},
        "hardware": {"preset": "v100", "devices_per_node": devices_per_node,
                     "network": {"bandwidth": "2 GB/s", "latency_s": 1.0e-5, "per": "node", "nics": 1}},
        "pipeline": {"stages": K, "data_parallel": D, "micro_batches": M, "batch_size": 2 * M * D,
                     "schedule": schedule, "chunks": family.default_chunks},
        "training": {"optimizer": "momentum", **training},
    })).simulated()


@pytest.mark.parametrize("devices_per_node", [2, 3])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("D", [1, 2, 4])
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_relaxed_step_is_the_previous_one_to_the_bit(schedule, D, setting, devices_per_node):
    plan = _plan(schedule, D, SETTINGS[setting], devices_per_node)
    step, relaxed = relaxed_step(plan), relaxed_plan(plan)
    assert step == float(evaluate_fast(relaxed)[1].max())
    if (plan.program.collective >= 0).any():  # the per-transfer pass's plans (the sweeps' are unchanged)
        assert step == reference_relaxed_step(plan)
        assert np.array_equal(np.stack(evaluate_fast(relaxed)), np.stack(reference_timeline(relaxed)))
    _, simulated = run_simpy(relaxed)  # an independent engine, on the contention-free relaxed plan
    assert abs(step - float(simulated.max())) <= 1e-9 * step
    prog = plan.program
    folded = replica_zero_stands_for_all(prog, relaxed_links(prog, plan.num_ranks), len(plan.ranks))
    nodes = np.asarray(plan.mesh.rank_devices).reshape(-1, K) // devices_per_node  # [replica, rank]
    together = nodes[:, :, None] == nodes[:, None, :]  # which of a replica's ranks share a node
    assert folded == bool((together == together[0]).all())


def test_the_shared_nic_is_contended_and_relaxed():
    plan = _plan("interleaved_1f1b", 2, {}, 2)
    assert not contention_free(plan) and contention_free(relaxed_plan(plan))


def test_replicas_placed_differently_are_not_folded():
    """Three devices a node, D = 2 (rank r of replica d on device 2r + d): replica 0's ranks 0 and
    1 share node 0, replica 1's meet over the network, so their sends' seconds differ."""
    plan = _plan("1f1b", 2, {}, 3)
    prog = plan.program
    assert prog.group_size == 2
    assert not replica_zero_stands_for_all(prog, relaxed_links(prog, plan.num_ranks), K)
