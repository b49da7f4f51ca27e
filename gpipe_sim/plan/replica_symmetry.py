"""Data-parallel replicas timed once where they are alike: the rule, and the links one replica stands for.

D replicas run the same program. Where each replica's devices and links are a relabelling of
replica 0's (the same ranks share a device, the same sends share a link, each hop crosses nodes
alike), no device or pipeline link is shared by two replicas, and every ring all-reduce holds, of
each replica's links, the ones it holds of replica 0's, every replica runs replica 0's times: the
simulator runs replica 0 alone, its all-reduces priced over all D replicas' ring (the same seconds),
holding the ring's links that no other replica's sends use (its own and those only rings share;
`gpipe_sim.plan.costed_program`). Where a runtime's ZeRO-1 buffers give the replicas
different shards (`hardware.host.step_buffers`), or the placement or links make replicas differ,
every replica is simulated. (Exactness: tests/test_replica_symmetry.py compares both paths.)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from gpipe_sim.kept import Kept
from gpipe_sim.plan.links import ring_link_keys, transfer_link_keys
from gpipe_sim.hardware.hardware import Hardware
from gpipe_sim.schedule import Kind, Schedule
from gpipe_sim.scenario.scenario import Scenario
from gpipe_sim.mesh import Mesh, node_of


class ReplicaSymmetry(NamedTuple):
    """Whether the replicas are alike (`alike`; why not in `reason`), and the link keys only other
    replicas' pipeline sends use (`foreign`, distinct and sorted): a replica-0 program's rings leave
    them out."""

    alike: bool
    reason: str
    foreign: np.ndarray


def _differ(reason: str) -> ReplicaSymmetry:
    """Replicas that are not alike, for `reason`."""
    return ReplicaSymmetry(False, reason, np.zeros(0, dtype=np.int64))


def _labels(rows: np.ndarray) -> np.ndarray:
    """Each row's values renamed by order of first occurrence in the row (0, 1, ...): two rows'
    labels are equal exactly when one is a relabelling of the other. All rows at once: a stable
    sort puts each value's first occurrence first among its equals."""
    n = rows.shape[1]
    if n == 0:
        return np.zeros(rows.shape, dtype=np.int64)
    order = np.argsort(rows, axis=1, kind="stable")
    ordered = np.take_along_axis(rows, order, axis=1)
    starts = np.ones(rows.shape, dtype=bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    start = np.maximum.accumulate(np.where(starts, np.arange(n), 0), axis=1)  # each's run's first place
    first = np.empty_like(order)
    np.put_along_axis(first, order, np.take_along_axis(order, start, axis=1), axis=1)  # its value's first index
    rank = np.cumsum(first == np.arange(n), axis=1) - 1  # first occurrences numbered in order
    return np.take_along_axis(rank, first, axis=1)


_KEPT: Kept[ReplicaSymmetry] = Kept(1024)  # the last layouts' answers, by all `_layout_symmetry` reads


def replica_symmetry(scenario: Scenario, schedule: Schedule) -> ReplicaSymmetry:
    """The rule of the module docstring for the scenario's D replicas of `schedule`'s K ranks, in
    array passes of O(D x (K + the rank pairs that exchange messages)) plus each rank's ring of
    links, never building D programs. Kept for the next call with the same network, nodes,
    devices and exchanging rank pairs (the planner's candidates share a few layouts)."""
    p, hardware, mesh = scenario.pipeline, scenario.hardware, scenario.mesh
    D, K = p.data_parallel, schedule.ranks
    if D == 1:
        return _differ("one replica")
    if hardware.host.step_buffers and scenario.training.zero:
        return _differ("ZeRO-1 step buffers differ per replica")
    cols = schedule.columns
    sends = cols.kind == Kind.SEND
    code = np.unique(cols.rank[sends].astype(np.int64) * K + cols.peer[sends])  # the (rank, peer) pairs
    pairs = np.stack([code // K, code % K], axis=1)
    key = (hardware.network, mesh.devices_per_node, mesh.rank_devices, K, code.tobytes())
    return _KEPT.get(key, lambda: _read_only(_layout_symmetry(hardware, mesh, K, pairs)))


def _read_only(symmetry: ReplicaSymmetry) -> ReplicaSymmetry:
    """`symmetry` with its array read-only (it is kept and shared)."""
    symmetry.foreign.flags.writeable = False
    return symmetry


def _layout_symmetry(hardware: Hardware, mesh: Mesh, K: int, pairs: np.ndarray) -> ReplicaSymmetry:
    """`replica_symmetry` for the mesh's replicas of K ranks whose rank pairs `pairs` [pair,
    (sender, receiver)] exchange messages."""
    D = mesh.data_parallel
    dmap = np.asarray(mesh.rank_devices, dtype=np.int64).reshape(D, K)
    devices = _labels(dmap)
    if (devices != devices[0]).any():
        return _differ("the replicas' ranks share devices differently")
    if len(np.unique(dmap)) != D * len(np.unique(dmap[0])):
        return _differ("a device runs ranks of two replicas")
    n_dev, per_node = mesh.device_span, mesh.node_size
    a, b = dmap[:, pairs[:, 0]], dmap[:, pairs[:, 1]]  # [replica, pair]
    keys = np.where(a != b, transfer_link_keys(hardware, a, b, n_dev, per_node), -1)
    between = node_of(a, per_node) != node_of(b, per_node)
    links = _labels(keys)
    if (links != links[0]).any() or (between != between[0]).any():
        return _differ("the replicas' sends share links differently")
    # each replica's links, once each: a link two replicas use counts twice here, once in `used`
    own = np.sort(keys, axis=1)
    distinct = np.ones(own.shape, dtype=bool)
    distinct[:, 1:] = own[:, 1:] != own[:, :-1]
    own = own[distinct & (own >= 0)]
    used = np.unique(own)
    if len(own) != len(used):
        return _differ("a link carries sends of two replicas")
    # the links of a replica's row that one label names are one link (the rows are relabellings), so
    # a ring holds the same of each replica's links exactly when it holds the same places of the rows
    r = _uneven_ring(hardware, dmap, keys, n_dev, per_node)
    if r is not None:
        return _differ(f"rank {r}'s all-reduce ring holds the replicas' links unevenly")
    return ReplicaSymmetry(True, "", np.unique(keys[1:][keys[1:] >= 0]))


def _uneven_ring(hardware: Hardware, dmap: np.ndarray, keys: np.ndarray, n_dev: int, per_node: int) -> int | None:
    """The first pipeline rank whose all-reduce ring (over the replicas' devices `dmap[:, r]`)
    holds the links `keys` [replica, pair] (-1: none) at different places in different replicas'
    rows, or None. Each place's rings (the ranks whose ring holds its link) are looked up in one
    table sorted by link, and compared with replica 0's; only where some differ is each rank's
    ring checked in turn, to name the first."""
    K = dmap.shape[1]
    rings = [np.asarray(ring_link_keys(hardware, dmap[:, r].tolist(), n_dev, per_node), dtype=np.int64)
             for r in range(K)]
    table = np.unique(np.concatenate([ring * K + r for r, ring in enumerate(rings)]))  # by link, then rank
    link, rank = table // K, table % K
    lo, hi = np.searchsorted(link, keys, "left"), np.searchsorted(link, keys, "right")  # -1 holds none
    count = hi - lo
    if (count == count[0]).all():
        column = np.repeat(np.arange(keys.shape[1]), count[0])
        step = np.arange(len(column)) - np.repeat(np.cumsum(count[0]) - count[0], count[0])
        holders = rank[lo[:, column] + step]  # [replica, (place, its k-th ring)]
        if (holders == holders[0]).all():
            return None
    for r, ring in enumerate(rings):
        held = np.isin(keys, ring)
        if (held != held[0]).any():
            return r
    raise AssertionError("a place's rings differ, so some rank's do")  # unreachable
