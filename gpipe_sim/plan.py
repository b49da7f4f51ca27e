"""The compiled pipeline: a scenario's partition, per-stage costs and the flat program the engines run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from gpipe_sim.costs import layer_seconds, update_seconds
from gpipe_sim.models import build_layers, input_bytes_per_sample
from gpipe_sim.partition import micro_batch_sizes, resolve_partition
from gpipe_sim.scenario import LayerSpec, Scenario
from gpipe_sim.schedule import ACTION_KINDS, Schedule, build_schedule

KIND_CODE = {kind: code for code, kind in enumerate(ACTION_KINDS)}
FORWARD, BACKWARD, RECOMPUTE, SEND, RECV, UPDATE = (KIND_CODE[k] for k in ACTION_KINDS)


@dataclass(frozen=True)
class StagePlan:
    """One stage: its layers, device, static memory and per-micro-batch costs."""

    index: int
    first_layer: int
    last_layer: int
    device: int
    params: int
    param_bytes: float
    state_bytes: float  # gradients, optimizer states and master weights
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    activation_bytes: tuple[float, ...]  # saved for backward, per micro-batch
    input_bytes: tuple[float, ...]  # the stage input, kept per micro-batch under re-materialization
    output_bytes: tuple[float, ...]  # sent to the next stage (and its gradient sent back)
    update_s: float


@dataclass(frozen=True)
class Program:
    """The schedule flattened into arrays: action i of stage k is at `offsets[k] + i`.

    `message[j]` pairs a send with its recv (same id); `link[j]` is the directed link a send uses
    (-1 on the same device); `dedicated[l]` tells whether only one stage sends over link l.
    """

    offsets: np.ndarray
    kind: np.ndarray
    stage: np.ndarray
    micro_batch: np.ndarray
    duration: np.ndarray  # seconds on the stage's own timeline: compute, and host time per transfer
    serialization: np.ndarray  # seconds a send occupies its link
    latency: np.ndarray  # seconds from leaving the link to arrival
    save: np.ndarray  # forward/recompute/backward: the micro-batch's activations were kept
    message: np.ndarray
    link: np.ndarray
    dedicated: np.ndarray
    shared_device: np.ndarray  # per stage: its device runs other stages too
    num_messages: int


@dataclass(frozen=True)
class Plan:
    """Everything the engines and the memory accountant need, computed once from a scenario."""

    scenario: Scenario
    schedule: Schedule
    layers: tuple[LayerSpec, ...]
    stages: tuple[StagePlan, ...]
    micro_batch_sizes: tuple[int, ...]
    device_map: tuple[int, ...]
    num_devices: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_devices", len(set(self.device_map)))

    @property
    def memory_capacity_bytes(self) -> float:
        return self.scenario.hardware.accelerator.usable_memory_bytes

    @cached_property
    def program(self) -> Program:
        return _flatten(self)


def compile_plan(scenario: Scenario) -> Plan:
    """Build the layer table, partition it, cost every stage and micro-batch, build the schedule."""
    p, training, accel = scenario.pipeline, scenario.training, scenario.hardware.accelerator
    dtype, dtype_bytes = training.dtype, training.dtype_bytes
    layers = build_layers(scenario.model, dtype_bytes)
    M = p.effective_micro_batches
    sizes = micro_batch_sizes(p.batch_size, M)
    largest = max(sizes)
    times = [layer_seconds(layer, largest, accel, dtype, dtype_bytes) for layer in layers]
    remat_factor = 0.0 if p.remat == "none" else 1.0
    time_weights = [f * (1 + remat_factor) + b for f, b in times]
    bpp = training.bytes_per_param
    memory_weights = [
        layer.params * bpp + layer.activation_bytes_per_sample * p.batch_size for layer in layers
    ]
    counts = resolve_partition(p.partition, p.stages, time_weights, memory_weights)
    schedule = build_schedule(p.stages, M, p.schedule, p.remat)
    model_input = input_bytes_per_sample(scenario.model, dtype_bytes)
    device_map = scenario.device_map
    stages = []
    first = 0
    for k, count in enumerate(counts):
        own = layers[first : first + count]
        by_size = {}
        for b in set(sizes):
            times_b = [layer_seconds(layer, b, accel, dtype, dtype_bytes) for layer in own]
            by_size[b] = (math.fsum(t[0] for t in times_b), math.fsum(t[1] for t in times_b))
        params = sum(layer.params for layer in own)
        input_per_sample = model_input if k == 0 else layers[first - 1].output_bytes_per_sample
        act_per_sample = sum(layer.activation_bytes_per_sample for layer in own)
        stages.append(
            StagePlan(
                index=k,
                first_layer=first,
                last_layer=first + count - 1,
                device=device_map[k],
                params=params,
                param_bytes=float(params * dtype_bytes),
                state_bytes=float(params * training.state_bytes_per_param),
                forward_s=tuple(by_size[b][0] for b in sizes),
                backward_s=tuple(by_size[b][1] for b in sizes),
                activation_bytes=tuple(act_per_sample * b for b in sizes),
                input_bytes=tuple(input_per_sample * b for b in sizes),
                output_bytes=tuple(own[-1].output_bytes_per_sample * b for b in sizes),
                update_s=update_seconds(own, accel, dtype_bytes, bpp),
            )
        )
        first += count
    return Plan(scenario, schedule, tuple(layers), tuple(stages), tuple(sizes), device_map)


def _flatten(plan: Plan) -> Program:
    """Vectorised: durations, transfer times, message pairing and link ids for every action."""
    c = plan.schedule.columns
    K, M = len(plan.stages), plan.schedule.micro_batches
    st, kind, mb, peer = c.stage, c.kind, c.micro_batch, c.peer
    fwd = np.array([s.forward_s for s in plan.stages])  # [stage, micro_batch]
    bwd = np.array([s.backward_s for s in plan.stages])
    upd = np.array([s.update_s for s in plan.stages])
    out = np.array([s.output_bytes for s in plan.stages])
    mbc = np.clip(mb, 0, M - 1)
    duration = np.zeros(len(kind))
    sel = (kind == FORWARD) | (kind == RECOMPUTE)
    duration[sel] = fwd[st[sel], mbc[sel]]
    sel = kind == BACKWARD
    duration[sel] = bwd[st[sel], mbc[sel]]
    sel = kind == UPDATE
    duration[sel] = upd[st[sel]]
    host = plan.scenario.hardware.host
    duration[(kind == FORWARD) | (kind == RECOMPUTE) | (kind == BACKWARD) | (kind == UPDATE)] += host.action_s
    bytes_moved = np.zeros(len(kind))
    comm = (kind == SEND) | (kind == RECV)
    if comm.any():  # a message carries the output of the lower of its two stages
        lower = np.minimum(st[comm], peer[comm])
        bytes_moved[comm] = out[lower, mbc[comm]]
    copy = bytes_moved / host.copy_bandwidth
    duration[kind == SEND] = host.send_s + copy[kind == SEND]
    duration[kind == RECV] = host.recv_s + copy[kind == RECV]

    is_send, is_recv = kind == SEND, kind == RECV
    comm = is_send | is_recv
    src = np.where(is_send, st, peer).astype(np.int64)
    dst = np.where(is_send, peer, st).astype(np.int64)
    message = np.full(len(kind), -1, dtype=np.int64)
    keys = ((src[comm] * K + dst[comm]) * 2 + c.tensor[comm]) * M + mb[comm]
    unique_keys, message[comm] = np.unique(keys, return_inverse=True)

    dmap = np.asarray(plan.device_map, dtype=np.int64)
    link = np.full(len(kind), -1, dtype=np.int64)
    serialization = np.zeros(len(kind))
    latency = np.zeros(len(kind))
    remote = is_send & (dmap[np.clip(src, 0, K - 1)] != dmap[np.clip(dst, 0, K - 1)])
    n_dev = int(dmap.max()) + 1
    pair = dmap[src[remote]] * n_dev + dmap[dst[remote]]
    pairs, link[remote] = np.unique(pair, return_inverse=True)
    hardware = plan.scenario.hardware
    pair_links = [hardware.link_between(k) for k in range(max(K - 1, 1))]
    bandwidth = np.array([link.bandwidth for link in pair_links])
    pair_latency = np.array([link.latency_s for link in pair_links])
    lower = np.minimum(src[remote], dst[remote])
    serialization[remote] = out[lower, mb[remote]] / bandwidth[lower]
    latency[remote] = pair_latency[lower]
    users = np.unique(np.stack([link[remote], st[remote].astype(np.int64)]), axis=1)
    dedicated = np.bincount(users[0], minlength=len(pairs)) == 1 if users.size else np.ones(0, bool)

    per_device = np.bincount(dmap)
    return Program(
        offsets=c.offsets,
        kind=kind,
        stage=st,
        micro_batch=mb,
        duration=duration,
        serialization=serialization,
        latency=latency,
        save=c.save,
        message=message,
        link=link,
        dedicated=dedicated,
        shared_device=per_device[dmap] > 1,
        num_messages=len(unique_keys),
    )
