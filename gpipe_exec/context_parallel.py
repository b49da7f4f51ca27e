"""Context parallelism on a device: its load-balanced share of the sequence, and causal attention over the group's keys and values.

As Megatron-LM (get_batch_on_this_cp_rank) and torch's context_parallel (_RoundRobinLoadBalancer)
split a sample: its s tokens are cut into 2C chunks and device c of the C-device group holds chunks
c and 2C-1-c (s/C tokens, 1/C of the causal attention). Everything but attention runs on those
tokens alone. Attention passes keys and values around the group's ring (gpipe_exec.ring_attention,
Transformer Engine's AttnFuncWithCPAndKVP2P), what each block's queries see of its keys following
from the load balance alone (`block_views`): no mask is held.
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


def block_views(size: int, rank: int, tokens: int) -> tuple[BlockView, ...]:
    """What member `rank`'s queries see of each member's keys, every member holding `tokens`
    tokens as two chunks (`load_balanced_positions`; Transformer Engine's three cases): its own
    block causally (its tokens lie in increasing position); an earlier member's first chunk whole
    with all its queries (that member's second chunk lies after both of its own); a later member's
    block whole with its second chunk of queries only (its first chunk lies before both of that
    member's)."""
    half = tokens // 2
    every, first, second = slice(0, tokens), slice(0, half), slice(half, tokens)
    return tuple(BlockView(every, every, True) if member == rank else
                 BlockView(every, first, False) if member < rank else BlockView(second, every, False)
                 for member in range(size))


@dataclass(frozen=True)
class SequenceShard:
    """This device's place in its context-parallel group: `size` C members in a `ring`, it the
    `rank`-th, holding the tokens at `positions` (`load_balanced_positions`), its queries seeing
    each member's keys as `views` say (`block_views`)."""

    size: int
    rank: int
    ring: Ring
    positions: torch.Tensor
    views: tuple[BlockView, ...]  # what its queries see of each member's keys

    @classmethod
    def of(cls, seq_len: int, size: int, rank: int, group: Any, device: torch.device) -> "SequenceShard":
        """Member `rank` of a group of `size` splitting `seq_len` tokens, its positions on `device`."""
        positions = load_balanced_positions(seq_len, size, rank).to(device)
        return cls(size, rank, Ring(group), positions, block_views(size, rank, seq_len // size))


def attend(shard: SequenceShard, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of this device's queries (batch, heads, its tokens, dim) over the group's
    keys and values (this device's `k` and `v`: batch, key/value heads, its tokens, dim) around
    the group's ring (gpipe_exec.ring_attention), each member's block seen as `shard.views` say."""
    return ring_attention(q, k, v, list(shard.views), shard.ring)


__all__ = ["SequenceShard", "attend", "block_views", "load_balanced_positions"]
