"""Mixture of experts as Megatron-LM's MoE layer runs it: a router, routed experts spread over E
devices, shared experts; the block's figures on one device and the model's total and active parameters.

A MoE block is the dense block with its MLP replaced (megatron/core/transformer/moe/moe_layer.py):
a linear router (d x experts, no bias, replicated) scores every token and keeps its `top_k`
experts (softmax and top-k in fp32); the tokens are permuted by expert, sent to the experts'
devices by an all-to-all (expert parallelism E: `experts / E` experts a device, carved from the
data-parallel group: gpipe_sim.plan.experts prices the exchange), run through the expert MLPs as
one grouped GEMM over their rows, sent back by a second all-to-all and combined by their router
weights; `shared_experts` run on every token beside them (one MLP of shared x expert_d_ff, as
DeepSeek-V3 fuses them). Balanced routing: every device's experts receive tokens x top_k rows in
all, at most their capacity where a `capacity_factor` caps it (rows past it dropped, none padded:
Megatron-LM's default, without --moe-pad-expert-input-to-capacity; the executor does the same). The experts are split over
the T tensor-parallel devices as the dense MLP is (Megatron's expert tensor parallelism defaults
to T).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from gpipe_sim.model import kernels as K
from gpipe_sim.model.block_shape import BlockShape
from gpipe_sim.model.model import LayerSpec, ModelSpec, TableModel, TransformerModel


def expert_parallel_problem(model: ModelSpec, ep: int, tp: int, data_parallel: int,
                            sequence_parallel: bool = True) -> str | None:
    """One line naming the field where the model's experts cannot be split over `ep` devices or
    `tp` tensor-parallel ones; None where they can (always for a dense model at E = 1). Tensor
    parallelism of a mixture of experts needs `sequence_parallel` (Megatron-LM refuses MoE with
    tensor parallelism without it; gpipe-exec runs it so). A measured
    layer table runs at the E it was profiled at only (its MoE rows hold one device's experts,
    the all-to-alls inside their times: `TableModel.expert_parallel`)."""
    if isinstance(model, TableModel):
        if model.expert_parallel != ep:
            return (f"model.expert_parallel: the layer table was profiled at expert_parallel {model.expert_parallel} "
                    f"(its rows are one device's share) but pipeline.expert_parallel is {ep}; profile it at {ep}")
        return _carved_problem(ep, data_parallel)
    if not isinstance(model, TransformerModel) or not model.experts:
        if ep > 1:
            return (f"pipeline.expert_parallel: {ep} needs a mixture of experts (model.experts > 0 on the "
                    "transformer preset)")
        return None
    if model.experts % ep:
        return f"model.experts: {model.experts:,} experts do not split over pipeline.expert_parallel {ep}"
    problem = _carved_problem(ep, data_parallel)
    if problem:
        return problem
    if tp > 1 and not sequence_parallel:
        return (f"pipeline.sequence_parallel: a mixture of experts at tensor_parallel {tp} needs sequence "
                "parallelism (Megatron-LM refuses MoE with tensor parallelism without it)")
    if model.moe_ffn % tp:
        return (f"model.expert_d_ff: {model.moe_ffn:,} does not split over pipeline.tensor_parallel {tp} "
                f"(give a multiple of {tp})")
    return None


def _carved_problem(ep: int, data_parallel: int) -> str | None:
    """One line where `ep` expert-parallel devices cannot be carved from `data_parallel` replicas."""
    if data_parallel % ep:
        return (f"pipeline.expert_parallel: {ep} devices an expert group, carved from the data-parallel group "
                f"as Megatron-LM carves it, must divide pipeline.data_parallel {data_parallel}")
    return None


def routed_rows(model: TransformerModel, tokens: int) -> int:
    """Rows the experts of one device's expert group run per sample of `tokens` tokens, summed over
    their devices' share: tokens x top_k under balanced routing, capped at the capacity
    ceil(tokens x top_k x capacity_factor) where a capacity factor below 1 drops rows (nothing is
    padded, as Megatron-LM runs by default and gpipe_exec.moe does)."""
    rows = tokens * model.top_k
    return rows if model.capacity_factor is None else min(rows, math.ceil(rows * model.capacity_factor))


def _mlp_params(d: int, f: int, matrices: int, bias: bool) -> int:
    """One MLP's parameters on a device holding `f` of its intermediate width (BlockShape's rule)."""
    return matrices * d * f + (((matrices - 1) * f + d) if bias else 0)


def _mlp_saved(f: int, matrices: int) -> int:
    """Elements a token's MLP keeps for backward inside it (gelu: fc1's and GeLU's outputs; swiglu:
    gate's, up's, silu's outputs and the product), as the dense block counts them."""
    return 2 * (matrices - 1) * f


