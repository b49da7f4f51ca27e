"""Published model architectures as transformer-preset fields, usable as `model: {preset: NAME}`."""

from __future__ import annotations

from typing import Any

# Llama 3 (Meta's model card and params.json: dim, n_layers, n_heads, n_kv_heads, the FFN size
# multiplied out, vocab 128,256, RoPE, RMSNorm, SwiGLU, no biases, untied output) and GPT-3 175B
# (Brown et al. 2020, Table 2.1: 96 layers, d_model 12,288, 96 heads of 128, context 2,048; GPT-2's
# BPE vocabulary of 50,257, learned positions, GeLU MLP of 4 d_model, LayerNorm, biases, the output
# projection tied to the token table).
_LLAMA3 = {"vocab": 128256, "seq_len": 8192, "mlp": "swiglu", "norm": "rmsnorm", "position": "rope",
           "tied_embeddings": False, "bias": False, "dropout": 0.0, "attention": "flash"}
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama3-8b": {**_LLAMA3, "layers": 32, "d_model": 4096, "heads": 32, "kv_heads": 8, "d_ff": 14336},
    "llama3-70b": {**_LLAMA3, "layers": 80, "d_model": 8192, "heads": 64, "kv_heads": 8, "d_ff": 28672},
    "llama3-405b": {**_LLAMA3, "layers": 126, "d_model": 16384, "heads": 128, "kv_heads": 8, "d_ff": 53248},
    # Llama 3 70B's long-context phase (the Llama 3 paper, section 3.4.2: the context raised to
    # 128K tokens in stages, with context parallelism): its activations fit only split over C > 1.
    "llama3-70b-128k": {**_LLAMA3, "layers": 80, "d_model": 8192, "heads": 64, "kv_heads": 8, "d_ff": 28672,
                        "seq_len": 131072},
    # Mixtral 8x7B (Mistral AI's config.json: hidden 4,096, 32 layers, 32 heads, 8 key/value heads,
    # intermediate 14,336, 8 local experts, 2 a token, vocab 32,000, RoPE, RMSNorm, no biases; trained
    # at 4,096 tokens here): 46.7B parameters, 12.9B active (Jiang et al. 2024).
    "mixtral-8x7b": {**_LLAMA3, "layers": 32, "d_model": 4096, "heads": 32, "kv_heads": 8, "d_ff": 14336,
                     "vocab": 32000, "seq_len": 4096, "experts": 8, "top_k": 2},
    # DeepSeek-V3-like (DeepSeek-AI 2024, Table/section 4.2 and its config.json: 61 layers, hidden
    # 7,168, the first 3 dense (intermediate 18,432), then 256 routed experts of 2,048, 8 a token, and
    # 1 shared expert; 128 heads; vocab 129,280; sequence 4,096): 671B parameters, 37B active.
    # APPROXIMATED: multi-head latent attention as plain multi-head attention of 128 heads of 56
    # (its low-rank projections and 192-wide query/key heads are not modelled: about 1B more
    # parameters over the model), no multi-token-prediction module, no node-limited routing.
    "deepseek-v3-like": {**_LLAMA3, "layers": 61, "d_model": 7168, "heads": 128, "kv_heads": 128, "d_ff": 18432,
                         "vocab": 129280, "seq_len": 4096, "experts": 256, "top_k": 8, "expert_d_ff": 2048,
                         "shared_experts": 1, "first_dense_layers": 3},
    "gpt3-175b": {"layers": 96, "d_model": 12288, "heads": 96, "d_ff": 49152, "seq_len": 2048, "vocab": 50257,
                  "mlp": "gelu", "norm": "layernorm", "position": "learned", "tied_embeddings": True,
                  "bias": True, "dropout": 0.1},
}


def expand_architecture(data: Any) -> Any:
    """Model data naming a published architecture (`preset: llama3-8b`) as the transformer preset's
    fields, the ones written beside the name overriding the architecture's; anything else as it is."""
    if isinstance(data, dict) and isinstance(data.get("preset"), str) and data["preset"] in ARCHITECTURES:
        return {**ARCHITECTURES[data["preset"]], **data, "preset": "transformer"}
    return data
