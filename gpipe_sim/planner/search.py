"""The planner: the fastest configuration (T x C x D x K, v, M, schedule, remat, partition, ZeRO) that fits N devices."""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, MutableMapping, Sequence

import numpy as np

from gpipe_sim.api import result_from_times, run_engine, simulate_plan
from gpipe_sim.errors import GpipeError
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.scenario.scenario import Scenario
from gpipe_sim.planner.bounds import (
    CostTable, chunk_placement, memory_lower_bound, min_max_partition, step_lower_bound,
)
from gpipe_sim.planner.program_bounds import program_step_bound, relaxed_step_bound
from gpipe_sim.planner.held_bound import held_memory_bound, held_memory_ceiling, held_samples
from gpipe_sim.planner.coarse import coarse_arrays
from gpipe_sim.planner.coarse_order import CoarseOrder
from gpipe_sim.planner.pruned import Pruned
from gpipe_sim.planner.space_index import CandidateSpace
from gpipe_sim.planner.refiner import Refiner
from gpipe_sim.planner.ranking import Ranking
from gpipe_sim.planner.work_rows import WorkCache
from gpipe_sim.planner.entries import (
    LIMITERS, MEMORY_LIMITED, NEGLIGIBLE_LOSS, PlanEntry, _entry, collapse_alike, limiter_of,
    pareto_front,
)
from gpipe_sim.planner.space import (
    AXES, DATA_PARALLEL, DATA_PARALLEL_SCHEDULE, DEFAULT_PARTITIONS, DEFAULT_RESERVE, TIE, Candidate, PlanOptions,
    candidate_space, check_options, device_layouts, device_pairs, enumerate_candidates, space_blocks,
    tensor_parallel_values,
)

__all__ = [
    "AXES", "DATA_PARALLEL", "DATA_PARALLEL_SCHEDULE", "DEFAULT_PARTITIONS", "DEFAULT_RESERVE", "LIMITERS", "MEMORY_LIMITED", "NEGLIGIBLE_LOSS", "Candidate", "CostTable",
    "PlanEntry", "PlanOptions", "PlanSearch", "candidate_space", "check_options", "collapse_alike", "device_layouts", "device_pairs",
    "enumerate_candidates", "held_memory_bound", "held_samples", "limiter_of", "memory_lower_bound",
    "min_max_partition", "pareto_front", "preference", "program_step_bound", "relaxed_step_bound", "reserved_base",
    "step_lower_bound", "tensor_parallel_values", "TIE",
]

@dataclass
class PlanSearch:
    """What the search found: `ranked` (every fitting configuration simulated, best throughput
    first), `distinct` (the same with configurations of equal signature collapsed into the first
    enumerated, its `alike` counting the others; its first `options.top` are exactly an exhaustive
    sweep's), `order` (what reports show: the distinct configurations within the tie of the
    fastest, by `preference`, then the others by throughput; its first is the `pick`), the
    counts, the Pareto front of throughput against peak memory over everything simulated, and
    the time taken. `base` is the scenario searched: the one given with the reserve applied.
    `candidates`, `pruned` (index -> (reason code, figure, threshold)) and `rejected` ((D, K, v,
    M, schedule, reason) the space refused) account for every configuration considered."""

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
    capacity_bytes: float  # per device, after the reserve
    smallest_peak: PlanEntry | None = None  # when nothing fits: the configuration needing the least
    notes: list[str] = field(default_factory=list)
    order: list[PlanEntry] = field(default_factory=list)
    tied: int = 0  # how many of `order` (its first) are within the tie of the fastest
    limit_bytes: float = math.inf  # the peak a configuration may reach: capacity less the headroom
    # each schedule family's fastest fitting configuration (`family`: the schedule, or "data
    # parallel" at K=1), found exactly (`_family_bests`), fastest family first
    family_best: list[PlanEntry] = field(default_factory=list)
    family_unproven: set[str] = field(default_factory=set)  # families whose best is the best found only
    candidates: Sequence[Candidate] = field(default_factory=list)
    pruned: MutableMapping[int, tuple[str, float, float]] = field(default_factory=dict)
    rejected: list[tuple[Any, ...]] = field(default_factory=list)

    @property
    def best(self) -> PlanEntry | None:
        """The fastest fitting configuration."""
        return self.ranked[0] if self.ranked else None

    @property
    def pick(self) -> PlanEntry | None:
        """What the planner proposes: of the configurations tied with the fastest, the preferred."""
        return self.order[0] if self.order else None

    @property
    def configs_per_second(self) -> float:
        """Configurations decided (enumerated) per second of search."""
        return self.enumerated / self.seconds if self.seconds > 0 else float("inf")


