"""Schedules as data: structure of the action lists."""

from __future__ import annotations

import pytest

from gpipe_sim.errors import ScheduleError
from gpipe_sim.partition import balance_by_weight, micro_batch_sizes
from gpipe_sim.schedule import SCHEDULES, build_schedule, register


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("remat", ["none", "except_last", "always"])
def test_every_stage_forwards_and_backwards_each_micro_batch_once(schedule, remat):
    K, M = 4, 6
    s = build_schedule(K, M, schedule, remat)
    for k, acts in enumerate(s.actions):
        assert sorted(a.micro_batch for a in acts if a.kind == "forward") == list(range(M))
        assert sorted(a.micro_batch for a in acts if a.kind == "backward") == list(range(M))
        assert acts[-1].kind == "update"
        recomputed = {a.micro_batch for a in acts if a.kind == "recompute"}
        expected = {"none": set(), "except_last": set(range(M - 1)), "always": set(range(M))}[remat]
        assert recomputed == expected
        sends = [a for a in acts if a.kind == "send"]
        assert len(sends) == M * ((k > 0) + (k < K - 1))


def test_gpipe_order_is_fill_drain():
    acts = build_schedule(3, 4, "gpipe", "none").actions[1]
    compute = [(a.kind, a.micro_batch) for a in acts if a.kind in ("forward", "backward")]
    assert compute == [("forward", m) for m in range(4)] + [("backward", m) for m in (3, 2, 1, 0)]


def test_1f1b_order_on_first_stage():
    acts = build_schedule(3, 5, "1f1b", "none").actions[0]
    compute = [(a.kind[0].upper(), a.micro_batch) for a in acts if a.kind in ("forward", "backward")]
    assert compute == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("F", 4),
                       ("B", 2), ("B", 3), ("B", 4)]


def test_recompute_precedes_the_gradient_receive():
    acts = build_schedule(2, 2, "gpipe", "always").actions[0]
    kinds = [a.kind for a in acts]
    i = kinds.index("recompute")
    assert kinds[i + 1] == "recv" and acts[i + 1].tensor == "gradient" and kinds[i + 2] == "backward"


def test_a_new_schedule_is_just_a_generator():
    @register("reverse-gpipe-test")
    def forward_then_backward_in_order(stages, micro_batches):
        order = [("F", m) for m in range(micro_batches)] + [("B", m) for m in range(micro_batches)]
        return [list(order) for _ in range(stages)]

    try:
        s = build_schedule(3, 4, "reverse-gpipe-test", "always")
        assert s.count("forward") == 12 and s.count("recompute") == 12
    finally:
        del SCHEDULES["reverse-gpipe-test"]


def test_a_broken_generator_is_rejected():
    @register("broken-test")
    def backward_first(stages, micro_batches):
        return [[("B", 0), ("F", 0)] for _ in range(stages)]

    try:
        with pytest.raises(ScheduleError, match="before forward"):
            build_schedule(2, 1, "broken-test", "none")
    finally:
        del SCHEDULES["broken-test"]


def test_micro_batch_sizes_match_tensor_split():
    assert micro_batch_sizes(10, 4) == [3, 3, 2, 2]
    assert micro_batch_sizes(8, 8) == [1] * 8
    assert sum(micro_batch_sizes(1000, 7)) == 1000


@pytest.mark.parametrize(
    "weights, stages, expected_max",
    [([1, 1, 1, 1], 2, 2), ([5, 1, 1, 1, 1, 1], 2, 5), ([1, 2, 3, 4, 5], 3, 6), ([9, 1, 1, 9], 3, 9)],
)
def test_time_partition_minimises_the_slowest_stage(weights, stages, expected_max):
    counts = balance_by_weight(weights, stages)
    assert len(counts) == stages and sum(counts) == len(weights) and min(counts) >= 1
    sums, i = [], 0
    for c in counts:
        sums.append(sum(weights[i : i + c]))
        i += c
    assert max(sums) == expected_max


def _brute_force_bottleneck(weights, stages):
    from itertools import combinations

    n, best = len(weights), float("inf")
    for cuts in combinations(range(1, n), stages - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(sum(weights[a:b]) for a, b in zip(bounds, bounds[1:])))
    return best


def test_time_partition_equals_brute_force_on_random_weights():
    import numpy as np

    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(1, 10))
        stages = int(rng.integers(1, n + 1))
        weights = rng.choice([0.0, 0.1, 1.0, 2.5, 7.0], size=n) * rng.uniform(0.5, 1.5, size=n)
        counts = balance_by_weight(weights.tolist(), stages)
        assert len(counts) == stages and sum(counts) == n and min(counts) >= 1
        bounds = np.concatenate(([0], np.cumsum(counts)))
        got = max(weights[a:b].sum() for a, b in zip(bounds, bounds[1:]))
        assert got == pytest.approx(_brute_force_bottleneck(weights.tolist(), stages), rel=1e-12)


def test_large_partition_uses_float_bisection_and_stays_balanced():
    counts = balance_by_weight([1.0] * 1000, 7)
    assert sum(counts) == 1000 and max(counts) == 143
