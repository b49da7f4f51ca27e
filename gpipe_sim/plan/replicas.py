"""What data parallelism costs: a ring all-reduce of a chunk's gradients among its D replicas.

(Where the replicas' programs and their collectives come from: gpipe_sim.schedule.global_program.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpipe_sim.plan.links import ring_link_keys
from gpipe_sim.schedule import Kind, ProgramColumns
from gpipe_sim.spec.hardware import Link
from gpipe_sim.spec.tensor_parallel import ALL_REDUCE, collective_seconds

if TYPE_CHECKING:
    from gpipe_sim.plan.compile import Plan


def ring_allreduce_seconds(nbytes: float, members: int, bandwidth: float, latency_s: float) -> float:
    """A ring all-reduce on dedicated links: 2(D-1)/D x bytes / bandwidth + 2(D-1) x latency
    (a reduce-scatter and an all-gather, each D-1 steps of bytes/D). 0 for one member. The one
    ring formula, shared with the tensor-parallel collectives (`collective_seconds`)."""
    return collective_seconds(((ALL_REDUCE, nbytes),), 1.0, members, bandwidth, latency_s)


def data_parallel_groups(plan: Plan, c: ProgramColumns, dmap: np.ndarray, per_node: int,
                         network: Link) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group of each allreduce action, [group, link key] rows of the links each group's ring
    uses, seconds of each group's ring all-reduce). One group per chunk: its D replicas (at
    T > 1, the ring of the chunk's first devices stands for its T concurrent rings, one per
    shard: they share the nodes' NICs, `network_ring_bandwidth`). Where the program holds replica 0
    alone, a ring holds none of the links only other replicas' sends use (ReplicaSymmetry.foreign)."""
    D, K = plan.replicas, len(plan.ranks)
    foreign = plan.symmetry.foreign if plan.num_ranks < D * K else frozenset()
    collective = np.full(len(c.kind), -1, dtype=np.int64)
    if D == 1:
        return collective, np.zeros((0, 2), dtype=np.int64), np.zeros(0)
    hardware = plan.scenario.hardware
    n_dev = int(dmap.max()) + 1
    starts = np.flatnonzero(c.kind == Kind.ALLREDUCE)
    collective[starts] = c.chunk[starts]
    dtype_bytes = plan.scenario.training.dtype_bytes
    tp = plan.scenario.pipeline.tensor_parallel  # each of a rank's T devices runs its shard's ring
    seconds, rows = [], []
    for chunk in plan.chunks:
        ring = [int(dmap[d * K + chunk.rank]) for d in range(D)]
        nodes = {device // per_node for device in ring}
        ln = hardware.link if len(nodes) == 1 else network
        bandwidth = ln.bandwidth if len(nodes) == 1 else hardware.network_ring_bandwidth(tp)
        seconds.append(ring_allreduce_seconds(chunk.params * dtype_bytes, D, bandwidth, ln.latency_s))
        rows.extend((chunk.index, key) for key in ring_link_keys(hardware, ring, n_dev, per_node)
                    if key not in foreign)
    return collective, np.asarray(rows, dtype=np.int64).reshape(-1, 2), np.asarray(seconds)
