"""Run a scenario for real: check it can run, launch the ranks, and turn their records into a Result."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from gpipe_exec.launch.spawn import LaunchOptions, launch
from gpipe_exec.errors import ExecutionError
from gpipe_exec.runtime.interpreter import Job, boundary_shapes, record_columns
from gpipe_exec.zoo import check_buildable
from gpipe_sim.errors import GpipeError, ScenarioError
from gpipe_sim.results.memory import device_peaks, levels_from_totals
from gpipe_sim.plan.compile import Plan, compile_plan, local_state_bytes_per_param
from gpipe_sim.results.result import Result, Timeline
from gpipe_sim.spec.scenario import Scenario
from gpipe_sim.api import simulate_plan, summarize_plan
from gpipe_sim.errors import first_line
from gpipe_sim.spec.model import ModelSpec
from gpipe_sim.schedule import ACTION_KINDS, Kind


FAULT_ENV = "GPIPE_EXEC_FAULT"  # fault injection for tests: "RANK:raise|kill[:ACTION[:STEP]]"


def parse_fault(text: str) -> dict[str, Any]:
    """Parse a fault-injection spec such as "1:kill:3" (rank 1 is killed before its action 3)."""
    parts = text.split(":")
    try:
        fault = {"rank": int(parts[0]), "kind": parts[1],
                 "action": int(parts[2]) if len(parts) > 2 else 0,
                 "step": int(parts[3]) if len(parts) > 3 else 0}
    except (IndexError, ValueError):
        raise GpipeError(f"{FAULT_ENV}: expected RANK:raise|kill[:ACTION[:STEP]], got {text!r}") from None
    if fault["kind"] not in ("raise", "kill"):
        raise GpipeError(f"{FAULT_ENV}: kind must be raise or kill, got {fault['kind']!r}")
    return fault


@dataclass
class Measurement:
    """A measured step in the result schema, plus what only a real run has."""

    result: Result
    step_times_s: list[float]
    loss: float
    cuda_peak_bytes: list[float | None] = field(default_factory=list)
    # The saved-tensor accounting (the simulator's definition, counted by hooks): per rank, static
    # + peak saved bytes. Not a measurement of memory: the result's peak_memory_bytes is that.
    accounting_peak_bytes: list[float] = field(default_factory=list)


RANK_OVERHEAD_BYTES = 0.5 * 2**30  # a rank's interpreter, torch and gloo, before the model


def check_model(scenario: Scenario) -> None:
    """ScenarioError (one line) unless the executor can build the scenario's model: a zoo preset
    whose layers build on the meta device."""
    check_buildable(scenario.model)
    try:
        boundary_shapes(scenario.model, scenario.training.dtype, 0, 0.0)
    except (RuntimeError, ValueError) as exc:
        raise ScenarioError(f"model: the {scenario.model.preset} model cannot be built ({first_line(exc)})") from None


def check_runnable(scenario: Scenario) -> Plan:
    """Check the model builds, compile the plan and, on CPU, check that all ranks fit in this
    machine's free memory; one clear line if it cannot run."""
    check_model(scenario)
    plan = compile_plan(scenario)
    if not torch.cuda.is_available():
        check_host_memory(plan)
    return plan


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
    needed = plan.replicas * (sum(s.peak_memory_bytes for s in stages) + RANK_OVERHEAD_BYTES * len(stages))
    if needed > available:
        gib = 2.0**30
        what = f"{len(stages)} stages" + (f" x {plan.replicas} replicas" if plan.replicas > 1 else "")
        raise ScenarioError(
            f"model: running these {what} here needs about {needed / gib:.1f} GiB "
            f"(weights, gradients, optimizer states and peak activations, as gpipe_sim predicts), "
            f"but this machine has {available / gib:.1f} GiB free; use a smaller model or batch"
        )


def job_for(plan: Plan, *, steps: int = 5, warmup: int = 2, seed: int = 0,
            dropout: float | None = None, **extra: Any) -> Job:
    """The job that runs the plan as compiled: its partition, micro-batches and global program (a
    schedule registered in this process needs no registration in the workers)."""
    if "fault" not in extra and os.environ.get(FAULT_ENV):
        extra["fault"] = parse_fault(os.environ[FAULT_ENV])
    extra.setdefault("memory_step", True)
    return Job(plan=plan, steps=steps, warmup=warmup, seed=seed, dropout=dropout, **extra)


