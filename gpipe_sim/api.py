"""Simulate a scenario: compile its plan, run an engine, account memory, summarise the result."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from gpipe_sim.engines.choice import DEFAULT_ENGINE, Engine
from gpipe_sim.engines.fast import contention_free, evaluate_fast
from gpipe_sim.plan.memory_timeline import memory_profile
from gpipe_sim.plan.compile import Plan, compile_plan
from gpipe_sim.plan.tensor_parallel import action_tp_seconds, rank_tp_comm_seconds
from gpipe_sim.results.result import ModelFigures, Result, Timeline, summarize
from gpipe_sim.results.run_cost import scenario_run_cost
from gpipe_sim.model.layers import build_layers
from gpipe_sim.model.model import LayerSpec, TableModel, TransformerModel
from gpipe_sim.model.model_flops import (active_parameters, megatron_flops_per_token, palm_flops_per_token,
                                        tied_parameters)
from gpipe_sim.scenario.scenario import Scenario
from gpipe_sim.scenario.training_run import tokens_per_sample

def run_engine(plan: Plan, engine: Engine = DEFAULT_ENGINE) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of every action. "auto" (`DEFAULT_ENGINE`, every tool's default) takes the fast evaluator
    (exact, linear in the actions) where no device or link is shared (`contention_free`), else
    the SimPy engine."""
    if engine == "fast":
        return evaluate_fast(plan)
    if engine == "auto" and contention_free(plan):
        return evaluate_fast(plan)
    return run_simpy(plan)


