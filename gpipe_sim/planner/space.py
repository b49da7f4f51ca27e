"""The planner's search space: its options, the typed `Candidate` configuration and their enumeration."""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, NamedTuple

import numpy as np

from gpipe_sim.errors import GpipeError, ScenarioError
from gpipe_sim.mesh import Mesh
from gpipe_sim.schedule import SCHEDULES, Kind
from gpipe_sim.model.recompute import per_layer, remat_problem
from gpipe_sim.schema import limits
from gpipe_sim.scenario.scenario import PARTITION_METHODS, REMAT_MODES, ZERO_STAGES, Scenario

DEFAULT_PARTITIONS = ("uniform", "time")
# Step times within this share of the fastest are a tie: the model cannot tell them apart
# (docs/measurements/accuracy.md: the executor's step time within a median 2.2% at K=2 and 7.6% at K=4; on
# vTrain's A100 rows the predicted best costs a median 0%, at worst 7.1%, against the measured best).
TIE = 0.05
# Memory held back on each device beyond the simulated peak, as a share of its memory: the CUDA
# context, cuBLAS/NCCL workspaces and buffers and the caching allocator's fragmentation (our
# estimate, as the h100-sxm preset's 6%); a hardware whose usable share already leaves as much is
# unchanged.
DEFAULT_RESERVE = 0.06
# K=1: one stage, no pipeline; every schedule runs it as gradient accumulation, and this one (a
# forward and its backward per micro-batch) holds the fewest activations. Shown as "data parallel".
DATA_PARALLEL_SCHEDULE = "1f1b"
DATA_PARALLEL = "data parallel"
# at K=1 (no pipeline, one chunk) reports show these axes so
_SHOWN_AT_K1 = {"schedule": DATA_PARALLEL, "v": None, "partition": None}
# the axes of a configuration: short name -> the dotted scenario field it overrides (in this order)
AXES = {"D": "pipeline.data_parallel", "K": "pipeline.stages", "v": "pipeline.chunks",
        "M": "pipeline.micro_batches", "schedule": "pipeline.schedule", "remat": "pipeline.remat",
        "partition": "pipeline.partition", "zero": "training.zero", "T": "pipeline.tensor_parallel",
        "C": "pipeline.context_parallel", "E": "pipeline.expert_parallel"}
_AXIS_INDEX = {name: i for i, name in enumerate(AXES)}  # a short name's field in `Candidate`
# T, C and E = 1 where an overrides dict (written before they were axes) does not name them
_OPTIONAL_AXES = {"pipeline.tensor_parallel": 1, "pipeline.context_parallel": 1, "pipeline.expert_parallel": 1}
# By default the planner tries context parallelism C only while every device keeps at least this
# many tokens of a sample: the ring's transfers hide behind the attention only on long blocks, and
# the runs that use it split long sequences so (Llama 3's long-context phase: 131,072 tokens over
# C = 16, 8,192 a GPU; Megatron-LM's guide: CP for long sequences). --context-parallel overrides.
MIN_TOKENS_PER_CP_RANK = 8192
# hardware fields of the base a candidate may clear (override with None), in this order
CLEARABLE = ("hardware.placement", "hardware.stage_to_device", "hardware.links")


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
    zero: tuple[int, ...] | None = None  # None: (0, 1, 2, 3) when D > 1, else (0,); (3,) for a hybrid-sharded base
    max_chunks: int = 4  # v values tried for families with chunks > 1
    top: int = 10  # the ranking that must be exact: the bound never skips a candidate that enters it
    micro_batches: tuple[int, ...] | None = None  # None: every M the batch allows (1 .. batch / D)
    powers_of_two: bool = False  # K and D powers of two only (a narrower space for large N)
    stages: tuple[int, ...] | None = None  # K values tried (None: every K)
    even_micro_batches: bool = False  # only M dividing the per-replica batch (else uneven M are marked)
    tie: float = TIE  # step times within this share of the fastest are a tie (broken by `preference`)
    reserve: float = DEFAULT_RESERVE  # share of each device's memory kept free of the simulated peak
    headroom: float = 0.0  # share of the usable capacity (after the reserve) that must stay free
    # T values tried (None: every power of two up to a node's devices that the model splits; T=1 always)
    tensor_parallel: tuple[int, ...] | None = None
    sequence_parallel: bool = False  # T > 1 with sequence parallelism (else the scenario's own setting)
    # C values tried (None: 1, and each power of two the model's sequence splits into at least
    # MIN_TOKENS_PER_CP_RANK tokens a device: `context_parallel_values`)
    context_parallel: tuple[int, ...] | None = None
    # E values tried for a mixture of experts (None: 1 and each power of two dividing its experts
    # and D: `expert_parallel_values`); 1 for a dense model
    expert_parallel: tuple[int, ...] | None = None