def _end_sends_at_arrival(kind: np.ndarray, message: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
    """A send ends when its data has arrived: no later than the matching receive's end (the sender
    only notices completion when it next polls). Sends and receives pair by their recorded message."""
    sends = np.flatnonzero((kind == Kind.SEND) & (message >= 0))
    recvs = np.flatnonzero((kind == Kind.RECV) & (message >= 0))  # not the waits for all-reduces
    if not len(sends):
        return
    size = int(max(message[sends].max(), message[recvs].max(initial=-1))) + 1
    received = np.full(size, np.inf)
    received[message[recvs]] = end[recvs]
    end[sends] = np.maximum(start[sends], np.minimum(end[sends], received[message[sends]]))


def step_timelines(plan: Plan, output: dict[str, Any]) -> list[Timeline]:
    """Every measured step's timeline, rank after rank, each rank's actions as they ran (kind, chunk
    and micro-batch from the ranks' own records), on seconds from the step's start."""
    ranks = output["ranks"]
    if len(ranks) != plan.num_ranks:
        raise ExecutionError(f"{len(ranks)} ranks reported for a plan of {plan.num_ranks}")
    timelines = []
    for s in range(len(ranks[0]["records"])):
        recs = [rank["records"][s] for rank in ranks]
        cols = record_columns(recs)
        t0 = min(r.step_start for r in recs)
        start, end = cols["start_s"] - t0, cols["end_s"] - t0
        # the ranks record the global program's message ids, unique in the step
        _end_sends_at_arrival(cols["kind"], cols["message"], start, end)
        timeline = Timeline(cols["rank"], cols["chunk"], cols["kind"], cols["micro_batch"], start, end)
        check_ran_as_planned(plan, timeline, step=s)
        timelines.append(timeline)
    return timelines


def check_ran_as_planned(plan: Plan, timeline: Timeline, step: int = 0) -> None:
    """ExecutionError (one line, naming the rank and the first action that differs) unless every
    rank ran exactly its program: the same kinds, chunks and micro-batches in the same order."""
    prog = plan.program
    for r in range(plan.num_ranks):
        lo, hi = int(prog.offsets[r]), int(prog.offsets[r + 1])
        mine = np.flatnonzero(timeline.rank == r)
        planned = np.stack([prog.kind[lo:hi], prog.chunk[lo:hi], prog.micro_batch[lo:hi]], axis=1).astype(np.int64)
        ran = np.stack([timeline.kind[mine], timeline.chunk[mine], timeline.micro_batch[mine]], axis=1).astype(np.int64)
        if planned.shape == ran.shape and np.array_equal(planned, ran):
            continue
        n = min(len(planned), len(ran))
        differ = np.flatnonzero((planned[:n] != ran[:n]).any(axis=1))
        i = int(differ[0]) if len(differ) else n

        def text(row: np.ndarray | None) -> str:
            if row is None:
                return "nothing"
            kind, chunk, mb = (int(v) for v in row)
            return ACTION_KINDS[kind] if chunk < 0 else f"{ACTION_KINDS[kind]}(chunk {chunk}, micro-batch {mb})"

        raise ExecutionError(
            f"step {step}, rank {r}: action {i} ran {text(ran[i] if i < len(ran) else None)}, "
            f"the program says {text(planned[i] if i < len(planned) else None)}")


def measured_memory(plan: Plan, output: dict[str, Any]) -> tuple[list[float], list[dict[str, float]], dict[int, float]] | None:
    """From the ranks' memory step (`Job.memory_step`): per pipeline rank (replica 0) the real tensor
    bytes at their peak and what they were made of; per device the peak of its ranks' bytes merged
    in time (each action holding its own peak from its start, its ending bytes from its end), by
    `device_peaks`, the simulator's definition. None when the ranks ran no memory step."""
    records = [rank.get("memory") for rank in output["ranks"]]
    if any(r is None or r.memory_peak_bytes is None for r in records):
        return None
    K = len(plan.ranks)
    times, levels = [], []
    for r in records:
        t = np.empty(2 * len(r))
        t[0::2], t[1::2] = r.starts, r.ends
        level = np.empty(2 * len(r))
        level[0::2], level[1::2] = r.memory_action_peaks, r.memory_levels
        times.append(t)
        levels.append(level)
    # the bytes live before the first action (static state) are the first level's: no static term
    device = device_peaks(plan.device_map, [0.0] * len(records), times, levels)
    return ([float(r.memory_peak_bytes) for r in records[:K]], [dict(r.memory_breakdown) for r in records[:K]],
            device)


def measured_result(plan: Plan, output: dict[str, Any]) -> Measurement:
    """The measured Result (median step after warm-up), via gpipe_sim.results.result.summarize.

    Its stages' `peak_memory_bytes` (and the device peaks) are the ranks' real tensor bytes over the
    memory step (`measured_memory`) where the ranks ran one; `peak_activation_bytes` stays the
    saved-tensor accounting, and `Measurement.accounting_peak_bytes` its static + activations."""
    ranks = output["ranks"]
    K, G = len(plan.ranks), plan.num_ranks  # pipeline ranks; every process (D replicas of K)
    timelines = step_timelines(plan, output)
    times = [float(t.end_s.max()) for t in timelines]
    order = np.argsort(times)
    median = int(order[(len(times) - 1) // 2])
    recs = [ranks[g]["records"][median] for g in range(G)]
    state_per_param = local_state_bytes_per_param(plan.scenario)  # ZeRO-1 shards, as the plan counts
    owned = {c: info for rank in ranks for c, info in rank["chunks"].items()}
    chunks = range(len(plan.chunks))
    param_bytes = [float(owned[c]["param_bytes"]) for c in chunks]
    state_bytes = [float(owned[c]["param_count"] * state_per_param) for c in chunks]
    chunk_peaks = {c: peak for r in recs[:K] for c, peak in r.chunk_peak_activation_bytes.items()}
    timeline = timelines[median]
    curves = []
    for g in range(G):
        mine = timeline.rank == g
        curves.append(levels_from_totals(timeline.start_s[mine], timeline.end_s[mine], recs[g].held))
    static = [sum(param_bytes[c] + state_bytes[c] for c in plan.ranks[g % K].chunks) for g in range(G)]
    device_peak = device_peaks(plan.device_map, static, [c[0] for c in curves], [c[1] for c in curves])
    accounting = [static[k] + recs[k].peak_activation_bytes for k in range(K)]
    memory = measured_memory(plan, output)
    peak_memory, breakdown = None, None
    if memory is not None:
        peak_memory, breakdown, device_peak = memory
    result = summarize_plan(
        plan, timeline,
        peak_activation_bytes=[r.peak_activation_bytes for r in recs[:K]],  # replica 0's ranks
        chunk_peak_activation_bytes=[chunk_peaks[c] for c in chunks],
        param_bytes=param_bytes,
        state_bytes=state_bytes,
        device_peak_memory_bytes=device_peak,
        source="measured",
        peak_memory_bytes=peak_memory,
        memory_breakdown=breakdown,
    )
    result.memory_timeline = curves[:K]
    return Measurement(
        result=result,
        step_times_s=times,
        loss=float(sum(r.loss for r in recs)),  # every replica's share of the global batch
        cuda_peak_bytes=[r.cuda_peak_bytes for r in recs],
        accounting_peak_bytes=accounting,
    )


def execute(scenario: Scenario, *, steps: int = 5, warmup: int = 2, seed: int = 0,
            dropout: float | None = None, options: LaunchOptions = LaunchOptions()) -> Measurement:
    """Train `scenario` for warm-up + measured steps with one process per rank; measure the step."""
    return run_plan(check_runnable(scenario), steps=steps, warmup=warmup, seed=seed, dropout=dropout,
                    options=options)


def run_plan(plan: Plan, *, model: ModelSpec | None = None, steps: int = 5, warmup: int = 2, seed: int = 0,
             dropout: float | None = None, options: LaunchOptions = LaunchOptions()) -> Measurement:
    """Train the compiled plan for warm-up + measured steps with one process per rank; measure the
    step. `model`: the zoo model the ranks build where the plan's is a measured table."""
    if steps < 1 or warmup < 0:
        raise GpipeError(f"steps must be >= 1 and warm-up >= 0, got {steps} and {warmup}")
    job = job_for(plan, model=model, steps=steps, warmup=warmup, seed=seed, dropout=dropout)
    output = launch([job], plan.device_map, options)[0]
    return measured_result(plan, output)