def run_simpy(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """The SimPy engine (`gpipe_sim.engines.simpy_engine.run_simpy`), SimPy loaded only where a
    plan needs it (a simulate the fast evaluator answers never imports it)."""
    from gpipe_sim.engines import simpy_engine

    return simpy_engine.run_simpy(plan)


def model_figures(scenario: Scenario, layers: Sequence[LayerSpec] | None = None) -> ModelFigures:
    """What the model, batch and accelerator fix about a step (`ModelFigures`): total parameters of
    the layers (a tied table once); model FLOPs per step: for the transformer preset Megatron-LM's
    (`megatron_flops_per_token` x tokens, causal attention), beside PaLM's (`palm_flops_per_token`),
    for other models batch x sum over layers of (forward + backward FLOPs per sample),
    re-computation not counted (None where a layer has no FLOPs); tokens per step = batch x
    seq_len for the transformer preset (None for models without tokens); the accelerator's peak
    FLOP/s for the training dtype (the highest given where that dtype has none, as the cost model
    does). `layers`: the plan's, where built already (the whole model's: not split over tensor
    parallelism). A layer table profiled at T > 1 (rows of one device's share) gives its whole
    model's `parameters`, FLOPs and tokens per sample where it records them."""
    if layers is None:
        layers = build_layers(scenario.model, scenario.training.dtype_bytes)
    batch = scenario.pipeline.batch_size
    per_sample = [(layer.forward_flops_per_sample, layer.backward_flops_per_sample) for layer in layers]
    flops = (None if any(f is None or b is None for f, b in per_sample)
             else float(batch) * sum(float(f) + float(b) for f, b in per_sample))  # type: ignore[arg-type]
    model = scenario.model
    sample_tokens = tokens_per_sample(model)
    tokens = None if sample_tokens is None else batch * sample_tokens
    if isinstance(model, TableModel):  # profiled at T > 1: the whole model's, where recorded
        flops = flops if model.flops_per_sample is None else float(batch) * model.flops_per_sample
    peak = scenario.hardware.accelerator.peak_flops_for(scenario.training.dtype)
    parameters = model.parameters if isinstance(model, TableModel) else None  # profiled at T > 1: the whole's
    if parameters is None:
        parameters = sum(layer.params for layer in layers)
    palm = None
    if isinstance(model, TransformerModel) and tokens is not None:
        parameters -= tied_parameters(model)
        flops = tokens * megatron_flops_per_token(model)
        palm = tokens * palm_flops_per_token(model, active_parameters(model, parameters))
    return ModelFigures(parameters=int(parameters), model_flops_per_step=flops,
                        tokens_per_step=tokens, peak_flops_per_device=float(peak), palm_flops_per_step=palm)


def summarize_plan(plan: Plan, timeline: Timeline, *, peak_activation_bytes: Sequence[float],
                   chunk_peak_activation_bytes: Sequence[float], param_bytes: Sequence[float],
                   state_bytes: Sequence[float], device_peak_memory_bytes: dict[int, float],
                   source: str, peak_memory_bytes: Sequence[float] | None = None,
                   memory_breakdown: Sequence[dict[str, float]] | None = None) -> Result:
    """`summarize` with everything the plan fixes (batch, micro-batches, layout, capacity, the
    schedule's analytic bubble, the model's figures) taken from it: the one call the simulator and
    the executor both make. `peak_activation_bytes` is per rank; the other sequences are per chunk.
    Its `run` is the training run's days and cost where the scenario asks for them."""
    result = summarize(
        timeline,
        batch_size=plan.scenario.pipeline.batch_size,
        micro_batches=plan.schedule.micro_batches,
        layout=plan.layout,
        analytic_bubble_fraction=plan.analytic_bubble_fraction,
        peak_activation_bytes=peak_activation_bytes,
        chunk_peak_activation_bytes=chunk_peak_activation_bytes,
        param_bytes=param_bytes,
        state_bytes=state_bytes,
        memory_capacity_bytes=plan.memory_capacity_bytes,
        device_peak_memory_bytes=device_peak_memory_bytes,
        source=source,
        peak_memory_bytes=peak_memory_bytes,
        memory_breakdown=memory_breakdown,
        figures=model_figures(plan.scenario, plan.layers if plan.mesh.whole_layers else None),
        # what the collectives add, where the timeline prices it (simulated, program order); a
        # measured step's collectives are inside its timed passes, not timed apart
        tp_comm_s=None if timeline.tp_s is None else rank_tp_comm_seconds(plan, timeline.tp_s),
    )
    tokens = result.figures.tokens_per_step if result.figures is not None else None
    result.run = scenario_run_cost(plan.scenario, result.step_time_s, result.devices, tokens)
    return result


def result_from_times(plan: Plan, start: np.ndarray, end: np.ndarray, source: str = "simulated") -> Result:
    """The Result for a plan given every action's start and end; its timeline's `tp_s` the
    seconds tensor-parallel collectives add to each action (None where they add none: T = 1)."""
    prog = plan.program
    tp = action_tp_seconds(plan)
    timeline = Timeline(prog.rank, prog.chunk, prog.kind, prog.micro_batch, start, end,
                        tp_s=tp if tp.any() else None)
    memory = memory_profile(plan, start, end)
    result = summarize_plan(
        plan, timeline,
        peak_activation_bytes=memory.peak_activation_bytes.tolist(),
        chunk_peak_activation_bytes=memory.chunk_peak_activation_bytes.tolist(),
        param_bytes=[c.param_bytes for c in plan.chunks],
        state_bytes=[c.state_bytes for c in plan.chunks],
        device_peak_memory_bytes=memory.device_peak_bytes,
        source=source,
        peak_memory_bytes=memory.peak_memory_bytes.tolist(),
        memory_breakdown=memory.breakdown,
    )
    result.memory_timeline = list(zip(memory.times, memory.activation_bytes))
    return result


def simulate_plan(plan: Plan, engine: Engine = DEFAULT_ENGINE, *, every_replica: bool = False) -> Result:
    """Time a compiled plan and summarise it: the one run-and-summarise call every tool makes.
    Data-parallel replicas that are alike are timed once (`Plan.simulated`; the timeline then
    holds replica 0's ranks, every figure as with all); `every_replica` times each of them."""
    if not every_replica:
        plan = plan.simulated()
    start, end = run_engine(plan, engine)
    return result_from_times(plan, start, end)


def simulate(scenario: Scenario, engine: Engine = DEFAULT_ENGINE) -> Result:
    """Predict one training step of `scenario`."""
    return simulate_plan(compile_plan(scenario), engine)
