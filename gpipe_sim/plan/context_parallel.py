"""Context parallelism in the compiled plan: each block's key/value ring priced on its group's link,
overlapped with the attention steps as Transformer Engine's ring attention overlaps it."""

from __future__ import annotations

from typing import Sequence

from gpipe_sim.model.block_shape import BlockShape
from gpipe_sim.model.context_parallel import local_model, ring_bytes_per_sample
from gpipe_sim.costs.gpu_model import StreamWork, flash_seconds
from gpipe_sim.hardware.hardware import Hardware
from gpipe_sim.model.kernels import Flash
from gpipe_sim.mesh import context_members, node_of
from gpipe_sim.model.model import TransformerModel
from gpipe_sim.model.recompute import checkpointed_layers
from gpipe_sim.scenario.scenario import Scenario


def cp_link(hardware: Hardware, tp: int, cp: int, device: int) -> tuple[float, float]:
    """(bandwidth, latency) of a ring step between the context-parallel group's neighbours, for the
    tensor rank at `device`: `hardware.link`'s where the C devices share a node, else the
    network's (capped by the link's): every device sends at once, so the step lasts as long as
    its slowest hop, one that leaves a node. The bandwidth is scaled by the accelerator's
    `gpu.collective_efficiency` as the tensor-parallel collectives' is."""
    members = context_members(device, tp, cp)
    per_node = hardware.devices_per_node
    link = hardware.link
    if len({node_of(d, per_node) for d in members}) == 1:
        bandwidth, latency = link.bandwidth, link.latency_s
    else:
        net = hardware.network or link
        bandwidth, latency = min(link.bandwidth, net.bandwidth), net.latency_s
    gpu = hardware.accelerator.gpu
    return bandwidth * (gpu.collective_efficiency if gpu is not None else 1.0), latency


def exposed_ring_seconds(cp: int, step_s: float, transfer_s: float) -> float:
    """What a ring of `cp` steps adds to its attention: steps 0..C-2 each send the next block while
    computing (max(compute, transfer) each), the last computes alone, so the ring costs
    (C-1) x max(0, transfer - compute) beyond the C steps' compute."""
    return (cp - 1) * max(0.0, transfer_s - step_s)


def ring_work(scenario: Scenario, device: int, sizes: Sequence[float],
              layers: slice = slice(None)) -> list[list[StreamWork]] | None:
    """[layer][size]: what the context-parallel ring adds to each layer of `layers` on a
    micro-batch of each of `sizes` samples (`ring_layer_work` on the scenario's T and C), on the
    ring of the tensor rank at `device`; None at C = 1."""
    p = scenario.pipeline
    return ring_layer_work(scenario, p.tensor_parallel, p.context_parallel, p.remat, device, sizes, layers)


def ring_layer_work(scenario: Scenario, tp: int, cp: int, remat: str, device: int, sizes: Sequence[float],
                    layers: slice = slice(None)) -> list[list[StreamWork]] | None:
    """`ring_work` at these T, C and remat mode (the planner's candidates): per layer and size, the
    exposed ring seconds (`exposed_ring_seconds`, forward and backward) on the ring of the
    tensor rank at `device` (`cp_link`); zero for the embedding and head. A step's compute is one
    s/C block's causal attention (the kernel tables' flash kernel, else its FLOPs at the
    roofline's rate: 4 (s/C)^2 q forward, twice that backward, as the layer table counts them);
    it sends K and V forward, K, V, dK and dV backward, and the last step's dK and dV after the
    last block (exposed). Under `full` or `selective` remat the
    backward runs the forward's ring again first. None at C = 1."""
    training, model = scenario.training, scenario.model
    if cp == 1 or not isinstance(model, TransformerModel):
        return None
    b = BlockShape.of(local_model(model, cp), tp)  # type: ignore[arg-type]
    bandwidth, latency = cp_link(scenario.hardware, tp, cp, device)
    sent = ring_bytes_per_sample(model, cp, tp, training.dtype_bytes)
    accel = scenario.hardware.accelerator
    redo = remat in ("full", "selective")

    def work(samples: float) -> StreamWork:
        if accel.gpu is not None:
            n = int(samples)
            fwd_step = flash_seconds(Flash(b.heads, b.s, b.head_dim), n, training.dtype, accel.peak_flops, accel.gpu)
            bwd_step = flash_seconds(Flash(b.heads, b.s, b.head_dim, backward=True), n, training.dtype,
                                     accel.peak_flops, accel.gpu)
        else:
            fwd_step = 4.0 * b.s * b.s * b.q * samples / (accel.peak_flops_for(training.dtype) * accel.efficiency)
            bwd_step = 2.0 * fwd_step
        forward = exposed_ring_seconds(cp, fwd_step, sent * samples / bandwidth + latency)
        # Each step's dK, dV travel on while the next block computes; the last step's return to
        # their owner after the last block, with nothing to hide behind (Transformer Engine's P2P
        # backward sends them C times, as gpipe_exec.ring_attention does).
        backward = (exposed_ring_seconds(cp, bwd_step, 2.0 * sent * samples / bandwidth + latency)
                    + sent * samples / bandwidth + latency)
        return StreamWork(exposed_forward_s=forward, exposed_backward_s=backward + (forward if redo else 0.0),
                          forward_launches=2 * (cp - 1),
                          backward_launches=2 * (cp - 1) + 1 + (2 * (cp - 1) if redo else 0))

    blocks = set(checkpointed_layers(model))
    per_size = [work(s) for s in sizes]
    empty = [StreamWork()] * len(sizes)
    return [per_size if i in blocks else empty for i in range(model.layers + 2)[layers]]


def combined(*works: list[list[StreamWork]] | None) -> list[list[StreamWork]] | None:
    """Per layer and size, the stream works given summed (the tensor-parallel collectives, the
    context-parallel ring, the experts' all-to-alls); None where none is given."""
    given = [w for w in works if w is not None]
    if not given:
        return None
    return [[sum(cells[1:], cells[0]) for cells in zip(*layer)] for layer in zip(*given)]


__all__ = ["combined", "cp_link", "exposed_ring_seconds", "ring_layer_work", "ring_work"]
