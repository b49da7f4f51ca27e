"""Tensor parallelism as Megatron-LM runs it: what it needs of a scenario and the collectives it adds."""

from __future__ import annotations

from dataclasses import dataclass

from gpipe_sim.model.block_shape import kv_heads_problem
from gpipe_sim.model.experts import routed_rows
from gpipe_sim.model.model import ModelSpec, TableModel, TransformerModel

# A reduce-scatter or an all-gather of B bytes moves half what a ring all-reduce of B bytes moves
# ((T-1)/T x B each way against 2(T-1)/T x B) in half its steps (priced: gpipe_sim.costs.collectives).
ALL_REDUCE = 1.0
HALF = 0.5
# Bytes per token of each of the vocabulary-parallel cross-entropy's three all-reduces (fp32: the
# logits' maximum, the sum of exponentials and the target's logit).
_LOSS_REDUCES = 3


@dataclass(frozen=True)
class Collectives:
    """One layer's tensor-parallel collectives on a sample, per pass: (all-reduces' worth, bytes) pairs.
    The backward ones reduce input gradients, so they belong to a split backward's input pass."""

    forward: tuple[tuple[float, float], ...] = ()
    backward: tuple[tuple[float, float], ...] = ()


def split_vocab(model: TransformerModel, tp: int) -> int:
    """The vocabulary rows as the split tables hold them: padded to a multiple of vocab_multiple x T,
    as Megatron-LM pads (--make-vocab-size-divisible-by times the tensor-parallel size); T = 1:
    `padded_vocab`."""
    multiple = model.vocab_multiple * tp
    return -(-model.vocab // multiple) * multiple


def tensor_parallel_problem(model: ModelSpec, tp: int) -> str | None:
    """One line naming the field where `tp` devices per rank cannot split this model; None where
    they can (whether they tile the nodes is the mesh's to say: gpipe_sim.mesh.layout_problem). The transformer preset splits at any `tp` dividing its heads
    and d_ff whose key/value heads it splits or replicates (`kv_heads_problem`); a measured layer table runs at the T it was profiled at only (its rows are one
    device's share: `TableModel.tensor_parallel`), T = 1 included; other presets at T = 1 only.
    """
    if isinstance(model, TableModel) and model.tensor_parallel != tp:
        return (f"model.tensor_parallel: the layer table was profiled at tensor_parallel {model.tensor_parallel} "
                f"(its rows are one device's share) but pipeline.tensor_parallel is {tp}; profile it at {tp}")
    if tp == 1:
        return None
    if not isinstance(model, (TransformerModel, TableModel)):
        return (f"pipeline.tensor_parallel: {tp} needs the transformer preset (model.preset is "
                f"{model.preset}): only its layers are split the Megatron way (or a layer table "
                f"profiled at tensor_parallel {tp})")
    if isinstance(model, TransformerModel):
        for field, value in (("model.heads", model.heads), ("model.d_ff", model.d_ff)):
            if value % tp:
                return f"{field}: {value:,} does not split over pipeline.tensor_parallel {tp} (give a multiple of {tp})"
        problem = kv_heads_problem(model.query_groups, tp)
        if problem:
            return problem
    return None


def transformer_collectives(model: TransformerModel, tp: int, sequence_parallel: bool,
                            dtype_bytes: int) -> list[Collectives]:
    """Per layer of the transformer preset (embedding, blocks, head): the collectives of its
    forward and backward on one sample, none at T = 1. A block all-reduces its attention's and its
    MLP's row-parallel outputs in the forward and its two column-parallel inputs' gradients in
    the backward; the vocabulary-parallel embedding all-reduces its output; the head's input
    gradient is all-reduced, and its cross-entropy all-reduces three fp32 figures per token.
    Sequence parallel (Megatron-LM's): each all-reduce is a reduce-scatter plus an all-gather of
    the same bytes; a block all-gathers the inputs of QKV and fc1 and reduce-scatters the outputs
    of the projection and fc2 (four halves forward), and its backward all-gathers the row-parallel
    outputs' gradients, all-gathers the column-parallel inputs again for their weight gradients
    and reduce-scatters those inputs' gradients (six); the embedding reduce-scatters its output
    and all-gathers its gradient; the head all-gathers its input forward, and again backward
    beside the reduce-scatter of its gradient. A MoE block under sequence parallelism:
    `moe_collectives`."""
    empty = Collectives()
    if tp == 1:
        return [empty] * (model.layers + 2)
    act = float(model.seq_len * model.d_model * dtype_bytes)
    loss = tuple((ALL_REDUCE, 4.0 * model.seq_len) for _ in range(_LOSS_REDUCES))
    moe = block = None
    if sequence_parallel:
        embed = Collectives(forward=((HALF, act),), backward=((HALF, act),))
        block = Collectives(forward=((HALF, act),) * 4, backward=((HALF, act),) * 6)
        head = Collectives(forward=((HALF, act), *loss), backward=((HALF, act),) * 2)
        moe = moe_collectives(model, dtype_bytes) if model.experts else None
    else:
        embed = Collectives(forward=((ALL_REDUCE, act),))
        block = Collectives(forward=((ALL_REDUCE, act),) * 2, backward=((ALL_REDUCE, act),) * 2)
        head = Collectives(forward=loss, backward=((ALL_REDUCE, act),))
    return [embed, *(moe if moe is not None and model.is_moe(i) else block for i in range(model.layers)), head]


def moe_collectives(model: TransformerModel, dtype_bytes: int) -> Collectives:
    """A MoE block's collectives on a sample under sequence parallelism, as Megatron-LM's alltoall
    token dispatcher runs its default expert tensor parallelism of T (gpipe_exec.expert_tensor
    alike): the attention's as the dense block's (QKV's input gathered, the projection's output
    scattered; backward the projection's output gradient gathered, QKV's input gathered again and
    its gradient scattered); the routed rows (`routed_rows` of the s tokens x d_model, every T
    devices' share) gathered over T before the experts and their partial outputs summed back
    (`gather_from_sequence_parallel_region`, `reduce_scatter_to_sequence_parallel_region`),
    backward the same two for their gradients (the gathered rows are kept: no second gather); the
    shared experts as the dense MLP."""
    act = float(model.seq_len * model.d_model * dtype_bytes)
    rows = float(routed_rows(model, model.seq_len) * model.d_model * dtype_bytes)
    shared = model.shared_experts > 0
    return Collectives(forward=((HALF, act),) * (2 + 2 * shared) + ((HALF, rows),) * 2,
                       backward=((HALF, act),) * (3 + 3 * shared) + ((HALF, rows),) * 2)
