"""The planner's bounds: per-layer cost tables, and memory and step-time bounds below the simulator's."""

from __future__ import annotations

import math
from functools import cached_property, lru_cache
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from gpipe_sim.plan.partition import resolve_partition
from gpipe_sim.plan.replicas import ring_allreduce_seconds
from gpipe_sim.plan.sharding import bytes_per_param
from gpipe_sim.schedule import SCHEDULES
from gpipe_sim.schedule.lower import saves_activations
from gpipe_sim.schedule.registry import looped
from gpipe_sim.costs.layer_time import layer_pass_times, layer_pass_times_over, update_seconds
from gpipe_sim.costs.gpu_model import StreamWork
from gpipe_sim.costs.twins import twins
from gpipe_sim.plan.context_parallel import combined, ring_layer_work
from gpipe_sim.plan.tensor_parallel import stream_work, tp_ring
from gpipe_sim.model.context_parallel import local_model
from gpipe_sim.plan.layer_table import layer_table
from gpipe_sim.model.recompute import per_layer, recompute_collectives
from gpipe_sim.model.model import TransformerModel
from gpipe_sim.scenario.scenario import Scenario
from gpipe_sim.model.tensor_parallel import Collectives, transformer_collectives
from gpipe_sim.planner.chunk_arrays import partition_edges, placement_arrays
from gpipe_sim.planner.segments import SLACK, cumulative, min_max_partition, segment_cost
from gpipe_sim.planner.space import Candidate
from gpipe_sim.planner.work import Work

