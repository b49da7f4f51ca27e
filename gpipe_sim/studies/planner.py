"""The planner: the fastest configuration (D x K, v, M, schedule, remat, partition, ZeRO) that fits N devices.

The search enumerates every configuration the schema and the schedule families accept, drops
those that a memory lower bound already rules out, and simulates the rest (compile + the fast
evaluator) in the order of a step-time lower bound, skipping every candidate whose bound is above
the top-N found so far: both bounds are proven below the simulator's own figures (see
`memory_lower_bound` and `step_lower_bound`), so the top-N is the one an exhaustive sweep finds.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Sequence

import numpy as np

from gpipe_sim.api import result_from_times, run_engine
from gpipe_sim.errors import GpipeError, ScenarioError
from gpipe_sim.plan.compile import (
    Plan, compile_plan,
)
from gpipe_sim.plan.replicas import ring_allreduce_seconds
from gpipe_sim.plan.partition import held_activations, micro_batch_sizes, resolve_partition
from gpipe_sim.results.result import Result
from gpipe_sim.schedule import COMPUTE_KINDS, SCHEDULES, Kind
from gpipe_sim.schedule.lower import build_schedule, saves_activations
from gpipe_sim.spec import limits
from gpipe_sim.spec.costs import layer_seconds, split_backward_seconds, update_seconds
from gpipe_sim.spec.layers import build_layers
from gpipe_sim.spec.scenario import PARTITION_METHODS, REMAT_MODES, Scenario

DEFAULT_PARTITIONS = ("uniform", "time")
LIMITERS = ("bubble", "imbalance", "memory", "communication", "compute")
MEMORY_LIMITED = 0.9  # a configuration whose peak is at least this share of the capacity is memory-limited
NEGLIGIBLE_LOSS = 0.05  # device-time losses below this share of the step: the configuration is compute-bound
_SLACK = 1.0 - 1e-9  # bounds are sums in another order than the simulator's: keep them strictly below


@dataclass(frozen=True)
class PlanOptions:
    """The space the planner searches. None on an axis: its full range (see each field)."""

    devices: int  # N
    fewer_devices: bool = False  # also D*K < N
    schedules: tuple[str, ...] | None = None  # None: every registered schedule family
    remat: tuple[str, ...] | None = None  # None: every remat mode of the schema
    # None: the partition methods worth trying here, DEFAULT_PARTITIONS ("memory" and "fit" run a
    # partition search of 0.03-0.2 s per candidate: ask for them where memory is tight)
    partitions: tuple[str, ...] | None = None
    zero: tuple[int, ...] | None = None  # None: (0, 1) when D > 1, else (0,)
    max_chunks: int = 4  # v values tried for families with chunks > 1
    top: int = 10  # the ranking that must be exact: the bound never skips a candidate that enters it
    micro_batches: tuple[int, ...] | None = None  # None: every M the batch allows (1 .. batch / D)
    powers_of_two: bool = False  # K and D powers of two only (a narrower space for large N)


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


AXES = {"D": "pipeline.data_parallel", "K": "pipeline.stages", "v": "pipeline.chunks",
        "M": "pipeline.micro_batches", "schedule": "pipeline.schedule", "remat": "pipeline.remat",
        "partition": "pipeline.partition", "zero": "training.zero"}


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
# the space


def device_pairs(base: Scenario, options: PlanOptions) -> list[tuple[int, int]]:
    """(D, K) pairs with D*K = N (or <= N with `fewer_devices`) that the batch and layers allow."""
    from gpipe_sim.spec.layers import layer_count

    layers = layer_count(base.model)
    batch = base.pipeline.batch_size
    counts = range(1, options.devices + 1) if options.fewer_devices else [options.devices]
    pairs = []
    for n in counts:
        for K in _divisors(n):
            D = n // K
            if options.powers_of_two and (K & (K - 1) or D & (D - 1)):
                continue
            if K <= layers and batch % D == 0 and D <= batch:
                pairs.append((D, K))
    return pairs


def _divisors(n: int) -> list[int]:
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return sorted(set(small + [n // k for k in small]))


def _placement_overrides(base: Scenario, D: int, K: int) -> dict[str, Any]:
    """Hardware fields of the base that no longer fit D x K, cleared so the candidate places
    itself (Megatron-LM's order over D*K devices)."""
    hw, p = base.hardware, base.pipeline
    out: dict[str, Any] = {}
    same = (D, K) == (p.data_parallel, p.stages)
    if hw.placement is not None and not same:
        out["hardware.placement"] = None
    if hw.stage_to_device is not None and not (same or (D == 1 and len(hw.stage_to_device) == K)):
        out["hardware.stage_to_device"] = None
    if hw.links is not None and len(hw.links) != K - 1:
        out["hardware.links"] = None
    return out


def enumerate_candidates(base: Scenario, options: PlanOptions) -> list[dict[str, Any]]:
    """Every configuration in the space that the schema and the schedule families accept, as dotted
    overrides of the base scenario (e.g. {"pipeline.stages": 2, "pipeline.data_parallel": 1,
    "pipeline.chunks": 1, "pipeline.micro_batches": 4, "pipeline.schedule": "1f1b",
    "pipeline.remat": "none", "pipeline.partition": "time", "training.zero": 0}), in a stable order:
    D*K, K, schedule (registry order), v, M, remat, partition, zero. Hardware fields of the base
    that do not fit a (D, K) (an explicit placement, per-pair links) are overridden with None.

    Which (K, M, v) a family accepts is its own `problem` check; the schema's rules are checked
    once per (D, K, v, schedule) by validating a scenario, and its M rules (M <= batch / D, the
    pass limit) per M."""
    check_options(options)
    from gpipe_sim.spec.layers import layer_count

    layers = layer_count(base.model)
    batch = base.pipeline.batch_size
    names = options.schedules if options.schedules is not None else tuple(SCHEDULES)
    remats = options.remat if options.remat is not None else REMAT_MODES
    partitions = options.partitions if options.partitions is not None else DEFAULT_PARTITIONS
    out: list[dict[str, Any]] = []
    for D, K in device_pairs(base, options):
        share = batch // D
        zeros = options.zero if options.zero is not None else ((0, 1) if D > 1 else (0,))
        Ms = [m for m in (options.micro_batches or range(1, share + 1)) if 1 <= m <= share]
        hardware = _placement_overrides(base, D, K)
        for name in names:
            family = SCHEDULES[name]
            for v in range(1, options.max_chunks + 1):
                if K * v > layers:
                    break
                accepted = [M for M in Ms if K * v * M * D <= limits.MAX_PASSES and family.problem(K, M, v) is None]
                accepted = _schema_accepts(base, D, K, v, name, accepted, hardware)
                for M in accepted:
                    for remat in remats:
                        for partition in partitions:
                            for zero in zeros:
                                out.append({
                                    "pipeline.data_parallel": D, "pipeline.stages": K, "pipeline.chunks": v,
                                    "pipeline.micro_batches": M, "pipeline.schedule": name,
                                    "pipeline.remat": remat, "pipeline.partition": partition,
                                    "training.zero": zero, **hardware,
                                })
    return out


def _schema_accepts(base: Scenario, D: int, K: int, v: int, name: str, Ms: list[int],
                    hardware: dict[str, Any]) -> list[int]:
    """The Ms of a (D, K, v, schedule) group the schema accepts: one validation for the group
    (its other rules do not depend on M), each M on its own if that one fails."""
    if not Ms:
        return Ms

    def ok(M: int) -> bool:
        try:
            base.with_updates({"pipeline.data_parallel": D, "pipeline.stages": K, "pipeline.chunks": v,
                               "pipeline.micro_batches": M, "pipeline.schedule": name, **hardware})
        except GpipeError:
            return False
        return True

    if ok(Ms[0]) and ok(Ms[-1]):
        return Ms
    return [M for M in Ms if ok(M)]


def check_options(options: PlanOptions) -> None:
    """ScenarioError naming the option when the space is malformed (unknown schedule, N < 1...)."""
    if isinstance(options.devices, bool) or not isinstance(options.devices, int) or options.devices < 1:
        raise ScenarioError(f"--devices: expected a whole number >= 1, got {options.devices!r}")
    if options.devices > limits.MAX_PASSES:
        raise ScenarioError(f"--devices: {options.devices:,} is over the limit of {limits.MAX_PASSES:,}")
    for what, given, allowed in (("--schedules", options.schedules, tuple(SCHEDULES)),
                                 ("--remat", options.remat, REMAT_MODES),
                                 ("--partitions", options.partitions, PARTITION_METHODS),
                                 ("--zero", options.zero, (0, 1))):
        if given is None:
            continue
        if not given:
            raise ScenarioError(f"{what}: give at least one value")
        for value in given:
            if value not in allowed:
                raise ScenarioError(f"{what}: unknown value {str(value)[:40]!r} "
                                    f"(choose from {', '.join(str(a) for a in allowed)})")
    if options.max_chunks < 1:
        raise ScenarioError(f"--max-chunks: must be >= 1, got {options.max_chunks}")
    if options.top < 1:
        raise ScenarioError(f"--top: must be >= 1, got {options.top}")


# ---------------------------------------------------------------------------------------------
# bounds


class CostTable:
    """Per-layer costs of the base model, built once and reused by every candidate's bounds:
    seconds per micro-batch size, static bytes per (D, ZeRO), activation bytes per sample."""

    def __init__(self, base: Scenario) -> None:
        self.base = base
        t = base.training
        self.accel = base.hardware.accelerator
        self.dtype, self.dtype_bytes = t.dtype, t.dtype_bytes
        self.layers = build_layers(base.model, self.dtype_bytes, self.accel.dropout_mask_bytes(self.dtype_bytes))
        self.L = len(self.layers)
        self.params = np.array([float(layer.params) for layer in self.layers])
        self.act = np.array([float(layer.activation_bytes_per_sample) for layer in self.layers])
        bpp = t.bytes_per_param
        self.update = np.array([update_seconds([layer], self.accel, self.dtype_bytes, bpp) for layer in self.layers])
        self.capacity = self.accel.usable_memory_bytes
        self._times: dict[int, np.ndarray] = {}
        self.cache: dict[Any, float] = {}  # partition-free bounds by the axes they depend on

    def times(self, b: int) -> np.ndarray:
        """[layer, (forward, backward, backward input, backward weight)] seconds for b samples."""
        cached = self._times.get(b)
        if cached is None:
            rows = []
            for layer in self.layers:
                f, bk = layer_seconds(layer, b, self.accel, self.dtype, self.dtype_bytes)
                rows.append((f, bk, *split_backward_seconds(layer, b, bk)))
            cached = self._times[b] = np.array(rows, dtype=float).reshape(self.L, 4)
        return cached

    def allreduce(self, o: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """Per pipeline rank: (seconds per parameter, fixed seconds) of the D-member ring all-reduce
        of a chunk's gradients, `ring_allreduce_seconds` over the link `compile_plan` gives that
        ring: `link` when the replicas of the rank share a node, else `network`; the faster of the
        two where the candidate keeps an explicit placement of the base."""
        D, K = o["pipeline.data_parallel"], o["pipeline.stages"]
        if D <= 1:
            return np.zeros(K), np.zeros(K)
        hw = self.base.hardware
        network = hw.network or hw.link
        placed = hw.placement is not None and "hardware.placement" not in o
        per_node = hw.devices_per_node or D * K
        out = []
        for r in range(K):
            ring = [r * D + d for d in range(D)]  # Megatron-LM's order: a stage's replicas side by side
            within = len({device // per_node for device in ring}) == 1
            links = [hw.link, network] if placed else [hw.link if within else network]
            bandwidth = max(ln.bandwidth for ln in links)
            latency = min(ln.latency_s for ln in links)
            out.append((ring_allreduce_seconds(self.dtype_bytes, D, bandwidth, 0.0),
                        ring_allreduce_seconds(0.0, D, math.inf, latency)))
        per_param, fixed = np.array(out).T
        return per_param, fixed

    def hops(self, o: dict[str, Any], samples: int, placement: Sequence[int]) -> np.ndarray:
        """Per chunk boundary j (chunk j -> j+1): seconds at least that a micro-batch of `samples`
        takes to cross it (serialization at the least output size of a layer a chunk can end with, plus latency) over
        the link `compile_plan` gives replica 0's ranks (Megatron-LM's order); 0 on one device, and
        0 everywhere where the candidate keeps an explicit device map of the base."""
        hw = self.base.hardware
        D = o["pipeline.data_parallel"]
        C = len(placement)
        if C < 2 or (hw.placement is not None and "hardware.placement" not in o) or \
                (hw.stage_to_device is not None and "hardware.stage_to_device" not in o):
            return np.zeros(max(C - 1, 0))
        per_node = hw.devices_per_node or D * o["pipeline.stages"]
        network = hw.network or hw.link
        # a boundary follows any layer but the last
        least = min(float(layer.output_bytes_per_sample) for layer in self.layers[:-1]) * samples
        out = np.zeros(C - 1)
        for j in range(C - 1):
            a, b = placement[j], placement[j + 1]
            if a == b:
                continue
            if (a * D) // per_node != (b * D) // per_node:
                ln = network
            else:
                ln = hw.link_between(min(a, b)) if abs(a - b) == 1 else hw.link
            out[j] = least / ln.bandwidth + ln.latency_s
        return out

    def static_per_param(self, D: int, zero: int) -> float:
        """Bytes per parameter a rank holds: weight, gradient, optimizer states (sharded by ZeRO-1)."""
        t = self.base.training
        sharded = (t.state_bytes_per_param - t.dtype_bytes) / (D if zero else 1)
        return t.dtype_bytes + t.dtype_bytes + sharded

    def time_weights(self, largest: int, remat: str) -> list[float]:
        """What the "time" partition balances, as `compile_plan` computes it."""
        tt = self.times(largest)
        factor = 0.0 if remat == "none" else 1.0
        return (tt[:, 0] * (1 + factor) + tt[:, 1]).tolist()


@dataclass(frozen=True)
class _Work:
    """A candidate's per-layer figures for one replica: `work`, compute seconds over all
    micro-batches (re-computation, the cheaper of full or split backward, the update); `trail`,
    the part of it that may run after a chunk's last input-gradient pass (the update and every
    weight-gradient pass); and one (the smallest) micro-batch's forward and backward seconds."""

    work: np.ndarray
    trail: np.ndarray
    forward: np.ndarray
    backward: np.ndarray
    largest: int
    smallest: int


def _work(costs: CostTable, o: dict[str, Any]) -> _Work:
    D, M = o["pipeline.data_parallel"], o["pipeline.micro_batches"]
    remat, zero = o["pipeline.remat"], o["training.zero"]
    sizes = micro_batch_sizes(costs.base.pipeline.batch_size // D, M)
    update = costs.update / (D if zero else 1)
    work, trail = update, update
    for m, b in enumerate(sizes):
        tt = costs.times(b)
        back = np.minimum(tt[:, 1], tt[:, 2] + tt[:, 3])
        recompute = 0.0 if saves_activations(remat, m, M) else 1.0  # type: ignore[arg-type]
        work = work + tt[:, 0] * (1.0 + recompute) + back
        trail = trail + tt[:, 3]
    small = costs.times(min(sizes))
    return _Work(work, trail, small[:, 0].copy(), np.minimum(small[:, 1], small[:, 2]), max(sizes), min(sizes))


def _placement(o: dict[str, Any]) -> tuple[int, ...]:
    """The rank of each chunk under the candidate's schedule family."""
    return _family_placement(o["pipeline.schedule"], o["pipeline.stages"], o["pipeline.chunks"])


@lru_cache(maxsize=1024)
def _family_placement(name: str, K: int, v: int) -> tuple[int, ...]:
    family = SCHEDULES.get(name)
    return tuple(family.placement(K, v)) if family is not None else tuple(c % K for c in range(K * v))


def _cum(values: np.ndarray) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(values)))


def min_max_partition(cost: np.ndarray | Sequence[np.ndarray], priced: Sequence[bool]) -> float:
    """min over partitions of L layers into len(priced) contiguous non-empty chunks of the largest
    cost[s, e] of a priced chunk (layers s .. e-1; `cost` may also be one matrix per chunk): an
    exact dynamic programme, O(C L^2)."""
    matrices = [cost] * len(priced) if isinstance(cost, np.ndarray) else list(cost)
    L = matrices[0].shape[0] - 1
    s_idx, e_idx = np.indices(matrices[0].shape)
    valid = s_idx < e_idx
    free_cost = np.where(valid, -np.inf, np.inf)
    best = np.full(L + 1, np.inf)
    best[0] = -np.inf
    for flag, matrix in zip(priced, matrices):
        step = np.where(valid, matrix, np.inf) if flag else free_cost
        best = np.maximum(best[:, None], step).min(axis=0)
    return float(best[L])


def held_samples(o: dict[str, Any], batch: int) -> tuple[np.ndarray, tuple[np.ndarray | None, ...]]:
    """Samples whose whole activations the candidate's schedule holds at once, counted by
    `held_activations` in program order as the memory accountant counts bytes: per chunk, the
    most it holds at some moment; per rank, every undominated moment as a (moments x its chunks)
    matrix (None where too many to list). A sample counts when kept, or when held as an input and
    re-computed at the same time (input + re-computed bytes >= the saved bytes)."""
    return _held_samples(o["pipeline.schedule"], o["pipeline.stages"], o["pipeline.micro_batches"],
                         o["pipeline.chunks"], o["pipeline.remat"], batch // o["pipeline.data_parallel"])


def _effective(rows: np.ndarray) -> np.ndarray:
    """(kept, input-only, re-computed) columns per chunk -> whole-activation samples per chunk."""
    return rows[:, 0::3] + np.minimum(rows[:, 1::3], rows[:, 2::3])


@lru_cache(maxsize=256)
def _held_samples(name: str, K: int, M: int, v: int, remat: str, share: int
                  ) -> tuple[np.ndarray, tuple[np.ndarray | None, ...]]:
    schedule = build_schedule(K, M, name, remat, v)  # type: ignore[arg-type]
    held = held_activations(schedule, micro_batch_sizes(share, M))
    per_chunk = np.array([float(_effective(rows).max(initial=0.0)) for rows in held.rows])
    per_rank = tuple(None if rows is None else _effective(rows) for rows in held.rank_rows)
    return per_chunk, per_rank


def held_memory_bound(costs: CostTable, o: dict[str, Any], counts: Sequence[int] | None = None) -> float:
    """`memory_lower_bound` with the activations counted for the samples the schedule holds at
    once (`held_samples`) instead of one micro-batch: static(rank) + the most its chunks hold at
    one moment (or, where the moments are too many to list, the most one chunk holds); exactly
    minimised over the partitions (per chunk) when the counts are not given."""
    D, K = o["pipeline.data_parallel"], o["pipeline.stages"]
    static = costs.params * costs.static_per_param(D, o["training.zero"])
    h, per_rank = held_samples(o, costs.base.pipeline.batch_size)
    placement = _placement(o)
    s_cum, a_cum = _cum(static), _cum(costs.act)
    if counts is not None:
        edges = np.concatenate(([0], np.cumsum(counts))).astype(int)
        chunk_static = s_cum[edges[1:]] - s_cum[edges[:-1]]
        chunk_act = a_cum[edges[1:]] - a_cum[edges[:-1]]
        rank_static = np.bincount(placement, weights=chunk_static, minlength=K)
        rank_act = np.zeros(K)
        np.maximum.at(rank_act, np.asarray(placement), chunk_act * h)
        for r, eff in enumerate(per_rank):
            if eff is not None:
                mine = [c for c, owner in enumerate(placement) if owner == r]
                rank_act[r] = max(rank_act[r], float((eff @ chunk_act[mine]).max(initial=0.0)))
        return float((rank_static + rank_act).max()) * _SLACK
    seg_s, seg_a = _segment_cost(s_cum), _segment_cost(a_cum)
    return min_max_partition([seg_s + hc * seg_a for hc in h], [True] * len(h)) * _SLACK


def _segment_cost(cum: np.ndarray, extra: np.ndarray | None = None) -> np.ndarray:
    """cost[s, e] = cum[e] - cum[s] (+ extra[s]): a chunk of layers s .. e-1."""
    cost = cum[None, :] - cum[:, None]
    return cost + extra[:, None] if extra is not None else cost


def memory_lower_bound(costs: CostTable, o: dict[str, Any], counts: Sequence[int] | None = None) -> float:
    """Bytes that the fullest device's simulated peak is at least, for any partition (or the
    given layer counts per chunk).

    Every rank holds its chunks' static bytes, and at some moment the activations of one
    micro-batch (the largest) of each of its chunks: a saved forward allocates them all, and
    under re-materialization the kept input plus what the re-computation allocates is at least
    as much. So a rank needs static(its chunks) + max over its chunks of act(chunk): at least
    (S + A/v)/K for the fullest of K ranks, and at least the static + act of any one chunk,
    minimised over the partitions (exactly, by `min_max_partition`) when the counts are not given.
    """
    D, K, v = o["pipeline.data_parallel"], o["pipeline.stages"], o["pipeline.chunks"]
    M = o["pipeline.micro_batches"]
    largest = max(micro_batch_sizes(costs.base.pipeline.batch_size // D, M))
    static = costs.params * costs.static_per_param(D, o["training.zero"])
    act = costs.act * largest
    if counts is not None:
        placement = _placement(o)
        edges = np.concatenate(([0], np.cumsum(counts))).astype(int)
        s_cum, a_cum = _cum(static), _cum(act)
        chunk_static = s_cum[edges[1:]] - s_cum[edges[:-1]]
        chunk_act = a_cum[edges[1:]] - a_cum[edges[:-1]]
        rank_static = np.bincount(placement, weights=chunk_static, minlength=K)
        rank_act = np.zeros(K)
        np.maximum.at(rank_act, np.asarray(placement), chunk_act)
        return float((rank_static + rank_act).max()) * _SLACK
    key = ("memory", D, M, o["training.zero"], K, v)
    bound = costs.cache.get(key)
    if bound is None:
        per_chunk = min_max_partition(_segment_cost(_cum(static + act)), [True] * (K * v))
        bound = costs.cache[key] = max((static.sum() + act.sum() / v) / K, per_chunk)
    return bound * _SLACK


def step_lower_bound(costs: CostTable, o: dict[str, Any], counts: Sequence[int] | None = None,
                     work: _Work | None = None) -> float:
    """Seconds that the simulated step is at least, for any partition (or the given layer counts).

    - A rank runs its passes one at a time: the step is at least the mean busy time T/K, and one
      micro-batch's whole forward-backward chain through every layer.
    - A rank cannot start before one micro-batch has gone forward through every chunk before its
      lowest chunk c*: step >= forward(< c*) + busy(rank); with D > 1 replicas its update also
      waits for the all-reduce of the chunk of its last backward pass: + the least all-reduce of
      its chunks (the ring time over the link its replicas' ring uses, see `CostTable.allreduce`).
    - With one chunk per rank, after c*'s last input-gradient pass only weight passes and the
      update remain on the rank, and one micro-batch still goes backward through every chunk
      before c*: step >= forward(< c*) + busy - trail + backward(< c*).
    Every chain also crosses the chunk boundaries before c* (each way): + the transfer time of
    each (`CostTable.hops`). Without counts, the per-rank terms (at least those of c* alone) are
    minimised over the partitions exactly (`min_max_partition`)."""
    w = work or _work(costs, o)
    K, v = o["pipeline.stages"], o["pipeline.chunks"]
    T = float(w.work.sum())
    bound = max(T / K, float(w.forward.sum() + w.backward.sum()))
    placement = _placement(o)
    lowest = np.full(K, len(placement))
    np.minimum.at(lowest, np.asarray(placement), np.arange(len(placement)))
    w_cum, f_cum, b_cum, t_cum = _cum(w.work), _cum(w.forward), _cum(w.backward), _cum(w.trail)
    per_param, fixed = costs.allreduce(o)
    p_cum = _cum(costs.params)
    h_cum = _cum(costs.hops(o, w.smallest, placement))  # transfers before chunk c: h_cum[c]
    bound = max(bound, float(w.forward.sum() + w.backward.sum() + 2 * h_cum[-1]))
    if counts is not None:
        edges = np.concatenate(([0], np.cumsum(counts))).astype(int)
        busy = np.bincount(placement, weights=w_cum[edges[1:]] - w_cum[edges[:-1]], minlength=K)
        reduce = np.full(K, np.inf)
        ranks = np.asarray(placement)
        np.minimum.at(reduce, ranks, fixed[ranks] + per_param[ranks] * (p_cum[edges[1:]] - p_cum[edges[:-1]]))
        start = edges[lowest]
        bound = max(bound, float((f_cum[start] + h_cum[lowest] + busy + reduce).max()))
        if v == 1:
            trail = t_cum[edges[1:]] - t_cum[edges[:-1]]
            bound = max(bound, float((f_cum[start] + b_cum[start] + 2 * h_cum[lowest] + busy - trail).max()))
    elif K > 1 or fixed.any():
        key = ("step", o["pipeline.data_parallel"], o["pipeline.micro_batches"], o["pipeline.remat"],
               o["training.zero"], K, v, placement, "hardware.placement" in o)
        best = costs.cache.get(key)
        if best is None:
            priced = np.zeros(len(placement), dtype=bool)
            priced[lowest] = True
            base_cost = _segment_cost(w_cum, f_cum)
            cost = [base_cost + h_cum[c] for c in range(len(placement))]
            if v == 1:  # chunk r is rank r's only one
                trailing = base_cost + b_cum[:, None] - _segment_cost(t_cum)
                params = _segment_cost(p_cum)
                cost = [np.maximum(cost[r] + fixed[r] + per_param[r] * params, trailing + 2 * h_cum[r])
                        for r in range(K)]
            best = costs.cache[key] = min_max_partition(cost, priced.tolist())
        bound = max(bound, best)
    return bound * _SLACK


def program_step_bound(costs: CostTable, o: dict[str, Any], plan_: Plan) -> float:
    """`step_lower_bound` from the compiled programs, for any placement: rank r starts no earlier
    than one micro-batch's forward chain (and transfers) through the chunks before its lowest c*,
    runs its compute passes one at a time in program order, and after c*'s last input-gradient
    (or full backward) pass one micro-batch still goes backward through those chunks while the
    rank runs what follows in its program. With D > 1, the all-reduce of the chunk of the rank's
    last backward pass starts after it, and the update waits for it."""
    prog = plan_.program
    K, C = len(plan_.ranks), len(plan_.chunks)
    compute = np.isin(prog.kind, sorted(COMPUTE_KINDS))
    fwd = np.stack([c.forward_s for c in plan_.chunks])  # [chunk, micro-batch]
    back = np.minimum(np.stack([c.backward_s for c in plan_.chunks]), np.stack([c.backward_input_s for c in plan_.chunks]))
    f_pref = np.concatenate(([0.0], np.cumsum(fwd, axis=0).min(axis=1)))[:C]  # chain before chunk c
    b_pref = np.concatenate(([0.0], np.cumsum(back, axis=0).min(axis=1)))[:C]
    placement = [c.rank for c in plan_.chunks]
    h_cum = _cum(costs.hops(o, min(plan_.micro_batch_sizes), placement))
    per_param, fixed = costs.allreduce(o)
    D = o["pipeline.data_parallel"]
    bound = 0.0
    for r in range(K):
        lo, hi = int(prog.offsets[r]), int(prog.offsets[r + 1])
        kind, chunk = prog.kind[lo:hi], prog.chunk[lo:hi]
        dur = np.where(compute[lo:hi], prog.duration[lo:hi], 0.0)
        done = np.cumsum(dur)
        if not len(done):
            continue
        low = min(plan_.ranks[r].chunks)
        start = f_pref[low] + h_cum[low]
        bound = max(bound, start + float(done[-1]))
        last = np.flatnonzero((chunk == low) & ((kind == Kind.BACKWARD) | (kind == Kind.BACKWARD_INPUT)))
        if len(last) and low > 0:
            after = float(done[-1] - done[last[-1]])
            bound = max(bound, start + float(done[last[-1]]) + max(b_pref[low] + h_cum[low], after))
        if D > 1:
            final = np.flatnonzero((kind == Kind.BACKWARD) | (kind == Kind.BACKWARD_WEIGHT))
            if len(final):
                j = int(final[-1])
                c = plan_.chunks[int(chunk[j])]
                update = float(dur[kind == Kind.UPDATE].sum())
                bound = max(bound, start + float(done[j]) + fixed[r] + per_param[r] * c.params + update)
    return bound * _SLACK


# ---------------------------------------------------------------------------------------------
# the search


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


def _entry(index: int, o: dict[str, Any], result: Result) -> PlanEntry:
    peak = max(result.device_peak_memory_bytes.values(), default=0.0)
    return PlanEntry(
        index=index, overrides=o, step_time_s=result.step_time_s,
        throughput_samples_per_s=result.throughput_samples_per_s,
        devices=o["pipeline.data_parallel"] * o["pipeline.stages"],
        bubble_fraction=result.bubble_fraction, imbalance_fraction=result.imbalance_fraction,
        exposed_allreduce_s=result.exposed_allreduce_s, peak_memory_bytes=peak,
        capacity_bytes=result.memory_capacity_bytes, fits=result.fits_in_memory,
        limiter=limiter_of(result), result=result,
    )


def pareto_front(entries: Sequence[PlanEntry]) -> list[PlanEntry]:
    """The entries no other beats on both throughput (higher) and peak memory (lower), by peak."""
    front: list[PlanEntry] = []
    best = -math.inf
    for e in sorted(entries, key=lambda e: (e.peak_memory_bytes, -e.throughput_samples_per_s, e.index)):
        if e.throughput_samples_per_s > best:
            front.append(e)
            best = e.throughput_samples_per_s
    return front


def _quick_counts(costs: CostTable, o: dict[str, Any], largest: int) -> list[int] | None:
    """The layer counts of a "uniform" or "time" partition without compiling (as compile resolves
    them); None for the methods that need the schedule's memory table."""
    method = o["pipeline.partition"]
    if method not in ("uniform", "time"):
        return None
    return _resolve_cached(method, o["pipeline.stages"] * o["pipeline.chunks"],
                           tuple(costs.time_weights(largest, o["pipeline.remat"])))


@lru_cache(maxsize=4096)
def _resolve_cached(method: str, chunks: int, weights: tuple[float, ...]) -> list[int]:
    return resolve_partition(method, chunks, list(weights))


def plan(base: Scenario, options: PlanOptions, *,
         progress: Callable[[int, int], None] | None = None) -> PlanSearch:
    """Search the space of `enumerate_candidates` for the fastest configurations that fit.

    Candidates whose memory lower bound exceeds the capacity are dropped unsimulated; the rest are
    simulated (`compile_plan` + the fast evaluator, as `gpipe_sim.api.simulate(..., "auto")`) in the
    order of their step-time lower bound, and a candidate whose bound is above the `top`-th best
    step found is skipped (all later ones too, before compiling). Candidates whose partition comes
    out equal to one already simulated reuse its figures. `progress(done, total)` is called as
    candidates are decided."""
    t0 = time.perf_counter()
    candidates = enumerate_candidates(base, options)
    costs = CostTable(base)
    cap = costs.capacity
    total = len(candidates)
    pruned_mem = pruned_bound = infeasible = simulated = reused = 0
    queue = []
    works: dict[Any, _Work] = {}
    bound_cache: dict[Any, tuple[float, float]] = {}
    for i, o in enumerate(candidates):
        wkey = (o["pipeline.data_parallel"], o["pipeline.micro_batches"], o["pipeline.remat"], o["training.zero"])
        w = works.get(wkey)
        if w is None:
            w = works[wkey] = _work(costs, o)
        counts = _quick_counts(costs, o, w.largest)
        # the bounds depend on the schedule only through its placement
        bkey = (wkey, o["pipeline.stages"], o["pipeline.chunks"], _placement(o), None if counts is None else tuple(counts))
        bounds = bound_cache.get(bkey)
        if bounds is None:
            bounds = bound_cache[bkey] = (memory_lower_bound(costs, o, counts), step_lower_bound(costs, o, counts, w))
        mem, step = bounds
        if mem > cap:
            pruned_mem += 1
            continue
        queue.append((step, i, counts))
    queue.sort(key=lambda q: (q[0], q[1]))
    done = pruned_mem
    if progress:
        progress(done, total)
    top = options.top
    best_steps: list[float] = []  # max-heap (negated) of the top fitting step times, one per signature
    signatures: set[tuple[Any, ...]] = set()
    entries: list[PlanEntry] = []
    seen: dict[Any, PlanEntry] = {}

    def threshold() -> float:
        return -best_steps[0] if len(best_steps) >= top else math.inf

    def record(entry: PlanEntry) -> None:
        entries.append(entry)
        if entry.fits and entry.signature not in signatures:
            signatures.add(entry.signature)
            if len(best_steps) < top:
                heapq.heappush(best_steps, -entry.step_time_s)
            elif entry.step_time_s < -best_steps[0]:
                heapq.heapreplace(best_steps, -entry.step_time_s)

    for n, (bound, i, counts) in enumerate(queue):
        if bound > threshold():
            pruned_bound += len(queue) - n
            break
        done += 1
        if progress and done % 64 == 0:
            progress(done, total)
        o = candidates[i]
        key = _dedup_key(o, counts) if counts is not None else None
        if key is not None and key in seen:
            record(_copy_entry(seen[key], i, o))
            reused += 1
            continue
        try:
            if held_memory_bound(costs, o, counts) > cap:
                pruned_mem += 1
                continue
        except GpipeError:
            infeasible += 1
            continue
        try:
            plan_ = compile_plan(base.with_updates(o))
        except GpipeError:
            infeasible += 1
            continue
        if counts is None:
            counts = plan_.layer_counts
            key = _dedup_key(o, counts)
            if key in seen:
                record(_copy_entry(seen[key], i, o))
                reused += 1
                continue
            if memory_lower_bound(costs, o, counts) > cap:
                pruned_mem += 1
                continue
            if step_lower_bound(costs, o, counts) > threshold():
                pruned_bound += 1
                continue
        if program_step_bound(costs, o, plan_) > threshold():
            pruned_bound += 1
            continue
        entry = _entry(i, o, _simulate(plan_))
        simulated += 1
        seen[key] = entry
        record(entry)
    if progress:
        progress(total, total)
    ranked = sorted((e for e in entries if e.fits), key=lambda e: (-e.throughput_samples_per_s, e.index))
    distinct = collapse_alike(ranked)
    keep = {id(e) for e in ranked[:top]} | {id(e) for e in distinct[:top]}
    for e in entries:
        if id(e) not in keep:
            e.result = None
    search = PlanSearch(
        base=base, options=options, ranked=ranked, distinct=distinct, simulated_entries=entries, front=pareto_front(entries),
        enumerated=total, simulated=simulated, reused=reused, pruned_by_memory=pruned_mem,
        pruned_by_bound=pruned_bound, infeasible=infeasible, seconds=time.perf_counter() - t0,
        capacity_bytes=cap,
    )
    if not ranked:
        search.smallest_peak = _smallest_peak(base, candidates, entries, costs, search.notes)
    search.seconds = time.perf_counter() - t0
    return search


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


def _dedup_key(o: dict[str, Any], counts: Sequence[int]) -> tuple[Any, ...]:
    """Two candidates with equal keys compile to the same plan (the partition method only picks counts)."""
    return tuple((k, repr(v)) for k, v in sorted(o.items()) if k != "pipeline.partition") + (tuple(counts),)


def _copy_entry(entry: PlanEntry, index: int, o: dict[str, Any]) -> PlanEntry:
    return PlanEntry(index=index, overrides=o, step_time_s=entry.step_time_s,
                     throughput_samples_per_s=entry.throughput_samples_per_s, devices=entry.devices,
                     bubble_fraction=entry.bubble_fraction, imbalance_fraction=entry.imbalance_fraction,
                     exposed_allreduce_s=entry.exposed_allreduce_s, peak_memory_bytes=entry.peak_memory_bytes,
                     capacity_bytes=entry.capacity_bytes, fits=entry.fits, limiter=entry.limiter,
                     result=entry.result)


def _smallest_peak(base: Scenario, candidates: list[dict[str, Any]], entries: list[PlanEntry],
                   costs: CostTable, notes: list[str], limit: int = 500) -> PlanEntry | None:
    """When nothing fits: the configuration with the smallest peak, by branch and bound on the
    memory lower bound (candidates simulated in its order until it exceeds the least peak found;
    at most `limit` more simulations, with a note when that cuts the search short)."""
    best = min(entries, key=lambda e: (e.peak_memory_bytes, e.index), default=None)
    done = {e.index for e in entries}
    order = sorted((memory_lower_bound(costs, o), i) for i, o in enumerate(candidates) if i not in done)
    for n, (bound, i) in enumerate(order):
        if best is not None and bound > best.peak_memory_bytes:
            break
        if n >= limit:
            notes.append(f"the smallest peak was searched among {limit} more configurations only")
            break
        try:
            other = _entry(i, candidates[i], _simulate(compile_plan(base.with_updates(candidates[i]))))
        except GpipeError:
            continue
        if best is None or (other.peak_memory_bytes, other.index) < (best.peak_memory_bytes, best.index):
            best = other
    return best
