"""A Hugging Face `config.json` read into the transformer preset's fields: Llama, Mistral, Mixtral (its
experts), Qwen2, GPT-2 and GPT-NeoX keys, from the file alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from gpipe_sim.errors import ScenarioError
from gpipe_sim.schema.files import read_text_file, shown_path
from gpipe_sim.schema.limits import MAX_FILE_BYTES

FIELD = "model.hf_config"
Fields = tuple[dict[str, Any], list[str]]  # the preset's fields, one note per key not taken as written


class _Config:
    """The file's keys, each read once by name: a missing required key is one line naming it."""

    def __init__(self, data: dict[str, Any], where: str) -> None:
        self.data, self.where = data, where

    def number(self, key: str, default: Any = None, *, whole: bool = True) -> Any:
        value = self.data.get(key, default)
        if value is None and default is None:
            raise ValueError(f"{self.where}: no `{key}` (a {self.data.get('model_type')} config gives it)")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (whole and value != int(value)):
            raise ValueError(f"{self.where}: `{key}` is {str(value)[:40]!r}, not a {'whole ' if whole else ''}number")
        return int(value) if whole else float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise ValueError(f"{self.where}: `{key}` is {str(value)[:40]!r}, not true or false")
        return value


def _llama(c: _Config, family: str) -> Fields:
    """Llama, Mistral, Mixtral and Qwen2 (LlamaConfig's keys): rotary positions, RMSNorm, SwiGLU
    (hidden_act silu), grouped-query attention; no biases unless attention_bias and mlp_bias say so;
    Mixtral's `num_local_experts` experts of `intermediate_size`, `num_experts_per_tok` a token."""
    notes: list[str] = []
    act = c.data.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{c.where}: `hidden_act` {str(act)[:20]!r}: a gated MLP gpipe-sim models is SwiGLU (silu)")
    d, heads = c.number("hidden_size"), c.number("num_attention_heads")
    head_dim = c.data.get("head_dim")
    if head_dim is not None and head_dim * heads != d:
        raise ValueError(f"{c.where}: `head_dim` {head_dim} x {heads} heads is not hidden_size {d} "
                         "(the preset's heads are d_model / heads wide)")
    attention_bias, mlp_bias = c.flag("attention_bias", False), c.flag("mlp_bias", False)
    if attention_bias != mlp_bias:
        notes.append(f"attention_bias {attention_bias}, mlp_bias {mlp_bias}: the preset has one `bias` for every "
                     f"linear layer; took {attention_bias or mlp_bias}")
    if family == "qwen2":
        notes.append("qwen2: its Q, K and V projections have biases (q + 2 kv per block), which `bias: false` "
                     "does not count")
    if c.data.get("sliding_window") is not None and c.data.get("use_sliding_window", True):
        notes.append(f"sliding_window {c.data['sliding_window']}: attention is counted over the whole causal "
                     "sequence")
    fields = {"layers": c.number("num_hidden_layers"), "d_model": d, "heads": heads,
              "kv_heads": c.number("num_key_value_heads", heads), "d_ff": c.number("intermediate_size"),
              "vocab": c.number("vocab_size"), "seq_len": c.number("max_position_embeddings"),
              "mlp": "swiglu", "norm": "rmsnorm", "position": "rope",
              "tied_embeddings": c.flag("tie_word_embeddings", False), "bias": attention_bias or mlp_bias,
              "dropout": c.number("attention_dropout", 0.0, whole=False)}
    if "num_local_experts" in c.data:  # Mixtral: every block's MLP is num_local_experts experts of intermediate_size
        fields.update(experts=c.number("num_local_experts"), top_k=c.number("num_experts_per_tok", 2))
    return fields, notes


def _gpt2(c: _Config, family: str) -> Fields:
    """GPT-2 (GPT2Config's keys): learned positions, LayerNorm, a GeLU MLP of n_inner (4 n_embd when
    null), biases, the output tied to the token table."""
    notes: list[str] = []
    act = str(c.data.get("activation_function", "gelu_new"))
    if not act.startswith("gelu"):
        raise ValueError(f"{c.where}: `activation_function` {act[:20]!r}: the GeLU MLP is the one gpipe-sim models")
    d = c.number("n_embd")
    dropout = c.number("resid_pdrop", 0.1, whole=False)
    if any(c.data.get(key, 0.1) != dropout for key in ("attn_pdrop", "embd_pdrop")):
        notes.append(f"attn_pdrop, embd_pdrop: the preset has one dropout rate; took resid_pdrop {dropout}")
    inner = c.data.get("n_inner")
    fields = {"layers": c.number("n_layer"), "d_model": d, "heads": c.number("n_head"),
              "d_ff": 4 * d if inner is None else c.number("n_inner"), "vocab": c.number("vocab_size"),
              "seq_len": c.number("n_positions"), "mlp": "gelu", "norm": "layernorm", "position": "learned",
              "tied_embeddings": c.flag("tie_word_embeddings", True), "bias": True, "dropout": dropout}
    return fields, notes