# ---------------------------------------------------------------------------------------------
# the search


def reserved_base(base: Scenario, options: PlanOptions) -> Scenario:
    """`base` with at least `options.reserve` of each device's memory held back: its usable share
    lowered to 1 - reserve where it is above (a hardware that already leaves as much is kept);
    with `options.sequence_parallel`, sequence parallelism on (it changes nothing at T = 1)."""
    if options.sequence_parallel and not base.pipeline.sequence_parallel:
        base = base.with_updates({"pipeline.sequence_parallel": True})
    accel = base.hardware.accelerator
    usable = 1.0 - options.reserve
    if not math.isfinite(accel.memory_bytes) or accel.usable_memory_fraction <= usable:
        return base
    return base.with_updates({"hardware.accelerator.usable_memory_fraction": usable})


# No re-computation first, then the cheaper in time: selective recomputes the attention core only,
# full each block's forward, always the whole chunk's
_REMAT_ORDER = {"none": 0, "selective": 1, "except_last": 2, "full": 3, "always": 4}
# The schedules an engineer reaches for first: the plain pipelines, then zero-bubble, then chunked.
_SCHEDULE_ORDER = ("1f1b", "gpipe", "zb_h1", "zb_h2", "interleaved_1f1b", "interleaved_zb", "looped_bfs",
                   "zbv", "dualpipev", "naive")


