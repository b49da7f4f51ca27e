"""The transformer preset's architecture fields (grouped-query attention, SwiGLU, RMSNorm, RoPE, tied
embeddings, biases), the published architectures as presets, and the MFU conventions (issue 32)."""

from __future__ import annotations

import pytest

from gpipe_sim.api import model_figures, simulate
from gpipe_sim.errors import ScenarioError
from gpipe_sim.model.layers import build_layers
from gpipe_sim.scenario.scenario import parse_scenario


def _scenario(model: dict, tp: int = 1, batch: int = 8, **pipeline) -> object:
    return parse_scenario({"model": model, "hardware": {"preset": "h100-sxm"}, "training": {"dtype": "bf16"},
                           "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": batch, "tensor_parallel": tp,
                                        **pipeline}})


def _llama_parameters(layers: int, d: int, heads: int, kv: int, f: int, vocab: int) -> int:
    """Llama's parameters from its architecture: untied token table and output, per block the Q
    and output projections (d x d), K and V (d x kv x head_dim), three d x f SwiGLU matrices and
    two RMSNorm weights, and the final RMSNorm; no biases."""
    head_dim = d // heads
    block = 2 * d * d + 2 * d * kv * head_dim + 3 * d * f + 2 * d
    return 2 * vocab * d + layers * block + d


# (preset, the parameters its published architecture gives, the count its publishers quote)
PUBLISHED = [
    ("llama3-8b", _llama_parameters(32, 4096, 32, 8, 14336, 128256), 8.03e9),
    ("llama3-70b", _llama_parameters(80, 8192, 64, 8, 28672, 128256), 70.6e9),
    ("llama3-405b", _llama_parameters(126, 16384, 128, 8, 53248, 128256), 405.9e9),
    # GPT-3 175B: 96 blocks of 12 d^2 + 13 d (QKV, projection, a 4d MLP, their biases, two
    # LayerNorms), the token table (50,257 padded to 50,304 rows) tied to the output, 2,048 learned
    # positions and the final LayerNorm
    ("gpt3-175b", 96 * (12 * 12288**2 + 13 * 12288) + 50304 * 12288 + 2048 * 12288 + 2 * 12288, 174.6e9),
]


@pytest.mark.parametrize("preset,exact,quoted", PUBLISHED)
def test_presets_have_their_published_parameter_counts(preset, exact, quoted):
    sc = _scenario({"preset": preset})
    assert model_figures(sc).parameters == exact
    assert round(exact / 1e8) == round(quoted / 1e8)  # the quoted count, to its 0.1B


def test_a_preset_is_the_transformer_with_any_field_overridden():
    sc = _scenario({"preset": "llama3-8b", "layers": 4, "kv_heads": 4, "seq_len": 4096})
    m = sc.model
    assert (m.preset, m.layers, m.kv_heads, m.seq_len, m.d_model, m.mlp, m.norm, m.position) == (
        "transformer", 4, 4, 4096, 4096, "swiglu", "rmsnorm", "rope")
    assert parse_scenario(sc.to_dict()).model == m  # what it writes reads back the same
    again = sc.with_updates({"model.preset": "gpt3-175b"})
    assert (again.model.tied_embeddings, again.model.vocab, again.model.kv_heads) == (True, 50257, None)


@pytest.mark.parametrize("model,tp,message", [
    ({"heads": 16, "kv_heads": 32}, 1, r"^model.kv_heads: 32 key/value heads exceed the 16 query heads$"),
    ({"heads": 16, "kv_heads": 6}, 1, r"^model.kv_heads: 16 heads do not form groups of 6 key/value heads"),
    ({"heads": 12, "d_model": 768, "kv_heads": 6}, 4, r"^model.kv_heads: 6 key/value heads neither split over nor "
                                                        r"replicate across pipeline.tensor_parallel 4"),
    ({"heads": 4, "d_model": 12, "position": "rope"}, 1, r"^model.position: rope rotates pairs"),
    ({"mlp": "relu"}, 1, r"^model.mlp: "),
])
def test_bad_architecture_fields_get_one_line_naming_the_field(model, tp, message):
    with pytest.raises(ScenarioError, match=message) as info:
        _scenario({"preset": "transformer", **model}, tp=tp)
    assert "\n" not in str(info.value)


def test_default_fields_are_the_gpt_block():
    """Writing today's defaults out changes nothing: the same layers to the last field."""
    base = {"preset": "transformer", "layers": 2, "d_model": 256, "d_ff": 1024, "heads": 8}
    explicit = {**base, "kv_heads": 8, "mlp": "gelu", "norm": "layernorm", "position": "learned",
                "tied_embeddings": False, "bias": True}
    for tp in (1, 2):
        a, b = (build_layers(_scenario(m, tp=tp).model, 2, 1, tp) for m in (base, explicit))
        assert [x.model_dump() for x in a] == [x.model_dump() for x in b]


