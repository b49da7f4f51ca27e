"""Context parallelism as Megatron-LM and torch's context_parallel run it: the sequence split over C
devices, attention's keys and values passed around them in a ring.

Load balancing (Megatron-LM's get_batch_on_this_cp_rank, torch's _RoundRobinLoadBalancer): the
sequence is cut into 2C chunks and device c holds chunks c and 2C-1-c, so every device holds s/C
tokens and does 1/C of the causal attention. Each block's attention runs C steps (Transformer
Engine's AttnFuncWithCPAndKVP2P): step i attends the device's queries to the key/value block that
arrived i hops around the ring, while the next block is sent on (C-1 transfers of K and V forward;
backward K, V and their gradients dK, dV). Each step is half a full s/C x s/C block (step 0 the
causal diagonal, later steps half of the block), so a step costs what causal attention over s/C
tokens costs. Everything outside attention works on the device's s/C tokens alone.
"""

from __future__ import annotations

from typing import Any, Sequence

from gpipe_sim.model.block_shape import BlockShape
from gpipe_sim.model.kernels import Flash, LayerKernels
from gpipe_sim.model.model import LayerSpec, ModelSpec, TableModel, TransformerModel


def context_parallel_problem(model: ModelSpec, cp: int) -> str | None:
    """One line naming the field where `cp` devices cannot split this model's sequence; None where
    they can (always at C = 1). Context parallelism needs the transformer preset with flash
    attention (Megatron-LM runs it through Transformer Engine's fused attention only) and a
    sequence that cuts into 2C equal chunks (whether T x C devices per rank tile the nodes is the
    mesh's to say: gpipe_sim.mesh.layout_problem). A measured layer table runs at the C it was
    profiled at only (its rows are one device's share, the ring inside their times:
    `TableModel.context_parallel`), C = 1 included."""
    if isinstance(model, TableModel):
        if model.context_parallel == cp:
            return None
        return (f"model.context_parallel: the layer table was profiled at context_parallel {model.context_parallel} "
                f"(its rows are one device's share) but pipeline.context_parallel is {cp}; profile it at {cp}")
    if cp == 1:
        return None
    if not isinstance(model, TransformerModel):
        return (f"pipeline.context_parallel: {cp} needs the transformer preset (model.preset is "
                f"{model.preset}): only its sequence is split")
    if model.attention != "flash":
        return (f"model.attention: context parallelism runs flash attention (Megatron-LM's ring is "
                f"Transformer Engine's fused attention); give attention: flash for context_parallel {cp}")
    if model.seq_len % (2 * cp):
        return (f"model.seq_len: {model.seq_len:,} tokens do not cut into {2 * cp} equal chunks "
                f"(2 x pipeline.context_parallel {cp}, two per device for the causal load balance)")
    return None


def local_model(model: ModelSpec, cp: int) -> ModelSpec:
    """The model as one of `cp` context-parallel devices runs everything but attention: a
    transformer on s/C tokens (the model itself at C = 1)."""
    if cp == 1 or not isinstance(model, TransformerModel):
        return model
    return model.model_copy(update={"seq_len": model.seq_len // cp})


def ring_bytes_per_sample(model: TransformerModel, cp: int, tp: int, dtype_bytes: int) -> float:
    """Bytes one ring step sends per sample forward: the device's K and V blocks (s/C tokens of
    its key/value heads); the backward sends these and their gradients, twice as much."""
    b = BlockShape.of(local_model(model, cp), tp)  # type: ignore[arg-type]
    return 2.0 * b.s * b.kv * dtype_bytes


def ring_attention_layers(layers: Sequence[LayerSpec], whole: Sequence[LayerSpec], model: TransformerModel,
                          cp: int, tp: int, dtype_bytes: int, recomputed: bool) -> list[LayerSpec]:
    """`layers`, built on the local model (s/C tokens; `local_model`), as one of `cp` devices runs
    them: each block's attention C ring steps (C times the s/C block's attention FLOPs, and again in
    its backward's re-computation where `recomputed`, per-layer remat), each flash kernel run C
    times (`Flash.steps`), and the ring's receive buffers (two K, V blocks in flight forward, two
    of K, V, dK, dV backward) among its transients. The embedding's parameters are `whole`'s
    (the model on all s tokens: a learned position table holds every position)."""
    b = BlockShape.of(local_model(model, cp), tp)  # type: ignore[arg-type]
    extra = (cp - 1) * 4.0 * b.s * b.s * b.q  # forward attention FLOPs beyond one s/C block
    buffers = 2 * 2 * ring_bytes_per_sample(model, cp, tp, dtype_bytes)
    redo = extra if recomputed else 0.0
    out = list(layers)
    out[0] = layers[0].model_copy(update={name: getattr(whole[0], name) for name in
                                          ("params", "largest_tensor_params", "transient_bytes")})
    for i in range(1, len(layers) - 1):
        block = layers[i]
        out[i] = block.model_copy(update={
            "forward_flops_per_sample": block.forward_flops_per_sample + extra,
            "backward_flops_per_sample": block.backward_flops_per_sample + 2 * extra + redo,
            "backward_input_flops_per_sample": block.backward_input_flops_per_sample + 2 * extra + redo,
            "transient_bytes_per_sample": block.transient_bytes_per_sample + buffers,
            "ops": _ring_kernels(block.ops, cp),
        })
    return out


def _ring_kernels(ops: Any, cp: int) -> Any:
    """A block's kernels with each flash kernel run as `cp` ring steps."""
    if not isinstance(ops, LayerKernels):
        return ops
    steps = lambda ks: tuple(k.with_steps(cp) if isinstance(k, Flash) else k for k in ks)  # noqa: E731
    return LayerKernels(steps(ops.forward), steps(ops.backward), ops.tensors, ops.beside_collectives)


__all__ = ["context_parallel_problem", "local_model", "ring_attention_layers", "ring_bytes_per_sample"]
