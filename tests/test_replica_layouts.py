"""The array passes that compile many replicas (replica symmetry, the all-reduces' inserts) against plain per-rank references."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpipe_sim.mesh import node_of
from gpipe_sim.plan.compile import scenario_schedule
from gpipe_sim.plan.links import ring_link_keys, transfer_link_keys
from gpipe_sim.plan.replica_symmetry import replica_symmetry
from gpipe_sim.scenario.scenario import parse_scenario
from gpipe_sim.schedule import SCHEDULES, Kind, Tensor, build_schedule
from gpipe_sim.schedule.global_program import with_collectives

MODEL = {"preset": "transformer", "layers": 8, "d_model": 256, "d_ff": 1024, "heads": 4, "seq_len": 128,
         "vocab": 512}


def _scenario(D: int, K: int, placement: list[list[int]], per_node: int, nics: int, per: str = "node"):
    network = {"bandwidth": "400 Gb/s", "per": per, **({"nics": nics} if per == "node" else {})}
    return parse_scenario({
        "model": MODEL, "training": {"dtype": "bf16"},
        "hardware": {"preset": "h100-sxm", "devices_per_node": per_node, "placement": placement,
                     "network": network},
        "pipeline": {"stages": K, "micro_batches": 4, "batch_size": 4 * D, "data_parallel": D,
                     "schedule": "1f1b"}})


def _reference_uneven_rank(scenario, schedule) -> int | None:
    """The first rank whose ring holds the replicas' send links unevenly, set by set: for each
    replica, the labels (by first occurrence in its row of send links) of the links the ring holds."""
    mesh, hardware = scenario.mesh, scenario.hardware
    D, K = mesh.data_parallel, mesh.stages
    dmap = np.asarray(mesh.rank_devices).reshape(D, K)
    cols = schedule.columns
    sends = cols.kind == Kind.SEND
    pairs = sorted(set(zip(cols.rank[sends].tolist(), cols.peer[sends].tolist())))
    n_dev, per_node = mesh.device_span, mesh.node_size
    rows = []
    for d in range(D):
        a = np.array([dmap[d, s] for s, _ in pairs])
        b = np.array([dmap[d, t] for _, t in pairs])
        keys = np.where(a != b, transfer_link_keys(hardware, a, b, n_dev, per_node), -1).tolist()
        labels: dict[int, int] = {}
        for k in keys:
            labels.setdefault(k, len(labels))
        rows.append(labels)
    for r in range(K):
        ring = set(ring_link_keys(hardware, dmap[:, r].tolist(), n_dev, per_node))
        held = [frozenset(label for k, label in row.items() if k >= 0 and k in ring) for row in rows]
        if any(h != held[0] for h in held):
            return r
    return None


def _placements():
    """Layouts of 2-3 replicas of 2-4 ranks over nodes of 2 or 4 devices: Megatron-LM's order and
    shuffles of it (most make some rank's ring hold the replicas' links unevenly)."""
    rng = np.random.default_rng(0)
    for D, K, per_node, (per, nics) in itertools.product((2, 3), (2, 4), (2, 4), (("node", 1), ("node", 2),
                                                                                  ("device", 1))):
        for shuffle in range(4):
            devices = rng.permutation(D * K) if shuffle else np.arange(D * K).reshape(K, D).T.ravel()
            yield _scenario(D, K, devices.reshape(D, K).tolist(), per_node, nics, per)


def test_replica_symmetry_names_the_rank_a_set_by_set_reference_names():
    named = 0
    for scenario in _placements():
        schedule = scenario_schedule(scenario)
        found = replica_symmetry(scenario, schedule)
        if not found.alike and "ring" not in found.reason:
            continue  # refused before the rings are compared
        expected = _reference_uneven_rank(scenario, schedule)
        if expected is None:
            assert found.alike, found.reason
        else:
            assert found.reason == f"rank {expected}'s all-reduce ring holds the replicas' links unevenly"
            named += 1
    assert named >= 5  # the layouts reach the rings' check and fail it


def test_kept_answers_follow_the_layout():
    alike = _scenario(2, 2, [[0, 2], [1, 3]], 4, 2)
    schedule = scenario_schedule(alike)
    first = replica_symmetry(alike, schedule)
    assert first.alike and replica_symmetry(alike, schedule) is first and not first.foreign.flags.writeable
    # the same sizes placed otherwise: found anew, not served from the first layout's answer
    other = _scenario(2, 2, [[0, 2], [1, 1]], 4, 2)
    assert not replica_symmetry(other, scenario_schedule(other)).alike


def _reference_with_collectives(columns, overlap):
    """Rank by rank: each chunk's allreduce after (overlap: before) its last backward pass, in the
    order those passes run, and a wait for each before the rank's update, in the same order."""
    names = ("kind", "chunk", "micro_batch", "peer", "tensor", "save")
    ranks = []
    for r in range(len(columns.offsets) - 1):
        lo, hi = int(columns.offsets[r]), int(columns.offsets[r + 1])
        rows = [tuple(getattr(columns, n)[i].item() for n in names) for i in range(lo, hi)]
        last = {}
        for i, row in enumerate(rows):
            if row[0] in (Kind.BACKWARD, Kind.BACKWARD_WEIGHT):
                last[row[1]] = i
        order = sorted(last, key=last.get)
        update = max(i for i, row in enumerate(rows) if row[0] == Kind.UPDATE)
        out = []
        for i, row in enumerate(rows):
            if i == update:
                out += [(Kind.RECV, c, -1, -1, Tensor.REDUCED, True) for c in order]
            if overlap:
                out += [(Kind.ALLREDUCE, c, -1, -1, Tensor.REDUCED, True) for c in order if last[c] == i]
            out.append(row)
            if not overlap:
                out += [(Kind.ALLREDUCE, c, -1, -1, Tensor.REDUCED, True) for c in order if last[c] == i]
        ranks.append(out)
    return ranks


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_with_collectives_inserts_what_a_rank_by_rank_reference_does(name):
    names = ("kind", "chunk", "micro_batch", "peer", "tensor", "save")
    for K, M, v, overlap in itertools.product((1, 2, 4), (2, 5, 8), (1, 2), (False, True)):
        try:
            schedule = build_schedule(K, M, name, "none", v)
        except Exception:  # noqa: BLE001 (a schedule that does not take these sizes)
            continue
        got = with_collectives(schedule.columns, overlap)
        expected = _reference_with_collectives(schedule.columns, overlap)
        assert np.diff(got.offsets).tolist() == [len(rows) for rows in expected]
        assert got.rank.tolist() == [r for r, rows in enumerate(expected) for _ in rows]
        flat = [row for rows in expected for row in rows]
        for j, n in enumerate(names):
            assert getattr(got, n).tolist() == [row[j] for row in flat], (name, K, M, v, overlap, n)
