"""Tensor parallelism in the compiled plan: each pass's collectives priced on its rank's TP link."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from gpipe_sim.costs.content_tokens import ContentTokens
from gpipe_sim.schedule import Kind
from gpipe_sim.model.context_parallel import local_model
from gpipe_sim.costs.gpu_model import StreamWork
from gpipe_sim.hardware.hardware import Hardware
from gpipe_sim.model.model import TransformerModel
from gpipe_sim.model.recompute import recompute_collectives
from gpipe_sim.scenario.scenario import Scenario
from gpipe_sim.costs.collectives import collective_seconds
from gpipe_sim.model.tensor_parallel import Collectives, transformer_collectives
from gpipe_sim.mesh import node_of, tensor_members


def tp_ring(hardware: Hardware, tp: int, device: int) -> tuple[float, float]:
    """(bandwidth, mean latency per step) of the ring among the `tp` devices from `device` on, as
    NCCL runs it. In one node: `link`'s. Over n nodes: NCCL's channels spread the ring's hops
    between nodes over the NICs the group's devices send through (`network_ports`), so the ring
    runs at the least of `link`'s bandwidth and those NICs' together (in the node with fewest);
    its latency is NCCL's ring model (src/graph/tuning.cc): of an all-reduce's 2(T-1) steps,
    2(n-1) cross the network at its latency and the rest `link`'s, given here as their mean."""
    per_node = hardware.devices_per_node
    link = hardware.link
    members = np.asarray(tensor_members(device, tp), dtype=np.int64)
    nodes = node_of(members, per_node)
    n = len(np.unique(nodes))
    if n == 1:
        return link.bandwidth, link.latency_s
    net = hardware.network or link
    ports = hardware.network_ports(members, per_node)
    nics = min(len(np.unique(ports[nodes == node])) for node in np.unique(nodes))
    latency = ((tp - n) * link.latency_s + (n - 1) * net.latency_s) / (tp - 1)
    return min(link.bandwidth, nics * net.bandwidth), latency


def tp_link(scenario: Scenario, device: int) -> tuple[float, float]:
    """(bandwidth, latency) of the collectives of the rank at `device`: its ring's (`tp_ring`),
    the bandwidth times the accelerator's `gpu.collective_efficiency` (the share of the link its
    collectives achieve; 1 without tables)."""
    hardware = scenario.hardware
    bandwidth, latency = tp_ring(hardware, scenario.pipeline.tensor_parallel, device)
    gpu = hardware.accelerator.gpu
    share = gpu.collective_efficiency if gpu is not None else 1.0
    return bandwidth * share, latency


def collective_work(scenario: Scenario, device: int, sizes: Sequence[float],
                    layers: slice = slice(None)) -> list[list[StreamWork]] | None:
    """[layer][size]: the tensor-parallel collectives of the passes of each layer of `layers` on a
    micro-batch of each of `sizes` samples, on the TP link of the rank at `device` (`tp_link`):
    a forward (and so a re-computation) its forward collectives, a backward (a split backward's
    input pass) its backward ones (under `pipeline.remat: full` its forward's first:
    `recompute_collectives`), one launch each. None at T = 1 and for models other than the
    transformer preset (a measured table's passes hold their collectives)."""
    p = scenario.pipeline
    tp = p.tensor_parallel
    if tp == 1 or not isinstance(scenario.model, TransformerModel):
        return None
    comms, made = _layer_collectives(scenario)
    bandwidth, latency = tp_link(scenario, device)
    out = []
    for i in range(len(comms))[layers]:
        row = []
        for b in sizes:
            work = made.get((i, b, bandwidth, latency))
            if work is None:
                work = made[(i, b, bandwidth, latency)] = stream_work(comms[i], b, tp, bandwidth, latency)
            row.append(work)
        out.append(row)
    return out


