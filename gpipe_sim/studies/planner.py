"""The planner: the fastest configuration (D x K, v, M, schedule, remat, partition, ZeRO) that fits N devices."""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from gpipe_sim.api import result_from_times, run_engine
from gpipe_sim.errors import GpipeError
from gpipe_sim.plan.compile import Plan, compile_plan
from gpipe_sim.results.result import Result
from gpipe_sim.spec.scenario import Scenario
from gpipe_sim.studies.planner_bounds import (
    CostTable, Work, candidate_work, chunk_placement, held_memory_bound, held_samples, memory_lower_bound,
    min_max_partition, program_step_bound, quick_counts, step_lower_bound,
)
from gpipe_sim.studies.planner_space import (
    AXES, DEFAULT_PARTITIONS, Candidate, PlanOptions, candidate_space, check_options, device_pairs,
    enumerate_candidates,
)

__all__ = [
    "AXES", "DEFAULT_PARTITIONS", "LIMITERS", "MEMORY_LIMITED", "NEGLIGIBLE_LOSS", "Candidate", "CostTable",
    "PlanEntry", "PlanOptions", "PlanSearch", "candidate_space", "check_options", "collapse_alike", "device_pairs",
    "enumerate_candidates", "held_memory_bound", "held_samples", "limiter_of", "memory_lower_bound",
    "min_max_partition", "pareto_front", "plan", "program_step_bound", "step_lower_bound",
]

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

    @property
    def signature(self) -> tuple[Any, ...]:
        """What tells configurations apart in the ranking: D, K, M, ZeRO and the figures. Names that
        compile to the same program (at K=1 most schedules, v and remat modes) share one signature."""
        return (self.overrides["pipeline.data_parallel"], self.overrides["pipeline.stages"],
                self.overrides["pipeline.micro_batches"], self.overrides["training.zero"],
                float(f"{self.step_time_s:.12g}"), float(f"{self.peak_memory_bytes:.12g}"))

    @property
    def throughput_per_device(self) -> float:
        return self.throughput_samples_per_s / max(1, self.devices)

    def get(self, key: str) -> Any:
        """An axis of the configuration by its short name (D, K, v, M, schedule, remat, partition, zero)."""
        return self.overrides[AXES[key]]

    def to_dict(self) -> dict[str, Any]:
        """Plain figures (JSON-ready; no Result)."""
        out: dict[str, Any] = {short: self.overrides[name] for short, name in AXES.items()}
        out.update(
            step_time_s=self.step_time_s, throughput_samples_per_s=self.throughput_samples_per_s,
            throughput_per_device=self.throughput_per_device, devices=self.devices,
            bubble_fraction=self.bubble_fraction, imbalance_fraction=self.imbalance_fraction,
            exposed_allreduce_s=self.exposed_allreduce_s, peak_memory_bytes=self.peak_memory_bytes,
            capacity_bytes=self.capacity_bytes if math.isfinite(self.capacity_bytes) else None,
            fits=self.fits, limiter=self.limiter, alike=self.alike,
        )
        return out


@dataclass
class PlanSearch:
    """What the search found: `ranked` (every fitting configuration simulated, best throughput
    first), `distinct` (the same with configurations of equal signature collapsed into the first
    enumerated, its `alike` counting the others; its first `options.top` are exactly an exhaustive
    sweep's), the counts, the Pareto front of throughput against peak memory over everything
    simulated, and the time taken."""

    base: Scenario
    options: PlanOptions
    ranked: list[PlanEntry]
    distinct: list[PlanEntry]
    simulated_entries: list[PlanEntry]
    front: list[PlanEntry]
    enumerated: int
    simulated: int
    reused: int  # candidates whose partition came out the same as one simulated: its figures reused
    pruned_by_memory: int
    pruned_by_bound: int
    infeasible: int
    seconds: float
    capacity_bytes: float
    smallest_peak: PlanEntry | None = None  # when nothing fits: the configuration needing the least
    notes: list[str] = field(default_factory=list)

    @property
    def best(self) -> PlanEntry | None:
        return self.ranked[0] if self.ranked else None

    @property
    def configs_per_second(self) -> float:
        """Configurations decided (enumerated) per second of search."""
        return self.enumerated / self.seconds if self.seconds > 0 else float("inf")


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


def _entry(index: int, cand: Candidate, result: Result) -> PlanEntry:
    """The entry of a candidate simulated as `result` (which it keeps)."""
    peak = max(result.device_peak_memory_bytes.values(), default=0.0)
    return PlanEntry(
        index=index, overrides=cand.overrides(), step_time_s=result.step_time_s,
        throughput_samples_per_s=result.throughput_samples_per_s, devices=cand.devices,
        bubble_fraction=result.bubble_fraction, imbalance_fraction=result.imbalance_fraction,
        exposed_allreduce_s=result.exposed_allreduce_s, peak_memory_bytes=peak,
        capacity_bytes=result.memory_capacity_bytes, fits=result.fits_in_memory,
        limiter=limiter_of(result), result=result,
    )