def structure(cand: Candidate, batch: int) -> tuple[Any, ...]:
    """The part of `preference` known before simulating: no tensor parallelism (then the smaller
    T), no context parallelism (then the smaller C), the smaller E, fewer stages, no re-computation, no ZeRO, one chunk per rank, even micro-batches, the
    plainer schedule and partition."""
    name = cand.schedule
    rank = _SCHEDULE_ORDER.index(name) if name in _SCHEDULE_ORDER else len(_SCHEDULE_ORDER)
    even = (batch // cand.data_parallel) % cand.micro_batches == 0
    return (cand.tensor_parallel, cand.context_parallel, cand.expert_parallel, cand.stages,
            _REMAT_ORDER.get(cand.remat, len(_REMAT_ORDER)),
            cand.zero, cand.chunks, not even, rank, cand.partition != "uniform")


def preference(e: PlanEntry, batch: int) -> tuple[Any, ...]:
    """How tied configurations are ordered, simplest and roomiest first: `structure`, then the
    lower peak memory, the shorter step and the enumeration order."""
    return (*structure(e.candidate, batch), e.peak_memory_bytes, e.step_time_s, e.index)


# a refined candidate: (step-time lower bound, index, layer counts where known, whether that bound is
_Refined = tuple[float, int, "list[int] | None", bool]  # its pass orders' already)


def _coarse_queue(costs: CostTable, candidates: CandidateSpace, works: WorkCache, pruned: Pruned) -> CoarseOrder:
    """Every candidate whose partition-free memory bound fits (the others noted in `pruned`),
    with its coarse step-time bound (`coarse_arrays`), in the order of (bound, index)."""
    memory, step = coarse_arrays(costs, candidates, works)
    cap = costs.capacity
    over = np.flatnonzero(memory > cap)
    pruned.set_many(over, "memory", memory[over], cap)
    kept = np.flatnonzero(~(memory > cap))
    return CoarseOrder(step[kept], kept)


def _decide(base: Scenario, costs: CostTable, ranking: Ranking, refine: Refiner, index: int, cand: Candidate,
            counts: list[int] | None, held_checked: bool = False) -> str:
    """Decide one queued candidate and record any entry it gives: "memory" (the activations its
    schedule holds, or after compiling a finer memory bound, exceed the capacity; not asked again
    where `held_checked`), "ordered" (its pass orders' bound is above the threshold), "reused" (its
    plan was simulated already: `PlanKeys`), "repeat" (its plan's step is bounded already above the
    threshold), "infeasible" (it does not compile), "bound" (a finer step-time bound is above the
    threshold), "timed" (its timed step is: pruned before its memory is accounted, as by a bound,
    the step its figure) or "simulated"; the reason of the pruned ones noted in `ranking.pruned`
    ("bound" for "ordered", "repeat" and "timed")."""
    cap = costs.capacity
    try:
        if not held_checked and _held_prunes(costs, ranking, index, cand, counts):
            return "memory"
        # the passes in the schedule's orders, before compiling (`order_bound`)
        if counts is not None and ranking.floor_prunes(index, None, refine.order(cand, counts, chunk_placement(cand))):
            return "ordered"
        key = ranking.plans.key(cand, counts) if counts is not None else None
        if ranking.reuse(key, index, cand):
            return "reused"
        if ranking.repeats(key, index):
            return "repeat"
        # alike replicas timed once (replicas that differ over the pass limit: infeasible, said why)
        plan_ = compile_plan(base.with_updates(cand.overrides())).simulated()
    except GpipeError as exc:
        ranking.pruned[index] = ("infeasible:" + str(exc).split("\n")[0], math.nan, math.nan)
        return "infeasible"
    if counts is None:
        counts = plan_.layer_counts
        key = ranking.plans.key(cand, counts)
        if ranking.reuse(key, index, cand):
            return "reused"
        if ranking.repeats(key, index):
            return "repeat"
        for what, bound, limit in (("memory", memory_lower_bound(costs, cand, counts), cap),
                                   ("bound", step_lower_bound(costs, cand, counts), ranking.threshold())):
            if bound > limit:
                ranking.pruned[index] = (what, bound, limit)
                return what
    # the compiled plan's step bound: for a plan the SimPy engine would time (links or devices
    # shared), the fast evaluator's step of it with the contention relaxed (`relaxed_step_bound`),
    # else `program_step_bound` (cheaper than the timing and the memory accounting it may spare)
    if ranking.floor_prunes(index, key, relaxed_step_bound(plan_) or program_step_bound(costs, cand, plan_)):
        return "bound"
    # timed before its memory is accounted: a step above the threshold prunes it as a bound would
    start, end = run_engine(plan_)
    if ranking.floor_prunes(index, key, float(end.max()) if len(end) else 0.0):
        return "timed"
    entry = _entry(index, cand, result_from_times(plan_, start, end), cap)
    ranking.seen[key] = entry
    ranking.record(entry)
    return "simulated"


def search_configurations(base: Scenario, options: PlanOptions, *,
                           progress: Callable[[int, int], None] | None = None) -> PlanSearch:
    """Search the space of `enumerate_candidates` for the fastest configurations that fit.

    The base is searched with at least `options.reserve` of each device's memory held back
    (`reserved_base`); a configuration fits when its peak leaves `options.headroom` of that free.
    Candidates whose memory lower bound exceeds it are dropped unsimulated; the rest are
    simulated (`compile_plan` + the fast evaluator, as `gpipe_sim.api.simulate(..., "auto")`) in
    the order of their step-time lower bound (a coarse one first, refined with the partition's
    counts when it comes up), and a candidate whose bound is above the threshold (the `top`-th
    best step found, or the fastest's plus the tie where higher) is skipped (all later ones
    too). Both bounds are proven below the simulator's own figures, so the top `top` are the
    ones an exhaustive sweep finds, and so is every configuration within the tie of the fastest.
    Candidates whose partition comes out equal to one already simulated reuse its figures.
    `progress(done, total)` is called as candidates are decided."""
    t0 = time.perf_counter()
    base = reserved_base(base, options)
    rejected: list[tuple[Any, ...]] = []
    candidates = CandidateSpace(space_blocks(base, options, rejected))
    costs = CostTable(base)
    costs.capacity *= 1.0 - options.headroom
    ranking = Ranking(options.top, len(candidates))
    works = WorkCache(costs)
    queue = _coarse_queue(costs, candidates, works, ranking.pruned)
    outcomes: Counter[str] = Counter(memory=len(ranking.pruned))
    refine = Refiner(costs, works)
    _run_queue(base, costs, ranking, candidates, queue, refine, outcomes, progress)
    if options.tie > 0 and math.isfinite(ranking.fastest):
        _resolve_ties(base, costs, ranking, candidates, refine, outcomes, options)
    unproven: set[str] = set()
    bests = _family_bests(base, costs, ranking, candidates, refine, outcomes, unproven, progress)
    search = _finish(base, options, candidates, costs, ranking.entries, outcomes, t0)
    search.family_best, search.family_unproven = bests, unproven
    search.pruned, search.rejected = ranking.pruned, rejected
    return search


def _run_queue(base: Scenario, costs: CostTable, ranking: Ranking, candidates: CandidateSpace,
               queue: CoarseOrder, refine: Refiner, outcomes: Counter[str],
               progress: Callable[[int, int], None] | None) -> None:
    """Decide the queued candidates in the order of their bounds, (bound, index): the coarse
    queue's in its order, each refined when it comes up first and put back in a heap of the
    refined, and bounded by its pass orders when it comes up there (put back where that is
    higher), until the least bound is above the threshold; the rest pruned by it."""
    total = len(candidates)
    bounds, indices = queue.bounds, queue.indices  # sorted a chunk at a time (`queue.more`)
    refined: list[_Refined] = []
    p, n = 0, len(queue)
    if progress:
        progress(total - n, total)
    while p < n or refined:
        if p == len(bounds) < n:
            queue.more()
        coarse = p < n and (not refined or (bounds[p], indices[p]) < refined[0][:2])
        bound = bounds[p] if coarse else refined[0][0]
        if bound > ranking.threshold():
            break
        if coarse:
            i = indices[p]
            p += 1
            mem, step, counts = refine(candidates[i])
            if mem > costs.capacity:
                ranking.pruned[i] = ("memory", mem, costs.capacity)
                outcomes["memory"] += 1
            else:
                heapq.heappush(refined, (step, i, counts, False))
            continue
        bound, i, counts, tight = heapq.heappop(refined)
        if not tight and counts is not None:
            # its held activations, then its pass orders' bound: back in the heap where that is
            # higher, so candidates are decided in the order of their close bounds (the threshold
            # falls sooner)
            if _held_prunes_or_fails(costs, ranking, i, candidates[i], counts):
                outcomes["memory"] += 1
                continue
            ordered = _order_bound(refine, candidates[i], counts)
            if ordered > bound:
                heapq.heappush(refined, (ordered, i, counts, True))
                continue
        # a candidate with counts had its held activations bounded when it first came up here
        outcomes[_decide(base, costs, ranking, refine, i, candidates[i], counts, held_checked=counts is not None)] += 1
        if progress and sum(outcomes.values()) % 64 == 0:
            progress(total - (n - p) - len(refined), total)
    limit = ranking.threshold()
    rest_bounds, rest_indices = queue.rest(p)
    ranking.pruned.set_many(rest_indices, "bound", rest_bounds, limit)
    if refined:
        ranking.pruned.set_many([r[1] for r in refined], "bound", [r[0] for r in refined], limit)
        ranking.close.update(r[1] for r in refined if r[3])  # bounded by their pass orders
    outcomes["bound"] += n - p + len(refined)
    if progress:
        progress(total, total)


def _held_prunes(costs: CostTable, ranking: Ranking, index: int, cand: Candidate, counts: list[int] | None) -> bool:
    """Whether the activations the candidate's schedule holds at once exceed the capacity (then
    noted "memory" in `ranking.pruned`); bounded only where the batch's could exceed it."""
    cap = costs.capacity
    held = 0.0 if counts is not None and held_memory_ceiling(costs, cand, counts) <= cap else \
        held_memory_bound(costs, cand, counts)
    if held > cap:
        ranking.pruned[index] = ("memory", held, cap)
        return True
    return False


def _held_prunes_or_fails(costs: CostTable, ranking: Ranking, index: int, cand: Candidate,
                          counts: list[int] | None) -> bool:
    """`_held_prunes`, False where the schedule cannot be built (`_decide` then says why)."""
    try:
        return _held_prunes(costs, ranking, index, cand, counts)
    except GpipeError:
        return False


def _order_bound(refine: Refiner, cand: Candidate, counts: list[int]) -> float:
    """`refine.order` of the candidate (kept: `_decide` reads it again), 0 where its orders cannot
    be generated (`_decide` then says why it does not compile)."""
    try:
        return refine.order(cand, counts, chunk_placement(cand))
    except GpipeError:
        return 0.0


def _resolve_ties(base: Scenario, costs: CostTable, ranking: Ranking, candidates: Sequence[Candidate],
                  refine: Refiner, outcomes: Counter[str], options: PlanOptions) -> None:
    """Simulate what the tie needs: the candidates pruned by a bound within the tie of the
    fastest, by `structure` (the preferred first), until `top` distinct tied configurations of
    the groups done are known (a later group's cannot rank before them); the rest noted
    "preferred" (others tied rank before them)."""
    batch = base.pipeline.batch_size
    limit = ranking.fixed = ranking.fastest * (1.0 + options.tie)
    groups: dict[tuple[Any, ...], list[int]] = {}
    pruned = ranking.pruned
    bounded = pruned.where("bound")
    for i in bounded[pruned.figure[bounded] <= limit].tolist():
        groups.setdefault(structure(candidates[i], batch), []).append(i)
    for e in ranking.entries:
        if e.fits and e.step_time_s <= limit:
            groups.setdefault(structure(e.candidate, batch), [])
    tied: set[tuple[Any, ...]] = set()
    rest: list[int] = []
    for key in sorted(groups):
        if len(tied) >= options.top:
            rest += groups[key]
            continue
        for i in sorted(groups[key]):
            _reconsider(base, costs, ranking, candidates, i, limit, refine, outcomes)
        tied |= {e.signature for e in ranking.entries if e.fits and e.step_time_s <= limit
                 and structure(e.candidate, batch) == key}
    _mark_preferred(costs, ranking, candidates, rest, limit, refine, outcomes)
    ranking.fixed = None


PREFERRED_TIGHTENED = 512  # at most this many candidates past the tie's top are bounded again


def _mark_preferred(costs: CostTable, ranking: Ranking, candidates: Sequence[Candidate], indices: list[int],
                    limit: float, refine: Refiner, outcomes: Counter[str]) -> None:
    """Note the candidates of the tie's later groups "preferred" (simpler tied ones rank before
    them) with their bound; where they are at most PREFERRED_TIGHTENED, each is first bounded by
    its refined memory bound and its pass orders (cheap, uncompiled), and one those put over the
    capacity or above the tie is noted so ("memory", "bound"), as the report then explains it."""
    tighten = len(indices) <= PREFERRED_TIGHTENED
    for i in indices:
        figure = ranking.pruned[i][1]
        if tighten:
            cand = candidates[i]
            memory, step, counts = refine(cand)
            if memory > costs.capacity:
                ranking.pruned[i] = ("memory", memory, costs.capacity)
                outcomes["bound"], outcomes["memory"] = outcomes["bound"] - 1, outcomes["memory"] + 1
                continue
            figure = max(figure, step, refine.order(cand, counts, chunk_placement(cand)) if counts is not None else 0.0)
        ranking.pruned[i] = ("bound" if figure > limit else "preferred", figure, limit)


def _reconsider(base: Scenario, costs: CostTable, ranking: Ranking, candidates: Sequence[Candidate], i: int,
                limit: float, refine: Refiner, outcomes: Counter[str]) -> str:
    """Take candidate i, pruned by the coarse bound, out of the pruned; prune it again by its
    refined memory or step bound where that exceeds the capacity or `limit`, else decide it
    (`_decide`: simulate, or reuse a simulated twin). Counts the outcome and returns `_decide`'s
    ("" where the refined bounds prune it). One marked "preferred" (within the tie) and pruned
    again by a step bound within that tie stays so marked."""
    was, _, tie = ranking.pruned.pop(i)
    outcomes["bound"] -= 1
    mem, step, counts = refine(candidates[i])
    decided = ""
    if not (mem > costs.capacity or step > limit):
        decided = _decide(base, costs, ranking, refine, i, candidates[i], counts)
        outcomes[decided] += 1
    else:
        what = "memory" if mem > costs.capacity else "bound"
        ranking.pruned[i] = (what, mem if what == "memory" else step,
                             costs.capacity if what == "memory" else limit)
        outcomes[what] += 1
    now, bound, _ = ranking.pruned.get(i, ("", math.nan, math.nan))
    if was == "preferred" and now == "bound" and bound <= tie:
        ranking.pruned[i] = (was, bound, tie)
    return decided


def _ordered(ranked: list[PlanEntry], distinct: list[PlanEntry], tie: float, batch: int
             ) -> tuple[list[PlanEntry], int]:
    """The entries as reports show them: those within the tie of the fastest by `preference`
    (one per signature, the preferred name, `alike` counting the others), then the other
    distinct ones by throughput; and how many are tied. Sets `vs_fastest` and `tied`."""
    if not ranked:
        return [], 0
    fastest = min(e.step_time_s for e in ranked)
    for e in ranked:
        e.vs_fastest = e.step_time_s / fastest - 1.0 if fastest > 0 else 0.0
        e.tied = e.step_time_s <= fastest * (1.0 + tie)
    kept: dict[tuple[Any, ...], PlanEntry] = {}
    for e in sorted((e for e in ranked if e.tied), key=lambda e: preference(e, batch)):
        first = kept.get(e.signature)
        if first is None:
            kept[e.signature] = e
            e.alike = 0
        else:
            first.alike += 1
    tied = list(kept.values())
    return tied + [e for e in distinct if not e.tied], len(tied)


def family(cand: Candidate) -> str:
    """A configuration's schedule family as reports name it: its schedule, "data parallel" at K=1."""
    return DATA_PARALLEL if cand.data_parallel_only else cand.schedule


MAX_FAMILY_DECISIONS = 48  # per family, after the main search (a bound on the extra work)
# what a decision pruned by a step bound counts of one (it compiles the plan and bounds its program,
# the relaxed evaluation included: about a quarter of the cost of simulating and accounting memory)
PROGRAM_BOUND_SHARE = 0.25
# one pruned by its timed step (compiled and timed, its memory not accounted) counts as the
# simulation it was before it was pruned so; one pruned by its pass orders' bound (not compiled) or
# by the activations its schedule holds (`held_memory_bound`, not compiled) counts as a tenth; one
# that reuses what a twin's decision found, nothing
TIMED_SHARE, ORDER_BOUND_SHARE = 1.0, 0.1
SHARES = {"bound": PROGRAM_BOUND_SHARE, "timed": TIMED_SHARE, "ordered": ORDER_BOUND_SHARE,
          "memory": ORDER_BOUND_SHARE, "reused": 0.0, "repeat": 0.0}


def _family_bests(base: Scenario, costs: CostTable, ranking: Ranking, candidates: Sequence[Candidate],
                  refine: Refiner, outcomes: Counter[str], unproven: set[str],
                  progress: Callable[[int, int], None] | None = None) -> list[PlanEntry]:
    """Each family's fastest fitting configuration, fastest family first. The main search proves
    only the top N; a family whose configurations all rank below them has candidates pruned by a
    bound above the N-th step, which may still beat the family's best found: those are decided
    in the order of their bounds, against that family's best (`ranking.fixed`), until the next
    bound is above it (at most MAX_FAMILY_DECISIONS a family, each decision counted its share of
    one, `SHARES`: where reached, it goes in `unproven`). Each family first decides its candidate
    of least bound among those bounded closely (`ranking.close`: by their pass orders, compiled
    programs or timed steps: a close best early, which prunes the rest sooner).
    `progress(total, total)` is called before each decision (where a caller may stop the search)."""
    best: dict[str, PlanEntry] = {}

    def keep(entries: Sequence[PlanEntry]) -> None:
        for e in entries:
            f = family(e.candidate)
            if e.fits and (f not in best or (e.step_time_s, e.index) < (best[f].step_time_s, best[f].index)):
                best[f] = e

    keep(ranking.entries)
    pending = _pending_by_family(ranking.pruned, candidates)

    def decide(i: int, limit: float) -> float:
        """Reconsider candidate i against `limit`; the share of a decision it cost (module constants)."""
        if progress:
            progress(len(candidates), len(candidates))
        ranking.fixed = limit
        done = len(ranking.entries)
        outcome = _reconsider(base, costs, ranking, candidates, i, limit, refine, outcomes)
        keep(ranking.entries[done:])
        return 0.0 if not outcome else SHARES.get(outcome, 1.0)

    for name, (bounds, indices) in pending.items():
        spent = 0.0
        # first the least close bound (a close best soon)
        seeds = np.flatnonzero(np.isin(indices, np.fromiter(ranking.close, dtype=np.int64)))
        if len(seeds) and bounds[seeds[0]] <= (best[name].step_time_s if name in best else math.inf):
            spent += decide(int(indices[seeds[0]]), best[name].step_time_s if name in best else math.inf)
        for bound, i in zip(bounds.tolist(), indices.tolist()):
            limit = best[name].step_time_s if name in best else math.inf
            if bound > limit:
                break
            if i not in ranking.pruned:  # the seed
                continue
            if spent >= MAX_FAMILY_DECISIONS:
                unproven.add(name)
                break
            spent += decide(i, limit)
    ranking.fixed = None
    return sorted(best.values(), key=lambda e: (e.step_time_s, e.index))


def _pending_by_family(pruned: Pruned, candidates: CandidateSpace) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per schedule family (`family`), its candidates pruned by a step-time bound or as
    "preferred": (bounds, indices) in the order of (bound, index); the families in the order
    they occur in the space."""
    codes, names = candidates.family_codes()
    held = pruned.where("bound", "preferred")
    held_codes, bounds = codes[held], pruned.figure[held]
    order = np.lexsort((held, bounds, held_codes))  # by family, then (bound, index)
    held, held_codes, bounds = held[order], held_codes[order], bounds[order]
    cuts = np.searchsorted(held_codes, np.arange(len(names) + 1))
    return {name: (bounds[cuts[f]:cuts[f + 1]], held[cuts[f]:cuts[f + 1]])
            for f, name in enumerate(names) if cuts[f + 1] > cuts[f]}


def _finish(base: Scenario, options: PlanOptions, candidates: Sequence[Candidate], costs: CostTable,
            entries: list[PlanEntry], outcomes: Counter[str], t0: float) -> PlanSearch:
    """The `PlanSearch` of the recorded entries: ranked, collapsed and ordered, Results dropped
    outside the top of each, the smallest peak searched for when nothing fits; `seconds` since `t0`."""
    top = options.top
    ranked = sorted((e for e in entries if e.fits), key=lambda e: (-e.throughput_samples_per_s, e.index))
    distinct = collapse_alike(ranked)
    order, tied = _ordered(ranked, distinct, options.tie, base.pipeline.batch_size)
    keep = {id(e) for e in ranked[:top]} | {id(e) for e in distinct[:top]} | {id(e) for e in order[:top]}
    for e in entries:
        if id(e) not in keep:
            e.result = None
    search = PlanSearch(
        base=base, options=options, ranked=ranked, distinct=distinct, simulated_entries=entries,
        front=pareto_front(entries), enumerated=len(candidates), simulated=outcomes["simulated"],
        reused=outcomes["reused"], pruned_by_memory=outcomes["memory"],
        pruned_by_bound=sum(outcomes[k] for k in ("bound", "ordered", "timed", "repeat")),
        infeasible=outcomes["infeasible"], seconds=time.perf_counter() - t0,
        capacity_bytes=base.hardware.accelerator.usable_memory_bytes, order=order, tied=tied,
        limit_bytes=costs.capacity, candidates=candidates,
    )
    if not ranked:
        search.smallest_peak = _smallest_peak(base, candidates, entries, costs, search.notes)
    search.seconds = time.perf_counter() - t0
    return search


def _smallest_peak(base: Scenario, candidates: Sequence[Candidate], entries: list[PlanEntry],
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
            other = _entry(i, candidates[i], simulate_plan(compile_plan(base.with_updates(candidates[i].overrides()))))
        except GpipeError:
            continue
        if best is None or (other.peak_memory_bytes, other.index) < (best.peak_memory_bytes, best.index):
            best = other
    return best
