"""What data parallelism costs: a ring all-reduce of a chunk's gradients among its D replicas.

(Where the replicas' programs and their collectives come from: gpipe_sim.schedule.global_program.)
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from gpipe_sim.plan.buckets import bucket_bytes, gathered_forward_delay, overlapped_seconds
from gpipe_sim.plan.links import ring_link_keys
from gpipe_sim.plan.sharding import Ring, rank_rings, replica_ring
from gpipe_sim.schedule import Kind, ProgramColumns
from gpipe_sim.scenario.scenario import Scenario
from gpipe_sim.costs.collectives import collective_seconds
from gpipe_sim.model.tensor_parallel import ALL_REDUCE


def ring_allreduce_seconds(nbytes: float, members: int, bandwidth: float, latency_s: float) -> float:
    """A ring all-reduce on dedicated links: 2(D-1)/D x bytes / bandwidth + 2(D-1) x latency
    (a reduce-scatter and an all-gather, each D-1 steps of bytes/D). 0 for one member. The one
    ring formula, shared with the tensor-parallel collectives (`collective_seconds`)."""
    return collective_seconds(((ALL_REDUCE, nbytes),), 1.0, members, bandwidth, latency_s)


def gradient_rings(scenario: Scenario, rank: int, per_node: int) -> tuple[Ring, Ring]:
    """(ring of pipeline rank `rank`'s D x C gradient members, ring of the D x C / E devices that
    hold the same experts on the same link), as `data_parallel_groups` reduces a chunk over them,
    in nodes of `per_node` devices."""
    mesh = scenario.mesh
    whole = replica_ring(scenario, mesh.gradient_members(rank), per_node, scenario.pipeline.tensor_parallel)
    return whole, Ring(mesh.expert_gradient_group, whole.bandwidth, whole.latency_s)


def data_parallel_groups(scenario: Scenario, c: ProgramColumns, chunk_ranks: Sequence[int],
                         chunk_params: Sequence[int], foreign: np.ndarray | None = None,
                         overlap: Sequence[tuple[Sequence[float], Sequence[float], Sequence[float]]] | None = None,
                         chunk_expert_params: Sequence[int] | None = None,
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group of each allreduce action of the program `c`, [group, link key] rows of the links
    each group's ring uses, in group order, seconds of each group's ring all-reduce). One group per
    chunk (on pipeline rank `chunk_ranks[i]`, `chunk_params[i]` parameters): its D replicas, each
    with its C context-parallel devices (`Mesh.gradient_members`: D x C; at T > 1, the ring of the
    chunk's first devices stands for its T concurrent rings, one per shard: they share the nodes'
    NICs, `network_ring_bandwidth`). A ring holds none of the `foreign` links (distinct sorted keys,
    where the program holds replica 0 alone: ReplicaSymmetry.foreign).
    `overlap` (`training.overlap_grad_reduce`), per chunk: its layers' gradient bytes and their
    seconds of its last backward pass, in backward order, and of its first forward, in forward
    order; a group's seconds then run from that pass's start to the end of its bucketed reduction
    (and ZeRO-1's parameter gather, or with `overlap_param_gather` what it delays the forward:
    gpipe_sim.plan.buckets). `chunk_expert_params`: of each chunk's parameters, its routed
    experts' (gpipe_sim.model.experts): without overlap their gradients are a second all-reduce,
    over the D x C / E devices that hold the same experts (`Mesh.expert_gradient_group`), on the same
    link; with overlap every bucket is reduced over D x C (an upper bound for the experts'). Under
    ZeRO-2 each backward pass reduce-scatters its gradients (gpipe_sim.plan.pass_collectives, no
    `overlap` then) and a group's seconds are the updated parameters' all-gather: half of those rings.
    The chunks of one rank share its rings: each is made once."""
    mesh = scenario.mesh
    collective = np.full(len(c.kind), -1, dtype=np.int64)
    if mesh.gradient_group == 1:
        return collective, np.zeros((0, 2), dtype=np.int64), np.zeros(0)
    starts = np.flatnonzero(c.kind == Kind.ALLREDUCE)
    collective[starts] = c.chunk[starts]
    rings = _RankRings(scenario, foreign)
    seconds = [_group_seconds(scenario, rings, index, rank, params, overlap, chunk_expert_params)
               for index, (rank, params) in enumerate(zip(chunk_ranks, chunk_params))]
    keys = [rings.link_keys(rank) for rank in chunk_ranks]
    rows = np.stack([np.repeat(np.arange(len(keys), dtype=np.int64), [len(k) for k in keys]),
                     np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)], axis=1)
    return collective, rows, np.asarray(seconds)


