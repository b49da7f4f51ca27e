"""Per-layer activation recomputation (`pipeline.remat: full | selective`) as the layer table runs it.

`full` is Megatron-LM's `--recompute-granularity full --recompute-method uniform
--recompute-num-layers 1` and torchtitan's activation checkpointing mode `full`: every transformer
block is checkpointed on its own. Its forward keeps only the block's input; before the block's
backward its forward runs again (its tensor-parallel collectives too), so one block's activations
are live at a time. The embedding and the head are not checkpointed.

`selective` is Megatron-LM's `--recompute-granularity selective` (`--recompute-activations`): the
attention core (`DotProductAttention`: Q K^T, scale + mask + softmax, dropout, the product with V)
runs under a checkpoint. Its inputs Q, K, V are kept (the core's products keep them anyway) and its
output is kept by the projection; what the core alone keeps (standard attention: the softmax's
probabilities, the dropout's mask and the dropped-out probabilities, Korthikanti et al. 2022's
5as^2b; flash: the fp32 log-sum-exp) is not, and the core's forward runs again in the backward.

Both keep the schedule's forwards "saved" (no whole-chunk re-computation): what they change is
each block's figures, rewritten here so that every consumer (memory accounting, pass times, the
partitions, the planner's bounds) reads the same table.
"""

from __future__ import annotations

from typing import Sequence

from gpipe_sim.model.kernels import Flash, Gemm, LayerKernels, MemOp, Softmax
from gpipe_sim.model.model import LayerSpec, ModelSpec, TransformerModel
from gpipe_sim.model.tensor_parallel import Collectives

PER_LAYER_REMAT = ("full", "selective")
# The attention core's forward kernels by their names in `kernels.transformer_block` (with the
# `Flash` and `Softmax` kernels, which have none).
_CORE_KERNELS = ("scores", "mask+softmax", "attn.dropout", "context")


def per_layer(remat: str) -> bool:
    """Whether `remat` checkpoints layers one by one (`full`, `selective`) rather than whole chunks."""
    return remat in PER_LAYER_REMAT


def remat_problem(model: ModelSpec, remat: str) -> str | None:
    """One line naming `pipeline.remat` where the model has no transformer blocks to checkpoint."""
    if per_layer(remat) and not isinstance(model, TransformerModel):
        return (f"pipeline.remat: {remat} checkpoints a transformer's blocks (Megatron-LM, torchtitan); "
                f"model.preset {model.preset} has none (use none, except_last or always)")
    return None


def checkpointed_layers(model: TransformerModel) -> range:
    """Indices of the layers `full` and `selective` checkpoint: the blocks (the embedding is
    layer 0, the head the last)."""
    return range(1, model.layers + 1)


def attention_core_bytes_per_token(model: TransformerModel, p: int, mask: int) -> float:
    """Bytes a token's attention core keeps for backward on one device beside its inputs and its
    output, summed over the device's heads x T (callers divide by T): standard attention's
    probabilities (`p` a score), with dropout its mask (`mask`) and the dropped-out copy (`p`);
    flash's fp32 log-sum-exp per head."""
    a, s = model.heads, model.seq_len
    if model.attention == "flash":
        return 4.0 * a
    return float(a * s * (p + (p + mask if mask else 0)))


def recompute_layers(layers: Sequence[LayerSpec], model: ModelSpec, remat: str, tensor_parallel: int,
                     selective: tuple[float, float] = (0.0, 0.0)) -> list[LayerSpec]:
    """The layer table under `remat`: unchanged unless per-layer (`full`, `selective`); then each
    block keeps less (`activation_bytes_per_sample`), re-makes the rest before its backward
    (`recompute_bytes_per_sample`; under `selective` only once its backward has freed what it
    keeps after the core: `freed_before_recompute_bytes_per_sample`) and its backward runs the
    recomputed forward's kernels and FLOPs first. `selective`: per token, what a block no
    longer keeps under `selective` and what it keeps after its core (`layers.selective_bytes_per_token`)."""
    if not per_layer(remat) or not isinstance(model, TransformerModel):
        return list(layers)
    out = list(layers)
    s = model.seq_len
    dropped, after = selective
    for i in checkpointed_layers(model):
        block = layers[i]
        if remat == "full":  # re-made as the block's backward starts
            kept = layers[i - 1].output_bytes_per_sample  # the block's input
            out[i] = _recomputed(block, kept, block.forward_flops_per_sample or 0.0,
                                 block.ops.forward if isinstance(block.ops, LayerKernels) else (), 0.0)
            continue
        # the core re-made once the block's backward has freed what it keeps after the core
        kept = block.activation_bytes_per_sample - s * dropped
        redo_flops = 4.0 * s * s * model.d_model / tensor_parallel  # Q K^T and P V
        out[i] = _recomputed(block, kept, redo_flops, _core_kernels(block.ops),
                             block.saved_with_previous_bytes_per_sample).model_copy(
            update={"freed_before_recompute_bytes_per_sample": min(s * after, kept)})
    return out


def recompute_peak_bytes(layer: LayerSpec) -> float:
    """Per sample, what a layer's per-layer recomputation adds to its backward's transient: the
    bytes it re-makes less those its backward has freed before re-making them, at least 0."""
    return max(layer.recompute_bytes_per_sample - layer.freed_before_recompute_bytes_per_sample, 0.0)


def recompute_collectives(comms: Sequence[Collectives], model: TransformerModel, remat: str) -> list[Collectives]:
    """Per layer, its tensor-parallel collectives under `remat`: under `full` a block's backward
    runs its forward's collectives again first (Megatron-LM recomputes the whole layer, its
    all-reduces or sequence-parallel all-gathers and reduce-scatters included); the attention core
    that `selective` recomputes has none."""
    out = list(comms)
    if remat == "full":
        for i in checkpointed_layers(model):
            out[i] = Collectives(comms[i].forward, (*comms[i].forward, *comms[i].backward))
    return out


def _core_kernels(ops: object) -> tuple:
    """The attention core's forward kernels of a block's `LayerKernels` (() without kernels)."""
    if not isinstance(ops, LayerKernels):
        return ()
    return tuple(k for k in ops.forward if isinstance(k, (Flash, Softmax))
                 or (isinstance(k, (Gemm, MemOp)) and k.name in _CORE_KERNELS))


def _recomputed(block: LayerSpec, kept: float, redo_flops: float, redo: tuple,
                saved_with_previous: float) -> LayerSpec:
    """`block` keeping `kept` bytes a sample and re-making the rest before its backward, which
    runs `redo` kernels (`redo_flops`) first; the input-gradient pass of a split backward too."""
    ops = block.ops
    if isinstance(ops, LayerKernels) and redo:
        ops = LayerKernels(ops.forward, (*redo, *ops.backward), ops.tensors, ops.beside_collectives)
    update = {
        "activation_bytes_per_sample": kept,
        "recompute_bytes_per_sample": block.activation_bytes_per_sample - kept,
        "saved_with_previous_bytes_per_sample": saved_with_previous,
        "ops": ops,
    }
    if block.backward_flops_per_sample is not None:
        update["backward_flops_per_sample"] = block.backward_flops_per_sample + redo_flops
    if block.backward_input_flops_per_sample is not None:
        update["backward_input_flops_per_sample"] = block.backward_input_flops_per_sample + redo_flops
    return block.model_copy(update=update)


__all__ = ["PER_LAYER_REMAT", "attention_core_bytes_per_token", "checkpointed_layers", "per_layer",
           "recompute_collectives", "recompute_layers", "recompute_peak_bytes", "remat_problem"]