def moe_block(dense: LayerSpec, model: TransformerModel, p: int, mask: int, tp: int, r: int, ep: int) -> LayerSpec:
    """The dense block `dense` (of `model`, one of `tp` devices, replicated activations shared over
    `r`) with its MLP replaced by the router, the device's `experts / ep` routed experts and the
    shared experts: parameters (`expert_params` the routed ones), FLOPs (the active ones: router,
    shared and routed rows), the activations they keep (the permuted tokens, the experts' and the
    shared MLP's inner tensors, the router's fp32 probabilities and int64 choices) and kernels."""
    b = BlockShape.of(model, tp)
    s, d, m = b.s, b.d, b.mlp_matrices
    f_e = model.moe_ffn // tp
    rows = routed_rows(model, s)
    local = model.experts // ep
    router = d * model.experts
    expert = _mlp_params(d, f_e, m, model.bias)
    shared = _mlp_params(d, f_e * model.shared_experts, m, model.bias) if model.shared_experts else 0
    dense_mlp = _mlp_params(d, b.f_share, m, model.bias)
    gemm = lambda n_rows, f: 2.0 * n_rows * m * d * f  # noqa: E731 (an MLP's forward GEMM FLOPs)
    delta = gemm(s, f_e * model.shared_experts) + gemm(rows, f_e) + 2.0 * s * router - gemm(s, b.f_share)
    saved = (rows * (_mlp_saved(f_e, m) + d) + s * _mlp_saved(f_e * model.shared_experts, m)
             - s * _mlp_saved(b.f_share, m)) * p + s * (4 * model.experts + 8 * model.top_k)
    kept = (rows * ((m - 1) * f_e + d) + s * (m - 1) * f_e * model.shared_experts - s * (m - 1) * b.f_share) * p
    return dense.model_copy(update={
        "params": dense.params - dense_mlp + router + shared + local * expert,
        "expert_params": local * expert,
        "largest_tensor_params": max(dense.largest_tensor_params or 0, d * f_e * max(1, model.shared_experts), router),
        "forward_flops_per_sample": dense.forward_flops_per_sample + delta,
        "backward_flops_per_sample": dense.backward_flops_per_sample + 2 * delta,
        "backward_input_flops_per_sample": dense.backward_input_flops_per_sample + delta,
        "activation_bytes_per_sample": dense.activation_bytes_per_sample + saved,
        "kept_for_weight_bytes_per_sample": dense.kept_for_weight_bytes_per_sample + kept + s * model.experts * p,
        "transient_bytes_per_sample": max(dense.transient_bytes_per_sample, 2.0 * rows * d * p),
        "ops": _moe_kernels(model, b, rows, p, mask, tp, r),
    })


def _moe_kernels(model: TransformerModel, b: BlockShape, rows: int, p: int, mask: int, tp: int, r: int) -> Any:
    """The block's kernels with the MLP's replaced: the router's GEMM and fp32 softmax + top-k,
    the permutation, the experts' MLP on the routed rows, the un-permutation and weighted sum,
    and the shared experts' MLP; backward the same in reverse (the router's two gradients)."""
    s, d = b.s, b.d
    router, router_b = K.linear("router", s, d, model.experts)
    scores = K.MemOp("router.softmax_topk", s * model.experts * 4 * 2.0)
    moved = float(rows * d * p)
    experts_f, experts_b = K.mlp_kernels(replace(b, s=rows, f=model.moe_ffn), p)
    fwd = [router, scores, K.MemOp("permute", 2 * moved), *experts_f, K.MemOp("unpermute", 2 * moved + s * d * p)]
    bwd = [K.MemOp("unpermute.bwd", 2 * moved + s * d * p), *experts_b, K.MemOp("permute.bwd", 2 * moved),
           K.MemOp("router.softmax_topk.bwd", s * model.experts * 4 * 3.0), *router_b]
    if model.shared_experts:
        shared_f, shared_b = K.mlp_kernels(replace(b, f=model.moe_ffn * model.shared_experts), p)
        fwd += shared_f
        bwd = shared_b + bwd
    return K.transformer_block(d, b.f, s, model.heads, model.attention, model.dropout > 0, p, mask, tp, r > 1,
                               shape=b, rope=model.position == "rope", mlp=(fwd, bwd))


def moe_parameters(model: TransformerModel) -> tuple[int, int]:
    """(routed experts' parameters over the model, those a token uses): every MoE block's experts,
    and its top_k of them."""
    d, m = model.d_model, 3 if model.mlp == "swiglu" else 2
    blocks = sum(model.is_moe(i) for i in range(model.layers))
    expert = _mlp_params(d, model.moe_ffn, m, model.bias)
    return blocks * model.experts * expert, blocks * model.top_k * expert


__all__ = ["expert_parallel_problem", "moe_block", "moe_parameters", "routed_rows"]
