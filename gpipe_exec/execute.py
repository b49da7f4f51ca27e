"""Run a scenario for real: check it can run, launch the ranks on its compiled plan, measure the step."""

from __future__ import annotations

import torch

from gpipe_exec.launch.devices import check_gpu_layout, device_type
from gpipe_exec.launch.spawn import LaunchOptions, launch
from gpipe_exec.measure.steps import Measurement, measured_result
from gpipe_exec.runtime.interpreter import boundary_shapes
from gpipe_exec.runtime.job import job_for
from gpipe_exec.zoo import check_buildable
from gpipe_sim.api import simulate_plan
from gpipe_sim.errors import GpipeError, ScenarioError, first_line
from gpipe_sim.plan.compile import Plan, compile_plan, scenario_schedule
from gpipe_sim.plan.sharding import shard_degree
from gpipe_sim.results.result import Result
from gpipe_sim.model.model import ModelSpec
from gpipe_sim.scenario.scenario import Scenario
from gpipe_sim.schedule import Kind

RANK_OVERHEAD_BYTES = 0.5 * 2**30  # a rank's interpreter, torch and gloo, before the model


def check_model(scenario: Scenario) -> None:
    """ScenarioError (one line) unless the executor can build the scenario's model: a zoo preset
    whose layers build on the meta device; with sequence parallelism, a sequence that splits
    evenly over the T devices (each sends and receives an equal shard); tied embeddings in one
    chunk on one device per rank; experts (at E > 1) without overlap_grad_reduce, (at T > 1) with
    sequence parallelism, as Megatron-LM trains them, and under ZeRO-2/3 at T > 1 only where
    D x C = E (each expert on one process of its tensor rank); ZeRO-2 and 3 as `check_sharding`."""
    check_buildable(scenario.model)
    p = scenario.pipeline
    experts = getattr(scenario.model, "experts", 0) and p.expert_parallel > 1
    if experts and scenario.training.overlap_grad_reduce:
        raise ScenarioError("model.experts: gpipe-exec runs a mixture of experts at expert_parallel > 1 with "
                            "overlap_grad_reduce false (its hooks reduce every bucket over D); gpipe-sim predicts it")
    if experts and scenario.training.zero > 1 and p.tensor_parallel > 1 and scenario.mesh.expert_gradient_group > 1:
        raise ScenarioError("model.experts: gpipe-exec runs a mixture of experts with training.zero 2 or 3 at "
                            "tensor_parallel > 1 only where each expert is on one process of its tensor rank "
                            "(data_parallel x context_parallel = expert_parallel); gpipe-sim predicts the rest")
    if p.tensor_parallel > 1 and scenario.training.overlap_grad_reduce and \
            p.data_parallel * p.context_parallel > 1 and scenario.training.zero < 2:
        raise ScenarioError(f"training.overlap_grad_reduce: gpipe-exec's gradient buckets run at tensor_parallel 1 "
                            f"(at {p.tensor_parallel} they would reduce the tensor-parallel shards before they "
                            "hold their gradients); gpipe-sim predicts it")
    if scenario.training.dtype == "fp8":
        raise ScenarioError("training.dtype: gpipe-exec has no FP8 GEMMs (Transformer Engine and torchao's float8 "
                            "need an H100 or H200); gpipe-sim predicts fp8, run bf16")
    check_sharding(scenario)
    T, seq_len = scenario.pipeline.tensor_parallel, getattr(scenario.model, "seq_len", 0)
    if getattr(scenario.model, "tied_embeddings", False) and (p.stages * p.chunks > 1 or T > 1):
        raise ScenarioError("model.tied_embeddings: the executor ties the token table and the output projection "
                            "within one chunk on one device per rank (pipeline.stages 1, chunks 1, "
                            "tensor_parallel 1); untie them or simulate only")
    parts = T * p.context_parallel  # a device's share of the sequence under sequence (and context) parallelism
    if T > 1 and scenario.pipeline.sequence_parallel and seq_len % parts:
        over = f"pipeline.tensor_parallel {T}" + (f" x context_parallel {p.context_parallel}" if parts > T else "")
        raise ScenarioError(f"model.seq_len: {seq_len:,} does not split over {over} "
                            f"with sequence parallelism (give a multiple of {parts})")
    try:
        boundary_shapes(scenario.model, scenario.training.dtype, 0, 0.0)
    except (RuntimeError, ValueError) as exc:
        raise ScenarioError(f"model: the {scenario.model.preset} model cannot be built ({first_line(exc)})") from None


def check_sharding(scenario: Scenario) -> None:
    """ScenarioError (one line) unless gpipe-exec runs the scenario's ZeRO-2 or 3 (FSDP2
    `fully_shard`, runtime.sharded): with tensor parallelism (T > 1, torchtitan's 2-D mesh) over
    the data-parallel (and context-parallel) dimensions, hybrid sharding at K = 1; with pipelining
    (K > 1) context_parallel 1 and a schedule whose backward passes are whole (FSDP2 reduces in its
    autograd hooks, which a split input/weight backward does not fire)."""
    p, zero = scenario.pipeline, scenario.training.zero
    if zero < 2 or p.data_parallel * p.context_parallel == 1:
        return
    pipelined = p.stages > 1
    split = pipelined and scenario_schedule(scenario).count(Kind.BACKWARD_INPUT) > 0
    if p.tensor_parallel > 1 and (pipelined or p.context_parallel > 1) and shard_degree(scenario) < p.data_parallel:
        raise ScenarioError(f"training.zero: gpipe-exec runs ZeRO-{zero} (FSDP2 fully_shard) with tensor_parallel "
                            f"{p.tensor_parallel} and hybrid sharding (shard_within_node) with one stage and "
                            "context_parallel 1 only; "
                            "gpipe-sim predicts the rest")
    if pipelined and (p.context_parallel > 1 or split):
        raise ScenarioError(f"training.zero: gpipe-exec runs ZeRO-{zero} (FSDP2 fully_shard) with pipelining at "
                            "context_parallel 1 and with a schedule without split backward passes "
                            f"(not {p.schedule_name} at context_parallel {p.context_parallel}); gpipe-sim predicts the rest")


