"""The built-in schedule families: each orders the passes of every rank, nothing more."""

from __future__ import annotations

import numpy as np

from gpipe_sim.schedule.actions import Kind
from gpipe_sim.schedule.registry import RankOrders, one_chunk, register

# Passes are (kind, chunk, micro_batch) rows: tuples, or an (n, 3) integer array for speed.
F, B = int(Kind.FORWARD), int(Kind.BACKWARD)


def _rows(kinds: np.ndarray, chunk: int, micro_batches: np.ndarray) -> np.ndarray:
    return np.stack([kinds, np.full(len(kinds), chunk), micro_batches], axis=1)


@register("gpipe", check=one_chunk("gpipe"))
def gpipe(ranks: int, micro_batches: int, chunks: int) -> RankOrders:
    """Fill-drain (GPipe): all forwards, then all backwards in reverse micro-batch order."""
    kinds = np.repeat([F, B], micro_batches)
    order = np.concatenate([np.arange(micro_batches), np.arange(micro_batches)[::-1]])
    return [_rows(kinds, r, order) for r in range(ranks)]


@register("1f1b", check=one_chunk("1f1b"))
def one_f_one_b(ranks: int, micro_batches: int, chunks: int) -> RankOrders:
    """1F1B (PipeDream-Flush): warm-up forwards, then one forward and one backward in turn."""
    orders: RankOrders = []
    for r in range(ranks):
        warmup = min(ranks - r - 1, micro_batches)
        steady = micro_batches - warmup
        kinds = np.concatenate([np.full(warmup, F), np.tile([F, B], steady), np.full(warmup, B)])
        mbs = np.concatenate([
            np.arange(warmup),
            np.stack([np.arange(warmup, micro_batches), np.arange(steady)], axis=1).ravel(),
            np.arange(steady, micro_batches),
        ])
        orders.append(_rows(kinds, r, mbs))
    return orders


def _naive_check(ranks: int, micro_batches: int, chunks: int) -> str | None:
    if micro_batches != 1:
        return "pipeline.micro_batches: the naive schedule runs the mini-batch whole; set it to 1"
    return one_chunk("naive")(ranks, micro_batches, chunks)


@register("naive", check=_naive_check)
def naive(ranks: int, micro_batches: int, chunks: int) -> RankOrders:
    """No micro-batching: the mini-batch goes through the ranks whole (M = 1)."""
    return gpipe(ranks, 1, 1)


@register("looped_bfs")
def looped_bfs(ranks: int, micro_batches: int, chunks: int) -> RankOrders:
    """Looped BFS (torch's ScheduleLoopedBFS): each rank forwards every micro-batch through its
    chunks in turn, then backwards them through its chunks in reverse."""
    orders: RankOrders = []
    for r in range(ranks):
        mine = [r + i * ranks for i in range(chunks)]
        order = [(F, c, m) for c in mine for m in range(micro_batches)]
        order += [(B, c, m) for c in reversed(mine) for m in reversed(range(micro_batches))]
        orders.append(order)
    return orders


def _interleaved_check(ranks: int, micro_batches: int, chunks: int) -> str | None:
    if chunks > 1 and micro_batches % ranks:
        return (f"pipeline.micro_batches: interleaved_1f1b with {chunks} chunks per rank needs M to be "
                f"a multiple of the {ranks} ranks, got {micro_batches}")
    return None


@register("interleaved_1f1b", check=_interleaved_check)
def interleaved_1f1b(ranks: int, micro_batches: int, chunks: int) -> RankOrders:
    """Interleaved 1F1B (Megatron-LM's virtual stages, torch's ScheduleInterleaved1F1B): v chunks
    per rank looped over the ranks; rounds of K micro-batches pass through each local chunk in
    turn, with (v-1)K + 2(K-1-r) warm-up forwards on rank r, then one forward and one backward."""
    orders: RankOrders = []
    total = micro_batches * chunks
    per_round = min(ranks, micro_batches)
    for r in range(ranks):
        warmup = min((chunks - 1) * per_round + 2 * (ranks - 1 - r), total)
        forwards = [0] * chunks
        backwards = [0] * chunks

        def forward(i: int) -> tuple[int, int, int]:
            local = (i // per_round) % chunks
            forwards[local] += 1
            return (F, local * ranks + r, forwards[local] - 1)

        def backward(i: int) -> tuple[int, int, int]:
            local = chunks - 1 - (i // per_round) % chunks
            backwards[local] += 1
            return (B, local * ranks + r, backwards[local] - 1)

        order = [forward(i) for i in range(warmup)]
        for j in range(total - warmup):
            order += [forward(warmup + j), backward(j)]
        order += [backward(j) for j in range(total - warmup, total)]
        orders.append(order)
    return orders
