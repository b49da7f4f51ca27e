"""What compile keeps between candidates (global programs, weight partitions) equals a fresh build."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpipe_sim.errors import ScenarioError
from gpipe_sim.plan.balance import balance_by_weight, split_by_weight
from gpipe_sim.schedule import SCHEDULES, build_schedule, global_program
from gpipe_sim.schedule.global_program import _global_program, replicate, with_collectives

_NAMES = ("kind", "chunk", "micro_batch", "peer", "tensor", "save")


def _reference_replicate(columns, replicas):
    """Rank by rank: replica d's rank r is program rank d*K + r, its peers d*K + peer."""
    K = len(columns.offsets) - 1
    rows = {n: [] for n in ("rank", *_NAMES)}
    lengths = []
    for d in range(replicas):
        for r in range(K):
            lo, hi = int(columns.offsets[r]), int(columns.offsets[r + 1])
            lengths.append(hi - lo)
            rows["rank"] += [d * K + r] * (hi - lo)
            for n in _NAMES:
                part = getattr(columns, n)[lo:hi].tolist()
                rows[n] += [d * K + p if p >= 0 else p for p in part] if n == "peer" else part
    return np.concatenate(([0], np.cumsum(lengths))).tolist(), rows


def _schedules():
    for name, K, M, v in itertools.product(sorted(SCHEDULES), (1, 2, 4), (3, 8), (1, 2)):
        try:
            yield build_schedule(K, M, name, "none", v)
        except Exception:  # noqa: BLE001 (a schedule that does not take these sizes)
            continue


def test_replicate_gives_every_replica_the_rank_by_rank_programs():
    for schedule in _schedules():
        for columns, D in itertools.product((schedule.columns, with_collectives(schedule.columns, True)), (1, 2, 5)):
            got = replicate(columns, D)
            offsets, rows = _reference_replicate(columns, D)
            assert got.offsets.tolist() == offsets
            assert got.offsets.dtype == np.int64 and got.rank.dtype == np.int32
            for n in ("rank", *_NAMES):
                assert getattr(got, n).tolist() == rows[n], (schedule.name, D, n)
                if n != "rank":
                    assert getattr(got, n).dtype == getattr(columns, n).dtype


def test_kept_global_program_equals_a_fresh_build_and_is_read_only():
    for schedule in _schedules():
        for D, held, overlap, reduced in itertools.product((1, 4), (None, 1), (False, True), (None, True)):
            first = global_program(schedule, D, held, overlap, reduced)
            again = global_program(schedule, D, held, overlap, reduced)
            assert again is first
            fresh = _global_program(schedule, D, D if held is None else held, overlap, D > 1 if reduced is None
                                    else reduced)
            assert first.num_messages == fresh.num_messages
            for n in ("offsets", "rank", *_NAMES):
                assert np.array_equal(getattr(first.columns, n), getattr(fresh.columns, n))
                assert getattr(first.columns, n).dtype == getattr(fresh.columns, n).dtype
            assert np.array_equal(first.message, fresh.message) and np.array_equal(first.keys, fresh.keys)
            with pytest.raises(ValueError):
                first.message[:1] = 0


def test_kept_global_program_tells_schedules_of_equal_arguments_apart():
    """A schedule read from a file may share its name and sizes with a registered one: the
    programs are kept per schedule object, not per name."""
    a = build_schedule(2, 4, "1f1b", "none", 1)
    b = build_schedule(2, 4, "gpipe", "none", 1)
    b = type(a)(a.name, a.ranks, a.micro_batches, a.chunks, a.remat, a.placement, b.columns)
    assert not np.array_equal(global_program(a, 2).columns.kind, global_program(b, 2).columns.kind)
    assert np.array_equal(global_program(b, 2).columns.kind, _global_program(b, 2, 2, False, True).columns.kind)


def test_kept_weight_partition_equals_a_fresh_split():
    rng = np.random.default_rng(3)
    for layers, stages in ((26, 2), (26, 8), (40, 5), (300, 7)):
        weights = rng.uniform(0.5, 2.0, layers).tolist()
        got = balance_by_weight(weights, stages)
        assert got == split_by_weight(weights, stages)
        got[0] += 1  # the caller's list: the kept split is untouched
        assert balance_by_weight(np.asarray(weights), stages) == split_by_weight(weights, stages)
    with pytest.raises(ScenarioError, match="pipeline.partition"):
        balance_by_weight([1.0, float("nan"), 1.0], 2)


@pytest.mark.parametrize("remat", ["full", "selective"])
def test_per_layer_remat_shares_the_programs_a_fresh_lowering_gives(remat):
    from gpipe_sim.schedule.lower import _build

    for name, K, M, v in itertools.product(("gpipe", "1f1b", "interleaved_1f1b"), (1, 2, 4), (3, 8), (1, 2)):
        try:
            fresh = _build(K, M, name, remat, v)
        except Exception:  # noqa: BLE001 (a schedule that does not take these sizes)
            continue
        got = build_schedule(K, M, name, remat, v)
        assert got.remat == remat and got.placement == fresh.placement
        assert got.columns is build_schedule(K, M, name, "none", v).columns
        for n in ("offsets", "rank", *_NAMES):
            assert np.array_equal(getattr(got.columns, n), getattr(fresh.columns, n))


