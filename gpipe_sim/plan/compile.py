"""The compiled pipeline: a scenario's partition into chunks, their placement on ranks and devices,
their costs, and the flat program the engines run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from gpipe_sim.plan.partition import micro_batch_sizes, resolve_partition
from gpipe_sim.results.result import Layout
from gpipe_sim.schedule import SCHEDULES, Kind, Schedule, build_schedule
from gpipe_sim.schedule.registry import fill_drain_bubble
from gpipe_sim.spec.costs import BACKWARD_INPUT_SHARE, layer_seconds, update_seconds
from gpipe_sim.spec.layers import build_layers, input_bytes_per_sample
from gpipe_sim.spec.model import LayerSpec
from gpipe_sim.spec.scenario import Scenario

FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT = (int(k) for k in (
    Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT))
RECOMPUTE, SEND, RECV, UPDATE = (int(k) for k in (Kind.RECOMPUTE, Kind.SEND, Kind.RECV, Kind.UPDATE))
COMPUTE_CODES = np.array([FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, RECOMPUTE, UPDATE])


@dataclass(frozen=True)
class ChunkPlan:
    """One model chunk: its layers, rank, static memory and per-micro-batch costs."""

    index: int
    rank: int
    first_layer: int
    last_layer: int
    params: int
    param_bytes: float
    state_bytes: float  # gradients, optimizer states and master weights
    # per micro-batch (NumPy arrays of length M):
    forward_s: np.ndarray
    backward_s: np.ndarray
    backward_input_s: np.ndarray
    backward_weight_s: np.ndarray
    activation_bytes: np.ndarray  # saved for backward
    input_bytes: np.ndarray  # the chunk input, kept under re-materialization
    output_bytes: np.ndarray  # sent to the next chunk (and its gradient sent back)
    update_s: float

    @property
    def layer_count(self) -> int:
        return self.last_layer - self.first_layer + 1


@dataclass(frozen=True)
class RankPlan:
    """One pipeline rank: the device it runs on and the chunks it holds."""

    index: int
    device: int
    chunks: tuple[int, ...]
    param_bytes: float
    state_bytes: float
    update_s: float


@dataclass(frozen=True)
class Program:
    """The programs flattened into arrays: action i of rank r is at `offsets[r] + i`.

    `message[j]` pairs a send with its recv (same id); `link[j]` is the directed device-pair link
    a send uses (-1 on the same device); `dedicated[l]` tells whether only one rank sends over link l.
    """

    offsets: np.ndarray
    kind: np.ndarray
    rank: np.ndarray
    chunk: np.ndarray
    micro_batch: np.ndarray
    duration: np.ndarray  # seconds on the rank's own timeline: compute, and host time per transfer
    serialization: np.ndarray  # seconds a send occupies its link
    latency: np.ndarray  # seconds from leaving the link to arrival
    save: np.ndarray  # compute passes: the micro-batch's activations were kept by its forward
    message: np.ndarray
    link: np.ndarray
    dedicated: np.ndarray
    shared_device: np.ndarray  # per rank: its device runs other ranks too
    num_messages: int


@dataclass(frozen=True)
class Plan:
    """Everything the engines and the memory accountant need, computed once from a scenario."""

    scenario: Scenario
    schedule: Schedule
    layers: tuple[LayerSpec, ...]
    chunks: tuple[ChunkPlan, ...]
    ranks: tuple[RankPlan, ...]
    micro_batch_sizes: tuple[int, ...]
    device_map: tuple[int, ...]  # per rank
    num_devices: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_devices", len(set(self.device_map)))

    @property
    def memory_capacity_bytes(self) -> float:
        return self.scenario.hardware.accelerator.usable_memory_bytes

    @property
    def layer_counts(self) -> list[int]:
        """Layers per chunk, in model order: the partition written out."""
        return [c.layer_count for c in self.chunks]

    @property
    def layout(self) -> Layout:
        """Each chunk's layers and rank and each rank's device, as a Result records them."""
        return Layout(tuple((c.first_layer, c.last_layer) for c in self.chunks),
                      tuple(c.rank for c in self.chunks), self.device_map)

    @property
    def analytic_bubble_fraction(self) -> float:
        """The schedule family's textbook bubble for this K, M and v (fill-drain's if unregistered)."""
        s = self.schedule
        family = SCHEDULES.get(s.name)
        bubble = family.analytic_bubble if family is not None else fill_drain_bubble
        return bubble(s.ranks, s.micro_batches, s.chunks)

    @cached_property
    def program(self) -> Program:
        return _flatten(self)


def compile_plan(scenario: Scenario) -> Plan:
    """Build the layer table, partition it into K*v chunks, place and cost them, build the programs."""
    p, training, accel = scenario.pipeline, scenario.training, scenario.hardware.accelerator
    dtype, dtype_bytes = training.dtype, training.dtype_bytes
    layers = build_layers(scenario.model, dtype_bytes)
    M = p.micro_batches
    sizes = micro_batch_sizes(p.batch_size, M)
    largest = max(sizes)
    times = [layer_seconds(layer, largest, accel, dtype, dtype_bytes) for layer in layers]
    remat_factor = 0.0 if p.remat == "none" else 1.0
    time_weights = [f * (1 + remat_factor) + b for f, b in times]
    bpp = training.bytes_per_param
    memory_weights = [
        layer.params * bpp + layer.activation_bytes_per_sample * p.batch_size for layer in layers
    ]
    schedule = build_schedule(p.stages, M, p.schedule, p.remat, p.chunks)
    counts = resolve_partition(p.partition, schedule.num_chunks, time_weights, memory_weights)
    model_input = input_bytes_per_sample(scenario.model, dtype_bytes)
    distinct, size_index = np.unique(sizes, return_inverse=True)
    distinct = distinct.tolist()
    samples = np.asarray(sizes, dtype=float)
    chunks = []
    first = 0
    for c, count in enumerate(counts):
        own = layers[first : first + count]
        per_size = np.array([
            [math.fsum(t[i] for t in (layer_seconds(layer, b, accel, dtype, dtype_bytes) for layer in own))
             for i in (0, 1)]
            for b in distinct
        ])[size_index]  # [micro-batch, (forward, backward)]
        params = sum(layer.params for layer in own)
        input_per_sample = model_input if c == 0 else layers[first - 1].output_bytes_per_sample
        act_per_sample = sum(layer.activation_bytes_per_sample for layer in own)
        backward = per_size[:, 1]
        chunks.append(
            ChunkPlan(
                index=c,
                rank=schedule.placement[c],
                first_layer=first,
                last_layer=first + count - 1,
                params=params,
                param_bytes=float(params * dtype_bytes),
                state_bytes=float(params * training.state_bytes_per_param),
                forward_s=per_size[:, 0].copy(),
                backward_s=backward.copy(),
                backward_input_s=backward * BACKWARD_INPUT_SHARE,
                backward_weight_s=backward * (1 - BACKWARD_INPUT_SHARE),
                activation_bytes=act_per_sample * samples,
                input_bytes=input_per_sample * samples,
                output_bytes=own[-1].output_bytes_per_sample * samples,
                update_s=update_seconds(own, accel, dtype_bytes, bpp),
            )
        )
        first += count
    device_map = scenario.device_map
    ranks = []
    for r in range(p.stages):
        mine = schedule.chunks_of(r)
        ranks.append(RankPlan(
            index=r, device=device_map[r], chunks=mine,
            param_bytes=math.fsum(chunks[c].param_bytes for c in mine),
            state_bytes=math.fsum(chunks[c].state_bytes for c in mine),
            update_s=math.fsum(chunks[c].update_s for c in mine),
        ))
    return Plan(scenario, schedule, tuple(layers), tuple(chunks), tuple(ranks), tuple(sizes), device_map)


def _flatten(plan: Plan) -> Program:
    """Vectorised: durations, transfer times, message pairing and link ids for every action
    (each step works on the index array of the actions it concerns, not on the whole program)."""
    c = plan.schedule.columns
    K, M, C = len(plan.ranks), plan.schedule.micro_batches, len(plan.chunks)
    rank, kind, chunk, mb, peer = c.rank, c.kind, c.chunk, c.micro_batch, c.peer
    host = plan.scenario.hardware.host
    # [pass kind, chunk, micro-batch] seconds; row k of `table` serves Kind code `rows[k]`
    rows = np.full(int(max(COMPUTE_CODES)) + 1, -1)
    table = np.stack([np.stack([getattr(ch, name) for ch in plan.chunks]) for name in
                      ("forward_s", "forward_s", "backward_s", "backward_input_s", "backward_weight_s")])
    rows[[FORWARD, RECOMPUTE, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT]] = np.arange(5)
    duration = np.zeros(len(kind))
    passes = np.flatnonzero(rows[np.minimum(kind, len(rows) - 1)] >= 0)
    duration[passes] = table[rows[kind[passes]], chunk[passes], mb[passes]] + host.action_s
    updates = np.flatnonzero(kind == UPDATE)
    duration[updates] = np.array([r.update_s for r in plan.ranks])[rank[updates]] + host.action_s

    keys = c.message_keys(M)
    message = keys  # dense ids: boundary, tensor and micro-batch (-1: not a transfer)
    num_messages = max(C - 1, 1) * 2 * M
    sends, recvs = np.flatnonzero(kind == SEND), np.flatnonzero(kind == RECV)
    out = np.stack([ch.output_bytes for ch in plan.chunks])  # [chunk, micro-batch]
    for idx, fixed in ((sends, host.send_s), (recvs, host.recv_s)):
        moved = out[keys[idx] // M // 2, mb[idx]]  # a message carries its boundary chunk's output
        duration[idx] = fixed + moved / host.copy_bandwidth

    dmap = np.asarray(plan.device_map, dtype=np.int64)
    link = np.full(len(kind), -1, dtype=np.int64)
    serialization = np.zeros(len(kind))
    latency = np.zeros(len(kind))
    src, dst = rank[sends].astype(np.int64), peer[sends].astype(np.int64)
    apart = dmap[src] != dmap[dst]
    remote, s, d = sends[apart], src[apart], dst[apart]
    n_dev = int(dmap.max()) + 1
    pairs, link[remote] = np.unique(dmap[s] * n_dev + dmap[d], return_inverse=True)
    # hardware.links[r] joins ranks r and r+1 (both directions); any other pair uses hardware.link
    hardware = plan.scenario.hardware
    pair_links = [hardware.link_between(r) for r in range(max(K - 1, 1))] + [hardware.link]
    bandwidth = np.array([ln.bandwidth for ln in pair_links])
    pair_latency = np.array([ln.latency_s for ln in pair_links])
    which = np.where(np.abs(s - d) == 1, np.minimum(s, d), len(pair_links) - 1)
    serialization[remote] = out[keys[remote] // M // 2, mb[remote]] / bandwidth[which]
    latency[remote] = pair_latency[which]
    users = np.unique(link[remote] * K + s)  # (link, sending rank) pairs
    dedicated = np.bincount(users // K, minlength=len(pairs)) == 1

    per_device = np.bincount(dmap)
    return Program(
        offsets=c.offsets,
        kind=kind,
        rank=rank,
        chunk=chunk,
        micro_batch=mb,
        duration=duration,
        serialization=serialization,
        latency=latency,
        save=c.save,
        message=message,
        link=link,
        dedicated=dedicated,
        shared_device=per_device[dmap] > 1,
        num_messages=num_messages,
    )