def test_block_parameters_and_flops_split_and_replicate_key_value_heads():
    """d 1024, 16 heads of 64, 2 key/value heads, SwiGLU of 2816, no biases: at T = 2 each device
    holds one key/value head; at T = 8 each holds one, replicated on 4 devices (its K and V weights
    whole), while queries, the MLP and the vocabulary split 8 ways."""
    d, f, hd, s = 1024, 2816, 64, 512
    model = {"preset": "llama3-8b", "layers": 1, "d_model": d, "heads": 16, "kv_heads": 2, "d_ff": f,
             "seq_len": s, "vocab": 1000}
    for tp, kv_per_device in ((1, 2), (2, 1), (8, 1)):
        block = build_layers(_scenario(model, tp=tp).model, 2, 1, tp)[1]
        q = d // tp
        weights = d * (q + 2 * kv_per_device * hd) + q * d + 3 * d * f // tp
        assert block.params == weights + 2 * d  # two RMSNorm weights, whole
        gemm = {k.name: k for k in block.ops.forward if hasattr(k, "n")}
        assert gemm["qkv"].n == q + 2 * kv_per_device * hd and gemm["fc1"].n == gemm["up"].n == f // tp
        assert block.forward_flops_per_sample == 2.0 * s * weights + 4.0 * s * s * q


def test_tied_embeddings_count_the_table_once():
    untied = {"preset": "gpt3-175b", "layers": 2, "d_model": 256, "d_ff": 1024, "heads": 4, "tied_embeddings": False}
    tied, apart = (model_figures(_scenario({**untied, "tied_embeddings": t})).parameters for t in (True, False))
    assert apart - tied == 256 * 50304
    rope = model_figures(_scenario({**untied, "position": "rope"})).parameters
    assert apart - rope == 256 * 2048  # rope has no position table


def _megatron_per_token(layers, d, heads, kv, f, s, vocab, swiglu):
    """Megatron-LM's num_floating_point_operations (training.py, dense GQA branch) / tokens."""
    hd = d // heads
    qp, kp = hd * heads, hd * kv
    attention = 3 * 2 * (d * (qp + 2 * kp) + qp * s / 2 * 2 + qp * d)
    mlp = 3 * 2 * d * f * (3 if swiglu else 2)
    return layers * (attention + mlp) + 3 * 2 * d * vocab


def test_mfu_is_megatrons_and_palms_beside_it():
    sc = _scenario({"preset": "llama3-8b", "layers": 4}, batch=16, micro_batches=4)
    result = simulate(sc)
    tokens = 16 * 8192
    megatron = tokens * _megatron_per_token(4, 4096, 32, 8, 14336, 8192, 128256, True)
    f = result.figures
    assert f.model_flops_per_step == pytest.approx(megatron, rel=1e-12)
    palm = tokens * (6 * f.parameters + 12 * 4 * 32 * 128 * 8192)
    assert f.palm_flops_per_step == pytest.approx(palm, rel=1e-12)
    peak = f.peak_flops_per_device
    assert result.mfu == pytest.approx(megatron / (result.step_time_s * peak), rel=1e-12)
    assert result.mfu_palm == pytest.approx(palm / (result.step_time_s * peak), rel=1e-12)
    assert result.to_dict()["mfu_palm"] == pytest.approx(result.mfu_palm)
    mlp = simulate(parse_scenario({"model": {"preset": "mlp"}, "hardware": {"preset": "a100-80gb"}}))
    assert mlp.mfu is not None and mlp.mfu_palm is None  # PaLM's convention is a language model's


def test_gpt_mfu_counts_the_causal_half_of_the_attention():
    """For a GPT model Megatron-LM's count is the layer table's FLOPs (which price the attention's
    s x s products in full, as the standard kernel runs them) less half of those products and the
    position add."""
    sc = _scenario({"preset": "transformer", "layers": 2, "d_model": 512, "d_ff": 2048, "heads": 8,
                    "seq_len": 1024, "vocab_multiple": 1, "vocab": 1000})
    layers = build_layers(sc.model, 2)
    table = 8 * sum(x.forward_flops_per_sample + x.backward_flops_per_sample for x in layers)
    half_attention = 8 * 2 * 3 * 2.0 * 1024 * 1024 * 512  # batch x blocks x 3 passes x 2 s^2 d
    position_add = 8 * 3 * 1024 * 512
    assert model_figures(sc).model_flops_per_step == pytest.approx(table - half_attention - position_add, rel=1e-12)
