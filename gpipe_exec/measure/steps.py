"""The ranks' records turned into the result schema: measured timelines, checked against the program, and memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpipe_exec.errors import ExecutionError
from gpipe_exec.measure.records import record_columns
from gpipe_sim.api import summarize_plan
from gpipe_sim.plan.compile import Plan, local_bytes_per_param
from gpipe_sim.plan.memory_timeline import device_peaks, levels_from_totals
from gpipe_sim.results.result import Result, Timeline
from gpipe_sim.schedule import ACTION_KINDS, Kind


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
    _, state_per_param = local_bytes_per_param(plan.scenario)  # ZeRO-1 shards, as the plan counts
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
    static = [sum(param_bytes[c] + state_bytes[c] for c in plan.ranks[plan.mesh.pipeline_rank(g)].chunks)
              for g in range(G)]
    accounting = [static[k] + recs[k].peak_activation_bytes for k in range(K)]
    memory = measured_memory(plan, output)
    if memory is not None:
        peak_memory, breakdown, device_peak = memory
    else:  # no memory step: the device peaks of the saved-tensor accounting
        peak_memory, breakdown = None, None
        device_peak = device_peaks(plan.device_map, static, [c[0] for c in curves], [c[1] for c in curves])
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
