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
from gpipe_sim.schedule import ACTION_KINDS, Schedule, build_schedule, saves_activations

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
    duration: np.ndarray  # compute seconds (0 for transfers)
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
        return self.scenario.hardware.accelerator.memory_bytes

    def transfer_times(self, src: int, dst: int, micro_batch: int) -> tuple[float, float]:
        """(seconds on the link, latency) to move stage `min(src,dst)`'s output for a micro-batch."""
        if self.device_map[src] == self.device_map[dst]:
            return 0.0, 0.0
        link = self.scenario.hardware.link
        nbytes = self.stages[min(src, dst)].output_bytes[micro_batch]
        return nbytes / link.bandwidth, link.latency_s

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
        by_size = {
            b: [layer_seconds(l, b, accel, dtype, dtype_bytes) for l in own] for b in set(sizes)
        }
        per_mb = [by_size[b] for b in sizes]
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
                state_bytes=float(params * (bpp - dtype_bytes)),
                forward_s=tuple(math.fsum(t[0] for t in mb) for mb in per_mb),
                backward_s=tuple(math.fsum(t[1] for t in mb) for mb in per_mb),
                activation_bytes=tuple(act_per_sample * b for b in sizes),
                input_bytes=tuple(input_per_sample * b for b in sizes),
                output_bytes=tuple(own[-1].output_bytes_per_sample * b for b in sizes),
                update_s=update_seconds(own, accel, dtype_bytes, bpp),
            )
        )
        first += count
    return Plan(scenario, schedule, tuple(layers), tuple(stages), tuple(sizes), device_map)


def _flatten(plan: Plan) -> Program:
    kinds, stage_of, mbs, durs, sers, lats, msgs, links, saves = ([] for _ in range(9))
    remat, M = plan.schedule.remat, plan.schedule.micro_batches
    offsets = [0]
    message_ids: dict[tuple[int, int, str | None, int], int] = {}
    link_ids: dict[tuple[int, int], int] = {}
    link_users: dict[int, set[int]] = {}
    dmap = plan.device_map
    for k, actions in enumerate(plan.schedule.actions):
        sp = plan.stages[k]
        for a in actions:
            code = KIND_CODE[a.kind]
            m = a.micro_batch
            dur = ser = lat = 0.0
            msg = lnk = -1
            if code == FORWARD or code == RECOMPUTE:
                dur = sp.forward_s[m]
            elif code == BACKWARD:
                dur = sp.backward_s[m]
            elif code == UPDATE:
                dur = sp.update_s
            else:
                src, dst = (k, a.peer) if code == SEND else (a.peer, k)
                key = (src, dst, a.tensor, m)
                msg = message_ids.setdefault(key, len(message_ids))
                if code == SEND:
                    ser, lat = plan.transfer_times(src, dst, m)
                    if dmap[src] != dmap[dst]:
                        lnk = link_ids.setdefault((dmap[src], dmap[dst]), len(link_ids))
                        link_users.setdefault(lnk, set()).add(k)
            kinds.append(code)
            stage_of.append(k)
            mbs.append(m)
            durs.append(dur)
            sers.append(ser)
            lats.append(lat)
            msgs.append(msg)
            links.append(lnk)
            saves.append(m < 0 or saves_activations(remat, m, M))
        offsets.append(len(kinds))
    per_device: dict[int, int] = {}
    for d in dmap:
        per_device[d] = per_device.get(d, 0) + 1
    return Program(
        offsets=np.asarray(offsets, dtype=np.int64),
        kind=np.asarray(kinds, dtype=np.int8),
        stage=np.asarray(stage_of, dtype=np.int32),
        micro_batch=np.asarray(mbs, dtype=np.int32),
        duration=np.asarray(durs, dtype=float),
        serialization=np.asarray(sers, dtype=float),
        latency=np.asarray(lats, dtype=float),
        save=np.asarray(saves, dtype=bool),
        message=np.asarray(msgs, dtype=np.int64),
        link=np.asarray(links, dtype=np.int64),
        dedicated=np.asarray([len(link_users[l]) == 1 for l in range(len(link_ids))], dtype=bool),
        shared_device=np.asarray([per_device[d] > 1 for d in dmap], dtype=bool),
        num_messages=len(message_ids),
    )