def _copy_entry(entry: PlanEntry, index: int, cand: Candidate) -> PlanEntry:
    """`entry`'s figures (and Result) under another candidate that compiles to the same plan."""
    return PlanEntry(index=index, overrides=cand.overrides(), step_time_s=entry.step_time_s,
                     throughput_samples_per_s=entry.throughput_samples_per_s, devices=entry.devices,
                     bubble_fraction=entry.bubble_fraction, imbalance_fraction=entry.imbalance_fraction,
                     exposed_allreduce_s=entry.exposed_allreduce_s, peak_memory_bytes=entry.peak_memory_bytes,
                     capacity_bytes=entry.capacity_bytes, fits=entry.fits, limiter=entry.limiter,
                     result=entry.result)


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


def _simulate(plan_: Plan) -> Result:
    """What `gpipe_sim.api.simulate(scenario, "auto")` gives: the fast evaluator, exact where no
    device or link is shared, else the SimPy engine."""
    start, end = run_engine(plan_, "auto")
    return result_from_times(plan_, start, end)


def _dedup_key(cand: Candidate, counts: Sequence[int]) -> tuple[Any, ...]:
    """Two candidates with equal keys compile to the same plan (the partition method only picks counts)."""
    axes = cand.axes()
    return tuple(repr(value) for value in axes[:6] + axes[7:]) + (cand.cleared, tuple(counts))


# ---------------------------------------------------------------------------------------------
# the search


def _bounded_queue(costs: CostTable, candidates: Sequence[Candidate]
                   ) -> tuple[list[tuple[float, int, list[int] | None]], int]:
    """(step-time lower bound, index, layer counts where known without compiling) of every
    candidate whose memory lower bound fits the capacity, sorted by bound then index; and how many
    the memory bound dropped. The bounds depend on the schedule only through its placement, and
    are computed once per distinct set of what they depend on."""
    works: dict[Any, Work] = {}
    bound_cache: dict[Any, tuple[float, float]] = {}
    queue = []
    pruned = 0
    for i, cand in enumerate(candidates):
        wkey = (cand.data_parallel, cand.micro_batches, cand.remat, cand.zero)
        w = works.get(wkey)
        if w is None:
            w = works[wkey] = candidate_work(costs, cand)
        counts = quick_counts(costs, cand, w.largest)
        bkey = (wkey, cand.stages, cand.chunks, chunk_placement(cand), None if counts is None else tuple(counts))
        bounds = bound_cache.get(bkey)
        if bounds is None:
            bounds = bound_cache[bkey] = (memory_lower_bound(costs, cand, counts),
                                          step_lower_bound(costs, cand, counts, w))
        mem, step = bounds
        if mem > costs.capacity:
            pruned += 1
            continue
        queue.append((step, i, counts))
    queue.sort(key=lambda q: (q[0], q[1]))
    return queue, pruned