class Candidate(NamedTuple):
    """One configuration of the space (an immutable named tuple, cheap to make by the hundred
    thousand): D replicas of a K-stage pipeline of v chunks per stage, M
    micro-batches, the schedule, remat mode, partition method and ZeRO stage, and T devices per
    rank (tensor parallelism), C devices per sequence (context parallelism); `cleared` names
    the hardware fields of the base (of `CLEARABLE`) that no longer fit D x K and are set to None."""

    data_parallel: int  # D
    stages: int  # K
    chunks: int  # v
    micro_batches: int  # M
    schedule: str
    remat: str
    partition: str
    zero: int
    tensor_parallel: int = 1  # T
    context_parallel: int = 1  # C
    expert_parallel: int = 1  # E (carved from the D replicas: no devices of its own)
    cleared: tuple[str, ...] = ()

    @property
    def devices(self) -> int:
        """T * C * D * K."""
        return self.tensor_parallel * self.context_parallel * self.data_parallel * self.stages

    @property
    def data_parallel_only(self) -> bool:
        """K=1: plain data parallelism with gradient accumulation, no pipeline schedule."""
        return self.stages == 1

    def mesh(self, devices_per_node: int | None) -> Mesh:
        """Its mesh where it places itself (Megatron-LM's order), as compile makes it."""
        return Mesh(self.data_parallel, self.stages, self.chunks, self.tensor_parallel, self.context_parallel,
                    self.expert_parallel, (), devices_per_node)

    def clears(self, field_name: str) -> bool:
        """Whether the candidate overrides the base's hardware field (e.g. "hardware.placement") with None."""
        return field_name in self.cleared

    def axes(self) -> tuple[Any, ...]:
        """The values of the axes, in `AXES` order."""
        return tuple(self[:11])

    def shown_axes(self) -> dict[str, Any]:
        """The axes by short name (`AXES`) as reports show them: at K=1 (no pipeline, one chunk)
        the schedule is "data parallel" and v and the partition are None."""
        axes = dict(zip(AXES, self.axes()))
        if self.data_parallel_only:
            axes.update(_SHOWN_AT_K1)
        return axes

    def shown(self, key: str) -> Any:
        """`shown_axes()[key]`, without making the dict (reports ask it of every candidate)."""
        if self.stages == 1 and key in _SHOWN_AT_K1:
            return _SHOWN_AT_K1[key]
        return self[_AXIS_INDEX[key]]

    def differs_only_in(self, axis: str, other: "Candidate") -> bool:
        """Whether `other` is this configuration with another value of `axis` (a short name of
        `AXES`) at most: `other._replace(**{field: self's}) == self`, without making a tuple."""
        i = _AXIS_INDEX[axis]
        return self[:i] == other[:i] and self[i + 1:] == other[i + 1:]

    def overrides(self) -> dict[str, Any]:
        """The dotted overrides of the base scenario that make this configuration: the axes in
        `AXES` order, then each cleared hardware field as None (a fresh dict on each call)."""
        out = dict(zip(AXES.values(), self.axes()))
        out.update((name, None) for name in self.cleared)
        return out

    @classmethod
    def from_overrides(cls, overrides: Mapping[str, Any]) -> "Candidate":
        """The candidate whose `overrides()` equal these: every `AXES` field, plus hardware fields
        of `CLEARABLE` set to None (T may be left out: 1); ValueError on a missing axis or any other key."""
        missing = [name for name in AXES.values() if name not in overrides and name not in _OPTIONAL_AXES]
        other = [k for k in overrides if k not in AXES.values() and not (k in CLEARABLE and overrides[k] is None)]
        if missing or other:
            raise ValueError(f"not a planner candidate: missing {missing}, unexpected {other}")
        return cls(*(overrides.get(name, _OPTIONAL_AXES.get(name)) for name in AXES.values()),
                   cleared=tuple(k for k in overrides if k in CLEARABLE))