class CostTable:
    """Per-layer costs of the base model split over T devices per rank, its sequence over C and
    its experts over E (the base's T, C and E unless given), its blocks as a per-layer remat mode
    checkpoints them (`layer_remat`: full, selective, or "none" for the whole-chunk modes, which
    leave the table as it is), built once and reused by every candidate's bounds: seconds per
    micro-batch size (the tensor-parallel collectives and context-parallel ring included; the
    experts' all-to-alls, which the schedule may hide, left out: a lower bound), static bytes per
    (D, ZeRO), activation bytes per sample. A candidate of another T, C, E or per-layer remat
    mode is bounded with that table (`of`)."""

    def __init__(self, base: Scenario, tensor_parallel: int | None = None, layer_remat: str = "none",
                 context_parallel: int | None = None, expert_parallel: int | None = None) -> None:
        self.base = base
        t, p = base.training, base.pipeline
        self.tp = p.tensor_parallel if tensor_parallel is None else tensor_parallel
        self.cp = p.context_parallel if context_parallel is None else context_parallel
        self.ep = p.expert_parallel if expert_parallel is None else expert_parallel
        self.layer_remat = layer_remat
        self.accel = base.hardware.accelerator
        self.dtype, self.dtype_bytes = t.dtype, t.dtype_bytes
        self.layers = layer_table(base, self.tp, layer_remat, self.cp, self.ep)
        self.L = len(self.layers)
        # each layer's first twin: priced alike (its name aside, every field and its kernels equal)
        self._twin = twins(self.layers)
        self.params = np.array([float(layer.params) for layer in self.layers])
        self.act = np.array([float(layer.activation_bytes_per_sample) for layer in self.layers])
        bpp = t.bytes_per_param
        self.update = np.array([update_seconds([layer], self.accel, self.dtype_bytes, bpp, base.optimizer_step)
                                for layer in self.layers])
        self.capacity = self.accel.usable_memory_bytes
        self._times: dict[int, np.ndarray] = {}
        self._compute: dict[int, np.ndarray] = {}
        self._terms: dict[tuple[int, float], tuple[np.ndarray, np.ndarray]] = {}
        self.params_sum, self.act_sum = float(self.params.sum()), float(self.act.sum())
        self.cache: dict[Any, float] = {}  # partition-free bounds by the axes they depend on
        self._tables: dict[tuple[int, str, int, int], CostTable] = {(self.tp, layer_remat, self.cp, self.ep): self}
        self._collectives = self._tp_collectives()
        self._allreduce: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = {}
        self._hops: dict[tuple[Any, ...], np.ndarray] = {}
        self._host: dict[tuple[Any, ...], np.ndarray] = {}
        self._hop_cums: dict[int, np.ndarray] = {}
        self.params_cum = cumulative(self.params)
        self.act_cum = cumulative(self.act)
        self._static: dict[tuple[Any, ...], np.ndarray] = {}
        self._reduce: dict[tuple[Any, ...], np.ndarray] = {}
        self.frames: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # `_counted_bound`'s, per what they depend on

    def of(self, cand: Candidate) -> "CostTable":
        """The table of the candidate's T, per-layer remat mode and C (this one, or one built once per
        such triple with this capacity)."""
        key = (cand.tensor_parallel, cand.remat if per_layer(cand.remat) else "none", cand.context_parallel,
               cand.expert_parallel)
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = CostTable(self.base, *key)
            table.capacity, table._tables = self.capacity, self._tables
        return table

    def _tp_collectives(self) -> list[Collectives] | None:
        """Per layer, its collectives (`transformer_collectives` on one context-parallel rank's
        tokens); None at T = 1."""
        if self.tp == 1 or not isinstance(self.base.model, TransformerModel):
            return None
        return recompute_collectives(transformer_collectives(local_model(self.base.model, self.cp), self.tp,
                                                             self.base.pipeline.sequence_parallel, self.dtype_bytes),
                                     self.base.model, self.layer_remat)

    def stream_work(self, b: int) -> list[StreamWork] | None:
        """Per layer, its tensor-parallel collectives and context-parallel ring on b samples (None
        at T = C = 1), as `collective_work` and `ring_work` give the simulator: on the rings they
        give every rank (each rank's T x C devices start at a multiple of T x C, in one node or
        filling whole nodes, so all are alike)."""
        ring = ring_layer_work(self.base, self.tp, self.cp, self.layer_remat, 0, [b])
        if self._collectives is None:
            return None if ring is None else [r[0] for r in ring]
        gpu = self.accel.gpu
        share = gpu.collective_efficiency if gpu is not None else 1.0
        bandwidth, latency = tp_ring(self.base.hardware, self.tp, 0)
        made: dict[Collectives, StreamWork] = {}  # the blocks' collectives are alike: each made once
        tp = [[made[c] if c in made else made.setdefault(c, stream_work(c, b, self.tp, bandwidth * share, latency))]
              for c in self._collectives]
        return [w[0] for w in combined(tp, ring)]

    def times(self, b: int) -> np.ndarray:
        """[layer, (forward, backward, backward input, backward weight)] seconds for b samples, the
        tensor-parallel collectives inside each pass as the simulator prices them
        (`layer_pass_times`)."""
        cached = self._times.get(b)
        if cached is None:
            work = self.stream_work(b)
            if work is None:
                cached = self.compute_times(b)
            else:
                cached = self._priced(b, work)
            self._times[b] = cached
        return cached

    def pass_terms(self, b: int, recompute: float) -> tuple[np.ndarray, np.ndarray]:
        """Per layer, for one micro-batch of b samples: its forward (twice when re-computed) plus
        the cheaper of a full or split backward, and its weight-gradient pass."""
        key = (b, recompute)
        got = self._terms.get(key)
        if got is None:
            tt = self.times(b)
            back = np.minimum(tt[:, 1], tt[:, 2] + tt[:, 3])
            got = self._terms[key] = (tt[:, 0] * (1.0 + recompute) + back, tt[:, 3])
        return got

    def compute_times(self, b: int) -> np.ndarray:
        """`times` without the collectives: the kernels alone (what the "time" partition weighs)."""
        cached = self._compute.get(b)
        if cached is None:
            cached = self._compute[b] = self._priced(b, [None] * self.L)
        return cached

    def price(self, sizes: Iterable[int]) -> None:
        """`times` (and at T = C = 1 `compute_times`, the same) of each of `sizes` not priced yet,
        each twin at all of them in one array pass (`layer_pass_times_over`): the figures `times`
        gives one size at a time, bit for bit."""
        todo = sorted({int(b) for b in sizes} - self._times.keys())
        if not todo:
            return
        works = [self.stream_work(b) for b in todo]
        if works[0] is None:  # no collectives: the kernels alone
            todo = [b for b in todo if b not in self._compute]
            self._compute.update(zip(todo, self._priced_over(todo, None)))
            self._times.update((b, self._compute[b]) for b in todo)
        else:
            self._times.update(zip(todo, self._priced_over(todo, works)))  # type: ignore[arg-type]

    def _priced_over(self, sizes: list[int], works: list[list[StreamWork]] | None) -> list[np.ndarray]:
        """Per size, `_priced`'s [layer, 4] with each layer's stream work at that size
        (`works[j][i]`, none where `works` is None), once per twin and its works."""
        priced: dict[tuple[int, tuple[StreamWork, ...] | None], list[tuple[float, float, float, float]]] = {}
        per_layer = []
        for i, twin in enumerate(self._twin):
            column = None if works is None else tuple(w[i] for w in works)
            got = priced.get((twin, column))
            if got is None:
                got = priced[(twin, column)] = layer_pass_times_over(self.layers[twin], sizes, self.accel, self.dtype,
                                                                     self.dtype_bytes, column)
            per_layer.append(got)
        table = np.array(per_layer, dtype=float).reshape(self.L, len(sizes), 4).transpose(1, 0, 2).copy()
        return list(table)

    def _priced(self, b: int, work: Sequence[StreamWork | None]) -> np.ndarray:
        """[layer, 4] `layer_pass_times` on b samples with each layer's stream work, once per twin
        (`_twin`) and work."""
        priced: dict[tuple[int, StreamWork | None], tuple[float, float, float, float]] = {}
        rows = []
        for twin, w in zip(self._twin, work):
            row = priced.get((twin, w))
            if row is None:
                row = priced[(twin, w)] = layer_pass_times(self.layers[twin], b, self.accel, self.dtype,
                                                           self.dtype_bytes, w)
            rows.append(row)
        return np.array(rows, dtype=float).reshape(self.L, 4)

    def allreduce(self, cand: Candidate) -> tuple[np.ndarray, np.ndarray]:
        """Per pipeline rank: (seconds per parameter, fixed seconds) of the D-member ring all-reduce
        of a chunk's gradients, `ring_allreduce_seconds` over the link `compile_plan` gives that
        ring: `link` when the replicas of the rank share a node, else `network`; the faster of the
        two where the candidate keeps an explicit placement of the base; none (0) under
        `overlap_grad_reduce` or ZeRO-3, whose reduction the backward may hide but for its last
        bucket. Cached per search: read-only arrays."""
        key = (cand.data_parallel, cand.stages, cand.tensor_parallel, cand.context_parallel, cand.expert_parallel,
               cand.zero, cand.clears("hardware.placement"))
        if key not in self._allreduce:
            self._allreduce[key] = self._ring_seconds(cand)
            for array in self._allreduce[key]:
                array.flags.writeable = False
        return self._allreduce[key]

    def _ring_seconds(self, cand: Candidate) -> tuple[np.ndarray, np.ndarray]:
        """`allreduce`, computed."""
        D, K, T, C = cand.data_parallel, cand.stages, cand.tensor_parallel, cand.context_parallel
        # overlapped (ZeRO-3 always): hidden up to its last bucket
        if D * C <= 1 or self.base.training.overlap_grad_reduce or cand.zero == 3:
            return np.zeros(K), np.zeros(K)
        if cand.expert_parallel > 1:  # experts' gradients on a smaller ring: bounded by 0
            return np.zeros(K), np.zeros(K)
        hw = self.base.hardware
        network = hw.network or hw.link
        placed = hw.placement is not None and not cand.clears("hardware.placement")
        per_node = hw.devices_per_node or T * C * D * K
        mesh = cand.mesh(hw.devices_per_node)  # Megatron-LM's order, as compile places the candidate
        out = []
        for r in range(K):
            within = len({mesh.node(device) for device in mesh.gradient_members(r)}) == 1
            links = [hw.link, network] if placed else [hw.link if within else network]
            bandwidth = max(hw.network_ring_bandwidth(min(T, per_node)) if ln is network else ln.bandwidth
                            for ln in links)
            latency = min(ln.latency_s for ln in links)
            out.append((ring_allreduce_seconds(self.dtype_bytes, D * C, bandwidth, 0.0),
                        ring_allreduce_seconds(0.0, D * C, math.inf, latency)))
        per_param, fixed = np.array(out).T
        return per_param, fixed

    def hops(self, cand: Candidate, samples: int, placement: Sequence[int]) -> np.ndarray:
        """Per chunk boundary j (chunk j -> j+1): seconds at least that a micro-batch of `samples`
        takes to cross it (serialization at the least output size of a layer a chunk can end with, plus latency) over
        the link `compile_plan` gives replica 0's ranks (Megatron-LM's order), plus the host's time to
        send and to receive it (`hardware.host`: send_s, recv_s and a copy at each end, on the
        ranks' own timelines, as compile prices them); 0 on one device, and 0 everywhere where the
        candidate keeps an explicit device map of the base. Cached per search: a read-only array."""
        key = (cand.data_parallel, cand.stages, cand.chunks, cand.tensor_parallel, cand.context_parallel,
               cand.expert_parallel, samples, tuple(placement), cand.clears("hardware.placement"),
               cand.clears("hardware.stage_to_device"))
        if key not in self._hops:
            self._hops[key] = self._hop_seconds(cand, samples, placement)
            self._hops[key].flags.writeable = False
        return self._hops[key]

    def _hop_seconds(self, cand: Candidate, samples: int, placement: Sequence[int]) -> np.ndarray:
        """`hops`, computed."""
        hw = self.base.hardware
        C = len(placement)
        if C < 2 or (hw.placement is not None and not cand.clears("hardware.placement")) or \
                (hw.stage_to_device is not None and not cand.clears("hardware.stage_to_device")):
            return np.zeros(max(C - 1, 0))
        mesh = cand.mesh(hw.devices_per_node)  # Megatron-LM's order, as compile places the candidate
        network = hw.network or hw.link
        # a boundary follows any layer but the last
        least = self.least_output_bytes * samples
        host = hw.host.send_seconds(least) + hw.host.recv_seconds(least)
        out = np.zeros(C - 1)
        for j in range(C - 1):
            a, b = placement[j], placement[j + 1]
            if a == b:
                continue
            if mesh.node(mesh.rank_devices[a]) != mesh.node(mesh.rank_devices[b]):
                ln = network
            else:
                ln = hw.link_between(min(a, b)) if abs(a - b) == 1 else hw.link
            out[j] = least / ln.bandwidth + ln.latency_s + host
        return out

    def hop_cums(self, cand: Candidate, samples: int, placement: Sequence[int]) -> np.ndarray:
        """Running sums (from 0) of `hops`: the transfers before chunk c, cached (read-only)."""
        hops = self.hops(cand, samples, placement)
        got = self._hop_cums.get(id(hops))  # `hops` keeps each array for the search
        if got is None:
            got = self._hop_cums[id(hops)] = cumulative(hops)
            got.flags.writeable = False
        return got

    def host_transfers(self, cand: Candidate, samples: int, placement: Sequence[int]) -> np.ndarray:
        """Per rank: host seconds at least of its transfers between its first input and last backward:
        each micro-batch crosses each boundary of two ranks' chunks both ways, a send and a receive on
        each (`hardware.host`, least bytes of `samples`); M - 1 counted (`hops` has the first, one follows)."""
        K, M = cand.stages, cand.micro_batches
        key = (K, M, samples, tuple(placement))
        out = self._host.get(key)
        if out is None:
            out = self._host[key] = np.zeros(K)
            if len(placement) >= 2:
                host = self.base.hardware.host
                least = self.least_output_bytes * samples
                per_crossing = (M - 1) * float(host.send_seconds(least) + host.recv_seconds(least))
                for a, b in zip(placement[:-1], placement[1:]):
                    if a != b:
                        out[a] += per_crossing
                        out[b] += per_crossing
            out.flags.writeable = False
        return out

    def pass_bytes(self, edges: np.ndarray) -> np.ndarray:
        """Per chunk (layers edges[c] .. edges[c+1] - 1), per sample, bytes at least that the rank
        holds of a micro-batch while the chunk's backward (or input-gradient) pass runs on it, as
        the simulator counts them (`plan.compile.chunk_transient_bytes`): the chunk's saved bytes (a
        tensor two of its layers save counted once) and, beyond them, the most any of its layers'
        pass allocates less what the layers after it have freed, max over j of (transient_j -
        saved after j), at least 0; a layer's transient the lesser of its `transient_bytes_per_sample`
        and its input pass's own bytes where measured."""
        saved, transient = self._pass_terms
        running = cumulative(saved)  # saved[j] net of what layer j shares with j - 1
        first, end = edges[:-1], edges[1:]
        own = running[end] - running[first] + self._shared[first]  # a chunk's first layer shares nothing in it
        reach = np.maximum.reduceat(transient + running[1:], first) - running[end]
        return own + np.maximum(reach, 0.0)

    @cached_property
    def _pass_terms(self) -> tuple[np.ndarray, np.ndarray]:
        """Per layer, per sample: its saved bytes net of those it shares with the previous layer,
        and its activation-gradient passes' transient bytes at least (`pass_bytes`)."""
        saved = self.act - self._shared
        transient = np.array([float(min(layer.transient_bytes_per_sample, layer.input_pass_bytes_per_sample
                                        if layer.input_pass_bytes_per_sample is not None else math.inf))
                              for layer in self.layers])
        return saved, transient

    @cached_property
    def _shared(self) -> np.ndarray:
        """Per layer, the saved bytes per sample it shares with the previous layer."""
        return np.array([float(layer.saved_with_previous_bytes_per_sample) for layer in self.layers])

    @cached_property
    def least_output_bytes(self) -> float:
        """The least output bytes per sample of a layer a chunk can end with (any but the last)."""
        return min(float(layer.output_bytes_per_sample) for layer in self.layers[:-1])

    def least_reduce(self, cand: Candidate, placement: tuple[int, ...], counts: tuple[int, ...]) -> np.ndarray:
        """Per rank, the least all-reduce (`allreduce`) of its chunks' gradients under these layer
        counts, cached per search: a read-only array."""
        key = ("reduce", cand.data_parallel, cand.stages, cand.zero, cand.clears("hardware.placement"), placement,
               counts)
        got = self._reduce.get(key)
        if got is None:
            per_param, fixed = self.allreduce(cand)
            ranks, _ = placement_arrays(placement, cand.stages)
            edges = partition_edges(counts)
            got = np.full(cand.stages, np.inf)
            np.minimum.at(got, ranks, fixed[ranks] + per_param[ranks] * (self.params_cum[edges[1:]]
                                                                          - self.params_cum[edges[:-1]]))
            got.flags.writeable = False
            self._reduce[key] = got
        return got

    def fsdp_collectives(self, cand: Candidate, micro_batches: int | np.ndarray | None = None) -> float | np.ndarray:
        """Seconds at least of ZeRO-3's collectives over a step without pipelining: each forward
        gathers every layer and each backward gathers them again and reduce-scatters their
        gradients, one after another on one queue a pass (gpipe_sim.plan.sharding), and the one
        rank runs its passes one after another, so M x 3/2 ring all-reduces of the parameters
        (`allreduce`'s ring, one latency for the many). 0 elsewhere and under hybrid sharding
        (whose shard ring is smaller). M is the candidate's, or `micro_batches` (an int, or an
        array of them: the figure for each)."""
        M = cand.micro_batches if micro_batches is None else micro_batches
        return M * 1.5 * self.fsdp_ring(cand)

    def fsdp_ring(self, cand: Candidate) -> float:
        """The ring all-reduce of the parameters that `fsdp_collectives` counts M x 3/2 times (0 where it counts none)."""
        if cand.zero != 3 or cand.stages != 1 or cand.data_parallel <= 1 or self.base.training.shard_within_node:
            return 0.0
        per_param, fixed = self.allreduce(cand._replace(zero=0))
        return float(fixed[0] + per_param[0] * self.params_sum)

    def static_cum(self, D: int, zero: int) -> np.ndarray:
        """Running sums (from 0) over the layers of the static bytes a rank holds per layer
        (`params` x `static_per_param(D, zero)`), cached: a read-only array."""
        key = ("static", D, zero)
        got = self._static.get(key)
        if got is None:
            got = self._static[key] = cumulative(self.params * self.static_per_param(D, zero))
            got.flags.writeable = False
        return got

    def static_per_param(self, D: int, zero: int) -> float:
        """Bytes per parameter a rank holds at least: weight, gradient, optimizer states as the ZeRO
        stage shards them over all `D` devices (D x C) without pipelining (`bytes_per_param`: the least it holds)."""
        return sum(bytes_per_param(self.base.training, D, D, 1, zero))

    def time_weights(self, largest: int, remat: str) -> list[float]:
        """What the "time" partition balances, as `compile_plan` computes it (kernels only)."""
        tt = self.compute_times(largest)
        factor = 0.0 if remat == "none" or per_layer(remat) else 1.0
        return (tt[:, 0] * (1 + factor) + tt[:, 1]).tolist()


