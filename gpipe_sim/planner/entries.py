"""The planner's entries: one simulated configuration's figures, what limits it, the Pareto front."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Sequence

from gpipe_sim.results.result import Result
from gpipe_sim.planner.space import AXES, Candidate

LIMITERS = ("bubble", "imbalance", "memory", "communication", "compute")
MEMORY_LIMITED = 0.9  # a configuration whose peak is at least this share of the capacity is memory-limited
NEGLIGIBLE_LOSS = 0.05  # device-time losses below this share of the step: the configuration is compute-bound


@dataclass
class PlanEntry:
    """One simulated configuration: its overrides of the base scenario and its figures."""

    index: int  # position in `enumerate_candidates` order
    overrides: dict[str, Any]
    step_time_s: float
    throughput_samples_per_s: float
    devices: int
    bubble_fraction: float
    imbalance_fraction: float
    exposed_allreduce_s: float
    peak_memory_bytes: float
    capacity_bytes: float
    fits: bool
    limiter: str
    result: Result | None = None  # kept for the top entries only
    alike: int = 0  # other configurations with the same figures (one compiled program under other names)
    even: bool = True  # M divides the per-replica batch (else micro-batches differ by one sample)
    vs_fastest: float = 0.0  # step time over the fastest fitting one's, less 1
    tied: bool = False  # within the tie of the fastest (`PlanOptions.tie`)
    # the most seconds tensor-parallel collectives add to one rank's passes over the step: the max over
    # ranks of their `StageResult.tp_comm_s`, as the sweep's column of that name
    max_stage_tp_comm_s: float = 0.0

    @property
    def signature(self) -> tuple[Any, ...]:
        """What tells configurations apart in the ranking: T, D, K, M, ZeRO and the figures. Names that
        compile to the same program (at K=1 most schedules, v and remat modes) share one signature."""
        return (self.get("T"), self.overrides["pipeline.data_parallel"], self.overrides["pipeline.stages"],
                self.overrides["pipeline.micro_batches"], self.overrides["training.zero"],
                float(f"{self.step_time_s:.12g}"), float(f"{self.peak_memory_bytes:.12g}"))

    @property
    def throughput_per_device(self) -> float:
        return self.throughput_samples_per_s / max(1, self.devices)

    def get(self, key: str) -> Any:
        """An axis of the configuration by its short name (D, K, v, M, schedule, remat, partition, zero,
        T, C, E; T, C and E are 1 where the overrides do not name them)."""
        return self.overrides[AXES[key]] if key not in ("T", "C", "E") else self.overrides.get(AXES[key], 1)

    @cached_property
    def candidate(self) -> Candidate:
        """The configuration as a `Candidate` (made once from `overrides`)."""
        return Candidate.from_overrides(self.overrides)

    @property
    def data_parallel_only(self) -> bool:
        """K=1: data parallelism with gradient accumulation, no pipeline."""
        return self.candidate.data_parallel_only

    def shown(self, key: str) -> Any:
        """An axis as reports show it (`Candidate.shown_axes`: at K=1 the schedule is "data
        parallel" and v, the partition are None)."""
        return self.candidate.shown(key)

    def to_dict(self) -> dict[str, Any]:
        """Plain figures (JSON-ready; no Result); the axes as `shown`."""
        out: dict[str, Any] = self.candidate.shown_axes()
        out.update(even_micro_batches=self.even, vs_fastest=self.vs_fastest, tied=self.tied)
        out.update(
            step_time_s=self.step_time_s, throughput_samples_per_s=self.throughput_samples_per_s,
            throughput_per_device=self.throughput_per_device, devices=self.devices,
            bubble_fraction=self.bubble_fraction, imbalance_fraction=self.imbalance_fraction,
            exposed_allreduce_s=self.exposed_allreduce_s, peak_memory_bytes=self.peak_memory_bytes,
            capacity_bytes=self.capacity_bytes if math.isfinite(self.capacity_bytes) else None,
            fits=self.fits, limiter=self.limiter, alike=self.alike,
            max_stage_tp_comm_s=self.max_stage_tp_comm_s,
        )
        return out


# ---------------------------------------------------------------------------------------------
# entries


def limiter_of(result: Result) -> str:
    """What limits a configuration: "memory" when its peak is at least 90% of the capacity, else
    the largest loss of device time: the pipeline's own idle time ("bubble"), uneven ranks
    ("imbalance") or waiting for the data-parallel all-reduce ("communication"); "compute" when
    each of those is under 5% of the step (only faster devices or fewer FLOPs help)."""
    peak = max(result.device_peak_memory_bytes.values(), default=0.0)
    if math.isfinite(result.memory_capacity_bytes) and peak >= MEMORY_LIMITED * result.memory_capacity_bytes:
        return "memory"
    comm = result.exposed_allreduce_s / result.step_time_s if result.step_time_s > 0 else 0.0
    losses = {"bubble": max(0.0, result.busiest_idle_fraction - comm),
              "imbalance": result.imbalance_fraction, "communication": comm}
    worst = max(losses, key=lambda k: losses[k])
    return worst if losses[worst] >= NEGLIGIBLE_LOSS else "compute"


def _entry(index: int, cand: Candidate, result: Result, limit: float = math.inf) -> PlanEntry:
    """The entry of a candidate simulated as `result` (which it keeps); it fits when the result
    does and its peak is at most `limit` (the capacity less the headroom)."""
    peak = max(result.device_peak_memory_bytes.values(), default=0.0)
    share = result.batch_size // cand.data_parallel
    return PlanEntry(
        index=index, overrides=cand.overrides(), step_time_s=result.step_time_s,
        throughput_samples_per_s=result.throughput_samples_per_s, devices=cand.devices,
        bubble_fraction=result.bubble_fraction, imbalance_fraction=result.imbalance_fraction,
        exposed_allreduce_s=result.exposed_allreduce_s, peak_memory_bytes=peak,
        capacity_bytes=result.memory_capacity_bytes, fits=result.fits_in_memory and peak <= limit,
        limiter=limiter_of(result), result=result, even=share % cand.micro_batches == 0,
        max_stage_tp_comm_s=max((s.tp_comm_s for s in result.stages), default=0.0),
    )


def _copy_entry(entry: PlanEntry, index: int, cand: Candidate) -> PlanEntry:
    """`entry`'s figures (and Result) under another candidate that compiles to the same plan (every
    figure field copied, so a new one needs no edit here; the ranking's own marks start afresh)."""
    return replace(entry, index=index, overrides=cand.overrides(), alike=0, vs_fastest=0.0, tied=False)


def pareto_front(entries: Sequence[PlanEntry]) -> list[PlanEntry]:
    """The entries no other beats on both throughput (higher) and peak memory (lower), by peak."""
    front: list[PlanEntry] = []
    best = -math.inf
    for e in sorted(entries, key=lambda e: (e.peak_memory_bytes, -e.throughput_samples_per_s, e.index)):
        if e.throughput_samples_per_s > best:
            front.append(e)
            best = e.throughput_samples_per_s
    return front


def collapse_alike(ranked: Sequence[PlanEntry]) -> list[PlanEntry]:
    """`ranked` with every entry whose signature an earlier (better, or equal and first enumerated)
    entry has dropped; the kept entry's `alike` counts the dropped ones. The threshold of the search
    counts signatures, so the first `top` of this list are exact too."""
    kept: dict[tuple[Any, ...], PlanEntry] = {}
    for e in sorted(ranked, key=lambda e: (-e.throughput_samples_per_s, e.index)):
        first = kept.get(e.signature)
        if first is None:
            e.alike = 0
            kept[e.signature] = e
        else:
            first.alike += 1
    return list(kept.values())
