"""Ring attention: a device's queries attend to the group's keys and values passed around a ring of point-to-point exchanges.

As Transformer Engine's AttnFuncWithCPAndKVP2P (Megatron-LM's default context-parallel
communication, cp_comm_type "p2p") and torch's context_parallel ring: the C members of a group
form a ring (member c sends to c + 1 and receives from c - 1). Forward, step i attends this
device's queries to the key/value block that arrived i hops around the ring (member c - i's) while
the next block is being sent on, and merges the steps' partial results by their log-sum-exp (the
online softmax of flash attention). Only this device's queries, keys, values, output and
log-sum-exp are kept for backward, which runs the ring again: each step recomputes its block's
probabilities from the kept log-sum-exp, accumulates the queries' gradient here, and adds the
block's dK, dV to the partial sums that travel with it (sent on while the next block computes,
as Transformer Engine overlaps them); after C steps every block's dK, dV has
come back to its owner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


class Ring:
    """The ring of a process group: this member's `rank` of `size`, its next and previous members'
    global ranks. `exchange` sends a tensor to the next member and receives one shaped like it from
    the previous, asynchronously, under `tag` (the keys and values and their gradients travel at
    once under tags of their own); `wait` finishes it."""

    def __init__(self, group: Any) -> None:
        self.group, self.size, self.rank = group, dist.get_world_size(group), dist.get_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.previous = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def exchange(self, send: torch.Tensor, tag: int = 0) -> tuple[torch.Tensor, list[Any]]:
        received = torch.empty_like(send)
        works = [dist.isend(send, self.next, group=self.group, tag=tag),
                 dist.irecv(received, self.previous, group=self.group, tag=tag)]
        return received, works

    @staticmethod
    def wait(works: list[Any]) -> None:
        for work in works:
            work.wait()


@dataclass(frozen=True)
class BlockView:
    """What this device's queries see of one member's key/value block: the query rows and key
    columns that take part (slices: the load balance makes them contiguous halves or the whole),
    and whether query i of `rows` sees key j of `cols` only for j <= i (`causal`: the device's own
    block, as Transformer Engine runs its diagonal step) or every key of `cols`. No mask tensor is
    held: the fused kernel takes `is_causal`."""

    rows: slice
    cols: slice
    causal: bool


def _repeat(t: torch.Tensor, groups: int) -> torch.Tensor:
    """Key/value heads repeated for the query heads of their group (grouped-query attention)."""
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def _fold(t: torch.Tensor, groups: int) -> torch.Tensor:
    """The gradient of `_repeat`: each key/value head's query heads summed."""
    if groups == 1:
        return t
    b, h, s, d = t.shape
    return t.view(b, h // groups, groups, s, d).sum(2)


def _masked(scores: torch.Tensor, causal: bool) -> torch.Tensor:
    """`scores` (..., queries, keys) with key j hidden from query i for j > i where `causal`; the
    mask is made here, a transient of the unfused path."""
    if not causal:
        return scores
    hidden = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)
    return scores.masked_fill(hidden, float("-inf"))


def forward_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  fused: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, fp32 log-sum-exp) of `q` attending to one block, `causal` or whole (`BlockView`).
    `fused` (default: on CPU) torch's fused CPU flash kernel (grouped heads natively); else the
    same computed unfused in fp32."""
    if q.device.type == "cpu" if fused is None else fused:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    groups = q.shape[1] // k.shape[1]
    scores = _masked(q.float() @ _repeat(k, groups).float().transpose(-2, -1) / math.sqrt(q.shape[-1]), causal)
    lse = scores.logsumexp(-1)
    return (torch.exp(scores - lse[..., None]) @ _repeat(v, groups).float()).to(q.dtype), lse


def backward_block(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, causal: bool, fused: bool | None = None) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) of one block given the whole attention's `out` and `lse` (flash attention's
    backward: P = exp(S - lse), dS = P (dP - rowsum(dO O))), fused or not as `forward_block`."""
    if q.device.type == "cpu" if fused is None else fused:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad, q, k, v, out, lse, 0.0, causal)
    groups, scale = q.shape[1] // k.shape[1], 1.0 / math.sqrt(q.shape[-1])
    qf, kf, vf, dout = q.float(), _repeat(k, groups).float(), _repeat(v, groups).float(), grad.float()
    p = torch.exp(_masked(qf @ kf.transpose(-2, -1) * scale, causal) - lse[..., None])
    ds = p * (dout @ vf.transpose(-2, -1) - (dout * out.float()).sum(-1, keepdim=True))
    return ((ds @ kf * scale).to(q.dtype), _fold(ds.transpose(-2, -1) @ qf * scale, groups).to(k.dtype),
            _fold(p.transpose(-2, -1) @ dout, groups).to(v.dtype))


