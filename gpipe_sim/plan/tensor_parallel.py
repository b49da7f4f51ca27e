"""Tensor parallelism in the compiled plan: each pass's collectives priced on its rank's TP link."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from gpipe_sim.schedule import Kind
from gpipe_sim.spec.hardware import Link
from gpipe_sim.spec.model import TransformerModel
from gpipe_sim.spec.scenario import Scenario
from gpipe_sim.spec.tensor_parallel import collective_seconds, transformer_collectives


def tp_link(scenario: Scenario, device: int) -> tuple[float, float]:
    """(bandwidth, latency) of the ring among the T devices from `device` on: `hardware.link`
    inside a node, `hardware.network` where they span nodes; the bandwidth times the accelerator's
    `gpu.collective_efficiency` (the share of the link its collectives achieve; 1 without tables)."""
    hardware, tp = scenario.hardware, scenario.pipeline.tensor_parallel
    per_node = hardware.devices_per_node
    link: Link = hardware.link
    if per_node is not None and device // per_node != (device + tp - 1) // per_node:
        link = hardware.network or hardware.link
    gpu = hardware.accelerator.gpu
    share = gpu.collective_efficiency if gpu is not None else 1.0
    return link.bandwidth * share, link.latency_s


def with_tensor_parallel(scenario: Scenario, chunks: Sequence[Any], sizes: Sequence[int]) -> list[Any]:
    """The chunks with their tensor-parallel collectives' seconds per micro-batch (`tp_forward_s`,
    `tp_backward_s`) added to their passes: a forward (and so a re-computation) its forward
    collectives, a full backward and a split backward's input pass the backward ones (they reduce
    input gradients). Unchanged at T = 1."""
    p = scenario.pipeline
    tp = p.tensor_parallel
    if tp == 1 or not isinstance(scenario.model, TransformerModel):
        return list(chunks)
    comms = transformer_collectives(scenario.model, tp, p.sequence_parallel, scenario.training.dtype_bytes)
    distinct, size_index = np.unique(np.asarray(sizes, dtype=float), return_inverse=True)
    out = []
    for chunk in chunks:  # priced once per distinct micro-batch size, as compile prices passes
        bandwidth, latency = tp_link(scenario, scenario.device_map[chunk.rank])
        own = comms[chunk.first_layer:chunk.last_layer + 1]
        fwd = tuple(op for c in own for op in c.forward)
        bwd = tuple(op for c in own for op in c.backward)
        tp_f = np.array([collective_seconds(fwd, b, tp, bandwidth, latency) for b in distinct])[size_index]
        tp_b = np.array([collective_seconds(bwd, b, tp, bandwidth, latency) for b in distinct])[size_index]
        out.append(dataclasses.replace(
            chunk, forward_s=chunk.forward_s + tp_f, backward_s=chunk.backward_s + tp_b,
            backward_input_s=chunk.backward_input_s + tp_b, tp_forward_s=tp_f, tp_backward_s=tp_b))
    return out


def rank_tp_comm_seconds(plan: Any) -> list[float]:
    """Per pipeline rank (replica 0): the seconds its passes spend in tensor-parallel collectives
    over the step (forwards and re-computations their forward collectives, full backwards and input
    passes their backward ones)."""
    K = len(plan.ranks)
    if plan.scenario.pipeline.tensor_parallel == 1 or plan.chunks[0].tp_forward_s is None:
        return [0.0] * K
    c = plan.steps.columns
    fwd = np.stack([ch.tp_forward_s for ch in plan.chunks])
    bwd = np.stack([ch.tp_backward_s for ch in plan.chunks])
    seconds = np.zeros(len(c.kind))
    for kinds, table in (((Kind.FORWARD, Kind.RECOMPUTE), fwd), ((Kind.BACKWARD, Kind.BACKWARD_INPUT), bwd)):
        idx = np.flatnonzero(np.isin(c.kind, [int(k) for k in kinds]) & (c.rank < K))
        seconds[idx] = table[c.chunk[idx], c.micro_batch[idx]]
    first = np.flatnonzero(c.rank < K)
    return [float(x) for x in np.bincount(c.rank[first], weights=seconds[first], minlength=K)]


def total_devices(rank_devices: int, tp: int) -> int:
    """Every device of the step: T for each distinct rank device (a rank's T consecutive devices)."""
    return rank_devices * tp


__all__ = ["rank_tp_comm_seconds", "tp_link", "total_devices", "with_tensor_parallel"]
