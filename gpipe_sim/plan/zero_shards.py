"""ZeRO-1's sharded buckets as Megatron-LM's distributed optimizer (and gpipe-exec) cut them: per group, part sizes, each replica's parts, the buffers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpipe_sim.plan.buckets import buckets, reduction_size
from gpipe_sim.plan.compile import Plan
from gpipe_sim.plan.layer_table import held_parameters


@dataclass(frozen=True)
class ShardedBuckets:
    """Every chunk's ZeRO-1 buckets in elements, sharded over the gradient group (N = D x C) and,
    with expert parallelism, each bucket's routed experts' parameters apart, over the expert-data-
    parallel group (N_e = D x C / E), as Megatron-LM's expert buffers are. A bucket of n elements
    over a group of N > 1 is padded to N parts of s = ceil(n / N) and reduce-scattered (its padded
    copy and the received part: (N + 1) s elements held); over a group of one it is its own sum
    (the copy only: s = n elements held), and so is its all-gather."""

    copies: np.ndarray  # per chunk: elements its buckets' reduction holds, from the allreduce to the wait
    owned: np.ndarray  # per global rank: elements of its parts (its master shard)
    gather: np.ndarray  # per pipeline rank: elements one bucket's all-gather holds, the largest of its buckets


def _held(group: int) -> int:
    """A part's multiple a reduce-scatter (or all-gather) over `group` processes holds."""
    return group + 1 if group > 1 else 1


def bucket_sizes(plan: Plan, chunk: Any) -> list[tuple[int, int]]:
    """(dense, routed experts') elements of each of a chunk's ZeRO-1 buckets: its layers' parameters
    in backward order, in buckets of `bucket_bytes` with `overlap_grad_reduce`
    (gpipe_sim.plan.buckets), else one; the experts' counted apart only with expert parallelism."""
    scenario = plan.scenario
    element = scenario.training.dtype_bytes
    size = reduction_size(scenario)
    apart = plan.mesh.expert_parallel > 1
    own = plan.layers[chunk.first_layer:chunk.last_layer + 1]
    params = [layer.params for layer in own]
    # a tied token table is held once (`held_parameters`): in the head's bucket, the first its
    # backward fills, as gpipe-exec's buckets take a shared tensor where they meet it first
    params[0] -= sum(params) - held_parameters(plan.scenario, own, len(own) == len(plan.layers))
    layers, params = own[::-1], params[::-1]
    out, first = [], 0
    for last, _ in buckets([n * element for n in params], size):
        expert = sum(layer.expert_params for layer in layers[first:last + 1]) if apart else 0
        out.append((sum(params[first:last + 1]) - expert, expert))
        first = last + 1
    return [b for b in out if sum(b)] or [(0, 0)]


def sharded_buckets(plan: Plan) -> ShardedBuckets:
    """Every chunk's buckets sharded (class docstring); a replica's index in the gradient group is
    d x C (its c = 0 device's: every c holds the same), in the expert-data-parallel group (d // E) x C."""
    mesh, C = plan.mesh, plan.scenario.pipeline.context_parallel
    g = np.arange(plan.num_ranks)
    replica, rank = mesh.replica(g), mesh.pipeline_rank(g)
    groups = ((mesh.gradient_group, replica * C), (mesh.expert_gradient_group, replica // mesh.expert_parallel * C))
    copies, owned = np.zeros(len(plan.chunks)), np.zeros(plan.num_ranks)
    gather = np.zeros(len(plan.ranks))
    for c, ch in enumerate(plan.chunks):
        sizes = np.asarray(bucket_sizes(plan, ch), dtype=float)
        for kind, (N, index) in enumerate(groups):
            n = sizes[:, kind]
            s = np.ceil(n / N)
            copies[c] += float(np.sum(_held(N) * s))
            mine = np.minimum((index[:, None] + 1) * s, n) - np.minimum(index[:, None] * s, n)
            owned += np.where(rank == ch.rank, mine.sum(axis=1), 0.0)
            gather[ch.rank] = max(gather[ch.rank], float(_held(N) * s.max(initial=0.0)))
    return ShardedBuckets(copies, owned, gather)


__all__ = ["ShardedBuckets", "bucket_sizes", "sharded_buckets"]