def _gpt_neox(c: _Config, family: str) -> Fields:
    """GPT-NeoX (GPTNeoXConfig's keys): rotary positions on rotary_pct of each head (no parameters
    either way), LayerNorm, a GeLU MLP, biases, an untied output unless tie_word_embeddings."""
    notes: list[str] = []
    act = str(c.data.get("hidden_act", "gelu"))
    if not act.startswith("gelu"):
        raise ValueError(f"{c.where}: `hidden_act` {act[:20]!r}: the GeLU MLP is the one gpipe-sim models")
    if c.data.get("rotary_pct", 0.25) != 1:
        notes.append(f"rotary_pct {c.data.get('rotary_pct', 0.25)}: rotary on part of each head, counted as rope "
                     "on all of it (no parameters either way)")
    if c.flag("use_parallel_residual", True):
        notes.append("use_parallel_residual: attention and MLP side by side, counted one after the other "
                     "(the same parameters and FLOPs)")
    fields = {"layers": c.number("num_hidden_layers"), "d_model": c.number("hidden_size"),
              "heads": c.number("num_attention_heads"), "d_ff": c.number("intermediate_size"),
              "vocab": c.number("vocab_size"), "seq_len": c.number("max_position_embeddings"),
              "mlp": "gelu", "norm": "layernorm", "position": "rope",
              "tied_embeddings": c.flag("tie_word_embeddings", False), "bias": c.flag("attention_bias", True),
              "dropout": c.number("hidden_dropout", 0.0, whole=False)}
    return fields, notes


FAMILIES: dict[str, Callable[[_Config, str], Fields]] = {
    "llama": _llama, "mistral": _llama, "qwen2": _llama, "mixtral": _llama, "gpt2": _gpt2, "gpt_neox": _gpt_neox,
}


def hf_model_fields(config: Any, where: str = FIELD) -> Fields:
    """The transformer preset's fields from a config.json's data, and one note for each key not taken
    as written; ValueError with one line naming the key that is missing, of the wrong kind, or of a
    family or architecture gpipe-sim does not model. The vocabulary is the file's (vocab_multiple
    1: a checkpoint's table has vocab_size rows); attention is flash (Hugging Face's default SDPA)."""
    if not isinstance(config, dict):
        raise ValueError(f"{where}: expected a JSON object (a config.json)")
    family = config.get("model_type")
    if family is None:
        raise ValueError(f"{where}: no `model_type` (choose a config of {', '.join(FAMILIES)})")
    if family not in FAMILIES:
        raise ValueError(f"{where}: `model_type` {str(family)[:40]!r} is not a family gpipe-sim reads "
                         f"({', '.join(FAMILIES)})")
    fields, notes = FAMILIES[family](_Config(config, where), family)
    return {"preset": "transformer", **fields, "vocab_multiple": 1, "attention": "flash"}, notes


def read_hf_config(path: str | Path) -> Fields:
    """`hf_model_fields` of the config.json at `path`; ScenarioError (one line) where it cannot be read."""
    where = f"{FIELD}: {shown_path(Path(path))}"
    text = read_text_file(Path(path), ScenarioError, MAX_FILE_BYTES, what="Hugging Face config ",
                          prefix=f"{FIELD}: ")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{where}: malformed JSON at line {exc.lineno}: {exc.msg}") from None
    try:
        return hf_model_fields(data, where)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None


def expand_hf_config(data: Any) -> Any:
    """Model data naming a config.json (`hf_config: PATH`) as the transformer preset's fields, those
    written beside it overriding the file's (the notes are `gpipe-sim read hf`'s to print)."""
    if not (isinstance(data, dict) and "hf_config" in data):
        return data
    path = data["hf_config"]
    if not isinstance(path, str) or not path or "\0" in path:
        raise ValueError(f"{FIELD}: give the path of a config.json")
    if data.get("preset", "transformer") != "transformer":
        raise ValueError(f"{FIELD}: a config.json describes a transformer; model.preset is {data['preset']!r}")
    try:
        fields, _ = read_hf_config(path)
    except ScenarioError as exc:
        raise ValueError(str(exc)) from None
    return {**fields, **{k: v for k, v in data.items() if k != "hf_config"}, "preset": "transformer"}
