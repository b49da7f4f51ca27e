"""Expert tensor parallelism: a MoE block's routed rows gathered over its T devices and their partial outputs summed back.

As Megatron-LM's MoEAlltoAllTokenDispatcher runs with an expert tensor-parallel size of T (its
default: the tensor-parallel size): each of the T devices routes its own 1/T of the tokens (sequence
parallelism), the rows dispatched to an expert-parallel member are all-gathered over the T devices
(`gather_from_sequence_parallel_region`), each device runs its T-th of every local expert's width
(fc1 and up column-parallel, fc2 row-parallel) on all of them, and the partial outputs are summed
back over the T devices, each keeping its own rows (`reduce_scatter_to_sequence_parallel_region`).
Members hold different numbers of rows: on gloo (no uneven all-gather or reduce-scatter) the rows
are padded to the largest count, and the sum is an all-reduce of every member's rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial


@dataclass(frozen=True)
class TensorGroup:
    """This device's place among the T devices splitting each expert's width: `size` T members, it
    the `rank`-th, over the process group `group` (Megatron-LM's expert tensor-parallel group)."""

    size: int
    rank: int
    group: Any


def local_weight(t: torch.Tensor | None) -> torch.Tensor | None:
    """A parameter as this device computes with it: a split DTensor's local shard (its gradient
    that shard's); a replicated DTensor's copy, whose gradient is this device's partial sum
    (`Partial`: summed over the T devices where the gradient is read,
    runtime.tensor_parallel.LocalShards), as a router seeing 1/T of the tokens makes it; a plain
    tensor (or None) as it is."""
    if not isinstance(t, DTensor):
        return t
    if all(p.is_replicate() for p in t.placements):
        return t.to_local(grad_placements=[Partial()])
    return t.to_local()


def gather_rows(rows: torch.Tensor, counts: list[int], group: TensorGroup) -> torch.Tensor:
    """Every member's rows (`counts[j]` of member j; `rows` this member's), concatenated in member order."""
    padded = rows.new_zeros(max(counts), *rows.shape[1:])
    padded[: rows.shape[0]] = rows
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded, group=group.group)
    return torch.cat([part[:n] for part, n in zip(parts, counts)])


def sum_rows(rows: torch.Tensor, counts: list[int], group: TensorGroup) -> torch.Tensor:
    """Rows laid out as `gather_rows` lays them (every member's, in member order) summed over the
    group: this member's `counts[rank]` of them."""
    padded = rows.new_zeros(len(counts), max(counts), *rows.shape[1:])
    for j, part in enumerate(rows.split(counts)):
        padded[j, : counts[j]] = part
    mine = padded.new_empty(padded.shape[1:])  # a reduce-scatter, as Megatron-LM's and the simulator's
    dist.reduce_scatter_tensor(mine, padded.flatten(0, 1), group=group.group)  # member j's rows: its block
    return mine[: counts[group.rank]]


class GatherRows(torch.autograd.Function):
    """`gather_rows`; its backward sums the gradient over the group (`sum_rows`)."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, counts: list[int], group: TensorGroup) -> torch.Tensor:
        ctx.counts, ctx.group = counts, group
        return gather_rows(rows, counts, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return sum_rows(grad.contiguous(), ctx.counts, ctx.group), None, None


class SumRows(torch.autograd.Function):
    """`sum_rows`; its backward gathers the gradient's rows from every member (`gather_rows`)."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, counts: list[int], group: TensorGroup) -> torch.Tensor:
        ctx.counts, ctx.group = counts, group
        return sum_rows(rows, counts, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return gather_rows(grad.contiguous(), ctx.counts, ctx.group), None, None


def member_counts(counts: torch.Tensor, group: TensorGroup) -> torch.Tensor:
    """Every member's `counts` (a 1-D tensor of the same length on each), stacked in member order."""
    parts = [torch.empty_like(counts) for _ in range(group.size)]
    dist.all_gather(parts, counts.contiguous(), group=group.group)
    return torch.stack(parts)


__all__ = ["GatherRows", "SumRows", "TensorGroup", "gather_rows", "local_weight", "member_counts", "sum_rows"]