def check_options(options: PlanOptions) -> None:
    """ScenarioError naming the option when the space is malformed (unknown schedule, N < 1...)."""
    if isinstance(options.devices, bool) or not isinstance(options.devices, int) or options.devices < 1:
        raise ScenarioError(f"--devices: expected a whole number >= 1, got {options.devices!r}")
    if options.devices > limits.MAX_PASSES:
        raise ScenarioError(f"--devices: {options.devices:,} is over the limit of {limits.MAX_PASSES:,}")
    for what, given, allowed in (("--schedules", options.schedules, tuple(SCHEDULES)),
                                 ("--remat", options.remat, REMAT_MODES),
                                 ("--partitions", options.partitions, PARTITION_METHODS),
                                 ("--zero", options.zero, ZERO_STAGES)):
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
    if options.tensor_parallel is not None and (not options.tensor_parallel or any(
            isinstance(t, bool) or not isinstance(t, int) or t < 1 or t & (t - 1) for t in options.tensor_parallel)):
        raise ScenarioError(f"--tensor-parallel: expected powers of two (1, 2, 4, 8, ...), got {options.tensor_parallel}")
    for flag, values in (("--context-parallel", options.context_parallel),
                         ("--expert-parallel", options.expert_parallel)):
        if values is not None and (not values or any(
                isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in values)):
            raise ScenarioError(f"{flag}: expected whole numbers >= 1, got {values}")
    if options.stages is not None and (not options.stages or any(k < 1 for k in options.stages)):
        raise ScenarioError(f"--stages: expected whole numbers >= 1, got {options.stages}")
    for flag, value, high in (("--tie", options.tie, 1.0), ("--reserve", options.reserve, 0.99),
                              ("--headroom", options.headroom, 0.99)):
        if not (isinstance(value, (int, float)) and 0.0 <= value <= high):
            raise ScenarioError(f"{flag}: expected a share between 0 and {high:g} (e.g. 5%), got {value!r}")


