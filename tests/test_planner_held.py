"""The planner's held-activation counts, read from each schedule's events once per schedule, equal
what `held_activations` lists from the built programs, and so does the bound made of them."""

from __future__ import annotations

import numpy as np
import pytest

from gpipe_sim.plan.partition import held_activations, micro_batch_sizes
from gpipe_sim.planner.bounds import CostTable, chunk_placement
from gpipe_sim.planner.held_bound import held_memory_bound, held_memory_ceiling, held_samples, moment_bytes
from gpipe_sim.planner.segments import SLACK
from gpipe_sim.planner.space import Candidate
from gpipe_sim.scenario.scenario import parse_scenario
from gpipe_sim.schedule import SCHEDULES
from gpipe_sim.schedule.lower import build_schedule


def _effective(rows: np.ndarray) -> np.ndarray:
    return rows[:, 0::3] + np.minimum(rows[:, 1::3], rows[:, 2::3])


def _cases():
    for name, family in SCHEDULES.items():
        for K, M, v in ((2, 3, 1), (4, 7, 1), (4, 8, 2), (3, 5, 2), (2, 6, 3)):
            if family.problem(K, M, v) is None:
                for remat in ("none", "except_last", "always"):
                    yield name, K, M, v, remat


CASES = list(_cases())


@pytest.mark.parametrize("name, K, M, v, remat", CASES + [("looped_bfs", 2, 1100, 2, "none")])
def test_held_samples_are_the_built_programs_counts(name, K, M, v, remat):
    """Per chunk the most held (every remat mode, even and uneven micro-batches), and per rank of
    several chunks its undominated moments, as `held_activations` counts them on the programs."""
    for share in (M, 2 * M + 1, 3 * M - 1):
        cand = Candidate(1, K, v, M, name, remat, "uniform", 0)
        got_held = held_samples(cand, share)
        held = held_activations(build_schedule(K, M, name, remat, v), micro_batch_sizes(share, M))
        want = np.array([float(_effective(rows).max(initial=0.0)) for rows in held.rows])
        assert np.array_equal(got_held.per_chunk, want), share
        assert got_held.placement.tolist() == list(held.placement)
        for r, rows in enumerate(held.rank_rows):
            got = got_held.rank_rows(r)
            if len(held.rank_chunks[r]) == 1:
                assert got is None
            else:  # every undominated moment covered, and nothing above them: the same most for any weights
                assert (got is None) == (rows is None)
                if got is not None:
                    want_rows = _effective(rows)
                    assert all((got >= row).all(axis=1).any() for row in want_rows), (share, r)
                    assert all((want_rows >= row).all(axis=1).any() for row in got), (share, r)


def _bound_from_programs(costs, cand, counts):
    """`held_memory_bound` with counts, computed from `held_activations` of the built programs."""
    held = held_activations(build_schedule(cand.stages, cand.micro_batches, cand.schedule, cand.remat,
                                           cand.chunks), micro_batch_sizes(costs.base.pipeline.batch_size, cand.micro_batches))
    edges = np.concatenate(([0], np.cumsum(counts))).astype(int)
    s_cum, a_cum = costs.static_cum(1, cand.zero), costs.act_cum
    chunk_static = s_cum[edges[1:]] - s_cum[edges[:-1]]
    chunk_act = a_cum[edges[1:]] - a_cum[edges[:-1]]
    out = 0.0
    for r, mine in enumerate(held.rank_chunks):
        act = max(float(_effective(held.rows[c]).max(initial=0.0)) * chunk_act[c] for c in mine)
        if held.rank_rows[r] is not None:
            rows = _effective(held.rank_rows[r])
            weights = np.broadcast_to(chunk_act[list(mine)], rows.shape)
            act = max(act, float(moment_bytes(rows, weights).max(initial=0.0)))
        out = max(out, float(chunk_static[list(mine)].sum()) + act)
    return out * SLACK


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_held_bound_equals_the_one_from_the_programs(name):
    """The bound with a partition's counts is the one the built programs' counts give, exactly."""
    base = parse_scenario({"model": {"preset": "transformer", "layers": 12, "d_model": 256, "d_ff": 1024,
                                     "heads": 4, "seq_len": 128, "vocab": 1000},
                           "hardware": {"preset": "a100-80gb"},
                           "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 11, "schedule": "1f1b"}})
    costs = CostTable(base)
    family = SCHEDULES[name]
    for K, M, v in ((2, 5, 1), (3, 7, 2), (2, 4, 3)):
        if family.problem(K, M, v) is not None:
            continue
        for remat in ("none", "except_last", "always"):
            cand = Candidate(1, K, v, M, name, remat, "uniform", 0)
            chunks = len(chunk_placement(cand))
            counts = [12 // chunks + (c < 12 % chunks) for c in range(chunks)]
            assert held_memory_bound(costs, cand, counts) == _bound_from_programs(costs, cand, counts), (K, M, v, remat)


@pytest.mark.parametrize("name, K, M, v, remat", CASES + [("zbv", 3, 4, 2, "always"), ("zb_h2", 4, 9, 1, "always"),
                                                        ("dualpipev", 2, 6, 2, "except_last")])
def test_order_events_are_the_lowered_programs(name, K, M, v, remat):
    """The events read from the generator's pass orders are those of the lowered programs, in order."""
    from gpipe_sim.plan.held import held_events
    from gpipe_sim.planner.held_orders import order_events

    schedule = build_schedule(K, M, name, remat, v)
    placement, events = order_events(name, K, M, v, remat)
    assert placement == schedule.placement
    want = held_events(schedule)
    assert len(events) == len(want)
    for got, ref in zip(events, want):
        for a, b in zip(got, ref):
            assert np.array_equal(a, b) and a.dtype.kind == b.dtype.kind


def test_the_ceiling_is_every_rank_holding_the_whole_batch():
    """`held_memory_ceiling` (its partition bytes kept per table and partition) is each rank's
    static bytes plus the replica batch's activations of its chunks (and the 1e-9 margin), for
    every D, ZeRO stage and partition asked in turn, and at least the held bound."""
    base = parse_scenario({"model": {"preset": "transformer", "layers": 12, "d_model": 256, "d_ff": 1024,
                                     "heads": 4, "seq_len": 128, "vocab": 1000},
                           "hardware": {"preset": "a100-80gb"},
                           "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 24, "schedule": "1f1b"}})
    costs = CostTable(base)
    for D, zero, counts in ((1, 0, (6, 6)), (2, 0, (6, 6)), (2, 3, (6, 6)), (2, 3, (5, 7)), (1, 0, (5, 7))):
        cand = Candidate(D, 2, 1, 4, "1f1b", "none", "uniform", zero)
        s_cum, a_cum = costs.static_cum(D, zero), costs.act_cum
        edges = np.concatenate(([0], np.cumsum(counts)))
        want = max(s_cum[edges[r + 1]] - s_cum[edges[r]] + (24 // D) * (a_cum[edges[r + 1]] - a_cum[edges[r]])
                   for r in range(2))
        got = held_memory_ceiling(costs, cand, counts)
        assert got == pytest.approx(want * (1 + 1e-9), rel=1e-12), (D, zero, counts)
        assert got >= held_memory_bound(costs, cand, counts)
