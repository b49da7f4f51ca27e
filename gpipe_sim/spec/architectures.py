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
