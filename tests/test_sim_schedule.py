"""Schedules as data: structure of the per-rank programs, every built-in family, the lowering's rules."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpipe_sim.errors import ScheduleError
from gpipe_sim.plan.partition import balance_by_weight, micro_batch_sizes
from gpipe_sim.schedule import SCHEDULES, Kind, Tensor, build_schedule, lower, register

F, B, I, W = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT

# (schedule, K, M, v) that every family must lower to a complete, checked program
CASES = [(s, K, M, 1) for s in ("gpipe", "1f1b") for K, M in ((1, 3), (4, 6), (4, 2), (3, 5))]
CASES += [("naive", K, 1, 1) for K in (1, 3)]
CASES += [("interleaved_1f1b", K, M, v) for K, M, v in ((2, 4, 2), (4, 8, 2), (4, 4, 3), (3, 6, 2), (4, 6, 1), (1, 3, 4))]
CASES += [("looped_bfs", K, M, v) for K, M, v in ((2, 3, 2), (4, 5, 2), (3, 2, 3), (4, 6, 1))]


@pytest.mark.parametrize("schedule, K, M, v", CASES)
@pytest.mark.parametrize("remat", ["none", "except_last", "always"])
def test_every_chunk_is_forwarded_and_backwarded_once_on_its_rank(schedule, K, M, v, remat):
    s = build_schedule(K, M, schedule, remat, v)
    assert s.ranks == K and s.num_chunks == K * v
    assert sorted(s.placement) == sorted(list(range(K)) * v)
    expected = {"none": set(), "except_last": set(range(M - 1)), "always": set(range(M))}[remat]
    for r, acts in enumerate(s.actions):
        mine = s.chunks_of(r)
        assert len(mine) == v
        for c in mine:
            assert sorted(a.micro_batch for a in acts if a.kind == F and a.chunk == c) == list(range(M))
            assert sorted(a.micro_batch for a in acts if a.kind == B and a.chunk == c) == list(range(M))
            assert {a.micro_batch for a in acts if a.kind == Kind.RECOMPUTE and a.chunk == c} == expected
        assert acts[-1].kind == Kind.UPDATE and sum(a.kind == Kind.UPDATE for a in acts) == 1
        # a transfer for every chunk boundary that crosses ranks, none for a local hand-over
        remote_in = sum(1 for c in mine if c > 0 and s.placement[c - 1] != r)
        remote_out = sum(1 for c in mine if c < K * v - 1 and s.placement[c + 1] != r)
        assert sum(a.kind == Kind.SEND for a in acts) == M * (remote_in + remote_out)
        assert sum(a.kind == Kind.RECV for a in acts) == M * (remote_in + remote_out)


def test_gpipe_order_is_fill_drain():
    acts = build_schedule(3, 4, "gpipe", "none").actions[1]
    compute = [(a.kind, a.micro_batch) for a in acts if a.kind in (F, B)]
    assert compute == [(F, m) for m in range(4)] + [(B, m) for m in (3, 2, 1, 0)]


def test_1f1b_order_on_first_rank():
    acts = build_schedule(3, 5, "1f1b", "none").actions[0]
    compute = [(a.kind.label[0].upper(), a.micro_batch) for a in acts if a.kind in (F, B)]
    assert compute == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("F", 4),
                       ("B", 2), ("B", 3), ("B", 4)]


def test_interleaved_1f1b_matches_megatron_order_on_rank_0():
    # K=2, v=2, M=4: chunks 0 and 2 on rank 0; (v-1)K + 2(K-1) = 4 warm-up forwards in rounds of
    # K micro-batches per chunk, then one forward and one backward (last chunk's backward first).
    acts = build_schedule(2, 4, "interleaved_1f1b", "none", 2).actions[0]
    compute = [(a.kind.label[0].upper(), a.chunk, a.micro_batch) for a in acts if a.kind in (F, B)]
    assert compute == [
        ("F", 0, 0), ("F", 0, 1), ("F", 2, 0), ("F", 2, 1),
        ("F", 0, 2), ("B", 2, 0), ("F", 0, 3), ("B", 2, 1), ("F", 2, 2), ("B", 0, 0), ("F", 2, 3), ("B", 0, 1),
        ("B", 2, 2), ("B", 2, 3), ("B", 0, 2), ("B", 0, 3),
    ]


def test_looped_placement_and_the_wrap_around_transfer():
    s = build_schedule(2, 2, "interleaved_1f1b", "none", 2)
    assert s.placement == (0, 1, 0, 1)
    # chunk 1 (rank 1) hands its activation to chunk 2 (rank 0): rank 1 sends to rank 0
    sends = [a for a in s.actions[1] if a.kind == Kind.SEND and a.tensor == Tensor.ACTIVATION]
    assert {(a.chunk, a.peer) for a in sends} == {(1, 0)}


def test_local_hand_overs_carry_no_transfer():
    # a V-shaped placement puts chunks 1 and 2 on rank 1: their hand-over is local
    orders = [[(F, 0, 0), (F, 3, 0), (B, 3, 0), (B, 0, 0)], [(F, 1, 0), (F, 2, 0), (B, 2, 0), (B, 1, 0)]]
    s = lower("v", orders, (0, 1, 1, 0), 1, "none", 2)
    kinds = [a.kind for a in s.actions[1]]
    assert kinds == [Kind.RECV, F, F, Kind.SEND, Kind.RECV, B, B, Kind.SEND, Kind.UPDATE]


def test_a_split_backward_lowers_with_transfers_on_its_input_gradient_pass():
    orders = [[(F, 0, 0), (I, 0, 0), (W, 0, 0)], [(F, 1, 0), (I, 1, 0), (W, 1, 0)]]
    s = lower("split", orders, (0, 1), 1, "always", 1)
    assert [a.kind for a in s.actions[1]] == [Kind.RECV, F, Kind.RECOMPUTE, I, Kind.SEND, W, Kind.UPDATE]
    assert [a.kind for a in s.actions[0]] == [F, Kind.SEND, Kind.RECOMPUTE, Kind.RECV, I, W, Kind.UPDATE]


@pytest.mark.parametrize("orders, placement, match", [
    ([[(W, 0, 0), (F, 0, 0), (I, 0, 0)]], (0,), "backward_weight after its backward_input"),
    ([[(F, 0, 0), (I, 0, 0)]], (0,), "one backward_weight"),
    ([[(F, 0, 0), (B, 0, 0), (W, 0, 0)]], (0,), "one backward_weight"),
    ([[(F, 1, 0), (F, 0, 0), (B, 1, 0), (B, 0, 0)]], (0, 0), "forwarded before chunk 0"),
    ([[(F, 0, 0), (F, 1, 0), (B, 0, 0), (B, 1, 0)]], (0, 0), "backwarded before chunk 1"),
    ([[(F, 0, 0), (B, 0, 0)], [(F, 0, 0), (B, 0, 0)]], (0, 1), "lives on rank 0"),
])
def test_inconsistent_programs_are_rejected(orders, placement, match):
    with pytest.raises(ScheduleError, match=match):
        lower("bad", orders, placement, 1, "none", len(placement) // len(orders))


def test_recompute_precedes_the_gradient_receive():
    acts = build_schedule(2, 2, "gpipe", "always").actions[0]
    kinds = [a.kind for a in acts]
    i = kinds.index(Kind.RECOMPUTE)
    assert kinds[i + 1] == Kind.RECV and acts[i + 1].tensor == Tensor.GRADIENT and kinds[i + 2] == B


def test_a_new_schedule_is_just_a_generator():
    @register("forward-then-backward-test")
    def forward_then_backward_in_order(ranks, micro_batches, chunks):
        return [[(F, r, m) for m in range(micro_batches)] + [(B, r, m) for m in range(micro_batches)]
                for r in range(ranks)]

    try:
        s = build_schedule(3, 4, "forward-then-backward-test", "always")
        assert s.count(F) == 12 and s.count(Kind.RECOMPUTE) == 12
    finally:
        del SCHEDULES["forward-then-backward-test"]


def test_a_broken_generator_is_rejected():
    @register("broken-test")
    def backward_first(ranks, micro_batches, chunks):
        return [[(B, r, 0), (F, r, 0)] for r in range(ranks)]

    try:
        with pytest.raises(ScheduleError, match="backwarded after its forward"):
            build_schedule(2, 1, "broken-test", "none")
    finally:
        del SCHEDULES["broken-test"]


@pytest.mark.parametrize("schedule, K, M, v, match", [
    ("gpipe", 2, 4, 2, "pipeline.chunks"),
    ("naive", 2, 4, 1, "pipeline.micro_batches"),
    ("interleaved_1f1b", 4, 6, 2, "multiple of the 4 ranks"),
])
def test_a_family_refuses_what_it_cannot_run_in_one_line(schedule, K, M, v, match):
    with pytest.raises(ScheduleError, match=match):
        build_schedule(K, M, schedule, "none", v)


def test_no_schedule_name_is_special_cased_outside_its_generator():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    # the generators, and the benchmark that maps our names onto torch's own schedule classes
    allowed = {root / "gpipe_sim" / "schedule" / "generators.py", root / "gpipe_exec" / "studies" / "bench.py"}
    for path in itertools.chain((root / "gpipe_sim").rglob("*.py"), (root / "gpipe_exec").rglob("*.py"),
                                (root / "app").rglob("*.py")):
        if path in allowed:
            continue
        text = path.read_text()
        for name in SCHEDULES:
            for quoted in (f'== "{name}"', f'!= "{name}"', f"== '{name}'", f"!= '{name}'"):
                assert quoted not in text, f"{path.relative_to(root)} special-cases {name}"


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


def test_rank_chunks_reads_each_placement_the_other_way():
    from gpipe_sim.schedule.registry import looped, rank_chunks, v_shape

    assert rank_chunks(v_shape(4, 2), 4) == ((0, 7), (1, 6), (2, 5), (3, 4))
    assert rank_chunks(looped(3, 2), 3) == ((0, 3), (1, 4), (2, 5))
    for placement, K in ((looped(5, 3), 5), (v_shape(6, 2), 6), ((0, 0, 1), 2)):
        held = rank_chunks(placement, K)
        assert sorted(c for chunks in held for c in chunks) == list(range(len(placement)))
        assert all(placement[c] == r for r, chunks in enumerate(held) for c in chunks)
