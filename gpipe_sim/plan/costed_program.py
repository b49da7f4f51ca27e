"""The compiled program the engines run: each action of the global program with its seconds, link and group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpipe_sim.plan.buckets import overlap_profiles
from gpipe_sim.plan.distinct import distinct_sorted
from gpipe_sim.plan.links import transfer_link_keys
from gpipe_sim.plan.replicas import data_parallel_groups
from gpipe_sim.schedule import GlobalProgram, Kind


@dataclass(frozen=True)
class Program:
    """The step's global program (`global_program`: its columns and message ids, built once by the
    schedule layer) with what each action costs: action i of global rank g is at `offsets[g] + i`.

    `link[j]` is the directed device-pair link a send uses (-1 on the same device); `dedicated[l]`
    tells whether only one rank sends over link l. Data parallelism: `collective[j]` is the group
    (the chunk) an allreduce action joins (-1 elsewhere); a group's reduction takes
    `group_seconds[g]` once its `group_size` members have started it, over the links
    `group_links[g]`, and posts messages num_messages - C*D + g*D + d (the waits' ids).
    """

    global_program: GlobalProgram
    duration: np.ndarray  # seconds on the rank's own timeline: compute, and host time per transfer
    serialization: np.ndarray  # seconds a send occupies its link
    latency: np.ndarray  # seconds from leaving the link to arrival
    link: np.ndarray
    dedicated: np.ndarray
    shared_device: np.ndarray  # per global rank: its device runs other ranks too
    collective: np.ndarray
    group_seconds: np.ndarray
    group_links: list[np.ndarray]
    group_size: int

    # the columns, as the engines read them
    offsets = property(lambda self: self.global_program.columns.offsets)
    kind = property(lambda self: self.global_program.columns.kind)
    rank = property(lambda self: self.global_program.columns.rank)
    chunk = property(lambda self: self.global_program.columns.chunk)
    micro_batch = property(lambda self: self.global_program.columns.micro_batch)
    save = property(lambda self: self.global_program.columns.save)  # passes: the forward kept the activations
    peer = property(lambda self: self.global_program.columns.peer)  # transfers: the other global rank
    tensor = property(lambda self: self.global_program.columns.tensor)  # transfers: a Tensor code (-1 elsewhere)
    message = property(lambda self: self.global_program.message)  # a send and its recv share an id
    num_messages = property(lambda self: self.global_program.num_messages)


def _expert_params(plan: Any) -> list[int]:
    """Per chunk, its layers' routed experts' parameters (gpipe_sim.model.experts)."""
    return [sum(layer.expert_params for layer in plan.layers[ch.first_layer:ch.last_layer + 1]) for ch in plan.chunks]


def costed_program(plan: Any) -> Program:
    """Vectorised: durations, transfer times and link ids for every action of the global program of
    `plan` (a gpipe_sim.plan.compile.Plan; each step works on the index array of the actions it concerns).

    Links: a directed device pair within a node (`hardware.link`, or `links[r]` between ranks r
    and r+1), or the sender's network port (its own or its node's NIC: `Hardware.network_ports`).
    """
    gp, mesh = plan.global_program, plan.mesh
    D, K, C = plan.replicas, len(plan.ranks), len(plan.chunks)
    G = plan.num_ranks  # the ranks the program holds
    c = gp.columns
    out = np.stack([ch.output_bytes for ch in plan.chunks])  # [chunk, micro-batch]
    duration = _durations(plan, out)
    sends = np.flatnonzero(c.kind == Kind.SEND)
    remote, senders, serialization, latency, link_key = _transfers(plan, sends, out)

    # replica 0 alone: other replicas' links
    foreign = plan.symmetry.foreign if G < D * K else None
    collective, group_links, group_seconds = data_parallel_groups(
        plan.scenario, c, [ch.rank for ch in plan.chunks], [ch.params for ch in plan.chunks], foreign,
        overlap_profiles(plan, c.kind, c.chunk, c.micro_batch, duration), _expert_params(plan))
    users_key = np.concatenate([link_key, group_links[:, 1]])
    users_who = np.concatenate([senders, G + group_links[:, 0]])  # a collective is a sender of its own
    keys_all, inverse = np.unique(users_key, return_inverse=True)
    link = np.full(len(c.kind), -1, dtype=np.int64)
    link[remote] = inverse[: len(remote)]
    group_link_ids = inverse[len(remote):]
    pairs = distinct_sorted(inverse * (G + C + 1) + users_who)
    dedicated = np.bincount(pairs // (G + C + 1), minlength=len(keys_all)) == 1
    dmap = np.asarray(mesh.rank_devices, dtype=np.int64)
    per_device = np.bincount(dmap)
    bounds = np.searchsorted(group_links[:, 0], np.arange(1, len(group_seconds)))  # rows come in group order
    return Program(
        global_program=gp,
        duration=duration,
        serialization=serialization,
        latency=latency,
        link=link,
        dedicated=dedicated,
        shared_device=per_device[dmap[:G]] > 1,
        collective=collective,
        group_seconds=group_seconds,
        group_links=np.split(group_link_ids, bounds) if len(group_seconds) else [],
        group_size=G // K,
    )


# per Kind code: the row of a chunk's [pass, micro-batch] seconds a compute action reads (-1: none)
_PASS_ROW = np.full(len(Kind), -1, dtype=np.int64)
_PASS_ROW[[Kind.FORWARD, Kind.RECOMPUTE, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT]] = [0, 0, 1, 2, 3]


def _durations(plan: Any, out: np.ndarray) -> np.ndarray:
    """Seconds of every action on its rank's own timeline: a pass's (its chunk's, on its
    micro-batch), an update's (its rank's), a transfer's host time (of its boundary chunk's output
    `out` [chunk, micro-batch]), each compute action with the host's `action_s`; 0 elsewhere."""
    gp = plan.global_program
    c, host, M = gp.columns, plan.scenario.hardware.host, plan.schedule.micro_batches
    kind, mb = c.kind, c.micro_batch
    table = np.array([(ch.forward_s, ch.backward_s, ch.backward_input_s, ch.backward_weight_s)
                      for ch in plan.chunks])  # [chunk, pass row, micro-batch]
    row = _PASS_ROW[kind]
    passes = np.flatnonzero(row >= 0)
    duration = np.zeros(len(kind))
    duration[passes] = table[c.chunk[passes], row[passes], mb[passes]] + host.action_s
    updates = np.flatnonzero(kind == Kind.UPDATE)
    update_s = np.array([r.update_s for r in plan.ranks])
    duration[updates] = update_s[plan.mesh.pipeline_rank(c.rank[updates])] + host.action_s
    keys = gp.keys  # a point-to-point transfer's key in its replica (-1 elsewhere: not a send or receive)
    transfers = np.flatnonzero(keys >= 0)
    nbytes = out[keys[transfers] // M // 2, mb[transfers]]  # a message carries its boundary chunk's output
    duration[transfers] = np.where(kind[transfers] == Kind.SEND, host.send_seconds(nbytes), host.recv_seconds(nbytes))
    return duration


def _transfers(plan: Any, sends: np.ndarray, out: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(the `sends` between two devices, their sending ranks, each action's seconds on its link and
    latency (0 but on those sends), those sends' link keys (gpipe_sim.plan.links)): hardware.links[r]
    joins ranks r and r+1 (both directions), any other pair in a node uses hardware.link, and a send
    between nodes the network."""
    gp, mesh, hardware = plan.global_program, plan.mesh, plan.scenario.hardware
    c, keys, M = gp.columns, gp.keys, plan.schedule.micro_batches
    dmap = np.asarray(mesh.rank_devices, dtype=np.int64)
    src, dst = c.rank[sends].astype(np.int64), c.peer[sends].astype(np.int64)
    a, b = dmap[src], dmap[dst]
    apart = a != b
    remote, s, d, a, b = sends[apart], src[apart], dst[apart], a[apart], b[apart]
    between = mesh.node(a) != mesh.node(b)
    pair_links = ([hardware.link_between(r) for r in range(max(len(plan.ranks) - 1, 1))]
                  + [hardware.link, hardware.network or hardware.link])
    bandwidth = np.array([ln.bandwidth for ln in pair_links])
    pair_latency = np.array([ln.latency_s for ln in pair_links])
    s_r, d_r = mesh.pipeline_rank(s), mesh.pipeline_rank(d)
    which = np.where(np.abs(s_r - d_r) == 1, np.minimum(s_r, d_r), len(pair_links) - 2)
    which = np.where(between, len(pair_links) - 1, which)
    serialization, latency = np.zeros(len(c.kind)), np.zeros(len(c.kind))
    serialization[remote] = out[keys[remote] // M // 2, c.micro_batch[remote]] / bandwidth[which]
    latency[remote] = pair_latency[which]
    return remote, s, serialization, latency, transfer_link_keys(hardware, a, b, mesh.device_span, mesh.node_size)


__all__ = ["Program", "costed_program"]
