"""The pass orders' step bound (`planner.order_bound`) against the simulator, on every registered schedule."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpipe_sim.api import simulate_plan
from gpipe_sim.errors import GpipeError
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.planner.bounds import CostTable, chunk_placement
from gpipe_sim.planner.order_bound import OrderBounds, order_step
from gpipe_sim.planner.space import Candidate
from gpipe_sim.scenario.scenario import parse_scenario
from gpipe_sim.schedule import SCHEDULES

BASE = {
    "model": {"preset": "transformer", "layers": 8, "d_model": 256, "d_ff": 1024, "heads": 4, "seq_len": 128,
              "vocab": 4000},
    "hardware": {"preset": "a100-80gb", "devices_per_node": 4,
                 "network": {"bandwidth": "100 Gb/s", "latency_s": 1.0e-5, "per": "node", "nics": 1}},
    "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 26},
    "training": {"dtype": "bf16"},
}


def _cases():
    for name, (K, v), M, remat, D in itertools.product(
            sorted(SCHEDULES), ((2, 1), (4, 1), (2, 2), (4, 2)), (1, 3, 5, 8), ("none", "except_last", "always"), (1, 2)):
        yield Candidate(D, K, v, M, name, remat, "time", 1 if D > 1 else 0)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_the_order_bound_is_at_most_the_simulated_step_and_close_to_it(name):
    """Uneven micro-batches (26 / D samples), re-computation, two replicas over a NIC they share
    (the SimPy engine's contention): never above the step; within 10% of it on the plain
    pipelines without replicas (their waits are what it models)."""
    base = parse_scenario(BASE)
    costs = CostTable(base)
    bounds = OrderBounds(costs)
    checked = 0
    for cand in (c for c in _cases() if c.schedule == name):
        try:
            plan = compile_plan(base.with_updates(cand.overrides()))
        except GpipeError:
            continue
        step = simulate_plan(plan).step_time_s
        got = bounds(cand, plan.layer_counts, chunk_placement(cand))
        assert got <= step, cand
        if cand.data_parallel == 1 and cand.remat == "none" and name in ("gpipe", "1f1b", "interleaved_1f1b"):
            assert got >= 0.9 * step, (cand, got, step)
        checked += 1
    assert checked >= 6


def test_order_step_by_hand():
    """Two ranks, one chunk each, GPipe over two micro-batches: F = 1, B = 2 (rank 0), F = 2,
    B = 3 (rank 1), 0.5 s a hop: rank 1's forwards end at 3.5 and 5.5, its backwards at 8.5 and
    11.5; rank 0's backwards of micro-batch 0 start at 9 (8.5 + 0.5), then 12: the step 14."""
    F, B, W, I = 0, 1, 3, 2
    orders = [[(F, 0, 0), (F, 0, 1), (B, 0, 0), (B, 0, 1)], [(F, 1, 0), (F, 1, 1), (B, 1, 0), (B, 1, 1)]]
    times = np.zeros((2, 2, 4))
    times[0, :, 0], times[0, :, 1], times[1, :, 0], times[1, :, 1] = 1, 2, 2, 3
    hops = np.full((1, 2), 0.5)
    assert order_step(orders, times, hops, [True, True]) == 14.0
    # re-computing micro-batch 1 (each chunk's forward again before its backward): rank 1's second
    # backward from 8.5 + 2 to 13.5, rank 0's from 14 to 16
    assert order_step(orders, times, hops, [True, False]) == 16.0
    # a host second to receive each input on rank 1: its forwards end at 3.5 and 6.5 (3.5 + 1 + 2),
    # its backwards at 9.5 and 12.5, rank 0's at 12 and 15
    host = np.zeros((2, 2, 4))
    host[1, :, 0] = 1.0
    assert order_step(orders, times, hops, [True, True], host) == 15.0
    # orders that cannot run (rank 1 waits for a backward rank 0 never makes first): no bound
    stuck = [[(B, 0, 0), (F, 0, 0)], [(F, 1, 0), (B, 1, 0)]]
    assert order_step(stuck, times[:, :1], hops[:, :1], [True]) == 0.0
    # a split backward: the weight pass adds its own time on its rank
    split = [[(F, 0, 0), (I, 0, 0), (W, 0, 0)], [(F, 1, 0), (I, 1, 0), (W, 1, 0)]]
    times[:, :, 2], times[:, :, 3] = 1.0, 4.0
    # rank 1: F 1.5-3.5, I 3.5-4.5, W to 8.5; rank 0: F 0-1, I after 4.5 + 0.5 = 5 to 6, W to 10
    assert order_step(split, times[:, :1], hops[:, :1], [True]) == 10.0


def test_generated_orders_are_kept_read_only_and_asked_anew_of_a_family_registered_anew():
    from gpipe_sim.planner.order_bound import pass_orders
    from gpipe_sim.schedule.registry import generated_orders, register

    first = generated_orders("1f1b", 2, 3, 1)
    assert generated_orders("1f1b", 2, 3, 1) is first
    assert all(not order.flags.writeable for order in first)
    assert [order.tolist() for order in first] == pass_orders("1f1b", 2, 3, 1)
    F, B = 0, 1
    try:
        for passes in ([[(F, 0, 0), (B, 0, 0)], [(F, 1, 0), (B, 1, 0)]],
                       [[(F, 0, 0), (B, 0, 0)], [(F, 1, 0), (B, 1, 0), (B, 1, 0)]]):
            register("orders-anew-test")(lambda ranks, micro_batches, chunks, passes=passes: passes)
            assert [order.tolist() for order in generated_orders("orders-anew-test", 2, 1, 1)] == \
                [[list(p) for p in rank] for rank in passes]
            assert pass_orders("orders-anew-test", 2, 1, 1) == [[list(p) for p in rank] for rank in passes]
    finally:
        del SCHEDULES["orders-anew-test"]


def test_chunk_placement_is_the_family_registered_now():
    from gpipe_sim.schedule.registry import looped, register, v_shape

    cand = Candidate(1, 2, 2, 4, "placement-anew-test", "none", "time", 0)
    try:
        for placement in (looped, v_shape):
            register("placement-anew-test", placement=placement)(lambda ranks, micro_batches, chunks: [[], []])
            assert chunk_placement(cand) == placement(2, 2)
    finally:
        del SCHEDULES["placement-anew-test"]
    assert chunk_placement(cand) == looped(2, 2)  # unregistered
