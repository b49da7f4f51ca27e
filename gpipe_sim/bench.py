"""`gpipe-sim bench`: engine speed against a straightforward SimPy model, measured side by side."""

from __future__ import annotations

import statistics
import time
from typing import Callable, Generator

import numpy as np
import simpy

from gpipe_sim.errors import SimulationError
from gpipe_sim.fast import evaluate_fast
from gpipe_sim.engine import run_simpy
from gpipe_sim.plan import BACKWARD, FORWARD, RECOMPUTE, RECV, SEND, Plan, compile_plan
from gpipe_sim.scenario import parse_scenario


def straightforward_simpy(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """The textbook SimPy model of the same plan, as a baseline: one Resource per device and per
    link, one process per transfer, every action a SimPy event."""
    prog = plan.program
    env = simpy.Environment()
    devices = {d: simpy.Resource(env, capacity=1) for d in set(plan.device_map)}
    links = [simpy.Resource(env, capacity=1) for _ in range(len(prog.dedicated))]
    delivered = [env.event() for _ in range(prog.num_messages)]
    start = np.zeros(len(prog.kind))
    end = np.zeros(len(prog.kind))

    def transfer(i: int) -> Generator[simpy.Event, object, None]:
        if prog.link[i] >= 0:
            with links[prog.link[i]].request() as request:
                yield request
                start[i] = env.now
                yield env.timeout(prog.serialization[i])
            yield env.timeout(prog.latency[i])
        else:
            start[i] = env.now
        end[i] = env.now
        delivered[prog.message[i]].succeed()

    on_device = plan.scenario.hardware.host.on_device

    def host(device: simpy.Resource, duration: float) -> Generator[simpy.Event, object, None]:
        if not on_device or duration <= 0:
            yield env.timeout(duration)
            return
        with device.request() as request:
            yield request
            yield env.timeout(duration)

    def stage(k: int) -> Generator[simpy.Event, object, None]:
        device = devices[plan.device_map[k]]
        for i in range(int(prog.offsets[k]), int(prog.offsets[k + 1])):
            kind = prog.kind[i]
            if kind == SEND:
                yield from host(device, prog.duration[i])  # host time to issue it
                env.process(transfer(i))
            elif kind == RECV:
                start[i] = env.now
                yield delivered[prog.message[i]]
                yield from host(device, prog.duration[i])  # host time to complete it
                end[i] = env.now
            else:
                with device.request() as request:
                    yield request
                    start[i] = env.now
                    yield env.timeout(prog.duration[i])
                    end[i] = env.now

    for k in range(len(plan.stages)):
        env.process(stage(k))
    env.run()
    return start, end


def _uniform_plan(stages: int, micro_batches: int, schedule: str) -> Plan:
    scenario = parse_scenario({
        "model": {"preset": "uniform", "layers": stages},
        "hardware": {"preset": "v100"},
        "pipeline": {"stages": stages, "micro_batches": micro_batches, "batch_size": micro_batches,
                     "schedule": schedule, "remat": "none"},
    })
    return compile_plan(scenario)


def _median_time(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_benchmark(stages: int = 128, micro_batches: int = 1024, repeat: int = 3) -> str:
    """Time the SimPy engine, the straightforward SimPy model and the fast evaluator on one plan
    (GPipe, uniform layers, V100 links), check they agree, and report actions per second."""
    t0 = time.perf_counter()
    plan = _uniform_plan(stages, micro_batches, "gpipe")
    compile_s = time.perf_counter() - t0
    prog = plan.program
    n_actions = len(prog.kind)
    n_compute = int(np.isin(prog.kind, [FORWARD, BACKWARD, RECOMPUTE]).sum())
    ours = run_simpy(plan)
    base = straightforward_simpy(plan)
    quick = evaluate_fast(plan)
    for name, (s, e) in (("straightforward SimPy", base), ("fast evaluator", quick)):
        if not np.allclose(e, ours[1], rtol=1e-9, atol=1e-12):
            raise SimulationError(f"benchmark: {name} disagrees with the SimPy engine")
    t_ours = _median_time(lambda: run_simpy(plan), repeat)
    t_base = _median_time(lambda: straightforward_simpy(plan), max(1, repeat // 2))
    t_fast = _median_time(lambda: evaluate_fast(plan), repeat)
    lines = [
        f"GPipe K={stages} M={micro_batches}: {n_compute:,} compute actions, {n_actions:,} actions "
        f"in all (transfers included); step {ours[1].max():.6g} s simulated by all three",
        f"plan compile (schedule, partition, costs): {compile_s:.3f} s",
        f"{'engine':<24}{'seconds':>10}{'actions/s':>14}{'vs straightforward':>21}",
    ]
    for name, t in (("SimPy engine", t_ours), ("straightforward SimPy", t_base), ("fast evaluator", t_fast)):
        lines.append(f"{name:<24}{t:>10.3f}{n_actions / t:>14,.0f}{t_base / t:>20.1f}x")
    return "\n".join(lines)
