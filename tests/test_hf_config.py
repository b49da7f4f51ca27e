"""A Hugging Face config.json as the model (`model: {hf_config: PATH}`, `gpipe-sim read hf`): the families'
keys, from the file alone, with the published parameter counts (issue 36, item 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpipe_sim.api import model_figures
from gpipe_sim.cli import main
from gpipe_sim.errors import ScenarioError
from gpipe_sim.scenario.scenario import load_scenario, parse_scenario

DATA = Path(__file__).parent / "data" / "hf"  # config.json files as the model repositories publish them


def _scenario(model: dict) -> object:
    return parse_scenario({"model": model, "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": 1}})


def _parameters(name: str, **overrides) -> int:
    return model_figures(_scenario({"hf_config": str(DATA / f"{name}.json"), **overrides})).parameters


def test_llama3_8b_reads_as_the_preset_with_its_8_03_billion_parameters():
    read = _scenario({"hf_config": str(DATA / "llama3-8b.json")}).model
    preset = _scenario({"preset": "llama3-8b"}).model
    assert read.model_dump(exclude={"vocab_multiple"}) == preset.model_dump(exclude={"vocab_multiple"})
    assert _parameters("llama3-8b") == 8_030_261_248


def test_gpt2_has_its_124_million_parameters():
    """12 blocks of 12 d^2 + 13 d (d = 768), the 50,257-row token table tied to the output (the
    file's rows: no padding), 1,024 learned positions and the final LayerNorm."""
    d = 768
    assert _parameters("gpt2") == 12 * (12 * d * d + 13 * d) + 50257 * d + 1024 * d + 2 * d == 124_439_808
    m = _scenario({"hf_config": str(DATA / "gpt2.json")}).model
    assert (m.mlp, m.norm, m.position, m.tied_embeddings, m.bias, m.dropout) == ("gelu", "layernorm", "learned",
                                                                                True, True, 0.1)


@pytest.mark.parametrize("name,parameters", [
    ("mistral-7b", 7_241_732_096),  # Mistral-7B-v0.1: 7.24B
    ("gpt-neox-20b", 20_554_567_680),  # GPT-NeoX-20B, untied: Hugging Face's count
    ("qwen2-7b", 7_615_616_512 - 28 * (3584 + 2 * 512)),  # Qwen2-7B's 7.62B less its QKV biases (noted)
])
def test_the_families_keys_give_their_architectures(name, parameters):
    assert _parameters(name) == parameters


def test_fields_written_beside_override_the_file_and_a_relative_path_is_the_scenarios(tmp_path):
    assert _scenario({"hf_config": str(DATA / "llama3-8b.json"), "layers": 2, "seq_len": 1024}).model.layers == 2
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "config.json").write_text((DATA / "gpt2.json").read_text())
    path = tmp_path / "run.yaml"
    path.write_text("model: {hf_config: models/config.json, layers: 4}\n")
    sc = load_scenario(path)
    assert (sc.model.layers, sc.model.d_model, sc.model.vocab) == (4, 768, 50257)


def _bad(tmp_path: Path, config: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ScenarioError) as info:
        _scenario({"hf_config": str(path)})
    assert "\n" not in str(info.value)
    return str(info.value)


def test_missing_keys_unknown_families_and_experts_get_one_line_naming_the_key(tmp_path):
    llama = json.loads((DATA / "llama3-8b.json").read_text())
    assert "no `hidden_size`" in _bad(tmp_path, {k: v for k, v in llama.items() if k != "hidden_size"})
    assert "no `model_type`" in _bad(tmp_path, {k: v for k, v in llama.items() if k != "model_type"})
    assert "`model_type` 'bert' is not a family" in _bad(tmp_path, {**llama, "model_type": "bert"})
    assert "`num_hidden_layers` is '32'" in _bad(tmp_path, {**llama, "num_hidden_layers": "32"})
    assert "`hidden_act` 'gelu'" in _bad(tmp_path, {**llama, "hidden_act": "gelu"})
    mixtral = json.loads((DATA / "mixtral-8x7b.json").read_text())
    assert "`num_experts_per_tok` is 'two'" in _bad(tmp_path, {**mixtral, "num_experts_per_tok": "two"})
    # a value the preset refuses names the field it fills
    assert _bad(tmp_path, {**llama, "num_key_value_heads": 5}).startswith("model.kv_heads: 32 heads do not form")
    with pytest.raises(ScenarioError, match=r"^model.hf_config: .*missing.json"):
        _scenario({"hf_config": str(tmp_path / "missing.json")})


def test_read_hf_prints_the_scenario_it_makes_and_its_notes(capsys):
    assert main(["read", "hf", str(DATA / "qwen2-7b.json"), "--set", "model.seq_len=4096"]) == 0
    out = capsys.readouterr()
    sc = parse_scenario(yaml.safe_load(out.out))
    assert (sc.model.kv_heads, sc.model.seq_len, sc.model.d_ff) == (4, 4096, 18944)
    assert "gpipe-sim: note: qwen2: its Q, K and V projections have biases" in out.err
    assert main(["read", "hf", str(DATA / "mixtral-8x7b.json")]) == 0
    model = parse_scenario(yaml.safe_load(capsys.readouterr().out)).model
    assert (model.experts, model.top_k, model.moe_ffn, model.layers) == (8, 2, 14336, 32)


def test_mixtral_config_reads_as_the_mixtral_preset_46_7b_parameters():
    """Mixtral 8x7B's config.json: the same model as the mixtral-8x7b preset but its 32,768 positions."""
    read = _scenario({"hf_config": str(DATA / "mixtral-8x7b.json")})
    preset = parse_scenario({"model": {"preset": "mixtral-8x7b", "seq_len": 32768, "vocab_multiple": 1}})
    assert model_figures(read).parameters == model_figures(preset).parameters == 46_702_792_704
