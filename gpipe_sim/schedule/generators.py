"""The built-in schedule families: each orders the passes of every rank, nothing more."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from gpipe_sim.schedule.actions import Kind
from gpipe_sim.schedule.registry import Check, RankOrders, fixed_chunks, one_chunk, rank_chunks, register, v_shape

# Passes are (kind, chunk, micro_batch) rows: tuples, or an (n, 3) integer array for speed; kinds
# as plain int codes, which NumPy converts at once (an IntEnum member is converted one by one).
F, B = int(Kind.FORWARD), int(Kind.BACKWARD)  # the papers' letters for the passes


@register("gpipe", check=one_chunk("gpipe"))
def gpipe(ranks: int, micro_batches: int, chunks: int) -> RankOrders:
    """Fill-drain (GPipe): all forwards, then all backwards in reverse micro-batch order."""
    kinds = np.repeat([F, B], micro_batches)
    order = np.concatenate([np.arange(micro_batches), np.arange(micro_batches)[::-1]])
    return _by_rank(kinds[None, :], np.arange(ranks)[:, None], order[None, :])


@register("1f1b", check=one_chunk("1f1b"))
def one_f_one_b(ranks: int, micro_batches: int, chunks: int) -> RankOrders:
    """1F1B (PipeDream-Flush): warm-up forwards, then one forward and one backward in turn."""
    warmup = np.minimum(ranks - 1 - np.arange(ranks), micro_batches)
    kind, nth = _one_f_one_b_grid(warmup, micro_batches)
    return _by_rank(kind, np.arange(ranks)[:, None], nth)


def _naive_check(ranks: int, micro_batches: int, chunks: int) -> str | None:
    if micro_batches != 1:
        return "pipeline.micro_batches: the naive schedule runs the mini-batch whole; set it to 1"
    return one_chunk("naive")(ranks, micro_batches, chunks)


@register("naive", check=_naive_check, chunks_per_rank=1)
def naive(ranks: int, micro_batches: int, chunks: int) -> RankOrders:
    """No micro-batching: the mini-batch goes through the ranks whole (M = 1)."""
    return gpipe(ranks, 1, 1)


@register("looped_bfs")
def looped_bfs(ranks: int, micro_batches: int, chunks: int) -> RankOrders:
    """Looped BFS (torch's ScheduleLoopedBFS): each rank forwards every micro-batch through its
    chunks in turn, then backwards them through its chunks in reverse."""
    forward, backward = np.tile(np.arange(micro_batches), chunks), np.tile(np.arange(micro_batches)[::-1], chunks)
    kinds = np.repeat([F, B], micro_batches * chunks)
    local = np.concatenate([np.repeat(np.arange(chunks), micro_batches),
                            np.repeat(np.arange(chunks)[::-1], micro_batches)])
    return _by_rank(kinds[None, :], np.arange(ranks)[:, None] + ranks * local[None, :],
                    np.concatenate([forward, backward])[None, :])


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
    total = micro_batches * chunks
    per_round = min(ranks, micro_batches)
    warmup = np.minimum((chunks - 1) * per_round + 2 * (ranks - 1 - np.arange(ranks)), total)
    kind, nth = _one_f_one_b_grid(warmup, total)
    return _looped_passes(kind, nth, np.ones(kind.shape, dtype=bool), ranks, per_round, chunks)


def _one_f_one_b_grid(warmup: np.ndarray, total: int) -> tuple[np.ndarray, np.ndarray]:
    """(ranks x 2 total) kinds and which forward or backward of its rank each pass is, for ranks
    of `total` forwards and backwards each, rank r starting with warmup[r] forwards: then one
    forward and one backward in turn, then the backwards left."""
    p = np.arange(2 * total)[None, :]
    w = warmup[:, None]
    steady = p - w
    is_f = (p < w) | ((steady >= 0) & (p < 2 * total - w) & (steady % 2 == 0))
    nth = np.where(p < w, p, np.where(p >= 2 * total - w, p - total, np.where(is_f, w + steady // 2, steady // 2)))
    return np.where(is_f, F, B), nth


def _by_rank(kind: np.ndarray, chunk: np.ndarray, micro: np.ndarray, present: np.ndarray | None = None
             ) -> RankOrders:
    """Per rank (row of the ranks x slots grids), its passes: the slots `present` marks (all
    where None), in order."""
    kind, chunk, micro = np.broadcast_arrays(kind, chunk, micro)
    if present is None:
        present = np.ones(kind.shape, dtype=bool)
    passes = np.stack([kind[present], chunk[present], micro[present]], axis=1).astype(np.int64)
    return np.split(passes, np.cumsum(present.sum(axis=1))[:-1])


def _looped_passes(kind: np.ndarray, nth: np.ndarray, present: np.ndarray, ranks: int, per_round: int,
                   chunks: int) -> RankOrders:
    """Every rank's passes, from (ranks x slots) grids of each slot's kind and which forward (or
    backward: a full or input-gradient pass, or the weight pass of that one) of its rank it is,
    the slots `present` marks taken in order: the n-th of either runs round n // per_round, on
    local chunk round mod v (backwards through the chunks in reverse), over micro-batch
    (round // v) * per_round + n mod per_round: each local chunk's passes count its micro-batches
    up in turn."""
    turn = (nth // per_round) % chunks
    local = np.where(kind == F, turn, chunks - 1 - turn)
    micro = (nth // (chunks * per_round)) * per_round + nth % per_round
    return _by_rank(kind, local * ranks + np.arange(ranks)[:, None], micro, present)


# ---------------------------------------------------------------------------------------------
# zero-bubble schedules (Qi et al., ICLR 2024): the backward split into an input-gradient pass I,
# on the critical path, and a weight-gradient pass W that fills the bubbles


I, W = int(Kind.BACKWARD_INPUT), int(Kind.BACKWARD_WEIGHT)


def split_bubble(ranks: int, micro_batches: int, chunks: int) -> float:
    """(K-1)/(3vM+K-1): the idle share of a zero-bubble schedule whose passes all take one slot
    (F = I = W, the ZB paper's unit assumption), whose ranks idle only while the first
    micro-batch fills the pipeline; exact on identical layers with free links."""
    return (ranks - 1) / (3 * chunks * micro_batches + ranks - 1)


def _zero_bubble_ranks(ranks: int, micro_batches: int, chunks: int, warmup: np.ndarray,
                       weight_delay: np.ndarray) -> RankOrders:
    """Every rank of a looped 1F1B whose backward is split, rank r: warmup[r] forwards, then in
    turn one forward and one input-gradient pass; once weight_delay[r] steps past the warm-up have
    run, each I is followed by the W of the oldest micro-batch whose W is still pending; the
    remaining I passes, then the remaining W passes end the program (torch's `_get_1f1b_rank_ops`
    with zero bubble, whose orders the tests compare with). The q-th W completes the q-th I."""
    total = micro_batches * chunks
    j = np.arange(total)[None, :]  # the warm-up's slots; the steps after it, by their I; the tail's
    w, d = warmup[:, None], weight_delay[:, None]
    ones = np.ones((ranks, total), dtype=bool)
    tail_start = np.maximum(0, total - d)  # the Ws still pending at the end: tail_start .. total-1
    kind = np.concatenate([np.full(total, F), np.tile([F, I, W], total), np.full(total, W)])[None, :]
    nth = np.concatenate([np.broadcast_to(j, (ranks, total)),
                          np.stack(np.broadcast_arrays(w + j, j, j - d), axis=2).reshape(ranks, -1),
                          tail_start + j], axis=1)
    present = np.concatenate([j < w, np.stack([w + j < total, ones, j >= d], axis=2).reshape(ranks, -1),
                              tail_start + j < total], axis=1)
    return _looped_passes(kind, nth, present, ranks, min(ranks, micro_batches), chunks)


def _zero_bubble_check(name: str) -> Check:
    def check(ranks: int, micro_batches: int, chunks: int) -> str | None:
        if chunks > 1 and micro_batches % ranks:
            return (f"pipeline.micro_batches: {name} with {chunks} chunks per rank needs M to be "
                    f"a multiple of the {ranks} ranks, got {micro_batches}")
        return None

    return check


@register("interleaved_zb", check=_zero_bubble_check("interleaved_zb"), analytic_bubble=split_bubble)
def interleaved_zero_bubble(ranks: int, micro_batches: int, chunks: int) -> RankOrders:
    """Interleaved zero bubble (torch's ScheduleInterleavedZeroBubble, the ZB paper's ZB1P on v
    chunks): interleaved 1F1B's order with (v-1)K + (K-1-r) warm-up forwards on rank r and every
    backward split, rank r deferring its first r weight passes."""
    total = micro_batches * chunks
    per_round = min(ranks, micro_batches)
    r = np.arange(ranks)
    return _zero_bubble_ranks(ranks, micro_batches, chunks,
                              np.minimum((chunks - 1) * per_round + (ranks - 1 - r), total), weight_delay=r)


@register("zb_h1", check=one_chunk("zb_h1"), analytic_bubble=split_bubble)
def zb_h1(ranks: int, micro_batches: int, chunks: int) -> RankOrders:
    """ZB-H1 (Qi et al. 2024): 1F1B's warm-up and memory with the backward split; rank r defers
    its first r weight passes into the bubble at the end, so the bubble shrinks to (K-1)(F+I-W)."""
    return interleaved_zero_bubble(ranks, micro_batches, 1)


@register("zb_h2", check=one_chunk("zb_h2"), analytic_bubble=split_bubble)
def zb_h2(ranks: int, micro_batches: int, chunks: int) -> RankOrders:
    """ZB-H2 (Qi et al. 2024): up to 2K-1 micro-batches in flight per rank, enough warm-up
    forwards that no rank waits for its first input gradient, and weight passes wherever a rank
    would otherwise idle; with F = I = W no rank idles between its first and last pass.

    Built by list scheduling in unit time (every pass one slot, transfers free): in each slot a
    rank runs an input-gradient pass if one is ready, else a forward if it is ready and fewer than
    2K-1 micro-batches are in flight, else the oldest pending weight pass."""
    cap = 2 * ranks - 1
    done_f = [[-1] * micro_batches for _ in range(ranks)]  # slot after which F(m) is done
    done_i = [[-1] * micro_batches for _ in range(ranks)]
    n_f, n_i, n_w = [0] * ranks, [0] * ranks, [0] * ranks
    orders: RankOrders = [[] for _ in range(ranks)]
    t = 0
    while any(n < micro_batches for n in n_w):
        for r in range(ranks):
            order = orders[r]
            m = n_i[r]
            if m < n_f[r] and (r == ranks - 1 or 0 <= done_i[r + 1][m] <= t):
                order.append((I, r, m))
                done_i[r][m], n_i[r] = t + 1, m + 1
                continue
            m = n_f[r]
            if m < micro_batches and m - n_w[r] < cap and (r == 0 or 0 <= done_f[r - 1][m] <= t):
                order.append((F, r, m))
                done_f[r][m], n_f[r] = t + 1, m + 1
            elif n_w[r] < n_i[r]:
                order.append((W, r, n_w[r]))
                n_w[r] += 1
        t += 1
    return orders


@register("zbv", placement=v_shape, check=fixed_chunks("zbv", 2), analytic_bubble=split_bubble)
def zbv(ranks: int, micro_batches: int, chunks: int) -> RankOrders:
    """ZB-V (Qi et al. 2024, section 6; torch's ScheduleZBVZeroBubble): two chunks per rank in a V,
    so the first and last chunks share rank 0; warm-up forwards of the first chunk, then of both,
    then steady F/I/W triples on each chunk; near-zero bubble at 1F1B's memory when F = I = W."""
    # the order for fewer micro-batches than 2K - 1 is that one's, cut
    return [order[order[:, 2] < micro_batches] for order in _zbv_orders(ranks, max(2 * ranks - 1, micro_batches))]


@lru_cache(maxsize=64)
def _zbv_orders(ranks: int, n: int) -> tuple[np.ndarray, ...]:
    """ZB-V's passes of each rank for n micro-batches (n >= 2K - 1), as arrays: made once per (K, n)."""
    orders = []
    for r, (down, up) in enumerate(rank_chunks(v_shape(ranks, 2), ranks)):  # r, and 2K-1-r on the way back
        counts = {(k, c): 0 for k in (F, I, W) for c in (down, up)}
        order: list[tuple[int, int, int]] = []

        def put(kind: int, chunk: int, counter: int | None = None) -> None:
            key = (kind, chunk)
            order.append((kind, chunk, counts[key] if counter is None else counter))
            counts[key] += 1

        for _ in range(2 * (ranks - r) - 1):
            put(F, down)
        for _ in range(r):
            put(F, up)
            put(F, down)
        for _ in range(ranks - r):
            put(F, up)
            put(I, up)
            put(W, up)
        while counts[F, up] < counts[F, down] or counts[F, down] < n:
            if counts[F, down] < n:
                put(F, down)
            put(I, down)
            put(W, down)
            put(F, up)
            put(I, up)
            put(W, up)
        for _ in range(r):
            put(I, down)
            put(I, up)
        for _ in range(ranks - r):
            put(I, down)
            put(W, down)
        while counts[W, up] < counts[I, up]:
            put(W, up)
        while counts[W, down] < counts[I, down]:
            put(W, down)
        orders.append(np.array(order, dtype=np.int64).reshape(-1, 3))
    return tuple(orders)


def _dualpipev_check(ranks: int, micro_batches: int, chunks: int) -> str | None:
    if micro_batches < 2 * ranks:
        return (f"pipeline.micro_batches: dualpipev needs at least as many micro-batches as chunks "
                f"(2K = {2 * ranks}), got {micro_batches}")
    return fixed_chunks("dualpipev", 2)(ranks, micro_batches, chunks)


@register("dualpipev", placement=v_shape, check=_dualpipev_check, analytic_bubble=split_bubble)
def dualpipev(ranks: int, micro_batches: int, chunks: int) -> RankOrders:
    """DualPipeV (DeepSeek; torch's ScheduleDualPipeV): two chunks per rank in a V; after the
    warm-up, each step pairs a forward of one chunk with a full backward of the other (torch
    overlaps the pair on the device; here they run one after the other), and the cool-down splits
    backwards so that weight passes fill the tail."""
    orders: RankOrders = []
    for r, (down, up) in enumerate(rank_chunks(v_shape(ranks, 2), ranks)):  # r, and 2K-1-r on the way back
        counts: dict[tuple[int, int], int] = {}
        weights: list[tuple[int, int]] = []  # (chunk, micro-batch) whose W is pending, oldest first
        order: list[tuple[int, int, int]] = []

        def put(kind: int, chunk: int) -> None:
            key = (I if kind == B else kind, chunk)
            m = counts.get(key, 0)
            order.append((kind, chunk, m))
            counts[key] = m + 1
            if kind == I:
                weights.append((chunk, m))

        def pending_weight() -> None:
            if weights:
                chunk, m = weights.pop(0)
                order.append((W, chunk, m))

        for _ in range(2 * (ranks - r - 1)):
            put(F, down)
        for _ in range(r + 1):
            put(F, down)
            put(F, up)
        for _ in range(ranks - r - 1):
            put(I, up)
            pending_weight()
            put(F, up)
        for i in range(micro_batches - 2 * ranks + r + 1):
            put(F, down)  # overlapped with the next full backward in torch
            put(B, up)
            put(F, up)
            put(B, down)
        for _ in range(ranks - r - 1):
            put(B, up)
            put(F, up)
            put(B, down)
        split = False
        steps = r + 1
        for i in range(steps):
            if i == steps // 2 and r % 2 == 1:
                split = True
            put(I if split else B, up)
            if i == steps // 2 and r % 2 == 0:
                split = True
            put(I if split else B, down)
        for _ in range(ranks - r - 1):
            pending_weight()
            put(I if split else B, down)
        for _ in range(r + 1):
            pending_weight()
        orders.append(order)
    return orders
