"""Bucketed gradient all-reduce overlapping a chunk's last backward pass (`training.overlap_grad_reduce`).

As Megatron-LM's DistributedDataParallel and torch DDP do: a chunk's parameters are put in buckets in
the order its backward makes their gradients, by the simulator's own rule (`gpipe_sim.plan.buckets`:
the chunk's layers from its last to its first, a bucket closing once it holds `bucket_bytes`, whole
layers), and once armed (right before the chunk's last backward pass, where the program's `allreduce`
stands) each parameter's post-accumulate-grad hook counts it in; the bucket whose last gradient has
just been accumulated starts its asynchronous all-reduce over the data-parallel group while the pass
goes on. `finish` starts any bucket not started (a parameter the pass gave no gradient), waits for
them all and puts the sums back in `.grad`, before the update. Each bucket is all-reduced under
ZeRO-1 too (gloo has no reduce-scatter of unequal shards): each replica then updates its shard.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import torch
from torch import nn

from gpipe_sim.plan.buckets import bucket_bytes, buckets
from gpipe_sim.scenario.scenario import Scenario


class Collectives(Protocol):
    """What the buckets need of the rank's communicator (`runtime.comm.Comm`)."""

    def allreduce(self, bucket: torch.Tensor, group: Any, chunk: int) -> Any: ...

    def wait_collective(self, work: Any, chunk: int) -> None: ...


class GradBuckets:
    """Chunk `index`'s gradient buckets. `layers`: its layers in forward order; `size`: bytes a bucket
    holds (`gpipe_sim.plan.buckets.bucket_bytes`); `comm`: sums a bucket over `group` (asynchronous);
    `clock()`: the time each bucket's start is recorded at."""

    def __init__(self, index: int, layers: Sequence[nn.Module], size: float, comm: Collectives, group: Any,
                 clock: Callable[[], float]) -> None:
        backward = [list(dict.fromkeys(layer.parameters())) for layer in reversed(layers)]
        self.groups: list[list[nn.Parameter]] = []
        first = 0
        for last, _ in buckets([sum(p.numel() * p.element_size() for p in ps) for ps in backward], size):
            params = [p for ps in backward[first:last + 1] for p in ps]
            if params:  # a chunk without parameters reduces nothing
                self.groups.append(params)
            first = last + 1
        self.index, self.comm, self.group, self.clock = index, comm, group, clock
        self.armed = False
        self.pending: list[int] = []
        self.works: dict[int, tuple[Any, torch.Tensor]] = {}
        self.started_at: list[float] = []  # when each started bucket's all-reduce was launched
        self.hooks = [p.register_post_accumulate_grad_hook(self._hook(b))
                      for b, group in enumerate(self.groups) for p in group if p.requires_grad]

    def _hook(self, b: int) -> Callable[[torch.Tensor], None]:
        def accumulated(_: torch.Tensor) -> None:
            if not self.armed or b in self.works:
                return
            self.pending[b] -= 1
            if self.pending[b] == 0:
                self._launch(b)
        return accumulated

    def arm(self) -> None:
        """Start counting gradients: the next backward pass is the chunk's last of the step."""
        self.armed, self.works, self.started_at = True, {}, []
        self.pending = [sum(p.requires_grad for p in group) for group in self.groups]

    def _launch(self, b: int) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.groups[b]]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.started_at.append(self.clock())
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
                  comm: Collectives, group: Any, clock: Callable[[], float]) -> dict[int, GradBuckets]:
    """Each chunk's buckets (its module's children are its layers) where `training.overlap_grad_reduce`
    asks for them with more than one device holding the same weights (`replicas`: D x C) and without
    FSDP2 (which reduces in the backward itself); else none."""
    if not scenario.training.overlap_grad_reduce or replicas == 1 or sharded:
        return {}
    size = bucket_bytes(scenario)
    return {c: GradBuckets(c, list(module), size, comm, group, clock) for c, module in modules.items()}


__all__ = ["Collectives", "GradBuckets", "chunk_buckets"]
