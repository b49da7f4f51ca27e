"""The planner's space held as arrays: its blocks list `candidate_space` exactly, `WorkRows` equals
`candidate_work` element for element, the coarse arrays stay below the partition-free bounds, and
the pruned store behaves as the dict it replaces."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gpipe_sim.planner.bounds import CostTable, candidate_work, memory_lower_bound, step_lower_bound
from gpipe_sim.planner.coarse import coarse_arrays
from gpipe_sim.planner.pruned import Pruned
from gpipe_sim.planner.search import PlanOptions, candidate_space, family, reserved_base
from gpipe_sim.planner.space import space_blocks
from gpipe_sim.planner.space_index import CandidateSpace
from gpipe_sim.planner.work_rows import WorkCache, rows_key
from gpipe_sim.scenario.scenario import parse_scenario

# a transformer on 2 nodes of 2 with a batch that most M split unevenly, and ZeRO-3 at K=1 (its
# collectives are a coarse bound's third term)
SCENARIO = {
    "model": {"preset": "transformer", "layers": 4, "d_model": 256, "d_ff": 1024, "heads": 4, "seq_len": 128,
              "vocab": 1000},
    "hardware": {"preset": "a100-80gb", "accelerator": {"memory_bytes": "60 MB"}, "devices_per_node": 2,
                 "network": {"bandwidth": "2 GB/s", "latency_s": 1.0e-5}},
    "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 14, "schedule": "gpipe"},
    "training": {"dtype": "bf16"},
}
OPTIONS = PlanOptions(devices=4, fewer_devices=True, max_chunks=2, reserve=0.0,
                      schedules=("gpipe", "1f1b", "interleaved_1f1b", "zbv"), tensor_parallel=(1, 2))


@pytest.fixture(scope="module")
def space():
    base = reserved_base(parse_scenario(SCENARIO), OPTIONS)
    return base, candidate_space(base, OPTIONS), CandidateSpace(space_blocks(base, OPTIONS))


def test_blocks_list_the_space_in_its_order(space):
    """Indexing, slicing, iterating and the columns of the blocks give `candidate_space`'s list."""
    _, listed, held = space
    assert len(held) == len(listed) and list(held) == listed
    assert [held[i] for i in range(len(listed))] == listed
    assert held[3:40:7] == listed[3:40:7] and held[-1] == listed[-1]
    for axis, field in (("T", "tensor_parallel"), ("D", "data_parallel"), ("K", "stages")):
        assert held.column(axis).tolist() == [getattr(c, field) for c in listed]
        assert held.values(axis) == {getattr(c, field) for c in listed}
    codes, names = held.family_codes()
    assert [names[k] for k in codes] == [family(c) for c in listed]
    for i in (0, len(listed) // 2, len(listed) - 1):
        block = held.block_of(i)
        assert block.start <= i < block.start + block.size and listed[i] in list(block.candidates())
    with pytest.raises(IndexError):
        held[len(listed)]


def test_work_rows_equal_candidate_work(space):
    """Every M's Work from the rows is `candidate_work`'s, bit for bit (uneven M, except_last, ZeRO)."""
    base, listed, _ = space
    costs, works = CostTable(base), None
    works = WorkCache(costs)
    for cand in listed:
        want, got = candidate_work(costs, cand), works.work(cand)
        for name in ("work", "trail", "forward", "backward"):
            assert np.array_equal(getattr(want, name), getattr(got, name)), (cand, name)
        assert (want.largest, want.smallest) == (got.largest, got.smallest)
        rows = works.of(cand)
        assert rows.total[cand.micro_batches - 1] == want.total and rows.chain[cand.micro_batches - 1] == want.chain


def test_work_rows_built_at_once_equal_one_by_one(space):
    """Rows built together (every cost table priced once for all of them: `WorkCache.build`) equal
    rows built one at a time from a fresh table, array for array, and `candidate_work`'s figures."""
    base, listed, _ = space
    costs = CostTable(base)
    together = WorkCache(costs)
    together.build(listed)
    alone = WorkCache(CostTable(base))
    assert len(together.rows) > 4
    for key, rows in together.rows.items():
        cand = next(c for c in listed if rows_key(c) == key)
        one = alone.of(cand)
        for name in ("work_", "trail_", "total", "chain", "largest", "size"):
            assert np.array_equal(getattr(rows, name), getattr(one, name)), (cand, name)
        for M in range(1, len(rows.total) + 1):
            want = candidate_work(costs, cand._replace(micro_batches=M))
            assert np.array_equal(rows.work(M).work, want.work) and rows.chain[M - 1] == want.chain


def test_coarse_arrays_are_below_the_partition_free_bounds(space):
    """The coarse bounds of every configuration are at most its memory and step-time bounds over
    every partition (which the simulator's figures are at least: tests/test_planner.py)."""
    base, listed, held = space
    costs = CostTable(base)
    memory, step = coarse_arrays(costs, held, WorkCache(costs))
    assert np.all(np.isfinite(memory)) and np.all(np.isfinite(step)) and np.all(step > 0)
    assert any(c.zero == 3 and c.stages == 1 for c in listed)
    for i, cand in enumerate(listed):
        assert memory[i] <= memory_lower_bound(costs, cand), cand
        assert step[i] <= step_lower_bound(costs, cand), cand
    # the memory bound is (static + activations of the largest micro-batch per chunk) / K, exactly
    cand = next(c for c in listed if c.stages == 2 and c.chunks == 2 and c.zero == 1 and c.micro_batches == 3)
    table = costs.of(cand)
    static = table.params_sum * table.static_per_param(cand.data_parallel, 1)
    largest = -(-(14 // cand.data_parallel) // 3)
    assert memory[listed.index(cand)] == pytest.approx((static + table.act_sum * largest / 2) / 2, rel=1e-8)


def test_pruned_store_is_a_dict():
    """Random notes, removals and bulk notes: the store reads as a dict of the same operations
    does (iterated in index order), and `where` finds each reason's indices."""
    rng = random.Random(3)
    store, plain = Pruned(200), {}
    for _ in range(400):
        i = rng.randrange(200)
        op = rng.random()
        if op < 0.5:
            value = (rng.choice(["memory", "bound", "preferred", "infeasible: no"]), rng.random(), rng.random())
            store[i] = plain[i] = value
        elif op < 0.7 and i in plain:
            assert store.pop(i) == plain.pop(i)
        elif op < 0.8:
            many = rng.sample(range(200), 20)
            figures = [rng.random() for _ in many]
            store.set_many(many, "bound", figures, 0.5)
            plain.update({j: ("bound", f, 0.5) for j, f in zip(many, figures)})
        assert (i in store) == (i in plain)
    assert len(store) == len(plain) and dict(store) == dict(sorted(plain.items()))
    assert list(store) == sorted(plain)
    assert store.where("bound").tolist() == sorted(j for j, v in plain.items() if v[0] == "bound")
    assert store.get(-1) is None and 10**6 not in store


@pytest.mark.parametrize("tensor_parallel", [1, 2])
def test_cost_table_prices_twin_layers_once_and_alike(tensor_parallel):
    """A table prices each set of twin layers (equal but for the name) once a micro-batch size,
    and every layer's row is what `layer_pass_times` gives that layer (the collectives inside)."""
    from gpipe_sim.costs.layer_time import layer_pass_times

    costs = CostTable(parse_scenario(SCENARIO), tensor_parallel)
    assert len(set(costs._twin)) < costs.L  # the blocks are twins
    for b in (1, 3, 7):
        work = costs.stream_work(b) or [None] * costs.L
        want = [layer_pass_times(layer, b, costs.accel, costs.dtype, costs.dtype_bytes, w)
                for layer, w in zip(costs.layers, work)]
        assert costs.times(b).tolist() == [list(row) for row in want]
        assert costs.compute_times(b).tolist() == [
            list(layer_pass_times(layer, b, costs.accel, costs.dtype, costs.dtype_bytes)) for layer in costs.layers]


@pytest.mark.parametrize("name, K, M, v", [("1f1b", 4, 6, 1), ("interleaved_1f1b", 2, 4, 2), ("zbv", 2, 5, 2),
                                           ("looped_bfs", 2, 3, 2)])
def test_per_layer_remat_modes_hold_what_none_holds(name, K, M, v):
    """The held-activation bound builds one schedule for none, full and selective: their programs
    (and so the samples each chunk holds) are the same."""
    from gpipe_sim.plan.partition import held_activations, micro_batch_sizes
    from gpipe_sim.schedule.lower import build_schedule

    plain = build_schedule(K, M, name, "none", v).columns
    for remat in ("full", "selective"):
        columns = build_schedule(K, M, name, remat, v).columns
        for field in vars(plain):
            got, want = getattr(columns, field), getattr(plain, field)
            assert np.array_equal(got, want) if isinstance(want, np.ndarray) else got == want, (remat, field)
        held = held_activations(build_schedule(K, M, name, remat, v), micro_batch_sizes(2 * M + 1, M))
        plain_held = held_activations(build_schedule(K, M, name, "none", v), micro_batch_sizes(2 * M + 1, M))
        assert all(np.array_equal(a, b) for a, b in zip(held.rows, plain_held.rows))


def test_split_backward_read_from_the_orders_is_the_built_schedules():
    """`_splits_backward` (read from the generator's orders) says what the built programs count, for
    every registered family at every (K, M, v) it accepts here; each family check asked once per
    (K, v, M) gives the reasons it gives asked one by one."""
    from gpipe_sim.planner.space import _family_accepts, _splits_backward
    from gpipe_sim.schedule import SCHEDULES, Kind
    from gpipe_sim.schedule.lower import build_schedule

    split = set()
    for name, family in SCHEDULES.items():
        for K, v, M in ((K, v, M) for K in (1, 2, 3, 4) for v in (1, 2, 3) for M in (1, 2, 3, 5, 8)):
            if family.problem(K, M, v) is None:
                built = build_schedule(K, M, name, "none", v).count(Kind.BACKWARD_INPUT) > 0
                assert _splits_backward(name, K, v, M) == built, (name, K, v, M)
                split |= {name} if built else set()
        checked: dict = {}
        for D, Ms in ((1, [1, 2, 3, 5, 8]), (2, [5, 1, 3]), (4, [1, 2, 3, 5, 8, 9])):
            rejected: list = []
            accepted = _family_accepts(family, (D, 2, 2, 1), name, Ms, rejected, checked)
            assert accepted == [M for M in Ms if family.problem(2, M, 2) is None]
            assert rejected == [(D, 2, 2, M, name, f"invalid for the schedule: {family.problem(2, M, 2)}", 1)
                                for M in Ms if family.problem(2, M, 2) is not None]
    assert {"zbv", "zb_h1"} <= split and "1f1b" not in split


def test_work_rows_of_a_deep_model_equal_candidate_work():
    """With more layers than NumPy sums in one block (26 here), each M's chain and work from the
    stacked sizes (`SizeTerms`), and the sums its `Work` is given, are still `candidate_work`'s
    (which computes them from its arrays), bit for bit."""
    data = {**SCENARIO, "model": {**SCENARIO["model"], "layers": 24}}
    options = PlanOptions(devices=4, max_chunks=1, reserve=0.0, schedules=("1f1b",), tensor_parallel=(1, 2),
                          remat=("none", "except_last", "full"))
    base = reserved_base(parse_scenario(data), options)
    costs = CostTable(base)
    works = WorkCache(costs)
    firsts = {rows_key(c): c for c in candidate_space(base, options)}
    works.build(firsts.values())
    assert costs.L > 16 and len(works.terms) > 1
    for cand in firsts.values():
        rows = works.of(cand)
        for M in range(1, len(rows.total) + 1):
            want = candidate_work(costs, cand._replace(micro_batches=M))
            got = rows.work(M)
            assert rows.chain[M - 1] == want.chain and rows.total[M - 1] == want.total, (cand, M)
            for name in ("work", "trail", "forward", "backward"):
                assert np.array_equal(getattr(got, name), getattr(want, name)), (cand, M, name)
            assert (got.total, got.chain) == (want.total, want.chain)
            assert all(np.array_equal(a, b) for a, b in zip(got.cums, want.cums)), (cand, M)


def test_counted_bounds_from_kept_frames_equal_fresh_ones(space):
    """The step bound with layer counts reads what it keeps per (D, K, v, schedule, ZeRO class,
    counts) and per (smallest micro-batch, M): asked for every configuration of the space through
    one table, each equals the bound a fresh table computes for that configuration alone."""
    from gpipe_sim.planner.bounds import quick_counts

    base, listed, _ = space
    shared = CostTable(base)
    asked = 0
    for cand in listed:
        counts = quick_counts(shared, cand, max(1, -(-(14 // cand.data_parallel) // cand.micro_batches)))
        if counts is None:
            continue
        fresh = CostTable(base)
        assert step_lower_bound(shared, cand, counts) == step_lower_bound(fresh, cand, counts), cand
        assert memory_lower_bound(shared, cand, counts) == memory_lower_bound(fresh, cand, counts), cand
        asked += 1
    assert asked > 100