# Each model's per-layer collectives by what they depend on (`_layer_collectives`), with the
# stream work made of them: the planner asks for every chunk of a thousand candidates.
_MODELS: ContentTokens[TransformerModel] = ContentTokens(lambda model: model.model_dump_json(), size=64)
_COLLECTIVES: dict[tuple[Any, ...], tuple[list[Collectives], dict[tuple[Any, ...], StreamWork]]] = {}
_COLLECTIVES_SIZE = 64
_WORKS_SIZE = 1 << 16


def _layer_collectives(scenario: Scenario) -> tuple[list[Collectives], dict[tuple[Any, ...], StreamWork]]:
    """The scenario's per-layer collectives (`recompute_collectives` of `transformer_collectives`
    on one context-parallel rank's tokens), and the stream work already made of them by (layer,
    samples, bandwidth, latency): once per (model, T, C, sequence parallelism, dtype, remat)."""
    p = scenario.pipeline
    key = (_MODELS(scenario.model), p.tensor_parallel, p.context_parallel, p.sequence_parallel,
           scenario.training.dtype_bytes, p.remat)
    got = _COLLECTIVES.get(key)
    if got is None or len(got[1]) >= _WORKS_SIZE:
        model = local_model(scenario.model, p.context_parallel)  # the tokens of one context-parallel rank
        comms = recompute_collectives(transformer_collectives(model, p.tensor_parallel, p.sequence_parallel,
                                                              scenario.training.dtype_bytes), scenario.model, p.remat)
        if len(_COLLECTIVES) >= _COLLECTIVES_SIZE:
            _COLLECTIVES.pop(next(iter(_COLLECTIVES)), None)
        got = _COLLECTIVES[key] = (comms, {})
    return got


def stream_work(c: Collectives, samples: float, tp: int, bandwidth: float, latency_s: float) -> StreamWork:
    """One layer's collectives `c` on a micro-batch of `samples`, as work on the GPU's stream: ring
    collectives among `tp` devices (`collective_seconds`), one launch each."""
    return StreamWork(collective_seconds(c.forward, samples, tp, bandwidth, latency_s),
                      collective_seconds(c.backward, samples, tp, bandwidth, latency_s),
                      len(c.forward), len(c.backward))


def action_tp_seconds(plan: Any) -> np.ndarray:
    """Per action of the plan's program (every replica, in program order): the seconds the
    tensor-parallel collectives add to it (forwards and re-computations their chunk's forward
    collectives on that micro-batch, full backwards and input passes its backward ones), past
    what the host's issue and the weight-gradient GEMMs hide; 0 for every other kind, and for
    every action at T = 1 or where the plan prices no collectives (a measured table's passes)."""
    c = plan.global_program.columns
    seconds = np.zeros(len(c.kind))
    if plan.scenario.pipeline.tensor_parallel == 1 or plan.chunks[0].tp_forward_s is None:
        return seconds
    fwd = np.stack([ch.tp_forward_s for ch in plan.chunks])
    bwd = np.stack([ch.tp_backward_s for ch in plan.chunks])
    for kinds, table in (((Kind.FORWARD, Kind.RECOMPUTE), fwd), ((Kind.BACKWARD, Kind.BACKWARD_INPUT), bwd)):
        idx = np.flatnonzero(np.isin(c.kind, [int(k) for k in kinds]))
        seconds[idx] = table[c.chunk[idx], c.micro_batch[idx]]
    return seconds


def rank_tp_comm_seconds(plan: Any, per_action: np.ndarray | None = None) -> list[float]:
    """Per pipeline rank (replica 0): the seconds the tensor-parallel collectives add to its passes
    over the step, `action_tp_seconds` summed over its actions (all 0 at T = 1); `per_action`:
    that column, where already computed (a simulated timeline's `tp_s`)."""
    K = len(plan.ranks)
    c = plan.global_program.columns
    first = np.flatnonzero(c.rank < K)
    seconds = action_tp_seconds(plan) if per_action is None else per_action
    return [float(x) for x in np.bincount(c.rank[first], weights=seconds[first], minlength=K)]


__all__ = ["action_tp_seconds", "collective_work", "rank_tp_comm_seconds", "stream_work", "tp_link", "tp_ring"]
