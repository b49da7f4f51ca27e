"""The SimPy engine against itself as it stood at a42f6be (`simpy_engine_a42f6be`, every event taken):
the same Result, timeline included, to the bit, over every registered schedule, D in 1, 2, 4,
a shared NIC and shared devices, ZeRO 0-3 and overlapped gradient reduction."""

from __future__ import annotations

import numpy as np
import pytest
import simpy_engine_a42f6be as frozen

from gpipe_sim.api import simulate_plan
from gpipe_sim.engines import simpy_engine
from gpipe_sim.engines.fast import contention_free
from gpipe_sim.errors import ScenarioError
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.schedule import SCHEDULES
from gpipe_sim.scenario.scenario import parse_scenario

MODEL = {"preset": "transformer", "layers": 8, "d_model": 256, "d_ff": 1024, "heads": 4, "seq_len": 128,
         "vocab": 1000}
TWO_CHUNKS = {"looped_bfs", "interleaved_1f1b", "interleaved_zb", "zbv", "dualpipev"}


def _hardware(kind: str, D: int) -> dict:
    if kind == "shared NIC":  # nodes of 2, one NIC a node: sends and rings of several ranks share it
        return {"preset": "h100-sxm", "devices_per_node": 2,
                "network": {"bandwidth": "100 Gb/s", "per": "node", "latency_s": 5e-6}}
    # two ranks a device, host time on the device: computes and transfers' host time contend
    return {"preset": "h100-sxm", "placement": [[4 * d, 4 * d, 4 * d + 1, 4 * d + 1] for d in range(D)],
            "host": {"action_s": 1e-5, "send_s": 2e-5, "recv_s": 1e-5, "on_device": True}}


def _plans(schedule: str):
    """Every (D, hardware, ZeRO, overlap) plan of `schedule` the scenario accepts (ZeRO-3 refuses
    overlap_grad_reduce), with D > 1 both timed once per alike replicas and replica by replica."""
    v = 2 if schedule in TWO_CHUNKS else 1
    M = 1 if schedule == "naive" else 8
    for D in (1, 2, 4):
        for hardware in ("shared NIC", "shared devices"):
            for zero in range(4):
                for overlap in (False, True):
                    try:
                        scenario = parse_scenario({
                            "model": MODEL, "hardware": _hardware(hardware, D),
                            "pipeline": {"stages": 4, "chunks": v, "micro_batches": M, "batch_size": 2 * M * D,
                                         "data_parallel": D, "schedule": schedule},
                            "training": {"dtype": "bf16", "zero": zero, "overlap_grad_reduce": overlap}})
                    except ScenarioError:
                        assert zero == 3 and overlap
                        continue
                    plan = compile_plan(scenario)
                    yield plan.simulated()
                    if D > 1:
                        yield plan


def _simulated(monkeypatch, plan, engine) -> tuple[tuple[np.ndarray, np.ndarray], str]:
    """(start, end) of every action as `engine` times `plan`, and the whole Result (timeline,
    memory timeline and peaks included) `simulate_plan` makes of them, as JSON."""
    times = []

    def run(p):
        times.append(engine(p))
        return times[-1]

    with monkeypatch.context() as patch:
        patch.setattr(simpy_engine, "run_simpy", run)
        result = simulate_plan(plan, "simpy", every_replica=True)
    return times[0], result.to_json()


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_engine_gives_the_frozen_engines_result_to_the_bit(monkeypatch, schedule):
    contended = 0
    for plan in _plans(schedule):
        contended += not contention_free(plan)
        (start, end), result = _simulated(monkeypatch, plan, simpy_engine.run_simpy)
        (frozen_start, frozen_end), frozen_result = _simulated(monkeypatch, plan, frozen.run_simpy)
        assert np.array_equal(start, frozen_start) and np.array_equal(end, frozen_end)
        assert result == frozen_result
    assert contended >= 30  # most of them contend: the engine's queues, not only its local clocks
