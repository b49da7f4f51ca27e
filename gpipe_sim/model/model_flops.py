"""Model FLOPs per token of the transformer preset under Megatron-LM's and PaLM's MFU conventions."""

from __future__ import annotations

from gpipe_sim.model.experts import moe_parameters
from gpipe_sim.model.model import TransformerModel


def megatron_flops_per_token(model: TransformerModel) -> float:
    """Megatron-LM's `num_floating_point_operations` (megatron/training/training.py, dense
    models) per token: 3 (forward, input gradient, weight gradient) x 2 (FLOPs per multiply-add)
    x, per block, d (q + 2 kv) for QKV, q s for the causal attention (QK^T and its product with V,
    half of each s x s matrix), q d for the projection and (2 or 3) d d_ff for the MLP (gelu or
    swiglu); plus d x the padded vocabulary for the logits. q = heads x head_dim, kv = kv_heads x
    head_dim. A mixture of experts' MoE blocks count the MLPs a token runs, top_k routed and the
    shared experts (Megatron-LM's MoE terms; the router's d x experts is not counted, as there).
    Norms, the embedding lookup and the loss are not counted, nor re-computation."""
    d, s = model.d_model, model.seq_len
    head_dim = d // model.heads
    q, kv = model.heads * head_dim, model.query_groups * head_dim
    matrices = 3 if model.mlp == "swiglu" else 2
    attention = d * (q + 2 * kv) + q * s + q * d
    moe = sum(model.is_moe(i) for i in range(model.layers))
    dense_mlp = matrices * d * model.d_ff
    active_mlp = matrices * d * model.moe_ffn * (model.top_k + model.shared_experts)
    mlp = (model.layers - moe) * dense_mlp + moe * active_mlp
    return 6.0 * (model.layers * attention + mlp + d * model.padded_vocab)


def palm_flops_per_token(model: TransformerModel, parameters: int) -> float:
    """PaLM's model FLOPs per token (Chowdhery et al. 2022, Appendix B): 6 N + 12 L H Q T, N the
    model's parameters (every one, a tied table once), L layers, H heads, Q the head dimension, T
    the sequence length (the attention's s x s products in full, not causal). For a mixture of
    experts pass the active parameters as N (`active_parameters`)."""
    head_dim = model.d_model // model.heads
    return 6.0 * parameters + 12.0 * model.layers * model.heads * head_dim * model.seq_len


def tied_parameters(model: TransformerModel) -> int:
    """Parameters the head holds as a copy of the token table (tied embeddings), counted once in
    the model's parameters: d_model x the padded vocabulary, else 0."""
    return model.d_model * model.padded_vocab if model.tied_embeddings else 0


def active_parameters(model: TransformerModel, parameters: int) -> int:
    """Of the model's `parameters`, those a token uses: all but the routed experts it is not sent
    to (a dense model: all of them)."""
    total, used = moe_parameters(model)
    return parameters - total + used