class _RankRings:
    """Per pipeline rank, made when first asked for: its gradient rings (`gradient_rings`), ZeRO's
    shard rings (`rank_rings`) and the link keys its gradient ring holds, less the `foreign` ones."""

    def __init__(self, scenario: Scenario, foreign: np.ndarray | None) -> None:
        self.scenario, self.mesh, self.foreign = scenario, scenario.mesh, foreign
        self.per_node = self.mesh.node_size
        self._gradient: dict[int, tuple[Ring, Ring]] = {}
        self._shard: dict[int, tuple[Callable[[float], float], Callable[[float], float]]] = {}
        self._keys: dict[int, np.ndarray] = {}

    def gradient(self, rank: int) -> tuple[Ring, Ring]:
        """(whole, alike): `gradient_rings` of the rank."""
        if rank not in self._gradient:
            self._gradient[rank] = gradient_rings(self.scenario, rank, self.per_node)
        return self._gradient[rank]

    def shard(self, rank: int) -> tuple[Callable[[float], float], Callable[[float], float]]:
        """ZeRO-3's collectives of the rank, each remembered by its bytes (a chunk's layers repeat
        theirs): (half: the seconds of a gather or a reduce-scatter of so many bytes over the shard
        ring, reduce: of a layer's gradient reduction, its reduce-scatter and under HSDP its
        shard's all-reduce across the groups: `rank_rings`)."""
        if rank not in self._shard:
            shard, across = rank_rings(self.scenario, rank, self.per_node)
            self._shard[rank] = (_remembered(shard.half),
                                 _remembered(lambda n: shard.half(n) + across.allreduce(n / shard.members)))
        return self._shard[rank]

    def link_keys(self, rank: int) -> np.ndarray:
        if rank not in self._keys:
            mesh = self.mesh
            keys = np.asarray(ring_link_keys(self.scenario.hardware, mesh.gradient_members(rank), mesh.device_span,
                                             self.per_node), dtype=np.int64)
            foreign = self.foreign
            if foreign is not None and len(foreign):  # distinct and sorted: one search a key
                at = np.minimum(np.searchsorted(foreign, keys), len(foreign) - 1)
                keys = keys[foreign[at] != keys]
            self._keys[rank] = keys
        return self._keys[rank]


def _group_seconds(scenario: Scenario, rings: _RankRings, index: int, rank: int, params: int,
                   overlap: Sequence[tuple[Sequence[float], Sequence[float], Sequence[float]]] | None,
                   chunk_expert_params: Sequence[int] | None) -> float:
    """The seconds of chunk `index`'s group (`data_parallel_groups`), on pipeline rank `rank`."""
    training = scenario.training
    zero, dtype_bytes = training.zero, training.dtype_bytes
    if zero == 3:
        return _sharded_seconds(rings.shard(rank), overlap[index]) if scenario.pipeline.stages > 1 else 0.0
    whole, alike = rings.gradient(rank)
    reduce = whole.allreduce
    if overlap is None:  # ZeRO-2's too: its reduce-scatters are in the backward passes, the all-gather left
        experts = chunk_expert_params[index] if chunk_expert_params is not None else 0
        # the experts' gradients: `alike`, the ring of the D x C / E devices holding the same experts
        share = 0.5 if zero == 2 else 1.0  # gpipe_sim.plan.pass_collectives
        return share * (reduce((params - experts) * dtype_bytes)
                        + (alike.allreduce(experts * dtype_bytes) if experts else 0.0))
    if zero:  # each bucket reduce-scattered, the parameters all-gathered after
        grads, times, forward = overlap[index]
        half = lambda nbytes: reduce(nbytes) / 2  # noqa: E731 (a reduce-scatter or an all-gather)
        gather = (gathered_forward_delay(list(reversed(grads)), forward, bucket_bytes(scenario), half)
                  if training.overlap_param_gather else half(params * dtype_bytes))
        return overlapped_seconds(grads, times, bucket_bytes(scenario), half, gather)
    grads, times, _ = overlap[index]
    return overlapped_seconds(grads, times, bucket_bytes(scenario), reduce)


def _sharded_seconds(collectives: tuple[Callable[[float], float], Callable[[float], float]],
                     overlap: tuple[Sequence[float], Sequence[float], Sequence[float]]) -> float:
    """ZeRO-3 under pipelining (gpipe_sim.plan.sharding): from the start of a chunk's last backward,
    each layer's gradients reduce-scattered over the shard ring as its backward ends (and under
    HSDP their shard all-reduced across nodes), then what gathering the parameters layer by layer
    delays the step's first forward. `collectives`: the chunk's rank's (half, reduce) (`_RankRings.shard`)."""
    grads, times, forward = overlap
    half, reduce = collectives
    gather = gathered_forward_delay(list(reversed(grads)), forward, 0.0, half)
    return overlapped_seconds(grads, times, 0.0, reduce, gather)


def _remembered(seconds: Callable[[float], float]) -> Callable[[float], float]:
    """`seconds`, each value made once."""
    made: dict[float, float] = {}

    def remembered(nbytes: float) -> float:
        if nbytes not in made:
            made[nbytes] = seconds(nbytes)
        return made[nbytes]
    return remembered
