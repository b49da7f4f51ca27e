"""The generators built over all ranks at once give, rank by rank, the orders their papers' rules
give one rank at a time (written out here, as the generators read before they were vectorised)."""

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


def _reference(name, K, M, v):
    """Rank r's passes by the per-rank rules."""
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


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "looped_bfs", "interleaved_1f1b", "interleaved_zb", "zb_h1"])
def test_all_ranks_at_once_equal_the_per_rank_rules(name):
    family = SCHEDULES[name]
    cases = 0
    for K in (1, 2, 3, 4, 5, 8):
        for M in (1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17):
            for v in (1, 2, 3, 4):
                if family.problem(K, M, v) is not None:
                    continue
                got = [np.asarray(order, dtype=np.int64).reshape(-1, 3) for order in family.generate(K, M, v)]
                want = _reference(name, K, M, v)
                assert len(got) == K
                for r in range(K):
                    assert np.array_equal(got[r], want[r]), (K, M, v, r)
                cases += 1
    assert cases >= 60
