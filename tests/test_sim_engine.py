"""Engine behaviour: contention, deadlock detection, engine agreement, trace export."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gpipe_sim import SimulationError, parse_scenario, simulate
from gpipe_sim.engines.reference import straightforward_simpy
from gpipe_sim.engines.simpy_engine import run_simpy
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.engines.fast import evaluate_fast
from gpipe_sim.schedule import SCHEDULES, Kind, register
from gpipe_sim.results.trace import chrome_trace


def _table(outputs, stages, micro_batches, schedule, device_map, compute_s=0.0):
    layers = [
        {"name": f"l{i}", "forward_s_per_sample": compute_s, "backward_s_per_sample": compute_s,
         "output_bytes_per_sample": out, "activation_bytes_per_sample": out}
        for i, out in enumerate(outputs)
    ]
    return parse_scenario({
        "model": {"preset": "table", "layers": layers},
        "hardware": {"accelerator": {"peak_flops": {"fp32": 1e12}},
                     "link": {"bandwidth": 1.0, "latency_s": 0.0}, "stage_to_device": device_map},
        "pipeline": {"stages": stages, "micro_batches": micro_batches, "batch_size": micro_batches,
                     "schedule": schedule, "remat": "none", "partition": [1] * stages},
    })


def test_shared_link_serialises_transfers_first_come_first_served():
    # Stages 0 and 2 share device 0, so stage 0's activations and stage 2's gradients share the
    # link from device 0 to device 1. Hand-computed (1 byte/s, zero compute): stage 2's gradient
    # for micro-batch 0 waits for stage 0's second activation (link busy until t=6): step = 13 s.
    scenario = _table([3, 1, 1], 3, 2, "1f1b", [0, 1, 0])
    result = simulate(scenario)
    assert result.step_time_s == pytest.approx(13.0)
    plan = compile_plan(scenario)
    assert np.allclose(straightforward_simpy(plan)[1], run_simpy(plan)[1])


def test_stages_sharing_one_device_serialise_and_leave_no_bubble(uniform):
    scenario = uniform(2, 4, 16, 4, hardware={"preset": "ideal", "stage_to_device": [0, 0]})
    result = simulate(scenario)
    total_compute = 16 * (1e-3 + 2e-3) * 4
    assert result.step_time_s == pytest.approx(total_compute, rel=1e-9)
    assert result.bubble_fraction == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("device_map", [[0, 1, 0, 1], [0, 0, 1, 1], [0, 1, 1, 0]])
@pytest.mark.parametrize("schedule, chunks, micro_batches", [("gpipe", 1, 6), ("1f1b", 1, 6), ("interleaved_1f1b", 2, 8)])
@pytest.mark.parametrize("host", [{}, {"action_s": 1.3e-4, "send_s": 3.1e-4, "recv_s": 1.7e-4,
                                         "copy_bandwidth": 3e9},
                                  {"action_s": 1.3e-4, "send_s": 3.1e-4, "recv_s": 1.7e-4, "on_device": True}])
def test_engine_agrees_with_straightforward_simpy_under_contention(device_map, schedule, chunks, micro_batches, host):
    rng = np.random.default_rng(7)
    layers = [
        {"name": f"l{i}", "forward_s_per_sample": float(rng.uniform(1e-3, 3e-3)),
         "backward_s_per_sample": float(rng.uniform(2e-3, 6e-3)),
         "output_bytes_per_sample": float(rng.uniform(1e5, 1e6)), "activation_bytes_per_sample": 1e6}
        for i in range(8)
    ]
    scenario = parse_scenario({
        "model": {"preset": "table", "layers": layers},
        "hardware": {"preset": "p100-pcie", "stage_to_device": device_map, "host": host},
        "pipeline": {"stages": 4, "chunks": chunks, "micro_batches": micro_batches, "batch_size": 12,
                     "schedule": schedule, "remat": "always", "partition": "time"},
    })
    plan = compile_plan(scenario)
    ours = run_simpy(plan)
    theirs = straightforward_simpy(plan)
    assert np.allclose(ours[1], theirs[1], rtol=1e-9)
    assert np.allclose(ours[0], theirs[0], rtol=1e-9)


def test_deadlocking_schedule_is_reported_not_hung():
    F, B = Kind.FORWARD, Kind.BACKWARD

    @register("deadlock-test")
    def crossed(ranks, micro_batches, chunks):
        return [[(F, 0, 0), (B, 0, 0), (F, 0, 1), (B, 0, 1)], [(F, 1, 1), (B, 1, 1), (F, 1, 0), (B, 1, 0)]]

    try:
        scenario = parse_scenario({
            "model": {"preset": "uniform", "layers": 2}, "hardware": {"preset": "ideal"},
            "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 2, "schedule": "deadlock-test"},
        })
        for engine in ("simpy", "fast"):
            with pytest.raises(SimulationError, match="deadlocks: rank [01] waits forever at recv"):
                simulate(scenario, engine=engine)
    finally:
        del SCHEDULES["deadlock-test"]


def test_a_deadlock_of_zero_length_actions_is_not_taken_for_a_fixed_point():
    F, B = Kind.FORWARD, Kind.BACKWARD

    @register("zero-deadlock-test")
    def crossed(ranks, micro_batches, chunks):
        return [[(F, 0, 0), (B, 0, 0), (F, 0, 1), (B, 0, 1)], [(F, 1, 1), (B, 1, 1), (F, 1, 0), (B, 1, 0)]]

    try:
        scenario = parse_scenario({
            "model": {"preset": "uniform", "layers": 2, "forward_s_per_sample": 0.0,
                      "backward_s_per_sample": 0.0},
            "hardware": {"preset": "ideal"},
            "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 2, "schedule": "zero-deadlock-test"},
        })
        with pytest.raises(SimulationError, match="deadlocks"):
            simulate(scenario, engine="fast")
    finally:
        del SCHEDULES["zero-deadlock-test"]


def test_fast_evaluator_is_exact_where_sweeps_do_not_settle():
    # 1F1B at K=2 needs about M/2 up-and-down sweeps; the per-transfer pass takes over
    scenario = parse_scenario({"model": {"preset": "uniform"}, "hardware": {"preset": "v100"},
                               "pipeline": {"stages": 2, "micro_batches": 64, "schedule": "1f1b"}})
    plan = compile_plan(scenario)
    fast, slow = evaluate_fast(plan), run_simpy(plan)
    assert np.allclose(fast[0], slow[0], rtol=1e-12) and np.allclose(fast[1], slow[1], rtol=1e-12)


def test_fast_evaluator_refuses_contended_plans(uniform):
    scenario = uniform(2, 2, 4, 4, hardware={"preset": "ideal", "stage_to_device": [0, 0]})
    with pytest.raises(SimulationError, match="contention-free"):
        simulate(scenario, engine="fast")
    assert simulate(scenario, engine="auto").step_time_s == simulate(scenario).step_time_s


def test_timeline_is_consistent(uniform):
    result = simulate(uniform(4, 8, 32, 8, schedule="1f1b", remat="always", hardware={"preset": "v100"}))
    tl = result.timeline
    assert (tl.end_s >= tl.start_s).all()
    assert result.step_time_s == pytest.approx(tl.end_s.max())
    for k in range(4):
        compute = tl.is_compute & (tl.rank == k)
        starts, ends = tl.start_s[compute], tl.end_s[compute]
        assert (starts[1:] >= ends[:-1] - 1e-15).all(), "a stage runs one action at a time"
    names = set(tl.kind_names)
    assert {"forward", "backward", "recompute", "send", "recv", "update"} <= names


def test_chrome_trace_has_one_event_per_action(uniform, tmp_path):
    result = simulate(uniform(2, 4, 8, 4, hardware={"preset": "v100"}))
    trace = chrome_trace(result.timeline)
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(result.timeline)
    assert {e["cat"] for e in complete} == set(result.timeline.kind_names)
    assert max(e["ts"] + e["dur"] for e in complete) == pytest.approx(result.step_time_s * 1e6)
    json.dumps(trace)


def test_result_round_trips_through_json(uniform):
    result = simulate(uniform(2, 4, 8, 4, remat="always", hardware={"preset": "v100"}))
    from gpipe_sim.results.result import Result

    again = Result.from_dict(json.loads(result.to_json()))
    assert again.to_dict() == result.to_dict()


def test_per_pair_links_override_the_default_link(uniform):
    slow = {"bandwidth": 1e6, "latency_s": 0.0}
    fast_link = {"bandwidth": "inf", "latency_s": 0.0}
    base = {"accelerator": {"peak_flops": {"fp32": 1e12}}, "link": fast_link}
    quick = simulate(uniform(3, 1, 1, 3, hardware=base))
    slowed = simulate(uniform(3, 1, 1, 3, hardware={**base, "links": [slow, fast_link]}))
    # One sample crosses the slow pair twice (activation forward, gradient back), 1e6 B at 1e6 B/s.
    assert slowed.step_time_s == pytest.approx(quick.step_time_s + 2.0, rel=1e-9)


def test_memory_curves_rebuilt_from_totals_match_the_simulators():
    """The executor rebuilds each stage's curve from the bytes held after every action; on the
    simulator's own times and bytes that must give the simulator's curves and device peaks (no
    transients here: uniform layers and an optimizer that steps in place)."""
    from gpipe_sim.plan.memory_timeline import activation_deltas, device_peaks, levels_from_totals, memory_profile

    scenario = parse_scenario({
        "model": {"preset": "uniform", "layers": 8},
        "hardware": {"preset": "v100", "stage_to_device": [0, 0, 1, 1]},
        "pipeline": {"stages": 4, "micro_batches": 6, "batch_size": 12, "schedule": "1f1b",
                     "remat": "except_last"},
        "training": {"optimizer": "momentum"},
    })
    plan = compile_plan(scenario)
    start, end = run_simpy(plan)
    profile = memory_profile(plan, start, end)
    alloc, free = activation_deltas(plan)
    curves = []
    for k in range(4):
        lo, hi = int(plan.program.offsets[k]), int(plan.program.offsets[k + 1])
        totals = np.cumsum(alloc[lo:hi] - free[lo:hi])
        times, levels = levels_from_totals(start[lo:hi], end[lo:hi], totals)
        assert np.allclose(times, profile.times[k]) and np.allclose(levels, profile.activation_bytes[k])
        curves.append((times, levels))
    static = [r.param_bytes + r.state_bytes for r in plan.ranks]
    peaks = device_peaks(plan.device_map, static, [c[0] for c in curves], [c[1] for c in curves])
    assert peaks == pytest.approx(profile.device_peak_bytes)
    # Merged in time, a shared device never needs more than its stages' peaks added up.
    for device, members in ((0, (0, 1)), (1, (2, 3))):
        assert peaks[device] <= sum(static[k] + profile.peak_activation_bytes[k] for k in members) + 1e-6


HOST = {"action_s": 1e-4, "send_s": 3e-4, "recv_s": 2e-4, "copy_bandwidth": 4e9}


def _host_uniform(stages, micro_batches, schedule="gpipe"):
    return parse_scenario({
        "model": {"preset": "uniform", "layers": stages, "forward_s_per_sample": 1e-3,
                  "backward_s_per_sample": 2e-3},
        "hardware": {"preset": "ideal", "host": HOST},
        "pipeline": {"stages": stages, "micro_batches": micro_batches, "batch_size": micro_batches,
                     "schedule": schedule, "remat": "none", "partition": [1] * stages},
    })


def test_host_time_adds_to_every_action_of_one_stage():
    # K=1: no transfers; 2M compute actions and the update, each with its dispatch cost.
    M, a = 5, HOST["action_s"]
    result = simulate(_host_uniform(1, M))
    assert result.step_time_s == pytest.approx(M * (1e-3 + 2e-3) + (2 * M + 1) * a, rel=1e-12)


@pytest.mark.parametrize("engine", ["simpy", "fast"])
def test_host_time_of_transfers_lies_on_the_critical_path(engine):
    # K=2, M=1, free links: stage 0 forward, issue; stage 1 completes the receive, forward,
    # backward, issues the gradient; stage 0 completes it, backward, update (hand-computed).
    copy = 1e6 / HOST["copy_bandwidth"]  # the uniform preset's 1 MB output per sample, each end
    a, s, r = HOST["action_s"], HOST["send_s"] + copy, HOST["recv_s"] + copy
    f, b = 1e-3, 2e-3
    expected = (f + a) + s + r + (f + a) + (b + a) + s + r + (b + a) + a
    result = simulate(_host_uniform(2, 1), engine=engine)
    assert result.step_time_s == pytest.approx(expected, rel=1e-12)
    plan = compile_plan(_host_uniform(2, 1))
    assert np.allclose(straightforward_simpy(plan)[1], run_simpy(plan)[1], rtol=1e-12)



def test_host_time_on_a_shared_device_is_served_like_compute():
    # Two stages on one device, zero compute, free links: with the host time on the device, the
    # device serves every send and receive one at a time, so the step is their sum (4 of each
    # for M=2, GPipe: 2 activations and 2 gradients, each sent once and received once).
    base = _host_uniform(2, 2).with_updates({
        "model.forward_s_per_sample": 0.0, "model.backward_s_per_sample": 0.0,
        "hardware.stage_to_device": [0, 0],
        "hardware.host": {"send_s": 3e-4, "recv_s": 2e-4, "on_device": False}})
    apart = simulate(base).step_time_s
    together = simulate(base.with_updates({"hardware.host.on_device": True})).step_time_s
    assert together == pytest.approx(4 * (3e-4 + 2e-4), rel=1e-12)
    assert apart < together
