"""Expert parallelism in the compiled plan: each MoE block's two all-to-alls a pass (dispatch and
combine), priced over the links the expert group's devices cross."""

from __future__ import annotations

import math
from typing import Sequence

from gpipe_sim.costs.layer_time import layer_seconds
from gpipe_sim.model.experts import routed_rows
from gpipe_sim.costs.gpu_model import StreamWork
from gpipe_sim.hardware.hardware import Hardware
from gpipe_sim.model.model import LayerSpec, TransformerModel
from gpipe_sim.scenario.scenario import Scenario
from gpipe_sim.mesh import node_of

# the schedules that run one micro-batch's forward beside another's backward and hide each one's
# all-to-alls behind the other's compute (DeepSeek-V3's DualPipe, section 3.2.1; DualPipeV its V form)
OVERLAPPING = ("dualpipev",)


def all_to_all_seconds(hardware: Hardware, members: Sequence[int], nbytes: float) -> float:
    """An all-to-all among `members` in which each sends `nbytes` split evenly over all of them
    (its own share stays): the peers in its node receive theirs over `hardware.link`, the others
    over the network (its bandwidth capped by the link's), all at once, so the slower of the two
    sets, plus one latency (the network's where the group spans nodes)."""
    E = len(members)
    if E <= 1:
        return 0.0
    per_node = hardware.devices_per_node
    nodes = {node_of(d, per_node) for d in members}
    same = E // len(nodes)  # devices of the group in a node (Megatron's order spreads them evenly)
    link, net = hardware.link, hardware.network or hardware.link
    inside = (same - 1) * nbytes / E / link.bandwidth
    across = (E - same) * nbytes / E / min(link.bandwidth, net.bandwidth)
    return max(inside, across) + (net.latency_s if len(nodes) > 1 else link.latency_s)


def all_to_all_work(scenario: Scenario, device: int, sizes: Sequence[float], layers: slice = slice(None),
                    own: Sequence[LayerSpec] | None = None) -> list[list[StreamWork]] | None:
    """[layer][size]: the seconds each MoE block's all-to-alls add to its passes on a micro-batch
    of each of `sizes` samples, for the expert group of the rank at `device`: forward the tokens'
    dispatch and combine (each its routed rows x d_model in the training dtype), backward their
    gradients' two, and under `pipeline.remat: full` the forward's again; 0 elsewhere. Under an
    OVERLAPPING schedule each pass's all-to-alls run beside the paired micro-batch's pass of the
    other direction, as DualPipe's authors run them: only what exceeds that pass's compute is
    charged (`own`: the layers of `layers`, to price it; without them nothing is charged: a lower
    bound). Warm-up and cool-down passes have no partner but are priced alike (optimistic).
    None at E = 1 (the experts are all local: their tokens are permuted, not sent)."""
    p, model = scenario.pipeline, scenario.model
    ep = p.expert_parallel
    if ep == 1 or not isinstance(model, TransformerModel):
        return None
    members = scenario.mesh.expert_members(device)
    # each device's own tokens: s / C, and under sequence parallelism 1/T of them (Megatron-LM's
    # MoE with tensor parallelism routes each tensor rank's share: gpipe_sim.model.tensor_parallel.moe_collectives)
    tokens = model.seq_len // p.context_parallel // (p.tensor_parallel if p.sequence_parallel else 1)
    sent = routed_rows(model, tokens) * model.d_model * scenario.training.dtype_bytes
    overlapped = p.schedule_name in OVERLAPPING
    accel, training = scenario.hardware.accelerator, scenario.training

    def work(samples: float, layer: LayerSpec | None) -> StreamWork:
        one = all_to_all_seconds(scenario.hardware, members, sent * samples)
        forward, backward = 2 * one, 2 * one + (2 * one if p.remat == "full" else 0.0)
        if overlapped:
            fwd_s, bwd_s = ((math.inf, math.inf) if layer is None else
                            layer_seconds(layer, int(samples), accel, training.dtype, training.dtype_bytes))
            forward, backward = max(0.0, forward - bwd_s), max(0.0, backward - fwd_s)
        return StreamWork(exposed_forward_s=forward, exposed_backward_s=backward,
                          forward_launches=2, backward_launches=2 + (2 if p.remat == "full" else 0))

    empty = [StreamWork()] * len(sizes)
    index = range(model.layers + 2)[layers]
    return [[work(s, None if own is None else own[j]) for s in sizes]
            if 1 <= i <= model.layers and model.is_moe(i - 1) else empty for j, i in enumerate(index)]


__all__ = ["OVERLAPPING", "all_to_all_seconds", "all_to_all_work"]
