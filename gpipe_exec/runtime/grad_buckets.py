"""Bucketed gradient all-reduce overlapping a chunk's last backward pass (`training.overlap_grad_reduce`).

As Megatron-LM's DistributedDataParallel and torch DDP do: a chunk's parameters are put in buckets in
the order its backward makes their gradients, by the simulator's own rule (`gpipe_sim.plan.buckets`:
the chunk's layers from its last to its first, a bucket closing once it holds `bucket_bytes`, whole
layers), and once armed (right before the chunk's last backward pass, where the program's `allreduce`
stands) each parameter's post-accumulate-grad hook counts it in; the bucket whose last gradient has
just been accumulated starts its asynchronous all-reduce over the data-parallel group while the pass
goes on. `finish` starts any bucket not started (a parameter the pass gave no gradient), waits for
them all and puts the sums back in `.grad`, before the update. Under ZeRO-1 each bucket is
reduce-scattered instead, each replica receiving its part of the bucket summed, as Megatron-LM's
distributed optimizer does (runtime.zero_shards).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import torch
from torch import nn

from gpipe_sim.plan.buckets import buckets, reduction_size
from gpipe_sim.scenario.scenario import Scenario


class Collectives(Protocol):
    """What the buckets need of the rank's communicator (`runtime.comm.Comm`)."""

    def allreduce(self, bucket: torch.Tensor, group: Any, chunk: int) -> Any: ...

    def wait_collective(self, work: Any, chunk: int) -> None: ...


class ShardedReduction(Protocol):
    """ZeRO-1's reduce-scatter of a chunk's buckets (`runtime.zero_shards.ZeroShardUpdate`)."""

    def start(self, chunk: int, b: int) -> None: ...

    def finish(self, chunk: int, b: int) -> None: ...


def bucket_groups(layers: Sequence[nn.Module], size: float) -> list[list[nn.Parameter]]:
    """A chunk's gradient buckets (its `layers` in forward order), by the simulator's rule
    (`gpipe_sim.plan.buckets.buckets`): each bucket's parameters, the buckets in the order the
    backward makes their gradients (the last layer's first), whole layers of `size` bytes at least
    but the last; none for a chunk without parameters."""
    seen: set[int] = set()  # a parameter two layers share (tied) in the first to make its gradient
    backward = [[p for p in layer.parameters() if id(p) not in seen and not seen.add(id(p))]  # type: ignore[func-returns-value]
                for layer in reversed(layers)]
    groups: list[list[nn.Parameter]] = []
    first = 0
    for last, _ in buckets([sum(p.numel() * p.element_size() for p in ps) for ps in backward], size):
        params = [p for ps in backward[first:last + 1] for p in ps]
        if params:
            groups.append(params)
        first = last + 1
    return groups


class GradBuckets:
    """Chunk `index`'s gradient buckets. `layers`: its layers in forward order; `size`: bytes a bucket
    holds (`gpipe_sim.plan.buckets.bucket_bytes`); `comm`: sums a bucket over `group` (asynchronous);
    `clock()`: the time each bucket's start is recorded at; `zero`: under ZeRO-1, what reduce-scatters
    them instead."""

    def __init__(self, index: int, layers: Sequence[nn.Module], size: float, comm: Collectives, group: Any,
                 clock: Callable[[], float], zero: ShardedReduction | None = None) -> None:
        self.groups = bucket_groups(layers, size)
        self.index, self.comm, self.group, self.clock, self.zero = index, comm, group, clock, zero
        self.armed = False
        self.pending: list[int] = []
        self.works: dict[int, tuple[Any, torch.Tensor]] = {}
        self.started_at: list[float] = []  # when each started bucket's all-reduce was launched
        self.bucket_of = {id(p): b for b, group in enumerate(self.groups) for p in group}
        self.hooks = [p.register_post_accumulate_grad_hook(self._hook(b))
                      for b, group in enumerate(self.groups) for p in group if p.requires_grad]

    def _count(self, b: int) -> None:
        """One more of bucket b's gradients accumulated: start it once it holds them all."""
        if not self.armed or b in self.works:
            return
        self.pending[b] -= 1
        if self.pending[b] == 0:
            self._launch(b)

    def _hook(self, b: int) -> Callable[[torch.Tensor], None]:
        return lambda _: self._count(b)

    def accumulated(self, params: Sequence[nn.Parameter]) -> None:
        """These parameters' gradients have just been added outside autograd's accumulation (a
        split backward's weight pass: runtime.split_backward), which fires no hook: count them."""
        for p in params:
            b = self.bucket_of.get(id(p))
            if b is not None and p.requires_grad:
                self._count(b)

    def arm(self) -> None:
        """Start counting gradients: the next backward pass is the chunk's last of the step."""
        self.armed, self.works, self.started_at = True, {}, []
        self.pending = [sum(p.requires_grad for p in group) for group in self.groups]

    def _launch(self, b: int) -> None:
        self.started_at.append(self.clock())
        if self.zero is not None:
            self.zero.start(self.index, b)
            self.works[b] = (None, torch.zeros(0))
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.groups[b]]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.works[b] = (self.comm.allreduce(flat, self.group, self.index), flat)

    def finish(self) -> list[float]:
        """Start what the pass left unstarted, wait for every bucket and copy the sums into the
        parameters' `.grad`; return when each bucket was started (the clock's seconds, in order)."""
        for b in range(len(self.groups)):
            if b not in self.works:
                self._launch(b)
        self.armed = False
        for b, group in enumerate(self.groups):
            work, flat = self.works.pop(b)
            if self.zero is not None:
                self.zero.finish(self.index, b)
                continue
            self.comm.wait_collective(work, self.index)
            at = 0
            for p in group:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad.copy_(flat[at:at + p.numel()].view_as(p))
                at += p.numel()
        return self.started_at

    def remove(self) -> None:
        """Remove the hooks."""
        for handle in self.hooks:
            handle.remove()


def chunk_buckets(modules: dict[int, nn.Sequential], scenario: Scenario, replicas: int, sharded: bool,
                  comm: Collectives, group: Any, clock: Callable[[], float],
                  zero: ShardedReduction | None = None) -> dict[int, GradBuckets]:
    """Each chunk's buckets (its module's children are its layers) where `training.overlap_grad_reduce`
    asks for them with more than one device holding the same weights (`replicas`: D x C) and without
    FSDP2 (which reduces in the backward itself); else none."""
    if not scenario.training.overlap_grad_reduce or replicas == 1 or sharded:
        return {}
    size = reduction_size(scenario)
    return {c: GradBuckets(c, list(module), size, comm, group, clock, zero) for c, module in modules.items()}


__all__ = ["Collectives", "GradBuckets", "ShardedReduction", "bucket_groups", "chunk_buckets"]
