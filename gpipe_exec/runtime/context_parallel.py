"""Context parallelism on a rank: its process groups, its layers' share of the sequence, its batch and loss.

Processes are numbered by `gpipe_sim.mesh.Mesh` (Megatron-LM's tp-cp-dp-pp order): program rank g
(replica d, pipeline rank r: g = d*K + r) runs its context rank c and tensor rank t on process
(g*C + c)*T + t, each transfer going to the same (c, t) of the peer rank
(`gpipe_sim.schedule.global_program.process_program` with T x C processes a rank). Every member
holds the whole layers; the gradients are summed over the D x C processes holding the same layers
(`Mesh.gradient_group`), as Megatron-LM reduces over its data-parallel-with-context-parallel group.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate

from gpipe_exec.context_parallel import SequenceShard
from gpipe_exec.zoo import Block, Embedding
from gpipe_sim.mesh import Mesh

_GROUPS: tuple[Any, tuple[int, int, int, int], dict[tuple[str, int, int], Any]] | None = None


def _all_groups(mesh: Mesh) -> dict[tuple[str, int, int], Any]:
    """Every context-parallel group ("cp", program rank, tensor rank) and every gradient group
    ("grad", pipeline rank, tensor rank), made once per default group and (D, K, T, C);
    collective: every process makes all, in the same order."""
    global _GROUPS
    default = dist.distributed_c10d._get_default_group()
    D, K, T, C = mesh.data_parallel, mesh.stages, mesh.tensor_parallel, mesh.context_parallel
    if _GROUPS is None or _GROUPS[0] is not default or _GROUPS[1] != (D, K, T, C):
        groups: dict[tuple[str, int, int], Any] = {}
        for g in range(mesh.num_ranks):
            for t in range(T):
                groups["cp", g, t] = dist.new_group([mesh.process(g, c, t) for c in range(C)])
        for r in range(K):
            for t in range(T):
                members = sorted(q for c in range(C) for q in mesh.replica_processes(r, c, t))
                groups["grad", r, t] = dist.new_group(members)
        _GROUPS = (default, (D, K, T, C), groups)
    return _GROUPS[2]


def context_groups(mesh: Mesh, process: int) -> tuple[Any, Any]:
    """(this process's context-parallel group, the group its gradients are summed over: the D x C
    processes holding the same layers, `Mesh.gradient_group`)."""
    g, _, t = mesh.coordinates(process)
    groups = _all_groups(mesh)
    return groups["cp", g, t], groups["grad", mesh.pipeline_rank(g), t]


def split_sequence(module: nn.Module, shard: SequenceShard) -> None:
    """Every layer of `module` (split over T first, where it is) set to run on `shard`'s tokens:
    the embedding's learned positions those tokens' rows, each block's rotary tables likewise and
    its attention the group's (no mask: the shard's views follow from the load balance)."""
    for layer in module.modules():
        if isinstance(layer, Embedding):
            ids = shard.positions
            if isinstance(layer.positions, DTensor):  # sequence parallelism's replicated table: index it alike
                ids = DTensor.from_local(ids, layer.positions.device_mesh, [Replicate()], run_check=False)
            layer.position_ids = ids
        elif isinstance(layer, Block):
            layer.context = shard
            if layer.rotary:
                layer.cos, layer.sin = layer.cos[shard.positions], layer.sin[shard.positions]


def shard_batch(t: torch.Tensor, shard: SequenceShard) -> torch.Tensor:
    """This device's tokens of a batch of sequences (batch, tokens, ...): a copy, as Megatron-LM's
    loader hands each context-parallel rank only its own."""
    return t[:, shard.positions.to(t.device)].clone()


def context_loss(loss: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor], size: int
                 ) -> Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]:
    """`loss` (a per-token mean over the micro-batch's tokens, `zoo.loss_sum`) on this device's
    1/C of every sequence, divided by C: the group's losses sum to the whole sequence's."""

    def loss_sum(output: torch.Tensor, target: torch.Tensor, batch_size: int) -> torch.Tensor:
        return loss(output, target, batch_size) / size

    return loss_sum


def sum_losses(records: list[Any], group: Any, device: torch.device) -> None:
    """Each step record's `loss` made the context-parallel group's sum (a collective over tensors
    on `device`: every member calls it with as many records): the loss of the whole sequences."""
    losses = torch.tensor([float(r.loss) for r in records], dtype=torch.float64, device=device)
    dist.all_reduce(losses, group=group)
    for record, loss in zip(records, losses.tolist()):
        record.loss = loss


__all__ = ["context_groups", "context_loss", "shard_batch", "split_sequence", "sum_losses"]
