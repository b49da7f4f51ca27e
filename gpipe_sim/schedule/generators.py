"""The built-in schedule families: each orders the passes of every rank, nothing more."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from gpipe_sim.schedule.actions import Kind
from gpipe_sim.schedule.registry import Check, RankOrders, fixed_chunks, one_chunk, register, v_shape

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
    runs: list[list[int]] = [[] for _ in range(ranks)]  # per rank, (kind, micro-batch) flat
    t, finished = 0, 0  # finished: the ranks that ran every weight pass
    while finished < ranks:
        for r in range(ranks):
            run = runs[r]
            m = n_i[r]
            if m < n_f[r] and (r == ranks - 1 or 0 <= done_i[r + 1][m] <= t):
                run += (I, m)
                done_i[r][m], n_i[r] = t + 1, m + 1
                continue
            m = n_f[r]
            if m < micro_batches and m - n_w[r] < cap and (r == 0 or 0 <= done_f[r - 1][m] <= t):
                run += (F, m)
                done_f[r][m], n_f[r] = t + 1, m + 1
            elif n_w[r] < n_i[r]:
                run += (W, n_w[r])
                n_w[r] += 1
                finished += n_w[r] == micro_batches
        t += 1
    rows = [np.array(run, dtype=np.int64).reshape(-1, 2) for run in runs]
    return [np.stack([row[:, 0], np.full(len(row), r), row[:, 1]], axis=1) for r, row in enumerate(rows)]


@register("zbv", placement=v_shape, check=fixed_chunks("zbv", 2), analytic_bubble=split_bubble)
def zbv(ranks: int, micro_batches: int, chunks: int) -> RankOrders:
    """ZB-V (Qi et al. 2024, section 6; torch's ScheduleZBVZeroBubble): two chunks per rank in a V,
    so the first and last chunks share rank 0; warm-up forwards of the first chunk, then of both,
    then steady F/I/W triples on each chunk; near-zero bubble at 1F1B's memory when F = I = W."""
    # the order for fewer micro-batches than 2K - 1 is that one's, cut
    kind, chunk, micro, on = _zbv_grids(ranks, max(2 * ranks - 1, micro_batches))
    return _by_rank(kind, chunk, micro, on & (micro < micro_batches))


_DOWN, _UP = 0, 1  # a V-shaped rank's chunks: r on the way down, 2K-1-r on the way back


@lru_cache(maxsize=64)
def _zbv_grids(ranks: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """ZB-V's passes of every rank for n micro-batches (n >= 2K - 1) as (ranks x slots) grids of
    kind, chunk and micro-batch, and the slots each rank runs, made once per (K, n). Rank r runs 2(K-r)-1 forwards down; r
    times a forward up and one down; K-r F/I/W triples up; n-K steady steps of an F/I/W triple
    down (its forward while any is left) and one up; r times an I down and one up; K-r times an I
    and a W down; then the r weight passes left up, and the r left down. Each pass's micro-batch
    counts its (kind, chunk)'s passes before it."""
    r = np.arange(ranks)
    kind, role, on = _phase_grids(ranks, [
        ([(F, _DOWN)], 2 * (ranks - r) - 1, None),
        ([(F, _UP), (F, _DOWN)], r, None),
        ([(F, _UP), (I, _UP), (W, _UP)], ranks - r, None),
        ([(F, _DOWN), (I, _DOWN), (W, _DOWN), (F, _UP), (I, _UP), (W, _UP)], np.full(ranks, n - ranks),
         lambda step, slot: (slot > 0) | (step < (n - 2 * ranks + 1 + r)[:, None, None])),
        ([(I, _DOWN), (I, _UP)], r, None),
        ([(I, _DOWN), (W, _DOWN)], ranks - r, None),
        ([(W, _UP)], r, None),
        ([(W, _DOWN)], r, None),
    ])
    key = np.searchsorted(np.array(sorted((F, I, W))), kind) * 2 + role
    chunk = np.where(role == _DOWN, r[:, None], 2 * ranks - 1 - r[:, None])
    return kind, chunk, _counted(key, on, 6), on


def _phase_grids(ranks: int, phases: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ranks x slots) kinds, roles and which slots rank r runs, of programs made of phases: each
    phase a pattern of (kind, role) repeated reps[r] times on rank r, optionally only the (step,
    slot) its mask keeps."""
    kinds, roles, keep = [], [], []
    for pattern, reps, mask in phases:
        steps = np.arange(int(np.max(reps, initial=0)))[None, :, None]
        slots = np.arange(len(pattern))[None, None, :]
        on = (steps < np.asarray(reps)[:, None, None]) & (slots >= 0)
        if mask is not None:
            on &= mask(steps, slots)
        kinds.append(np.broadcast_to(np.array([k for k, _ in pattern]), on.shape).reshape(ranks, -1))
        roles.append(np.broadcast_to(np.array([c for _, c in pattern]), on.shape).reshape(ranks, -1))
        keep.append(on.reshape(ranks, -1))
    return np.concatenate(kinds, axis=1), np.concatenate(roles, axis=1), np.concatenate(keep, axis=1)


def _counted(key: np.ndarray, on: np.ndarray, keys: int) -> np.ndarray:
    """Per slot run (`on`), how many run slots of its key come before it in its rank's row."""
    count = np.zeros(key.shape, dtype=np.int64)
    for k in range(keys):
        mine = on & (key == k)
        count[mine] = (np.cumsum(mine, axis=1) - 1)[mine]
    return count


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
    r = np.arange(ranks)
    cool = ranks - 1 - r
    half = ((r + 1) // 2)[:, None, None]  # the step of the cool-down's split, on r + 1 steps
    odd = (r % 2 == 1)[:, None, None]
    kind, role, on = _phase_grids(ranks, [
        ([(F, _DOWN)], 2 * cool, None),
        ([(F, _DOWN), (F, _UP)], r + 1, None),
        ([(I, _UP), (W, _UP), (F, _UP)], cool, None),
        ([(F, _DOWN), (B, _UP), (F, _UP), (B, _DOWN)], micro_batches - 2 * ranks + r + 1, None),
        ([(B, _UP), (F, _UP), (B, _DOWN)], cool, None),
        # the cool-down's r + 1 steps split from the middle one on: on an odd rank before its up
        # pass, on an even one after it (so every B of them comes before every I)
        ([(B, _UP), (B, _DOWN)], r + 1, lambda step, slot: (step < half) | ((step == half) & ~odd & (slot == 0))),
        ([(I, _UP), (I, _DOWN)], r + 1, lambda step, slot: (step > half) | ((step == half) & (odd | (slot == 1)))),
        ([(W, _UP), (I, _DOWN)], cool, None),
        ([(W, _UP)], r + 1, None),
    ])
    # a full backward counts with the input-gradient passes; the q-th W completes the q-th I
    weight, split = on & (kind == W), on & (kind == I)
    micro = _counted(np.where(kind == F, 0, 2) + role, on & ~weight, 4)
    role[weight], micro[weight] = role[split], micro[split]
    return _by_rank(kind, np.where(role == _DOWN, r[:, None], 2 * ranks - 1 - r[:, None]), micro, on)