def check_runnable(scenario: Scenario, device: str | None = None) -> Plan:
    """Check the model builds, compile the plan and check the layout runs here: on CPU that all
    ranks fit in this machine's free memory, on CUDA that every rank's GPU exists (`device`:
    cpu | cuda | auto, as `launch.devices.device_type`); one clear line if it cannot run."""
    check_model(scenario)
    plan = compile_plan(scenario)
    check_layout(plan, device)
    return plan


def check_layout(plan: Plan, device: str | None = None, predicted: Result | None = None) -> None:
    """ScenarioError (one line) unless the plan's ranks can run on this machine's devices (see
    `check_runnable`; `predicted`: the plan's simulated result, where the caller has it)."""
    if device_type(device) == "cuda":
        check_gpu_processes(plan, torch.cuda.device_count())
    else:
        check_host_memory(plan, predicted=predicted)


def check_gpu_processes(plan: Plan, gpus: int) -> None:
    """ScenarioError (one line) unless every process has a GPU here, and, with tensor or context
    parallelism, one of its own (a pass's collectives need all T x C devices of a rank running at
    once: NCCL, one process per GPU)."""
    mesh = plan.mesh
    width = mesh.devices_per_rank
    field, what = ("tensor_parallel", mesh.tensor_parallel) if mesh.tensor_parallel > 1 else ("context_parallel",
                                                                                              mesh.context_parallel)
    processes = mesh.process_devices()
    if width > 1 and len(processes) > gpus:  # before check_gpu_layout, whose remedy (sharing a GPU) is not one here
        raise ScenarioError(f"pipeline.{field}: {width} x {len(processes) // width} ranks need {len(processes)} GPUs "
                            f"of their own (NCCL, one process per GPU) but this machine has {gpus}; "
                            f"run under torchrun across machines, or without {field.replace('_', ' ')}ism")
    check_gpu_layout(processes, gpus)
    if width > 1 and len(set(processes)) < len(processes):
        raise ScenarioError(f"hardware.stage_to_device: with {field} {what} every rank needs {width} GPUs of "
                            "its own (gpipe-exec runs several stages on one GPU only without "
                            f"{field.replace('_', ' ')}ism)")


def host_available_bytes() -> float | None:
    """Memory this machine can still give (Linux MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_host_memory(plan: Plan, available: float | None = None, predicted: Result | None = None) -> None:
    """Refuse a CPU run whose ranks (all on this machine) would need more memory than is free:
    the simulator's per-rank peak (weights, gradients, optimizer states, activations; from
    `predicted` where the caller has simulated the plan already) plus a fixed allowance per process."""
    available = host_available_bytes() if available is None else available
    if available is None:
        return
    stages = (predicted or simulate_plan(plan)).stages  # replica 0's; every replica holds as much
    p = plan.scenario.pipeline  # a rank's T x C processes each hold its per-device peak
    T, C = p.tensor_parallel, p.context_parallel
    needed = plan.replicas * T * C * (sum(s.peak_memory_bytes for s in stages) + RANK_OVERHEAD_BYTES * len(stages))
    if needed > available:
        gib = 2.0**30
        what = (f"{len(stages)} stages" + (f" x {T} tensor-parallel devices" if T > 1 else "")
                + (f" x {C} context-parallel devices" if C > 1 else "")
                + (f" x {plan.replicas} replicas" if plan.replicas > 1 else ""))
        raise ScenarioError(
            f"model: running these {what} here needs about {needed / gib:.1f} GiB "
            f"(weights, gradients, optimizer states and peak activations, as gpipe_sim predicts), "
            f"but this machine has {available / gib:.1f} GiB free; use a smaller model or batch"
        )


def execute(scenario: Scenario, *, steps: int = 5, warmup: int = 2, seed: int = 0,
            dropout: float | None = None, options: LaunchOptions = LaunchOptions()) -> Measurement:
    """Train `scenario` for warm-up + measured steps with one process per rank; measure the step."""
    return run_plan(check_runnable(scenario, options.device), steps=steps, warmup=warmup, seed=seed,
                    dropout=dropout, options=options)


def run_plan(plan: Plan, *, model: ModelSpec | None = None, steps: int = 5, warmup: int = 2, seed: int = 0,
             dropout: float | None = None, options: LaunchOptions = LaunchOptions()) -> Measurement:
    """Train the compiled plan for warm-up + measured steps with one process per rank; measure the
    step. `model`: the zoo model the ranks build where the plan's is a measured table."""
    if steps < 1 or warmup < 0:
        raise GpipeError(f"steps must be >= 1 and warm-up >= 0, got {steps} and {warmup}")
    job = job_for(plan, model=model, steps=steps, warmup=warmup, seed=seed, dropout=dropout)
    output = launch([job], plan.mesh.process_devices(), options)[0]
    return measured_result(plan, output)