class _RingAttention(torch.autograd.Function):
    """Causal attention over the ring's key/value blocks (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, views: list[BlockView],
                ring: Ring) -> torch.Tensor:
        kv = torch.stack((k, v)).contiguous()
        # laid out (batch, tokens, heads, dim), as the fused kernel lays out its output for the
        # block's queries: merging the heads after it is then a view, not a copy kept beside it
        out = q.new_zeros((q.shape[0], q.shape[2], q.shape[1], q.shape[3]), dtype=torch.float32).transpose(1, 2)
        lse = q.new_full(q.shape[:-1], float("-inf"), dtype=torch.float32)
        for i in range(ring.size):
            pending = ring.exchange(kv) if i + 1 < ring.size else None
            view = views[(ring.rank - i) % ring.size]
            part, part_lse = forward_block(q[:, :, view.rows], kv[0][:, :, view.cols], kv[1][:, :, view.cols],
                                            view.causal)
            # merged by log-sum-exp: each part weighed by its share of the softmax's denominator
            before = lse[:, :, view.rows]
            merged = torch.logaddexp(before, part_lse)
            out[:, :, view.rows] = (out[:, :, view.rows] * torch.exp(before - merged)[..., None]
                                    + part.float() * torch.exp(part_lse - merged)[..., None])
            lse[:, :, view.rows] = merged
            if pending is not None:
                kv = pending[0]
                ring.wait(pending[1])
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.views, ctx.ring = views, ring
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
        q, k, v, out, lse = ctx.saved_tensors
        ring: Ring = ctx.ring
        kv = torch.stack((k, v)).contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        # in the keys' dtype, as Transformer Engine's dKV buffers: what travels is what the
        # simulator's ring sends (gpipe_sim.model.context_parallel.ring_bytes_per_sample)
        dkv = torch.zeros_like(kv)
        travelling: list[Any] = []  # the previous step's dK, dV exchange, under way during this step's block
        for i in range(ring.size):
            pending = ring.exchange(kv) if i + 1 < ring.size else None
            view = ctx.views[(ring.rank - i) % ring.size]
            r, c = view.rows, view.cols
            dqi, dki, dvi = backward_block(grad[:, :, r], q[:, :, r], kv[0][:, :, c], kv[1][:, :, c],
                                            out[:, :, r], lse[:, :, r], view.causal)
            dq[:, :, r] += dqi
            ring.wait(travelling)  # this block's partial dK, dV have arrived (zeros at step 0)
            dkv[0][:, :, c] += dki
            dkv[1][:, :, c] += dvi
            # the block's dK, dV go on with it while the next block computes; after C hops they
            # are back with its owner
            dkv, travelling = ring.exchange(dkv, tag=1)
            if pending is not None:
                kv = pending[0]
                ring.wait(pending[1])
        ring.wait(travelling)
        return dq.to(q.dtype), dkv[0], dkv[1], None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, views: list[BlockView],
                   ring: Ring) -> torch.Tensor:
    """Causal attention of this device's queries (batch, heads, its tokens, dim) over the keys and
    values of every member of `ring` (this device's `k`, `v`: batch, key/value heads, its tokens,
    dim; heads a multiple of key/value heads), `views[s]` what its queries see of member s's keys
    (`BlockView`; every query sees at least its own key). Every member must call it at the same
    point (the exchanges pair up)."""
    return _RingAttention.apply(q, k, v, views, ring)


__all__ = ["BlockView", "Ring", "backward_block", "forward_block", "ring_attention"]
