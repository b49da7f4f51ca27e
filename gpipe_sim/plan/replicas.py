"""What data parallelism costs: a ring all-reduce of a chunk's gradients among its D replicas.

(Where the replicas' programs and their collectives come from: gpipe_sim.schedule.global_program.)
"""

from __future__ import annotations

from gpipe_sim.spec.tensor_parallel import ALL_REDUCE, collective_seconds


def ring_allreduce_seconds(nbytes: float, members: int, bandwidth: float, latency_s: float) -> float:
    """A ring all-reduce on dedicated links: 2(D-1)/D x bytes / bandwidth + 2(D-1) x latency
    (a reduce-scatter and an all-gather, each D-1 steps of bytes/D). 0 for one member. The one
    ring formula, shared with the tensor-parallel collectives (`collective_seconds`)."""
    return collective_seconds(((ALL_REDUCE, nbytes),), 1.0, members, bandwidth, latency_s)
