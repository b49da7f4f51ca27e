"""ZeRO-1 as Megatron-LM's distributed optimizer shards it: each gradient bucket reduce-scattered into its owner's part, the parts stepped, the parameters all-gathered.

Each of a rank's gradient buckets (a chunk's, or with `overlap_grad_reduce` each of its buckets:
`gpipe_exec.runtime.grad_buckets.bucket_groups`) is flattened and padded to a multiple of N (the
gradient group, D x C: `gpipe_sim.mesh.Mesh.gradient_group`) and cut into N equal parts of s_b
elements; replica i owns the i-th (`ShardLayout`), as Megatron-LM's `_ParamAndGradBuffer` shards each
bucket over the data-parallel group. The reduction reduce-scatters each bucket, so that a replica
receives its part summed over the group, and writes it into its parameters' gradients (the rest of
them stay unreduced, as Megatron's grad buffer outside a rank's shard); the optimizer steps the
concatenation of the replica's parts (one fp32 tensor: states for the shard only); after the step
every bucket's parts are all-gathered into the parameters, one bucket at a time. With expert
parallelism the routed experts' parameters are bucketed apart and sharded over the processes
holding the same experts (`ShardGroup` of D x C / E: `gpipe_sim.mesh.Mesh.expert_gradient_group`),
as Megatron-LM's distributed optimizer shards its expert buffers over the expert-data-parallel group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from gpipe_exec.runtime.update import make_optimizer
from gpipe_sim.scenario.scenario import Scenario


@dataclass(frozen=True)
class ShardLayout:
    """One bucket's sharding: `size` elements of gradients, padded to `parts` x `part` (part =
    ceil(size / parts)), this replica's part [lo, hi) of them (clipped to the bucket)."""

    size: int
    parts: int
    replica: int

    @property
    def part(self) -> int:
        return -(-self.size // self.parts)

    @property
    def lo(self) -> int:
        return min(self.replica * self.part, self.size)

    @property
    def hi(self) -> int:
        return min((self.replica + 1) * self.part, self.size)


@dataclass(frozen=True)
class ShardGroup:
    """The processes a bucket is sharded over: the process `group` (None: this process alone, no
    collective), its size `parts` and this process's index `replica` in it."""

    group: Any
    parts: int
    replica: int


def _grad(q: nn.Parameter) -> torch.Tensor:
    """`q`'s gradient, or zeros where it has none (a parameter the step's backward did not reach)."""
    return q.grad if q.grad is not None else torch.zeros_like(q)


def _materialise_grads(bucket: Sequence[nn.Parameter]) -> list[torch.Tensor]:
    """The bucket's gradients, each parameter without one given zeros first (to be written into)."""
    for q in bucket:
        if q.grad is None:
            q.grad = torch.zeros_like(q)
    return [q.grad for q in bucket]  # type: ignore[misc]


def _flat(tensors: Sequence[torch.Tensor], padded: int) -> torch.Tensor:
    """The tensors flattened into one new tensor of `padded` elements (zeros after them), copied
    into it one by one: the bucket is the only buffer made (a concatenation then padded would hold
    the gradients twice while it pads)."""
    flat = tensors[0].new_empty(padded)
    at = 0
    for t in tensors:
        flat[at:at + t.numel()].copy_(t.reshape(-1))
        at += t.numel()
    flat[at:].zero_()
    return flat


def _read(tensors: Sequence[torch.Tensor], lo: int, hi: int) -> torch.Tensor:
    """Elements [lo, hi) of the tensors as if flattened one after another, as one new tensor."""
    pieces, at = [], 0
    for t in tensors:
        a, b = max(lo, at), min(hi, at + t.numel())
        if a < b:
            pieces.append(t.reshape(-1)[a - at:b - at])
        at += t.numel()
    return torch.cat(pieces) if pieces else tensors[0].new_zeros(0)


def _write(params: Sequence[torch.Tensor], values: torch.Tensor, lo: int) -> None:
    """Copy `values` into elements [lo, lo + len) of the tensors as if flattened one after another."""
    at, hi = 0, lo + values.numel()
    for t in params:
        a, b = max(lo, at), min(hi, at + t.numel())
        if a < b:
            t.view(-1)[a - at:b - at].copy_(values[a - lo:b - lo])
        at += t.numel()


class ZeroShardUpdate:
    """ZeRO-1 on one global rank (module docstring). `buckets`: per chunk, its buckets' parameters
    (as the optimizer sees them), sharded as `replica` of `parts` in the gradient `group`;
    `expert_buckets`: per chunk, its routed experts' buckets (after its others), sharded over
    `expert_group`. The same interface as `runtime.update.Update` (`optimizer`, `masters`, `step`),
    with the reduction (`start`, `finish`: chunk c's buckets numbered as `of_chunk[c]` lists them) and
    the all-gather (`gather`, a collective the runtime calls out of the device lock)."""

    def __init__(self, buckets: dict[int, list[list[nn.Parameter]]], scenario: Scenario, replica: int,
                 parts: int, group: Any, comm: Any, expert_buckets: dict[int, list[list[nn.Parameter]]] | None = None,
                 expert_group: ShardGroup | None = None) -> None:
        self.comm = comm
        self.buckets: list[list[nn.Parameter]] = []
        self.groups: list[ShardGroup] = []  # each bucket's
        self.of_chunk: dict[int, list[int]] = {}  # chunk -> its buckets' indices
        dense = ShardGroup(group, parts, replica)
        for c in sorted(buckets):
            mine = [(b, dense) for b in buckets[c] if b]
            if expert_buckets is not None and expert_group is not None:
                mine += [(b, expert_group) for b in expert_buckets.get(c, []) if b]
            self.of_chunk[c] = list(range(len(self.buckets), len(self.buckets) + len(mine)))
            self.buckets += [b for b, _ in mine]
            self.groups += [g for _, g in mine]
        self.layouts = [ShardLayout(sum(q.numel() for q in b), g.parts, g.replica)
                        for b, g in zip(self.buckets, self.groups)]
        owned = [_read([q.detach() for q in b], s.lo, s.hi) for b, s in zip(self.buckets, self.layouts)]
        flat = torch.cat(owned) if owned else torch.zeros(0)  # a rank whose chunks hold no parameters
        self.master = nn.Parameter(flat.to(torch.float32, copy=True))  # fp32 like every master
        self.optimizer = make_optimizer([self.master], scenario)
        self.masters = [self.master]
        self.pending: dict[int, tuple[Any, torch.Tensor, torch.Tensor]] = {}

    def start(self, chunk: int, b: int) -> None:
        """Start the reduce-scatter of chunk `chunk`'s bucket b (`comm.reduce_scatter`, asynchronous):
        its gradients flattened and padded, this replica's part received."""
        index = self.of_chunk[chunk][b]
        bucket, s = self.buckets[index], self.layouts[index]
        grads = [_grad(q) for q in bucket]
        flat = _flat(grads, s.parts * s.part)
        if s.parts == 1:  # this process alone holds these parameters: its part is the sum
            self.pending[index] = (None, flat, flat)
            return
        mine = torch.empty(s.part, dtype=flat.dtype, device=flat.device)
        self.pending[index] = (self.comm.reduce_scatter(mine, flat, self.groups[index].group, chunk), flat, mine)

    def finish(self, chunk: int, b: int) -> None:
        """Wait for the reduce-scatter of chunk `chunk`'s bucket b and write the summed part into
        the gradients it covers."""
        b = self.of_chunk[chunk][b]
        work, _, mine = self.pending.pop(b)
        if work is not None:
            self.comm.wait_collective(work, chunk)
        s = self.layouts[b]
        _write(_materialise_grads(self.buckets[b]), mine[:s.hi - s.lo], s.lo)

    def step(self) -> None:
        """This replica's parts: its optimizer step (compute: under the device lock)."""
        parts = [_read([_grad(q) for q in bucket], s.lo, s.hi)
                 for bucket, s in zip(self.buckets, self.layouts)]
        self.master.grad = torch.cat(parts).to(torch.float32)  # one new fp32 tensor of the parts
        self.optimizer.step()

    def _gathered(self, b: int, mine: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Every replica's part of bucket b (this one's: `mine`), all-gathered in `like`'s dtype:
        the bucket, padded (its part and the whole: (N + 1) s_b elements)."""
        s = self.layouts[b]
        part = torch.zeros(s.part, dtype=like.dtype, device=like.device)
        part[:s.hi - s.lo] = mine
        if s.parts == 1:
            return part
        whole = torch.empty(s.parts * s.part, dtype=like.dtype, device=like.device)
        dist.all_gather_into_tensor(whole, part, group=self.groups[b].group)
        return whole

    def gather(self) -> None:
        """Every replica's updated parts into the parameters, bucket by bucket (a collective:
        outside the device lock, which a replica sharing this device may need to reach it)."""
        at = 0
        with torch.no_grad():
            for b, (bucket, s) in enumerate(zip(self.buckets, self.layouts)):
                mine = self.master.detach()[at:at + s.hi - s.lo]
                _write(bucket, self._gathered(b, mine, bucket[0])[:s.size], 0)
                at += s.hi - s.lo

    def gather_gradients(self) -> None:
        """Every replica's summed part of each bucket into the gradients, which then hold the whole
        reduced gradient (a collective, to report them: the step needs only this replica's parts)."""
        for b, (bucket, s) in enumerate(zip(self.buckets, self.layouts)):
            grads = _materialise_grads(bucket)
            _write(grads, self._gathered(b, _read(grads, s.lo, s.hi), grads[0])[:s.size], 0)


__all__ = ["ShardGroup", "ShardLayout", "ZeroShardUpdate"]