class _Ranking:
    """The search's state: every entry recorded, the simulated ones by `_dedup_key`, and the step
    times of the `top` best fitting signatures, whose worst is the threshold a bound must beat."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.entries: list[PlanEntry] = []
        self.seen: dict[Any, PlanEntry] = {}
        self._best_steps: list[float] = []  # max-heap (negated) of the top fitting step times, one per signature
        self._signatures: set[tuple[Any, ...]] = set()

    def threshold(self) -> float:
        """The `top`-th best fitting step time found (inf until `top` signatures fit)."""
        return -self._best_steps[0] if len(self._best_steps) >= self.top else math.inf

    def record(self, entry: PlanEntry) -> None:
        """Keep the entry; a fitting one of a new signature may lower the threshold."""
        self.entries.append(entry)
        if entry.fits and entry.signature not in self._signatures:
            self._signatures.add(entry.signature)
            if len(self._best_steps) < self.top:
                heapq.heappush(self._best_steps, -entry.step_time_s)
            elif entry.step_time_s < -self._best_steps[0]:
                heapq.heapreplace(self._best_steps, -entry.step_time_s)

    def reuse(self, key: Any, index: int, cand: Candidate) -> bool:
        """Record the figures of the entry simulated under `key` for this candidate; False if none."""
        if key is None or key not in self.seen:
            return False
        self.record(_copy_entry(self.seen[key], index, cand))
        return True


def _decide(base: Scenario, costs: CostTable, ranking: _Ranking, index: int, cand: Candidate,
            counts: list[int] | None) -> str:
    """Decide one queued candidate and record any entry it gives: "reused" (its plan was simulated
    already), "memory" (a finer memory bound exceeds the capacity), "infeasible" (it does not
    compile), "bound" (a finer step-time bound is above the threshold) or "simulated"."""
    cap = costs.capacity
    key = _dedup_key(cand, counts) if counts is not None else None
    if ranking.reuse(key, index, cand):
        return "reused"
    try:
        if held_memory_bound(costs, cand, counts) > cap:
            return "memory"
        plan_ = compile_plan(base.with_updates(cand.overrides()))
    except GpipeError:
        return "infeasible"
    if counts is None:
        counts = plan_.layer_counts
        key = _dedup_key(cand, counts)
        if ranking.reuse(key, index, cand):
            return "reused"
        if memory_lower_bound(costs, cand, counts) > cap:
            return "memory"
        if step_lower_bound(costs, cand, counts) > ranking.threshold():
            return "bound"
    if program_step_bound(costs, cand, plan_) > ranking.threshold():
        return "bound"
    entry = _entry(index, cand, _simulate(plan_))
    ranking.seen[key] = entry
    ranking.record(entry)
    return "simulated"


def plan(base: Scenario, options: PlanOptions, *,
         progress: Callable[[int, int], None] | None = None) -> PlanSearch:
    """Search the space of `enumerate_candidates` for the fastest configurations that fit.

    Candidates whose memory lower bound exceeds the capacity are dropped unsimulated; the rest are
    simulated (`compile_plan` + the fast evaluator, as `gpipe_sim.api.simulate(..., "auto")`) in the
    order of their step-time lower bound, and a candidate whose bound is above the `top`-th best
    step found is skipped (all later ones too, before compiling). Both bounds are proven below the
    simulator's own figures, so the top `top` are the ones an exhaustive sweep finds. Candidates
    whose partition comes out equal to one already simulated reuse its figures.
    `progress(done, total)` is called as candidates are decided."""
    t0 = time.perf_counter()
    candidates = candidate_space(base, options)
    costs = CostTable(base)
    total = len(candidates)
    queue, pruned_mem = _bounded_queue(costs, candidates)
    outcomes: Counter[str] = Counter(memory=pruned_mem)
    done = pruned_mem
    if progress:
        progress(done, total)
    ranking = _Ranking(options.top)
    for n, (bound, i, counts) in enumerate(queue):
        if bound > ranking.threshold():
            outcomes["bound"] += len(queue) - n
            break
        done += 1
        if progress and done % 64 == 0:
            progress(done, total)
        outcomes[_decide(base, costs, ranking, i, candidates[i], counts)] += 1
    if progress:
        progress(total, total)
    return _finish(base, options, candidates, costs, ranking.entries, outcomes, t0)


def _finish(base: Scenario, options: PlanOptions, candidates: list[Candidate], costs: CostTable,
            entries: list[PlanEntry], outcomes: Counter[str], t0: float) -> PlanSearch:
    """The `PlanSearch` of the recorded entries: ranked and collapsed, Results dropped outside the
    top of each, the smallest peak searched for when nothing fits; `seconds` since `t0`."""
    top = options.top
    ranked = sorted((e for e in entries if e.fits), key=lambda e: (-e.throughput_samples_per_s, e.index))
    distinct = collapse_alike(ranked)
    keep = {id(e) for e in ranked[:top]} | {id(e) for e in distinct[:top]}
    for e in entries:
        if id(e) not in keep:
            e.result = None
    search = PlanSearch(
        base=base, options=options, ranked=ranked, distinct=distinct, simulated_entries=entries,
        front=pareto_front(entries), enumerated=len(candidates), simulated=outcomes["simulated"],
        reused=outcomes["reused"], pruned_by_memory=outcomes["memory"], pruned_by_bound=outcomes["bound"],
        infeasible=outcomes["infeasible"], seconds=time.perf_counter() - t0, capacity_bytes=costs.capacity,
    )
    if not ranked:
        search.smallest_peak = _smallest_peak(base, candidates, entries, costs, search.notes)
    search.seconds = time.perf_counter() - t0
    return search


def _smallest_peak(base: Scenario, candidates: list[Candidate], entries: list[PlanEntry],
                   costs: CostTable, notes: list[str], limit: int = 500) -> PlanEntry | None:
    """When nothing fits: the configuration with the smallest peak, by branch and bound on the
    memory lower bound (candidates simulated in its order until it exceeds the least peak found;
    at most `limit` more simulations, with a note when that cuts the search short)."""
    best = min(entries, key=lambda e: (e.peak_memory_bytes, e.index), default=None)
    done = {e.index for e in entries}
    order = sorted((memory_lower_bound(costs, c), i) for i, c in enumerate(candidates) if i not in done)
    for n, (bound, i) in enumerate(order):
        if best is not None and bound > best.peak_memory_bytes:
            break
        if n >= limit:
            notes.append(f"the smallest peak was searched among {limit} more configurations only")
            break
        try:
            other = _entry(i, candidates[i], _simulate(compile_plan(base.with_updates(candidates[i].overrides()))))
        except GpipeError:
            continue
        if best is None or (other.peak_memory_bytes, other.index) < (best.peak_memory_bytes, best.index):
            best = other
    return best