def candidate_work(costs: CostTable, cand: Candidate) -> Work:
    """The candidate's `Work`, one for every candidate of its `work_rows.rows_key` and M (T, C, E, D, M, remat,
    whether ZeRO shards). Micro-batches of the same size and re-computation are summed once, times
    their number."""
    costs = costs.of(cand)
    D, M = cand.data_parallel, cand.micro_batches
    remat, zero = cand.remat, cand.zero
    size, extra = divmod(costs.base.pipeline.batch_size // D, M)  # as `micro_batch_sizes` splits
    sizes = [size + 1] * (extra > 0) + [size] * (extra < M)
    update = costs.update / (D * cand.context_parallel if zero else 1)  # ZeRO's shards: over D x C
    groups: dict[tuple[int, float], int] = {}
    # the first `extra` micro-batches have one sample more; only the step's last micro-batch
    # (the last of its range) may re-compute otherwise than the others ("except_last")
    for first, last, b in ((0, extra, size + 1), (extra, M, size)):
        for m, count in ((first, last - first - 1), (last - 1, 1)):
            if count > 0 and last > first:
                key = (b, 0.0 if saves_activations(remat, m, M) else 1.0)  # type: ignore[arg-type]
                groups[key] = groups.get(key, 0) + count
    work, trail = update, update
    for (b, recompute), n in sorted(groups.items()):
        per_pass, weight = costs.pass_terms(b, recompute)
        work = work + n * per_pass
        trail = trail + n * weight
    small = costs.times(min(sizes))
    return Work(work, trail, small[:, 0].copy(), np.minimum(small[:, 1], small[:, 2]), max(sizes), min(sizes))


def chunk_placement(cand: Candidate) -> tuple[int, ...]:
    """The rank of each chunk under the candidate's schedule family (`looped` where unregistered),
    the family registered now (one registered anew under the name gives its own)."""
    family = SCHEDULES.get(cand.schedule)
    return _placement(family.placement if family is not None else looped, cand.stages, cand.chunks)


@lru_cache(maxsize=1024)
def _placement(placement: Callable[[int, int], tuple[int, ...]], K: int, v: int) -> tuple[int, ...]:
    """A family's placement of K x v chunks, cached: the planner asks for it for every candidate."""
    return tuple(int(r) for r in placement(K, v))


def memory_lower_bound(costs: CostTable, cand: Candidate, counts: Sequence[int] | None = None) -> float:
    """Bytes that the fullest device's simulated peak is at least, for any partition (or the
    given layer counts per chunk).

    Every rank holds its chunks' static bytes, and at some moment the activations of one
    micro-batch (the largest) of each of its chunks: a saved forward allocates them all, and
    under re-materialization the kept input plus what the re-computation allocates is at least
    as much. So a rank needs static(its chunks) + max over its chunks of act(chunk): at least
    (S + A/v)/K for the fullest of K ranks, and at least the static + act of any one chunk,
    minimised over the partitions (exactly, by `min_max_partition`) when the counts are not given.
    With the counts, a chunk's act is at least what its backward pass holds (`CostTable.pass_bytes`).
    """
    costs = costs.of(cand)
    D, K, v = cand.data_parallel, cand.stages, cand.chunks
    M = cand.micro_batches
    size, extra = divmod(costs.base.pipeline.batch_size // D, M)  # as `micro_batch_sizes` splits
    largest = size + (extra > 0)  # the first `extra` micro-batches have one sample more
    act = costs.act * largest
    if counts is not None:
        placement = chunk_placement(cand)
        edges = partition_edges(tuple(counts))
        s_cum, a_cum = costs.static_cum(D * cand.context_parallel, cand.zero), cumulative(act)
        chunk_static = s_cum[edges[1:]] - s_cum[edges[:-1]]
        chunk_act = a_cum[edges[1:]] - a_cum[edges[:-1]]
        rank_static = np.bincount(placement, weights=chunk_static, minlength=K)
        rank_act = np.zeros(K)
        np.maximum.at(rank_act, np.asarray(placement), np.maximum(chunk_act, costs.pass_bytes(edges) * largest))
        return float((rank_static + rank_act).max()) * SLACK
    key = ("memory", D, M, cand.zero, K, v)
    bound = costs.cache.get(key)
    if bound is None:
        static = costs.params * costs.static_per_param(D * cand.context_parallel, cand.zero)
        per_chunk = min_max_partition(segment_cost(cumulative(static + act)), [True] * (K * v))
        bound = costs.cache[key] = max((static.sum() + act.sum() / v) / K, per_chunk)
    return bound * SLACK


def step_zero(zero: int) -> int:
    """The ZeRO stage as `step_lower_bound` tells them apart: 0 (the update unsharded), 1 for ZeRO 1
    and 2 (sharded alike, no collective of their own counted) and 3 (its collectives counted)."""
    return 1 if zero == 2 else zero


def step_lower_bound(costs: CostTable, cand: Candidate, counts: Sequence[int] | None = None,
                     work: Work | None = None) -> float:
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
    each (`CostTable.hops`); and a rank's busy time holds the host time of its transfers
    (`CostTable.host_transfers`). Without counts, the per-rank terms (at least those of c* alone) are
    minimised over the partitions exactly (`min_max_partition`)."""
    costs = costs.of(cand)
    w = work or candidate_work(costs, cand)
    if counts is not None:
        return _counted_bound(costs, cand, tuple(counts), w) * SLACK
    K, v = cand.stages, cand.chunks
    bound = max(w.total / K, w.chain)
    placement = chunk_placement(cand)
    ranks, lowest = placement_arrays(placement, K)
    w_cum, f_cum, b_cum, t_cum = w.cums
    per_param, fixed = costs.allreduce(cand)
    p_cum = costs.params_cum
    h_cum = costs.hop_cums(cand, w.smallest, placement)  # transfers before chunk c: h_cum[c]
    host = costs.host_transfers(cand, w.smallest, placement)  # per rank
    bound = max(bound, float(w.chain + 2 * h_cum[-1]), costs.fsdp_collectives(cand))
    if K > 1 or fixed.any():
        key = ("step", cand.data_parallel, cand.micro_batches, cand.remat,
               cand.zero, K, v, placement, cand.clears("hardware.placement"))
        best = costs.cache.get(key)
        if best is None:
            priced = np.zeros(len(placement), dtype=bool)
            priced[lowest] = True
            base_cost = segment_cost(w_cum, f_cum)
            cost = [base_cost + h_cum[c] + host[placement[c]] for c in range(len(placement))]
            if v == 1:  # chunk r is rank r's only one
                trailing = base_cost + b_cum[:, None] - segment_cost(t_cum)
                params = segment_cost(p_cum)
                cost = [np.maximum(cost[r] + fixed[r] + per_param[r] * params, trailing + 2 * h_cum[r] + host[r])
                        for r in range(K)]
            best = costs.cache[key] = min_max_partition(cost, priced.tolist())
        bound = max(bound, best)
    return bound * SLACK


def _counted_bound(costs: CostTable, cand: Candidate, counts: tuple[int, ...], w: Work) -> float:
    """`step_lower_bound` (before its SLACK) with the layer counts given: what does not depend on
    M made once per (D, K, v, schedule, ZeRO 0, 1-2 or 3, counts), the transfers and the host's
    share of them once per (smallest micro-batch, M) too; the same terms in the same order."""
    K, v, M = cand.stages, cand.chunks, cand.micro_batches
    key = (cand.data_parallel, K, v, cand.schedule, step_zero(cand.zero), cand.cleared, counts)
    frame = costs.frames.get(key)
    if frame is None:
        placement = chunk_placement(cand)
        edges = partition_edges(counts)
        _, lowest = placement_arrays(placement, K)
        frame = costs.frames[key] = (placement, np.asarray(placement), lowest, edges[1:], edges[:-1], edges[lowest],
                                     costs.least_reduce(cand, placement, counts), {})
    placement, ranks, lowest, ends, starts, start, reduce, by_size = frame
    hop = by_size.get((w.smallest, M))
    if hop is None:
        h_cum = costs.hop_cums(cand, w.smallest, placement)  # transfers before chunk c: h_cum[c]
        host = costs.host_transfers(cand, w.smallest, placement)  # per rank
        hop = by_size[(w.smallest, M)] = (h_cum[-1], h_cum[lowest], host)
    last_hop, h_low, host = hop
    w_cum, f_cum, b_cum, t_cum = w.cums
    bound = max(w.total / K, w.chain, float(w.chain + 2 * last_hop), costs.fsdp_collectives(cand))
    busy = np.bincount(ranks, weights=w_cum[ends] - w_cum[starts], minlength=K) + host
    forward = f_cum[start]
    bound = max(bound, float((forward + h_low + busy + reduce).max()))
    if v == 1:
        trail = t_cum[ends] - t_cum[starts]
        bound = max(bound, float((forward + b_cum[start] + 2 * h_low + busy - trail).max()))
    return bound


def quick_counts(costs: CostTable, cand: Candidate, largest: int) -> list[int] | None:
    """The layer counts of a "uniform" or "time" partition without compiling (as compile resolves
    them, timing micro-batches of `largest` samples); None for the methods that need the
    schedule's memory table."""
    costs = costs.of(cand)
    method = cand.partition
    if method not in ("uniform", "time"):
        return None
    return _resolve_cached(method, cand.stages * cand.chunks,
                           tuple(costs.time_weights(largest, cand.remat)))


@lru_cache(maxsize=4096)
def _resolve_cached(method: str, chunks: int, weights: tuple[float, ...]) -> list[int]:
    return resolve_partition(method, chunks, list(weights))

