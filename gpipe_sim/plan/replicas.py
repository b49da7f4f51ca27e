"""What data parallelism costs: a ring all-reduce of a chunk's gradients among its D replicas.

(Where the replicas' programs and their collectives come from: gpipe_sim.schedule.global_program.)
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from gpipe_sim.plan.buckets import bucket_bytes, gathered_forward_delay, overlapped_seconds
from gpipe_sim.plan.links import ring_link_keys
from gpipe_sim.plan.sharding import Ring, rank_rings, replica_ring
from gpipe_sim.schedule import Kind, ProgramColumns
from gpipe_sim.hardware.hardware import Link
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
                         chunk_params: Sequence[int], dmap: np.ndarray, per_node: int, network: Link,
                         foreign: frozenset[int] = frozenset(),
                         overlap: Sequence[tuple[Sequence[float], Sequence[float], Sequence[float]]] | None = None,
                         chunk_expert_params: Sequence[int] | None = None,
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group of each allreduce action of the program `c`, [group, link key] rows of the links
    each group's ring uses, seconds of each group's ring all-reduce). One group per chunk (on
    pipeline rank `chunk_ranks[i]`, `chunk_params[i]` parameters): its D replicas, device
    dmap[d*K + rank], each with its C context-parallel devices (`Mesh.gradient_members`: D x C;
    at T > 1, the ring of the chunk's first devices stands for its T concurrent
    rings, one per shard: they share the nodes' NICs, `network_ring_bandwidth`). A ring holds
    none of the `foreign` links (where the program holds replica 0 alone: ReplicaSymmetry.foreign).
    `overlap` (`training.overlap_grad_reduce`), per chunk: its layers' gradient bytes and their
    seconds of its last backward pass, in backward order, and of its first forward, in forward
    order; a group's seconds then run from that pass's start to the end of its bucketed reduction
    (and ZeRO-1's parameter gather, or with `overlap_param_gather` what it delays the forward:
    gpipe_sim.plan.buckets). `chunk_expert_params`: of each chunk's parameters, its routed
    experts' (gpipe_sim.model.experts): without overlap their gradients are a second all-reduce,
    over the D x C / E devices that hold the same experts (`Mesh.expert_gradient_group`), on the same
    link; with overlap every bucket is reduced over D x C (an upper bound for the experts'). Under
    ZeRO-2 each backward pass reduce-scatters its gradients (gpipe_sim.plan.pass_collectives, no
    `overlap` then) and a group's seconds are the updated parameters' all-gather: half of those rings."""
    mesh = scenario.mesh
    K = mesh.stages
    members = mesh.gradient_group  # D x C: context-parallel ranks reduce their weights' gradients too
    collective = np.full(len(c.kind), -1, dtype=np.int64)
    if members == 1:
        return collective, np.zeros((0, 2), dtype=np.int64), np.zeros(0)
    hardware = scenario.hardware
    n_dev = int(dmap.max()) + 1
    starts = np.flatnonzero(c.kind == Kind.ALLREDUCE)
    collective[starts] = c.chunk[starts]
    dtype_bytes = scenario.training.dtype_bytes
    size = bucket_bytes(scenario)
    seconds, rows = [], []
    zero = scenario.training.zero
    for index, (rank, params) in enumerate(zip(chunk_ranks, chunk_params)):
        ring = mesh.gradient_members(rank)
        # the rings of the rank's shards in one node leave it together (all T, or a node's worth
        # where the rank's T devices fill several nodes)
        whole, alike = gradient_rings(scenario, rank, per_node)
        reduce = whole.allreduce
        if zero == 3:
            seconds.append(_sharded_seconds(scenario, rank, per_node, overlap[index]) if K > 1 else 0.0)
        elif overlap is None:  # ZeRO-2's too: its reduce-scatters are in the backward passes, the all-gather left
            experts = chunk_expert_params[index] if chunk_expert_params is not None else 0
            # the experts' gradients: `alike`, the ring of the D x C / E devices holding the same experts
            share = 0.5 if zero == 2 else 1.0  # gpipe_sim.plan.pass_collectives
            seconds.append(share * (reduce((params - experts) * dtype_bytes)
                                    + (alike.allreduce(experts * dtype_bytes) if experts else 0.0)))
        elif zero:  # each bucket reduce-scattered, the parameters all-gathered after
            grads, times, forward = overlap[index]
            half = lambda nbytes: reduce(nbytes) / 2  # noqa: E731 (a reduce-scatter or an all-gather)
            gather = (gathered_forward_delay(list(reversed(grads)), forward, size, half)
                      if scenario.training.overlap_param_gather else half(params * dtype_bytes))
            seconds.append(overlapped_seconds(grads, times, size, half, gather))
        else:
            grads, times, _ = overlap[index]
            seconds.append(overlapped_seconds(grads, times, size, reduce))
        rows.extend((index, key) for key in ring_link_keys(hardware, ring, n_dev, per_node) if key not in foreign)
    return collective, np.asarray(rows, dtype=np.int64).reshape(-1, 2), np.asarray(seconds)


def _sharded_seconds(scenario: Scenario, rank: int, per_node: int,
                     overlap: tuple[Sequence[float], Sequence[float], Sequence[float]]) -> float:
    """ZeRO-3 under pipelining (gpipe_sim.plan.sharding): from the start of a chunk's last backward,
    each layer's gradients reduce-scattered over the shard ring as its backward ends (and under
    HSDP their shard all-reduced across nodes), then what gathering the parameters layer by layer
    delays the step's first forward."""
    grads, times, forward = overlap
    shard, across = rank_rings(scenario, rank, per_node)
    gather = gathered_forward_delay(list(reversed(grads)), forward, 0.0, shard.half)
    return overlapped_seconds(grads, times, 0.0, lambda n: shard.half(n) + across.allreduce(n / shard.members), gather)