def _reference_duration(plan, i):
    """Action i's seconds on its rank's timeline, read action by action."""
    from gpipe_sim.schedule import Kind, Tensor

    p, host, K = plan.program, plan.scenario.hardware.host, len(plan.ranks)
    kind, chunk, mb, tensor = int(p.kind[i]), int(p.chunk[i]), int(p.micro_batch[i]), int(p.tensor[i])
    passes = {Kind.FORWARD: "forward_s", Kind.RECOMPUTE: "forward_s", Kind.BACKWARD: "backward_s",
              Kind.BACKWARD_INPUT: "backward_input_s", Kind.BACKWARD_WEIGHT: "backward_weight_s"}
    if kind in passes:
        return float(getattr(plan.chunks[chunk], passes[Kind(kind)])[mb]) + host.action_s
    if kind == Kind.UPDATE:
        return plan.ranks[int(p.rank[i]) % K].update_s + host.action_s
    if kind in (Kind.SEND, Kind.RECV) and tensor != Tensor.REDUCED:
        # the boundary's lower chunk sends its activation and receives its gradient
        lower_end = (kind == Kind.SEND) == (tensor == Tensor.ACTIVATION)
        nbytes = float(plan.chunks[chunk if lower_end else chunk - 1].output_bytes[mb])
        return host.send_seconds(nbytes) if kind == Kind.SEND else host.recv_seconds(nbytes)
    return 0.0


@pytest.mark.parametrize("schedule, remat, D, zero", [("1f1b", "always", 2, 0), ("zb_h1", "none", 2, 3),
                                                      ("interleaved_1f1b", "except_last", 1, 1)])
def test_program_durations_equal_an_action_by_action_reading(schedule, remat, D, zero):
    from gpipe_sim.plan.compile import compile_plan
    from gpipe_sim.scenario.scenario import parse_scenario

    scenario = parse_scenario({
        "model": {"preset": "transformer", "layers": 8, "d_model": 256, "d_ff": 1024, "heads": 4, "seq_len": 256},
        "hardware": {"preset": "a100-80gb", "devices_per_node": 4,  # a100-80gb: host time per action and transfer
                     "host": {"action_s": 1e-5, "send_s": 2e-5, "recv_s": 3e-5, "copy_bandwidth": 1e10}},
        "pipeline": {"stages": 2, "chunks": 2 if schedule.startswith("interleaved") else 1, "micro_batches": 6,
                     "batch_size": 22, "data_parallel": D, "schedule": schedule, "remat": remat},
        "training": {"dtype": "bf16", "zero": zero}})
    plan = compile_plan(scenario)
    got = plan.program.duration
    assert got.tolist() == [_reference_duration(plan, i) for i in range(len(got))]
    assert (got > 0).sum() > 3 * plan.schedule.micro_batches


def test_small_schedules_are_kept_past_a_hundred_others():
    from gpipe_sim.schedule.lower import SMALL_ACTIONS, _build

    first = build_schedule(2, 7, "1f1b", "always", 1)
    for M in range(8, 108):  # a search's hundred small schedules in turn
        assert len(build_schedule(2, M, "1f1b", "always", 1).columns.kind) <= SMALL_ACTIONS
    assert build_schedule(2, 7, "1f1b", "always", 1) is first
    fresh = _build(2, 7, "1f1b", "always", 1)
    for n in ("offsets", "rank", *_NAMES):
        assert np.array_equal(getattr(first.columns, n), getattr(fresh.columns, n))


def test_a_per_layer_mode_shares_its_programs_after_their_owner_was_dropped():
    """A mode kept past its programs' owner ("none") would hold the old columns while the owner
    is built anew: the two are dropped together."""
    from gpipe_sim.schedule.lower import _BUILT_SMALL, _BUILT_SMALL_SIZE

    build_schedule(2, 5, "1f1b", "full", 1)
    for M in range(300, 300 + _BUILT_SMALL_SIZE):  # small schedules until the owner is dropped
        build_schedule(1, M, "gpipe", "none", 1)
        if ("1f1b", 2, 5, "none", 1) not in _BUILT_SMALL:
            break
    full = build_schedule(2, 5, "1f1b", "full", 1)
    assert full.columns is build_schedule(2, 5, "1f1b", "none", 1).columns
    assert build_schedule(2, 5, "1f1b", "selective", 1).columns is full.columns


def test_kept_chunk_times_equal_a_fresh_pricing_and_tell_accelerators_apart():
    from gpipe_sim.plan.chunk_times import chunk_pass_times, chunk_times
    from gpipe_sim.plan.layer_table import scenario_layers
    from gpipe_sim.scenario.scenario import parse_scenario

    def scenario(preset):
        return parse_scenario({
            "model": {"preset": "transformer", "layers": 6, "d_model": 256, "d_ff": 1024, "heads": 4, "seq_len": 256},
            "hardware": {"preset": preset}, "pipeline": {"stages": 2, "micro_batches": 3, "batch_size": 7},
            "training": {"dtype": "bf16"}})

    seen = []
    for preset in ("a100-80gb", "h100-sxm"):
        s = scenario(preset)
        layers = scenario_layers(s)
        for first, count in ((0, 3), (3, 5), (1, 3)):
            own = layers[first:first + count]
            got, tp = chunk_times(s, own, first, 0, [2, 3])
            fresh, fresh_tp = chunk_pass_times(s, own, first, 0, [2, 3])
            assert tp is None and fresh_tp is None and np.array_equal(got, fresh)
            assert chunk_times(s, own, first, 0, [2, 3])[0] is got and not got.flags.writeable
            seen.append(got)
    assert not np.array_equal(seen[0], seen[3])  # the same chunk on another accelerator


def test_with_collectives_keeps_every_column_dtype_and_each_rank_ends_with_its_update():
    from gpipe_sim.schedule import Kind

    for schedule in _schedules():
        for overlap in (False, True):
            got = with_collectives(schedule.columns, overlap)
            for n in ("offsets", "rank", *_NAMES):
                assert getattr(got, n).dtype == getattr(schedule.columns, n).dtype, (schedule.name, n)
            assert (got.kind[got.offsets[1:] - 1] == Kind.UPDATE).all()
