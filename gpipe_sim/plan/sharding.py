"""Sharded data parallelism (ZeRO-1/2/3, FSDP2, HSDP): what a rank keeps per parameter and what ZeRO-3's per-layer collectives cost.

Bytes a rank holds per parameter (`bytes_per_param`), with g the gradient and w the weight in the
training dtype, s the optimizer states plus the fp32 master copy (none in fp32 training), D the
replicas and S the shard group (D, or with `shard_within_node` the replicas sharing a node); under
`training.dtype: fp8` w counts the weights' FP8 copies too (gpipe_sim.costs.fp8) but for ZeRO-3
without pipelining, whose gathered units the passes hold:

    zero 0:  w + g + s                          (PyTorch DDP, Megatron-LM without its distributed optimizer)
    zero 1:  w + g + s / D                      (Megatron-LM --use-distributed-optimizer, DeepSpeed stage 1)
    zero 2:  w + (w' + g + s) / D               (DeepSpeed stage 2: gradients reduce-scattered into their shard;
                                                 the replica's weight shard stepped apart from the whole weight,
                                                 DeepSpeed's `single_partition_of_fp32_groups` clone and FSDP2's
                                                 sharded parameter: w' = w in fp32 training, else 0, the fp32
                                                 master being that shard)
    zero 3, K = 1:  (w' + g + s) / S            (FSDP2 `fully_shard`: w' = w in fp32 training, else 0, the
                                                 fp32 master being the sharded parameter)
    zero 3, K > 1:  w + (w' + s) / S            (torchtitan under pipelining: `reshard_after_forward` False,
                                                 so a stage's gathered parameters are held all step; the
                                                 unsharded gradients torch.distributed.pipelining accumulates
                                                 until the last backward are held from the first backward on,
                                                 not all step: gpipe_sim.plan.accumulated_gradients)

ZeRO-3 without pipelining gathers each layer (FSDP unit: one layer of the layer table, as torchtitan
wraps each transformer block) before its forward and again before its backward, one unit ahead
(FSDP2's prefetch), and reduce-scatters each unit's gradients as its backward ends, every micro-batch
(no `no_sync` under gradient accumulation). One queue of collectives serves a pass (`fsdp_pass_seconds`);
the gathered units in flight (the running one and the prefetched one, plus the running unit's
unsharded gradient in backward) are transient bytes of the pass (`in_flight_bytes`). With pipelining
the gather runs in the step's first forward and the reduce-scatter in its last backward, layer by
layer (gpipe_sim.plan.buckets with one layer a bucket). ZeRO-2 reduce-scatters in every backward
pass and all-gathers once a step (gpipe_sim.plan.pass_collectives). Under HSDP each reduce-scatter
within the node is followed by an all-reduce of the shard across the D / S nodes' replicas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from gpipe_sim.errors import ScenarioError
from gpipe_sim.costs.fp8 import FP8, FP8_WEIGHT_BYTES
from gpipe_sim.model.model import LayerSpec
from gpipe_sim.scenario.scenario import Scenario, Training
from gpipe_sim.costs.collectives import collective_seconds
from gpipe_sim.model.tensor_parallel import ALL_REDUCE
from gpipe_sim.mesh import node_of


@dataclass(frozen=True)
class Ring:
    """A ring of `members` devices on links of `bandwidth` B/s and `latency_s`."""

    members: int
    bandwidth: float
    latency_s: float

    def allreduce(self, nbytes: float) -> float:
        """A ring all-reduce of `nbytes`: 2(n-1)/n x bytes / bandwidth + 2(n-1) x latency (0 for one member)."""
        return collective_seconds(((ALL_REDUCE, nbytes),), 1.0, self.members, self.bandwidth, self.latency_s)

    def half(self, nbytes: float) -> float:
        """A reduce-scatter or an all-gather of `nbytes` in all: half an all-reduce."""
        return self.allreduce(nbytes) / 2


def replica_ring(scenario: Scenario, devices: Sequence[int], per_node: int, rings: int) -> Ring:
    """The ring of these devices: the accelerators' link within one node, else the network, whose
    ports `rings` rings leave each node by at once (`Hardware.network_ring_bandwidth`)."""
    hardware = scenario.hardware
    within = node_of(min(devices), per_node) == node_of(max(devices), per_node)  # nodes hold consecutive devices
    ln = hardware.link if within else (hardware.network or hardware.link)
    bandwidth = ln.bandwidth if within else hardware.network_ring_bandwidth(min(rings, per_node))
    return Ring(len(devices), bandwidth, ln.latency_s)


def shard_degree(scenario: Scenario) -> int:
    """S: the replicas a ZeRO stage shards over. D, or with `shard_within_node` the replicas of a
    pipeline rank that share replica 0's node (the same for every rank and dividing D, else one
    line; one line too for ZeRO-3 with context parallelism)."""
    p = scenario.pipeline
    D, K = p.data_parallel, p.stages
    if scenario.training.zero == 3 and p.context_parallel > 1:
        raise ScenarioError("training.zero: ZeRO-3 over the data x context-parallel mesh (torchtitan's "
                            "dp_shard_cp) is not modelled; use zero 0-2 with pipeline.context_parallel > 1")
    if not scenario.training.shard_within_node or D == 1:
        return D
    mesh = scenario.mesh
    nodes = mesh.node(np.asarray(mesh.rank_devices).reshape(D, K))  # [replica, rank]
    counts = set((nodes == nodes[0]).sum(axis=0).tolist())  # per rank, its replicas in replica 0's node
    S = counts.pop()
    if counts or D % S:
        raise ScenarioError(f"training.shard_within_node: a node holds {S} of a stage's {D} replicas here, "
                            "not the same whole share for every stage; place replicas so each node holds D/nodes")
    return S


def rank_rings(scenario: Scenario, rank: int, per_node: int) -> tuple[Ring, Ring]:
    """(shard ring, replicate ring) of pipeline rank `rank`'s D replicas: the S replicas a shard is
    gathered and reduce-scattered among (replica 0's group), and the D / S groups' shard all-reduce
    across them (one member, free, without HSDP)."""
    T = scenario.pipeline.tensor_parallel
    S = shard_degree(scenario)
    mesh = scenario.mesh
    first = mesh.rank_devices[rank::mesh.stages]  # its program rank d*K + rank in each replica d
    shard = replica_ring(scenario, first[:S], per_node, T)
    across = replica_ring(scenario, first[::S], per_node, S * T)
    return shard, across


def bytes_per_param(training: Training, D: int, S: int, K: int, zero: int | None = None) -> tuple[float, float]:
    """(weight bytes, other bytes) a rank holds per parameter all step under ZeRO stage `zero`
    (`training.zero` if None; module docstring); `D` replicas, `S` of them sharing a shard, `K`
    pipeline stages."""
    g = float(training.dtype_bytes)
    w = g + (FP8_WEIGHT_BYTES if training.dtype == FP8 else 0)  # with FP8 GEMMs, their weights' FP8 copies
    s = training.state_bytes_per_param - g
    zero = (training.zero if zero is None else zero) if D > 1 else 0
    if zero == 0:
        return w, g + s
    if zero == 1:
        return w, g + s / D
    own = g if training.dtype == "fp32" else 0.0  # the sharded parameter beside the master copy
    if zero == 2:
        return w, (own + g + s) / D
    if K == 1:
        return own / S, (g + s) / S
    return w, (own + s) / S


def reduces_every_backward(scenario: Scenario) -> bool:
    """Whether each backward pass reduce-scatters its gradients (ZeRO-2 over D x C > 1 devices:
    gpipe_sim.plan.pass_collectives)."""
    return scenario.training.zero == 2 and scenario.mesh.gradient_group > 1


def reduce_scatter_copy_bytes(scenario: Scenario) -> float:
    """Bytes per parameter of the copy of a unit's gradient that FSDP2's reduce-scatter reads
    (`foreach_reduce`'s input buffer), made as the unit's backward ends beside its unsharded
    gradient and kept until the next unit's reduce-scatter (`reduce_scatter_max_input_buffers` 1),
    so while that unit's backward runs (`chunk_transient_bytes`): under ZeRO-2, whose every backward
    reduce-scatters (ZeRO-3 without pipelining counts it in `in_flight_bytes`); else 0."""
    return float(scenario.training.dtype_bytes) if reduces_every_backward(scenario) else 0.0


def accumulated_bytes_per_param(scenario: Scenario) -> float:
    """g, the bytes per parameter of the unsharded gradient a chunk accumulates from its first
    backward pass to its last under pipelined ZeRO-3 (K > 1, D x C > 1: gpipe_sim.plan.accumulated_gradients); else 0."""
    p = scenario.pipeline
    pipelined = scenario.training.zero == 3 and p.stages > 1 and scenario.mesh.gradient_group > 1
    return float(scenario.training.dtype_bytes) if pipelined else 0.0


def gathers_per_pass(scenario: Scenario) -> bool:
    """Whether each forward and backward pass gathers its layers and reduce-scatters their
    gradients (ZeRO-3 without pipelining, D > 1)."""
    p = scenario.pipeline
    return scenario.training.zero == 3 and p.stages == 1 and p.data_parallel > 1


def in_flight_bytes(layers: Sequence[LayerSpec], dtype_bytes: int) -> tuple[float, float]:
    """(forward, backward) bytes of gathered units a pass holds at its peak under ZeRO-3 without
    pipelining: the largest two neighbouring layers' parameters (the running unit and the one
    prefetched), and in backward the running unit's unsharded gradient too."""
    params = [float(layer.params) for layer in layers]
    pairs = [a + b for a, b in zip(params, params[1:])] or params
    gathered = max(pairs, default=0.0) * dtype_bytes
    return gathered, gathered + max(params, default=0.0) * dtype_bytes


def fsdp_pass_seconds(gathers: Sequence[float], computes: Sequence[float], reduces: Sequence[float] = ()) -> float:
    """Seconds of one pass over FSDP units in the order it runs them: unit i's compute (`computes[i]`)
    waits for its all-gather (`gathers[i]`); the gathers and the gradient reductions (`reduces[i]`,
    issued as unit i's compute ends) run one after another on one queue, unit i+1's gather issued as
    unit i's compute starts (one unit ahead). The pass ends when its compute and its last reduction
    have."""
    queue = gathers[0] if gathers else 0.0
    ready, end = queue, 0.0
    for i, compute in enumerate(computes):
        start = max(end, ready)
        if i + 1 < len(gathers):
            queue = max(queue, start) + gathers[i + 1]
            ready = queue
        end = start + compute
        if i < len(reduces):
            queue = max(queue, end) + reduces[i]
    return max(end, queue)


def fsdp_chunk_seconds(scenario: Scenario, layers: Sequence[LayerSpec], shares: np.ndarray,
                       seconds: np.ndarray) -> np.ndarray:
    """The [size, (forward, backward)] seconds of a chunk's passes under ZeRO-3 without pipelining:
    `seconds` the passes alone, shared over the layers as `shares` [size, layer, (forward, backward)]
    are; each layer gathered over the shard ring, its gradients reduce-scattered there and, under
    HSDP, their shard all-reduced across the nodes (`fsdp_pass_seconds`)."""
    shard, across = rank_rings(scenario, 0, scenario.mesh.node_size)
    nbytes = [float(layer.params * scenario.training.dtype_bytes) for layer in layers]
    gathers = [shard.half(n) for n in nbytes]
    reduces = [shard.half(n) + across.allreduce(n / shard.members) for n in nbytes]
    out = np.array(seconds, dtype=float)
    for i in range(len(out)):
        for k, order in ((0, slice(None)), (1, slice(None, None, -1))):
            weights = shares[i, :, k]
            total = weights.sum()
            parts = weights / total * out[i, k] if total > 0 else np.full(len(layers), out[i, k] / len(layers))
            out[i, k] = fsdp_pass_seconds(gathers[order], parts[order].tolist(), reduces[order] if k else ())
    return out


__all__ = ["Ring", "accumulated_bytes_per_param", "bytes_per_param", "fsdp_chunk_seconds", "fsdp_pass_seconds",
           "gathers_per_pass", "in_flight_bytes", "rank_rings", "reduce_scatter_copy_bytes", "reduces_every_backward",
           "replica_ring", "shard_degree"]
