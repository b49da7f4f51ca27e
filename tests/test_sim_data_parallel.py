"""Data parallelism: D replicas of the pipeline, each chunk's gradients all-reduced among them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpipe_sim import ScenarioError, parse_scenario, simulate
from gpipe_sim.engines.fast import contention_free, evaluate_fast
from gpipe_sim.engines.reference import straightforward_simpy
from gpipe_sim.engines.simpy_engine import run_simpy
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.plan.replicas import ring_allreduce_seconds

MODEL = {"preset": "transformer", "layers": 8, "d_model": 512, "d_ff": 2048, "heads": 8, "seq_len": 256,
         "vocab": 8000}


def scenario(D, K=4, M=8, schedule="1f1b", v=1, hardware=None, zero=0, batch_per_replica=16, **pipeline):
    return parse_scenario({
        "model": MODEL, "hardware": hardware or {"preset": "a100-80gb"},
        "pipeline": {"stages": K, "chunks": v, "data_parallel": D, "micro_batches": M,
                     "batch_size": batch_per_replica * D, "schedule": schedule, "remat": "none", **pipeline},
        "training": {"zero": zero, "dtype": "bf16"},
    })


def test_one_replica_adds_nothing():
    plan = compile_plan(scenario(1))
    assert (plan.program.collective < 0).all() and plan.num_ranks == 4
    assert simulate(scenario(1)).exposed_allreduce_s == 0.0


@pytest.mark.parametrize("D", [2, 4, 8])
@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("zbv", 2)])
def test_free_network_gives_d_times_one_replicas_throughput(D, schedule, v):
    ideal = {"preset": "ideal"}
    one = simulate(scenario(1, schedule=schedule, v=v, hardware=ideal))
    many = simulate(scenario(D, schedule=schedule, v=v, hardware=ideal))
    assert many.throughput_samples_per_s == pytest.approx(D * one.throughput_samples_per_s, rel=1e-12)
    assert many.num_devices == D * 4 and many.throughput_per_device == pytest.approx(one.throughput_per_device)
    assert many.bubble_fraction == pytest.approx(one.bubble_fraction, rel=1e-12)


@pytest.mark.parametrize("D", [2, 3, 8])
def test_ring_formula_on_an_idle_network(D):
    """One stage, one micro-batch: every replica finishes its backward together, then waits for the
    ring all-reduce alone: 2(D-1)/D x bytes / bandwidth + 2(D-1) x latency."""
    sc = scenario(D, K=1, M=1, schedule="gpipe")
    result = simulate(sc)
    link = sc.hardware.link
    grads = compile_plan(sc).chunks[0].params * 2  # bf16
    expected = ring_allreduce_seconds(grads, D, link.bandwidth, link.latency_s)
    assert expected == pytest.approx(2 * (D - 1) / D * grads / link.bandwidth + 2 * (D - 1) * link.latency_s)
    assert result.exposed_allreduce_s == pytest.approx(expected, rel=1e-12)
    assert result.step_time_s == pytest.approx(simulate(scenario(1, K=1, M=1, schedule="gpipe")).step_time_s
                                               + expected, rel=1e-12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(D=st.integers(1, 4), K=st.integers(1, 4), M=st.integers(1, 6), bandwidth=st.floats(1e8, 1e12),
       schedule=st.sampled_from(["gpipe", "1f1b", "zb_h1"]), per_node=st.sampled_from([None, 1, 2, 4]))
def test_exposed_reduction_is_between_zero_and_the_ring_formula(D, K, M, bandwidth, schedule, per_node):
    hardware = {"preset": "a100-80gb", "link": {"bandwidth": bandwidth}, "devices_per_node": per_node,
                "network": {"bandwidth": bandwidth / 4, "latency_s": 5e-6}}
    sc = scenario(D, K=K, M=M, schedule=schedule, hardware=hardware)
    plan = compile_plan(sc)
    slow = run_simpy(plan)
    assert np.allclose(straightforward_simpy(plan)[1], slow[1], rtol=1e-9, atol=1e-15)
    result = simulate(sc, engine="simpy")
    longest = float(plan.program.group_seconds.max(initial=0.0))
    free = contention_free(plan)  # else a ring may also wait for a port that the pipeline uses
    for stage in result.stages:
        assert stage.exposed_allreduce_s >= -1e-12
        if free:
            assert stage.exposed_allreduce_s <= longest * (1 + 1e-9) + 1e-12
    if free:
        fast = evaluate_fast(plan)
        assert np.allclose(fast[1], slow[1], rtol=1e-9, atol=1e-15)


def test_rings_across_nodes_contend_with_pipeline_transfers_for_the_port():
    # two devices per node and D=4: every stage's ring crosses nodes through the same ports that the
    # pipeline's activations use between nodes
    hardware = {"preset": "a100-80gb", "devices_per_node": 2, "network": {"bandwidth": "5 GB/s", "latency_s": 5e-6}}
    sc = scenario(4, K=2, M=4, schedule="1f1b", hardware=hardware)
    plan = compile_plan(sc)
    assert not plan.program.dedicated.all()
    with pytest.raises(Exception, match="contention-free"):
        evaluate_fast(plan)
    ours, textbook = run_simpy(plan), straightforward_simpy(plan)
    assert np.allclose(ours[1], textbook[1], rtol=1e-9)


def test_zero_1_shards_optimizer_states_and_master_weights():
    plain, sharded = simulate(scenario(4)), simulate(scenario(4, zero=1))
    for a, b in zip(plain.stages, sharded.stages):
        params = a.param_bytes / 2  # bf16 weights
        assert a.state_bytes == pytest.approx(params * (2 + 8 + 4))  # bf16 grad, Adam's two fp32 states, fp32 master
        assert b.state_bytes == pytest.approx(params * (2 + (8 + 4) / 4))
    assert sharded.step_time_s <= plain.step_time_s  # each replica updates a quarter of the weights


def test_default_placement_keeps_a_stages_replicas_together():
    sc = scenario(2, K=3)
    assert sc.mesh.rank_devices == (0, 2, 4, 1, 3, 5)  # replica 0's ranks, then replica 1's
    placed = parse_scenario({**sc.to_dict(), "hardware": {**sc.to_dict()["hardware"],
                                                           "placement": [[0, 1, 2], [3, 4, 5]]}})
    assert placed.mesh.rank_devices == (0, 1, 2, 3, 4, 5)


@pytest.mark.parametrize("change, match", [
    ({"pipeline": {"stages": 4, "data_parallel": 3, "batch_size": 16}}, "pipeline.batch_size: .* does not split evenly"),
    ({"pipeline": {"stages": 2, "data_parallel": 2, "batch_size": 8, "micro_batches": 8}}, "each replica's share"),
    ({"pipeline": {"stages": 2, "data_parallel": 2, "batch_size": 8, "micro_batches": 2},
      "hardware": {"preset": "v100", "placement": [[0, 1]]}}, "hardware.placement: give 2 rows"),
    ({"pipeline": {"stages": 2, "data_parallel": 2, "batch_size": 8, "micro_batches": 2},
      "hardware": {"preset": "v100", "stage_to_device": [0, 1]}}, "give hardware.placement instead"),
])
def test_data_parallel_mistakes_are_one_line(change, match):
    with pytest.raises(ScenarioError, match=match):
        parse_scenario({"model": {"preset": "uniform"}, **change})
