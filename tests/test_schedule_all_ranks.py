"""The generators built over all ranks at once (and ZB-H2's list scheduling, its passes kept as
arrays) give, rank by rank, the orders their papers' rules give one pass at a time (written out
here, as the generators read before they were vectorised)."""

from __future__ import annotations

import numpy as np
import pytest

from gpipe_sim.schedule import SCHEDULES, Kind

F, B, I, W = int(Kind.FORWARD), int(Kind.BACKWARD), int(Kind.BACKWARD_INPUT), int(Kind.BACKWARD_WEIGHT)


def _looped(kind, nth, K, r, per_round, v):
    turn = (nth // per_round) % v
    local = np.where(kind == F, turn, v - 1 - turn)
    return np.stack([kind, local * K + r, (nth // (v * per_round)) * per_round + nth % per_round], axis=1)


def _one_f_one_b_rank(warmup, total):
    steady = np.arange(total - warmup)
    nth = np.concatenate([np.arange(warmup), np.stack([warmup + steady, steady], axis=1).ravel(),
                          np.arange(total - warmup, total)])
    kind = np.concatenate([np.full(warmup, F), np.tile([F, B], total - warmup), np.full(warmup, B)])
    return kind, nth


def _zero_bubble_rank(K, M, v, r, warmup, delay):
    total = M * v
    j = np.arange(total)
    steps = np.stack([np.full(total, F), np.full(total, I), np.full(total, W)], axis=1)
    nth = np.stack([warmup + j, j, j - delay], axis=1)
    present = np.stack([warmup + j < total, np.ones(total, bool), j >= delay], axis=1)
    tail = np.arange(max(0, total - delay), total)
    kind = np.concatenate([np.full(warmup, F), steps[present], np.full(len(tail), W)])
    return _looped(kind, np.concatenate([np.arange(warmup), nth[present], tail]), K, r, min(K, M), v)


def _zbv_rank(K, n, r):
    """ZB-V's rank r for n >= 2K - 1 micro-batches, pass by pass."""
    down, up = r, 2 * K - 1 - r
    counts = {(k, c): 0 for k in (F, I, W) for c in (down, up)}
    order = []

    def put(kind, chunk):
        order.append((kind, chunk, counts[kind, chunk]))
        counts[kind, chunk] += 1

    for _ in range(2 * (K - r) - 1):
        put(F, down)
    for _ in range(r):
        put(F, up)
        put(F, down)
    for _ in range(K - r):
        put(F, up), put(I, up), put(W, up)
    while counts[F, up] < counts[F, down] or counts[F, down] < n:
        if counts[F, down] < n:
            put(F, down)
        put(I, down), put(W, down), put(F, up), put(I, up), put(W, up)
    for _ in range(r):
        put(I, down), put(I, up)
    for _ in range(K - r):
        put(I, down), put(W, down)
    while counts[W, up] < counts[I, up]:
        put(W, up)
    while counts[W, down] < counts[I, down]:
        put(W, down)
    return np.array(order, dtype=np.int64).reshape(-1, 3)


def _dualpipev_rank(K, M, r):
    """DualPipeV's rank r, pass by pass, weight passes from a queue of the pending ones."""
    down, up = r, 2 * K - 1 - r
    counts, weights, order = {}, [], []

    def put(kind, chunk):
        key = (I if kind == B else kind, chunk)
        m = counts.get(key, 0)
        order.append((kind, chunk, m))
        counts[key] = m + 1
        if kind == I:
            weights.append((chunk, m))

    def pending_weight():
        if weights:
            chunk, m = weights.pop(0)
            order.append((W, chunk, m))

    for _ in range(2 * (K - r - 1)):
        put(F, down)
    for _ in range(r + 1):
        put(F, down), put(F, up)
    for _ in range(K - r - 1):
        put(I, up), pending_weight(), put(F, up)
    for _ in range(M - 2 * K + r + 1):
        put(F, down), put(B, up), put(F, up), put(B, down)
    for _ in range(K - r - 1):
        put(B, up), put(F, up), put(B, down)
    split, steps = False, r + 1
    for i in range(steps):
        if i == steps // 2 and r % 2 == 1:
            split = True
        put(I if split else B, up)
        if i == steps // 2 and r % 2 == 0:
            split = True
        put(I if split else B, down)
    for _ in range(K - r - 1):
        pending_weight(), put(I if split else B, down)
    for _ in range(r + 1):
        pending_weight()
    return np.array(order, dtype=np.int64).reshape(-1, 3)


def _zb_h2_ranks(K, M):
    """ZB-H2's list scheduling in unit time, pass by pass as tuples."""
    done_f, done_i = [[-1] * M for _ in range(K)], [[-1] * M for _ in range(K)]
    n_f, n_i, n_w = [0] * K, [0] * K, [0] * K
    orders = [[] for _ in range(K)]
    t = 0
    while any(n < M for n in n_w):
        for r in range(K):
            m = n_i[r]
            if m < n_f[r] and (r == K - 1 or 0 <= done_i[r + 1][m] <= t):
                orders[r].append((I, r, m))
                done_i[r][m], n_i[r] = t + 1, m + 1
                continue
            m = n_f[r]
            if m < M and m - n_w[r] < 2 * K - 1 and (r == 0 or 0 <= done_f[r - 1][m] <= t):
                orders[r].append((F, r, m))
                done_f[r][m], n_f[r] = t + 1, m + 1
            elif n_w[r] < n_i[r]:
                orders[r].append((W, r, n_w[r]))
                n_w[r] += 1
        t += 1
    return [np.array(order, dtype=np.int64).reshape(-1, 3) for order in orders]


def _reference(name, K, M, v):
    """Rank r's passes by the per-rank rules."""
    if name == "zb_h2":
        return _zb_h2_ranks(K, M)
    if name == "zbv":  # the order for fewer micro-batches than 2K - 1 is that one's, cut
        return [o[o[:, 2] < M] for o in (_zbv_rank(K, max(2 * K - 1, M), r) for r in range(K))]
    if name == "dualpipev":
        return [_dualpipev_rank(K, M, r) for r in range(K)]
    out = []
    for r in range(K):
        if name == "gpipe":
            out.append(np.stack([np.repeat([F, B], M), np.full(2 * M, r),
                                 np.concatenate([np.arange(M), np.arange(M)[::-1]])], axis=1))
        elif name == "1f1b":
            kind, nth = _one_f_one_b_rank(min(K - r - 1, M), M)
            out.append(_looped(kind, nth, K, r, min(K, M), 1))
        elif name == "looped_bfs":
            mine = r + K * np.arange(v)
            out.append(np.stack([np.repeat([F, B], M * v),
                                 np.concatenate([np.repeat(mine, M), np.repeat(mine[::-1], M)]),
                                 np.concatenate([np.tile(np.arange(M), v), np.tile(np.arange(M)[::-1], v)])], axis=1))
        elif name == "interleaved_1f1b":
            per_round = min(K, M)
            kind, nth = _one_f_one_b_rank(min((v - 1) * per_round + 2 * (K - 1 - r), M * v), M * v)
            out.append(_looped(kind, nth, K, r, per_round, v))
        else:  # interleaved_zb, zb_h1 (v = 1)
            out.append(_zero_bubble_rank(K, M, v, r, min((v - 1) * min(K, M) + (K - 1 - r), M * v), r))
    return out


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "looped_bfs", "interleaved_1f1b", "interleaved_zb", "zb_h1",
                                  "zbv", "dualpipev", "zb_h2"])
def test_all_ranks_at_once_equal_the_per_rank_rules(name):
    family = SCHEDULES[name]
    cases = 0
    for K in (1, 2, 3, 4, 5, 8, 16):
        for M in (1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 31, 32, 33, 40):
            for v in (1, 2, 3, 4):
                if family.problem(K, M, v) is not None:
                    continue
                got = [np.asarray(order, dtype=np.int64).reshape(-1, 3) for order in family.generate(K, M, v)]
                want = _reference(name, K, M, v)
                assert len(got) == K
                for r in range(K):
                    assert np.array_equal(got[r], want[r]), (K, M, v, r)
                cases += 1
    assert cases >= 20
