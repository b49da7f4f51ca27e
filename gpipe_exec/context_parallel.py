"""Context parallelism on a device: its load-balanced share of the sequence, and causal attention over the group's keys and values.

As Megatron-LM (get_batch_on_this_cp_rank) and torch's context_parallel (_RoundRobinLoadBalancer)
split a sample: its s tokens are cut into 2C chunks and device c of the C-device group holds chunks
c and 2C-1-c (s/C tokens, 1/C of the causal attention). Everything but attention runs on those
tokens alone. Attention passes keys and values around the group's ring (gpipe_exec.ring_attention,
Transformer Engine's AttnFuncWithCPAndKVP2P), each block masked by the tokens' global positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gpipe_exec.ring_attention import BlockView, Ring, ring_attention


def load_balanced_positions(seq_len: int, size: int, rank: int) -> torch.Tensor:
    """The global positions device `rank` of `size` holds: chunks rank and 2 size - 1 - rank of
    the sequence cut into 2 size equal chunks (`seq_len` must cut so)."""
    n = seq_len // (2 * size)
    if n * 2 * size != seq_len:
        raise ValueError(f"{seq_len} tokens do not cut into {2 * size} equal chunks")
    first, second = rank * n, (2 * size - 1 - rank) * n
    return torch.cat((torch.arange(first, first + n), torch.arange(second, second + n)))


def context_mask(seq_len: int, size: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    """Member `rank`'s causal mask: its tokens (`load_balanced_positions`) x every member's, in
    member order; 0 where the query's global position is not before the key's, -inf elsewhere."""
    positions = load_balanced_positions(seq_len, size, rank)
    keys = torch.cat([load_balanced_positions(seq_len, size, r) for r in range(size)])
    hidden = keys[None, :] > positions[:, None]
    return torch.zeros(hidden.shape, dtype=dtype).masked_fill_(hidden, float("-inf"))


@dataclass(frozen=True)
class SequenceShard:
    """This device's place in its context-parallel group: `size` C members in a `ring`, it the
    `rank`-th, holding the tokens at `positions` (`load_balanced_positions`);
    `mask` (its tokens x the group's, in member order) is 0 where a query may see the key and -inf
    where it may not, in the model's dtype (a buffer of every block: static memory)."""

    size: int
    rank: int
    ring: Ring
    positions: torch.Tensor
    mask: torch.Tensor
    views: tuple[BlockView, ...]  # what its queries see of each member's keys

    @classmethod
    def of(cls, seq_len: int, size: int, rank: int, group: Any, device: torch.device,
           dtype: torch.dtype) -> "SequenceShard":
        """Member `rank` of a group of `size` splitting `seq_len` tokens, its tensors on `device`,
        its mask in `dtype`."""
        mask = context_mask(seq_len, size, rank, dtype).to(device)
        views = tuple(BlockView.of(block) for block in mask.chunk(size, dim=1))
        positions = load_balanced_positions(seq_len, size, rank).to(device)
        return cls(size, rank, Ring(group), positions, mask, views)


def attend(shard: SequenceShard, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of this device's queries (batch, heads, its tokens, dim) over the group's
    keys and values (this device's `k` and `v`: batch, key/value heads, its tokens, dim) around
    the group's ring (gpipe_exec.ring_attention), each member's block masked by the tokens'
    global positions."""
    return ring_attention(q, k, v, list(shard.views), shard.ring)


__all__ = ["SequenceShard", "attend", "context_mask", "load_balanced_positions"]
