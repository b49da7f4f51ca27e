"""Context parallelism's attention: a device's load-balanced share of the sequence, attending over the group's keys and values.

As Megatron-LM (get_batch_on_this_cp_rank) and torch's context_parallel (_RoundRobinLoadBalancer)
split a sample: its s tokens are cut into 2C chunks and device c of the C-device group holds chunks
c and 2C-1-c (s/C tokens, 1/C of the causal attention). Everything but attention runs on those
tokens alone. Attention exchanges keys and values as Transformer Engine's
AttnFuncWithCPAndKVAllGather (cp_comm_type "all_gather") does: each device all-gathers the group's
K and V, attends its queries to every key its position may see (the causal mask from the tokens'
global positions), and keeps only its own K and V for the backward, which gathers them again; the
gathered keys' and values' gradients are reduce-scattered back to their devices.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gpipe_exec.measure.saved_hooks import nested_saved_tensors_hooks


def load_balanced_positions(seq_len: int, size: int, rank: int) -> torch.Tensor:
    """The global positions device `rank` of `size` holds: chunks rank and 2 size - 1 - rank of
    the sequence cut into 2 size equal chunks (`seq_len` must cut so)."""
    n = seq_len // (2 * size)
    if n * 2 * size != seq_len:
        raise ValueError(f"{seq_len} tokens do not cut into {2 * size} equal chunks")
    first, second = rank * n, (2 * size - 1 - rank) * n
    return torch.cat((torch.arange(first, first + n), torch.arange(second, second + n)))


def _gather(x: torch.Tensor, group: Any, size: int) -> torch.Tensor:
    """The group's (batch, heads, tokens, dim) tensors concatenated along the tokens, in member order."""
    mine = x.movedim(2, 0).contiguous()
    out = mine.new_empty(size * mine.shape[0], *mine.shape[1:])
    dist.all_gather_single(out, mine, group=group)
    return out.movedim(0, 2)


class _GatherSequence(torch.autograd.Function):
    """`_gather` forward; backward, the gathered gradient reduce-scattered: each member gets the
    sum over the group of its own tokens' part."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, size: int) -> torch.Tensor:
        ctx.group, ctx.size = group, size
        return _gather(x, group, size)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        whole = grad.movedim(2, 0).contiguous()
        out = whole.new_empty(whole.shape[0] // ctx.size, *whole.shape[1:])
        dist.reduce_scatter_single(out, whole, group=ctx.group)
        return out.movedim(0, 2), None, None


@dataclass(frozen=True)
class SequenceShard:
    """This device's place in its context-parallel group: `size` C members over process group
    `group`, it the `rank`-th, holding the tokens at `positions` (`load_balanced_positions`);
    `mask` (its tokens x the group's, in member order) is 0 where a query may see the key and -inf
    where it may not, in the model's dtype: the attention keeps it as given (a boolean mask it
    would keep as a new additive copy, an activation of every block)."""

    size: int
    rank: int
    group: Any
    positions: torch.Tensor
    mask: torch.Tensor

    @classmethod
    def of(cls, seq_len: int, size: int, rank: int, group: Any, device: torch.device,
           dtype: torch.dtype) -> "SequenceShard":
        """Member `rank` of a group of `size` splitting `seq_len` tokens, its tensors on `device`,
        its mask in `dtype`."""
        positions = load_balanced_positions(seq_len, size, rank)
        keys = torch.cat([load_balanced_positions(seq_len, size, r) for r in range(size)])
        hidden = keys[None, :] > positions[:, None]
        mask = torch.zeros(hidden.shape, dtype=dtype).masked_fill_(hidden, float("-inf"))
        return cls(size, rank, group, positions.to(device), mask.to(device))


def attend(shard: SequenceShard, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grouped: bool) -> torch.Tensor:
    """Causal attention of this device's queries (batch, heads, its tokens, dim) over the group's
    keys and values (this device's `k` and `v`: batch, key/value heads, its tokens, dim), as fused
    attention (`scaled_dot_product_attention`, `grouped`: heads share key/value heads). The
    gathered K and V are saved for backward as this device's own (the same tensors the caller
    passed) and gathered again when the backward reads them."""
    k_all, v_all = (_GatherSequence.apply(t, shard.group, shard.size) for t in (k, v))
    own = {id(k_all): (weakref.ref(k_all), k), id(v_all): (weakref.ref(v_all), v)}
    regather: dict[int, weakref.ref[torch.Tensor]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        entry = own.get(id(t))
        if entry is None or entry[0]() is not t:
            return t
        local = entry[1].detach()
        regather[id(local)] = weakref.ref(local)
        return local

    def unpack(t: torch.Tensor) -> torch.Tensor:
        ref = regather.get(id(t))
        if ref is None or ref() is not t:
            return t
        with torch.no_grad():
            return _gather(t, shard.group, shard.size)

    with nested_saved_tensors_hooks(pack, unpack):
        return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=shard.mask, enable_gqa=grouped)


__all__ = ["SequenceShard", "attend", "load_balanced_positions"]
