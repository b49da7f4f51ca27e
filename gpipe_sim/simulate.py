"""Simulate a scenario: compile its plan, run an engine, account memory, summarise the result."""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np

from gpipe_sim.engine import run_simpy
from gpipe_sim.errors import SimulationError
from gpipe_sim.fast import contention_free, evaluate_fast
from gpipe_sim.memory import memory_profile
from gpipe_sim.plan import Plan, compile_plan
from gpipe_sim.result import Result, Timeline, summarize
from gpipe_sim.scenario import Scenario

Engine = Literal["simpy", "fast", "auto"]


AUTO_SWEEPS = 12  # "auto" gives the fast evaluator this many sweeps before taking SimPy


def run_engine(plan: Plan, engine: Engine = "simpy") -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of every action.

    "auto" takes the fast evaluator where there is no contention and it converges within a few
    sweeps (GPipe always does; 1F1B does unless its critical path zig-zags between stages many
    times, as on very deep pipelines with free communication), else the SimPy engine.
    """
    if engine == "fast":
        return evaluate_fast(plan)
    if engine == "auto" and contention_free(plan):
        try:
            return evaluate_fast(plan, max_sweeps=AUTO_SWEEPS)
        except SimulationError:
            pass
    return run_simpy(plan)


def summarize_plan(plan: Plan, timeline: Timeline, *, peak_activation_bytes: Sequence[float],
                   param_bytes: Sequence[float], state_bytes: Sequence[float],
                   device_peak_memory_bytes: dict[int, float], source: str) -> Result:
    """`summarize` with everything the plan fixes (batch, micro-batches, stages, devices, capacity)
    taken from it: the one call the simulator and the executor both make."""
    return summarize(
        timeline,
        batch_size=plan.scenario.pipeline.batch_size,
        micro_batches=plan.schedule.micro_batches,
        stage_layers=[(s.first_layer, s.last_layer) for s in plan.stages],
        device_map=plan.device_map,
        peak_activation_bytes=peak_activation_bytes,
        param_bytes=param_bytes,
        state_bytes=state_bytes,
        memory_capacity_bytes=plan.memory_capacity_bytes,
        device_peak_memory_bytes=device_peak_memory_bytes,
        source=source,
    )


def result_from_times(plan: Plan, start: np.ndarray, end: np.ndarray, source: str = "simulated") -> Result:
    """The Result for a plan given every action's start and end."""
    prog = plan.program
    timeline = Timeline(prog.stage, prog.kind, prog.micro_batch, start, end)
    memory = memory_profile(plan, start, end)
    result = summarize_plan(
        plan, timeline,
        peak_activation_bytes=memory.peak_activation_bytes.tolist(),
        param_bytes=[s.param_bytes for s in plan.stages],
        state_bytes=[s.state_bytes for s in plan.stages],
        device_peak_memory_bytes=memory.device_peak_bytes,
        source=source,
    )
    result.memory_timeline = list(zip(memory.times, memory.activation_bytes))
    return result


def simulate(scenario: Scenario, engine: Engine = "simpy") -> Result:
    """Predict one training step of `scenario`."""
    plan = compile_plan(scenario)
    start, end = run_engine(plan, engine)
    return result_from_times(plan, start, end)