def device_pairs(base: Scenario, options: PlanOptions, tensor_parallel: int = 1) -> list[tuple[int, int]]:
    """(D, K) pairs with T x D x K = N (or <= N with `fewer_devices`) that the batch and layers allow."""
    from gpipe_sim.model.layers import layer_count

    layers = layer_count(base.model)
    batch = base.pipeline.batch_size
    T = tensor_parallel
    counts = range(1, options.devices // T + 1) if options.fewer_devices else \
        ([options.devices // T] if options.devices % T == 0 else [])
    pairs = []
    for n in counts:
        for K in _divisors(n):
            D = n // K
            if options.powers_of_two and (K & (K - 1) or D & (D - 1)):
                continue
            if options.stages is not None and K not in options.stages:
                continue
            if K <= layers and batch % D == 0 and D <= batch:
                pairs.append((D, K))
    return pairs


def tensor_parallel_values(base: Scenario, options: PlanOptions) -> list[int]:
    """The T the planner tries: 1, and each power of two up to a node's devices (all N where the
    hardware has no nodes) that the model splits (the transformer preset, T dividing its heads and
    d_ff: `tensor_parallel_problem`); where `options.tensor_parallel` is given, those of its
    values, up to N (a T of several whole nodes, its collectives over the network, included)."""
    from gpipe_sim.mesh import tiles_nodes
    from gpipe_sim.model.tensor_parallel import tensor_parallel_problem

    hw = base.hardware
    # the candidate places itself (an explicit device map of the base is cleared for another T)
    most = options.devices if options.tensor_parallel else min(options.devices, hw.devices_per_node or options.devices)
    out = [1] + [1 << i for i in range(1, most.bit_length())
                 if tensor_parallel_problem(base.model, 1 << i) is None
                 and tiles_nodes(hw.devices_per_node, 1 << i)]
    return [t for t in out if options.tensor_parallel is None or t in options.tensor_parallel]


def context_parallel_values(base: Scenario, options: PlanOptions, tensor_parallel: int) -> list[int]:
    """The C the planner tries beside T = `tensor_parallel`: 1, and each power of two up to N / T
    that leaves every device at least MIN_TOKENS_PER_CP_RANK tokens; where
    `options.context_parallel` is given, those of its values; each only where the model and the
    nodes take it (`context_parallel_problem`: flash attention, 2C chunks, T x C tiling nodes)."""
    from gpipe_sim.mesh import tiles_nodes
    from gpipe_sim.model.context_parallel import context_parallel_problem

    per_node = base.hardware.devices_per_node
    most = options.devices // tensor_parallel
    if options.context_parallel is not None:
        values = sorted(c for c in options.context_parallel if c <= most)
    else:
        tokens = getattr(base.model, "seq_len", 0)
        values = [1] + [1 << i for i in range(1, most.bit_length()) if tokens // (1 << i) >= MIN_TOKENS_PER_CP_RANK]
    return [c for c in values if c == 1 or (context_parallel_problem(base.model, c) is None
                                            and tiles_nodes(per_node, tensor_parallel * c))]


def expert_parallel_values(base: Scenario, options: PlanOptions, data_parallel: int) -> list[int]:
    """The E the planner tries with D = `data_parallel` replicas: for a mixture of experts 1 and
    each power of two dividing both its experts and D (`options.expert_parallel`: those of its
    values that do); 1 for a dense model."""
    experts = getattr(base.model, "experts", 0)
    if not experts:
        return [1]
    values = options.expert_parallel or [1 << i for i in range(data_parallel.bit_length())]
    return sorted(e for e in set(values) if experts % e == 0 and data_parallel % e == 0)


def device_layouts(base: Scenario, options: PlanOptions) -> list[tuple[int, int, int, int]]:
    """(T, C, D, K) with T x C x D x K = N (or fewer): `device_pairs` for each of
    `tensor_parallel_values` and its `context_parallel_values`."""
    return [(T, C, D, K) for T in tensor_parallel_values(base, options)
            for C in context_parallel_values(base, options, T) for D, K in device_pairs(base, options, T * C)]


def _divisors(n: int) -> list[int]:
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return sorted(set(small + [n // k for k in small]))


def _cleared_hardware(base: Scenario, D: int, K: int, T: int = 1, C: int = 1) -> tuple[str, ...]:
    """Hardware fields of the base that no longer fit T x C x D x K, to be cleared so the candidate
    places itself (Megatron-LM's order over its devices), in `CLEARABLE` order."""
    hw, p = base.hardware, base.pipeline
    out: list[str] = []
    same_t = T == p.tensor_parallel and C == p.context_parallel
    same = (D, K) == (p.data_parallel, p.stages) and same_t
    if hw.placement is not None and not same:
        out.append("hardware.placement")
    if hw.stage_to_device is not None and not (same or (same_t and D == 1 and len(hw.stage_to_device) == K)):
        out.append("hardware.stage_to_device")
    if hw.links is not None and len(hw.links) != K - 1:
        out.append("hardware.links")
    return tuple(out)


_candidate = functools.partial(tuple.__new__, Candidate)  # a Candidate of its fields' tuple, made in C


class Block(NamedTuple):
    """The configurations of one (T, C, D, K, schedule, v, E): every M x remat x partition x ZeRO,
    in that order (ZeRO innermost), the `start`-th of the space first. What `candidate_space`
    lists one by one, held as the product it is."""

    start: int
    data_parallel: int
    stages: int
    chunks: int
    schedule: str
    tensor_parallel: int
    context_parallel: int
    expert_parallel: int
    micro_batches: tuple[int, ...]
    remats: tuple[str, ...]
    partitions: tuple[str, ...]
    zeros: tuple[int, ...]
    cleared: tuple[str, ...]

    @property
    def size(self) -> int:
        """How many configurations: M x remat x partition x ZeRO values."""
        return len(self.micro_batches) * len(self.remats) * len(self.partitions) * len(self.zeros)

    def candidates(self) -> Iterator[Candidate]:
        """Its configurations in the space's order."""
        return map(_candidate, itertools.product(  # the fields in Candidate's order
            (self.data_parallel,), (self.stages,), (self.chunks,), self.micro_batches, (self.schedule,),
            self.remats, self.partitions, self.zeros, (self.tensor_parallel,), (self.context_parallel,),
            (self.expert_parallel,), (self.cleared,)))

    def candidate(self, offset: int) -> Candidate:
        """Its `offset`-th configuration (0 <= offset < size)."""
        rest, z = divmod(offset, len(self.zeros))
        rest, p = divmod(rest, len(self.partitions))
        m, r = divmod(rest, len(self.remats))
        return _candidate((self.data_parallel, self.stages, self.chunks, self.micro_batches[m], self.schedule,
                           self.remats[r], self.partitions[p], self.zeros[z], self.tensor_parallel,
                           self.context_parallel, self.expert_parallel, self.cleared))


def candidate_space(base: Scenario, options: PlanOptions,
                    rejected: list[tuple[Any, ...]] | None = None) -> list[Candidate]:
    """Every configuration in the space that the schema and the schedule families accept, in a
    stable order: T, C, D*K, K, schedule (registry order), v, M, remat, partition, zero (T from
    `tensor_parallel_values`, C from `context_parallel_values`): `space_blocks`' configurations,
    one by one."""
    return [c for block in space_blocks(base, options, rejected) for c in block.candidates()]


def space_blocks(base: Scenario, options: PlanOptions,
                 rejected: list[tuple[Any, ...]] | None = None) -> list[Block]:
    """The space of `candidate_space` as its blocks (`Block`), in its order. Hardware fields of the
    base that do not fit a (T, C, D, K) (an explicit placement, per-pair links) are cleared.

    K=1 is data parallelism (gradient accumulation): one configuration per (M, remat, zero), run
    as `DATA_PARALLEL_SCHEDULE` with v=1 and the first partition method (one chunk: every method
    gives it every layer), whatever `options.schedules` says. With `options.even_micro_batches`,
    only M dividing the per-replica batch.

    Which (K, M, v) a family accepts is its own `problem` check; the schema's rules are checked
    once per (D, K, v, schedule) by validating a scenario, and its M rules (M <= batch / D, the
    pass limit) per M. Where `rejected` is a list, each (D, K, v, M, schedule, reason, T) refused
    is appended to it. ScenarioError when the options are malformed (`check_options`)."""
    check_options(options)
    asked = [r for r in options.remat or () if per_layer(r)]
    problem = remat_problem(base.model, asked[0]) if asked else None
    if problem:  # asked for by name: refused, not left out
        raise ScenarioError(f"--remat: {problem.split(': ', 1)[1]}")
    from gpipe_sim.model.layers import layer_count

    layers = layer_count(base.model)
    batch = base.pipeline.batch_size
    names = options.schedules if options.schedules is not None else tuple(SCHEDULES)
    remats = options.remat if options.remat is not None else REMAT_MODES
    partitions = options.partitions if options.partitions is not None else DEFAULT_PARTITIONS
    out: list[Block] = []
    start = 0
    checked: dict[tuple[str, int, int], list[Any]] = {}  # `_family_accepts`' checks, made once
    for T, C, D, K in device_layouts(base, options):
        share = batch // D
        zeros = options.zero if options.zero is not None else (
            # a hybrid-sharded base keeps ZeRO-3 (at D = 1 it shards nothing: plain training)
            (3,) if base.training.shard_within_node else (0,) if D == 1 else ZERO_STAGES)
        if C > 1:  # ZeRO-3 over the data x context mesh is not modelled (gpipe_sim.plan.sharding)
            zeros = tuple(z for z in zeros if z != 3)
        Ms = [m for m in (options.micro_batches or range(1, share + 1)) if 1 <= m <= share]
        if options.even_micro_batches:
            Ms = [m for m in Ms if share % m == 0]
        cleared = _cleared_hardware(base, D, K, T, C)
        groups = [(DATA_PARALLEL_SCHEDULE, 1, partitions[:1])] if K == 1 else \
            [(name, v, partitions) for name in names for v in range(1, options.max_chunks + 1) if K * v <= layers]
        for name, v, parts in groups:
            accepted = _family_accepts(SCHEDULES[name], (D, K, v, T), name, Ms, rejected, checked)
            for E in expert_parallel_values(base, options, D):
                kept = _schema_accepts(base, (D, K, v, T, C, E), name, accepted, cleared, rejected)
                modes = _remats_for(base, remats, name, K, v, kept)
                block = Block(start, D, K, v, name, T, C, E, tuple(kept), tuple(modes), tuple(parts),
                              tuple(zeros), cleared)
                if block.size:
                    out.append(block)
                    start += block.size
    return out


def _remats_for(base: Scenario, remats: tuple[str, ...], name: str, K: int, v: int,
                accepted: list[int]) -> tuple[str, ...]:
    """The remat modes a (schedule, K, v) can run: the per-layer ones (full, selective) only on a
    transformer and with a schedule whose backward is one pass (`scenario_schedule` refuses the
    rest), given or left to the default."""
    if not accepted or not any(per_layer(r) for r in remats):
        return remats
    if remat_problem(base.model, "full") or _splits_backward(name, K, v, accepted[0]):
        return tuple(r for r in remats if not per_layer(r))
    return remats


@functools.lru_cache(maxsize=256)
def _splits_backward(name: str, K: int, v: int, M: int) -> bool:
    """Whether the schedule splits its backward passes (input and weight passes) at (K, v, M), an
    (K, M, v) it accepts: whether its generator orders any input-gradient pass (lowering adds
    transfers, re-computations and the update around the passes and keeps them, so its programs
    count those: `build_schedule(...).count(Kind.BACKWARD_INPUT)`, without building them)."""
    split = int(Kind.BACKWARD_INPUT)
    return any(bool((np.asarray(order, dtype=np.int64).reshape(-1, 3)[:, 0] == split).any())
               for order in SCHEDULES[name].generate(K, M, v))


def _family_accepts(family: Any, layout: tuple[int, int, int, int], name: str, Ms: list[int],
                    rejected: list[tuple[Any, ...]] | None, checked: dict[tuple[str, int, int], list[Any]]
                    ) -> list[int]:
    """The Ms the pass limit and the schedule family accept for (D, K, v, T); the others noted in
    `rejected`. Each (family, K, v, M) is checked once per space (`checked`, by (name, K, v): per M
    None where accepted, else the reason): the checks depend on K, M and v only, and the space
    asks them again for every D and T with that K."""
    D, K, v, T = layout
    reasons = checked.setdefault((name, K, v), [_UNCHECKED])
    highest = max(Ms, default=0)
    if highest >= len(reasons):
        reasons.extend([_UNCHECKED] * (highest + 1 - len(reasons)))
    for M in Ms:
        if reasons[M] is _UNCHECKED:
            problem = ("over the pass limit" if K * v * M > limits.MAX_PASSES else family.problem(K, M, v))  # per replica
            reasons[M] = None if problem is None else f"invalid for the schedule: {problem}"
    if rejected is not None:
        rejected.extend([(D, K, v, M, name, reasons[M], T) for M in Ms if reasons[M] is not None])
    return [M for M in Ms if reasons[M] is None]


_UNCHECKED = object()  # `_family_accepts`: an M not checked yet


def enumerate_candidates(base: Scenario, options: PlanOptions) -> list[dict[str, Any]]:
    """`candidate_space` as dotted overrides of the base scenario (`Candidate.overrides`, e.g.
    {"pipeline.data_parallel": 1, "pipeline.stages": 2, "pipeline.chunks": 1,
    "pipeline.micro_batches": 4, "pipeline.schedule": "1f1b", "pipeline.remat": "none",
    "pipeline.partition": "time", "training.zero": 0, "pipeline.tensor_parallel": 1}, with cleared hardware fields as None), in
    the same order."""
    return [c.overrides() for c in candidate_space(base, options)]


def _schema_accepts(base: Scenario, layout: tuple[int, int, int, int, int, int], name: str, Ms: list[int],
                    cleared: tuple[str, ...], rejected: list[tuple[Any, ...]] | None = None) -> list[int]:
    """The Ms of a (D, K, v, T, C, E) layout and schedule the schema accepts: one validation for the group
    (its other rules do not depend on M), each M on its own if that one fails (those refused
    noted in `rejected` with the schema's message)."""
    D, K, v, T, C, E = layout
    if not Ms:
        return Ms

    def problem(M: int) -> str | None:
        try:
            base.with_updates({"pipeline.data_parallel": D, "pipeline.stages": K, "pipeline.chunks": v,
                               "pipeline.micro_batches": M, "pipeline.schedule": name,
                               "pipeline.tensor_parallel": T, "pipeline.context_parallel": C,
                               "pipeline.expert_parallel": E, **{field_name: None for field_name in cleared}})
        except GpipeError as exc:
            return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None

    if problem(Ms[0]) is None and problem(Ms[-1]) is None:
        return Ms
    accepted = []
    for M in Ms:
        why = problem(M)
        if why is None:
            accepted.append(M)
        elif rejected is not None:
            rejected.append((D, K, v, M, name, f"refused by the scenario schema: {why}", T))
    return accepted
