"""Data-parallel replicas timed once where they are alike: the rule, and the links one replica stands for.

D replicas run the same program. Where each replica's devices and links are a relabelling of
replica 0's (the same ranks share a device, the same sends share a link, each hop crosses nodes
alike), no device or pipeline link is shared by two replicas, and every ring all-reduce holds, of
each replica's links, the ones it holds of replica 0's, every replica runs replica 0's times: the
simulator runs replica 0 alone, its all-reduces priced over all D replicas' ring (the same seconds),
holding the ring's links that no other replica's sends use (its own and those only rings share;
`gpipe_sim.plan.compile`'s `_collectives`). Where a runtime's ZeRO-1 buffers give the replicas
different shards (`hardware.host.step_buffers`), or the placement or links make replicas differ,
every replica is simulated. (Exactness: tests/test_replica_symmetry.py compares both paths.)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from gpipe_sim.plan.links import ring_link_keys, transfer_link_keys
from gpipe_sim.schedule import Kind, Schedule
from gpipe_sim.scenario.scenario import Scenario
from gpipe_sim.mesh import node_of


class ReplicaSymmetry(NamedTuple):
    """Whether the replicas are alike (`alike`; why not in `reason`), and the link keys only other
    replicas' pipeline sends use (`foreign`): a replica-0 program's rings leave them out."""

    alike: bool
    reason: str
    foreign: frozenset[int]


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


def replica_symmetry(scenario: Scenario, schedule: Schedule) -> ReplicaSymmetry:
    """The rule of the module docstring for the scenario's D replicas of `schedule`'s K ranks, in
    time O(D x (K + the rank pairs that exchange messages)), never building D programs."""
    p, hardware = scenario.pipeline, scenario.hardware
    D, K = p.data_parallel, schedule.ranks
    if D == 1:
        return ReplicaSymmetry(False, "one replica", frozenset())
    if hardware.host.step_buffers and scenario.training.zero:
        return ReplicaSymmetry(False, "ZeRO-1 step buffers differ per replica", frozenset())
    dmap = np.asarray(scenario.mesh.rank_devices, dtype=np.int64).reshape(D, K)
    devices = _labels(dmap)
    if (devices != devices[0]).any():
        return ReplicaSymmetry(False, "the replicas' ranks share devices differently", frozenset())
    if len(np.unique(dmap)) != D * len(np.unique(dmap[0])):
        return ReplicaSymmetry(False, "a device runs ranks of two replicas", frozenset())
    cols = schedule.columns
    sends = cols.kind == Kind.SEND
    pairs = np.unique(np.stack([cols.rank[sends], cols.peer[sends]], axis=1).astype(np.int64), axis=0)
    n_dev = int(dmap.max()) + 1
    per_node = hardware.devices_per_node or n_dev
    a, b = dmap[:, pairs[:, 0]], dmap[:, pairs[:, 1]]  # [replica, pair]
    keys = np.where(a != b, transfer_link_keys(hardware, a, b, n_dev, per_node), -1)
    between = node_of(a, per_node) != node_of(b, per_node)
    links = _labels(keys)
    if (links != links[0]).any() or (between != between[0]).any():
        return ReplicaSymmetry(False, "the replicas' sends share links differently", frozenset())
    used = [set(row[row >= 0].tolist()) for row in keys]
    if sum(len(u) for u in used) != len(set().union(*used)):
        return ReplicaSymmetry(False, "a link carries sends of two replicas", frozenset())
    label = [dict(zip(row.tolist(), lab.tolist())) for row, lab in zip(keys, links)]
    for r in range(K):
        ring = set(ring_link_keys(hardware, dmap[:, r].tolist(), n_dev, per_node))
        held = [frozenset(label[d][k] for k in ring & used[d]) for d in range(D)]
        if any(h != held[0] for h in held):
            return ReplicaSymmetry(False, f"rank {r}'s all-reduce ring holds the replicas' links unevenly", frozenset())
    return ReplicaSymmetry(True, "", frozenset(set().union(*used[1:])))
