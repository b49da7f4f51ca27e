"""Bad input: one clear line naming the field, exit status 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpipe_sim.cli import main

BASE = {
    "model": {"preset": "uniform", "layers": 8},
    "hardware": {"preset": "v100"},
    "pipeline": {"stages": 4, "micro_batches": 4, "batch_size": 16},
}


def _with(path: str, value):
    data = yaml.safe_load(yaml.safe_dump(BASE))
    node = data
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return data


CASES = [
    (_with("pipeline.stages", 9), "pipeline.stages: 9 stages but the model has only 8 layers"),
    (_with("pipeline.micro_batches", 0), "pipeline.micro_batches"),
    (_with("pipeline.micro_batches", 17), "pipeline.micro_batches: 17 micro-batches exceed"),
    (_with("pipeline.partition", [2, 2, 2, 1]), "pipeline.partition: layer counts sum to 7"),
    (_with("pipeline.partition", [4, 4]), "pipeline.partition: 2 entries for 4 stages"),
    (_with("hardware.link", {"bandwidth": 0}), "hardware.link.bandwidth"),
    (_with("hardware.link", {"bandwidth": -5}), "hardware.link.bandwidth"),
    (_with("hardware.link", {"bandwidth": "fast"}), "hardware.link.bandwidth"),
    (_with("hardware.accelerator", {"memory_bytes": -1}), "hardware.accelerator.memory_bytes"),
    (_with("hardware.preset", "tpu-v9"), "hardware.preset: unknown hardware preset 'tpu-v9'"),
    (_with("model.preset", "resnet"), "model.preset: unknown model preset 'resnet'"),
    (_with("pipeline.stagez", 3), "pipeline.stagez: unknown key (did you mean stages?)"),
    (_with("pipeline.micro_batchs", 3), "pipeline.micro_batchs: unknown key (did you mean micro_batches?)"),
    (_with("model.layres", 3), "model.layres: unknown key (did you mean layers?)"),
    (_with("hardware.accelerator", {"memory_byte": 1}),
     "hardware.accelerator.memory_byte: unknown key (did you mean memory_bytes?)"),
    (_with("trainig", {}), "trainig: unknown key (did you mean training?)"),
    (_with("pipeline.schedule", "zigzag"), "pipeline.schedule: unknown schedule 'zigzag'"),
    (_with("pipeline.remat", "sometimes"), "pipeline.remat"),
    (_with("model.layers", -2), "model.layers"),
    (_with("hardware.stage_to_device", [0, 1]), "hardware.stage_to_device: 2 entries for 4 stages"),
    (_with("training.optimizer", "lion"), "training.optimizer"),
    (_with("training.optimizer_step", "vectorised"), "training.optimizer_step: Input should be"),
    ({**BASE, "training": {"optimizer": "rmsprop", "optimizer_step": "fused"}},
     "training.optimizer_step: torch has no fused rmsprop step"),
    ({**BASE, "model": {"preset": "table", "layers": [
        {"name": "a", "params": 10, "largest_tensor_params": 11, "forward_s_per_sample": 1.0,
         "backward_s_per_sample": 1.0}]}, "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": 1}},
     "layer 'a': largest_tensor_params (11) exceeds its params (10)"),
    # presets that add layers around their blocks say so: the count is not a mystery
    ({**BASE, "model": {"preset": "transformer", "layers": 8, "d_model": 64, "d_ff": 128, "heads": 4,
                        "seq_len": 16, "vocab": 100}, "pipeline": {**BASE["pipeline"], "stages": 12}},
     "pipeline.stages: 12 stages but the model has only 10 layers (8 blocks + embedding + head)"),
    ({**BASE, "model": {"preset": "convnet", "layers": 4}, "pipeline": {**BASE["pipeline"], "partition": [1, 1, 1, 1]}},
     "pipeline.partition: layer counts sum to 4, the model has 6 layers (4 blocks + stem + head)"),
]


@pytest.mark.parametrize("data, message", CASES, ids=[c[1].split(":")[0] for c in CASES])
def test_bad_scenario_gives_one_line_and_exit_2(tmp_path, capsys, data, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpipe-sim: error: ")
    assert message in err


def test_unknown_key_suggests_only_the_presets_own_fields():
    from gpipe_sim.errors import ScenarioError
    from gpipe_sim.scenario.scenario import parse_scenario

    with pytest.raises(ScenarioError) as err:  # heads is a transformer's field, not a uniform model's
        parse_scenario(_with("model.heads", 4))
    assert str(err.value) == "model.heads: unknown key"
    with pytest.raises(ScenarioError) as err:
        parse_scenario({**BASE, "model": {"preset": "transformer", "d_modle": 2048}})
    assert str(err.value) == "model.d_modle: unknown key (did you mean d_model?)"
    with pytest.raises(ScenarioError) as err:
        parse_scenario(_with("pipeline.zzz", 1))
    assert str(err.value) == "pipeline.zzz: unknown key"  # nothing close: no guess


def test_malformed_yaml_names_the_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("pipeline:\n  stages: 4\n   micro_batches: [1,\n")
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "malformed YAML" in err and "line" in err and err.count("\n") == 1


def test_missing_file_and_missing_table(tmp_path, capsys):
    assert main(["simulate", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read scenario" in capsys.readouterr().err
    path = tmp_path / "table.yaml"
    path.write_text(yaml.safe_dump({"model": {"preset": "table", "path": "missing.json"}}))
    assert main(["simulate", str(path)]) == 2
    assert "cannot read layer table" in capsys.readouterr().err


def test_table_file_with_an_unknown_field_is_refused_not_dropped(tmp_path, capsys):
    rows = [{"name": "l0", "forward_s_per_sample": 1e-3, "backward_s_per_sample": 2e-3, "params": 1024,
             "activation_bytes_per_sample": 1024}]
    table = tmp_path / "layers.yaml"
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({"model": {"preset": "table", "path": str(table)},
                                        "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": 1}}))
    table.write_text(yaml.safe_dump({"layers": rows, "input_bytes_per_sample": 8}))
    assert main(["simulate", str(scenario), "--json"]) == 0
    capsys.readouterr()
    table.write_text(yaml.safe_dump({"layers": rows, "input_bytes_per_sample": 8, "tensor_paralel": 2}))
    assert main(["simulate", str(scenario)]) == 2
    err = capsys.readouterr().err
    assert "unknown field 'tensor_paralel'" in err and err.count("\n") == 1


def test_command_line_process_prints_no_traceback(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_with("pipeline.stages", 99)))
    proc = subprocess.run([sys.executable, "-m", "gpipe_sim.cli", "simulate", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.strip().count("\n") == 0
    assert "pipeline.stages" in proc.stderr


def test_default_scenario_simulates(capsys):
    assert main(["simulate"]) == 0
    out = capsys.readouterr().out
    assert "bubble" in out and "per pipeline rank" in out


def test_json_output_has_the_result_schema(tmp_path, capsys):
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(BASE))
    trace = tmp_path / "trace.json"
    assert main(["simulate", str(path), "--json", "--trace", str(trace)]) == 0
    import json

    result = json.loads(capsys.readouterr().out)
    for key in ("step_time_s", "throughput_samples_per_s", "bubble_fraction",
                "analytic_bubble_fraction", "fits_in_memory", "stages", "timeline"):
        assert key in result
    for key in ("index", "layers", "busy_s", "peak_activation_bytes", "peak_memory_bytes", "param_bytes"):
        assert key in result["stages"][0]
    assert set(result["timeline"][0]) == {"rank", "chunk", "kind", "micro_batch", "start_s", "end_s"}
    assert json.loads(trace.read_text())["traceEvents"]


def test_presets_lists_every_preset(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for name in ("uniform", "transformer", "amoebanet", "ideal", "tpuv2", "tpuv3", "p100-pcie",
                 "v100", "a100-80gb", "h100-sxm", "h200"):
        assert name in out


def test_with_updates_switches_presets_cleanly():
    from gpipe_sim import Scenario

    base = Scenario().with_updates({"hardware.preset": "v100", "model.preset": "uniform"})
    h100 = base.with_updates({"hardware.preset": "h100-sxm", "hardware.accelerator.memory_bytes": 1e9})
    assert h100.hardware.accelerator.name == "H100 SXM"
    assert h100.hardware.accelerator.peak_flops["bf16"] == 989e12
    assert h100.hardware.accelerator.memory_bytes == 1e9
    assert base.with_updates({"model.layers": 32}).model.layers == 32
    deeper = Scenario().with_updates({"model.layers": 30, "pipeline.stages": 6})
    assert (deeper.model.preset, deeper.model.layers, deeper.pipeline.stages) == ("transformer", 30, 6)


def test_layer_counts_name_what_each_preset_adds():
    from gpipe_sim.model.layers import build_layers, describe_layer_count
    from gpipe_sim.model.model import (AmoebaNetModel, ConvNetModel, MlpModel, TableModel, TransformerModel,
                                      UniformModel)

    expected = {
        TransformerModel(layers=24): "26 layers (24 blocks + embedding + head)",
        MlpModel(layers=8): "10 layers (8 blocks + input + head)",
        ConvNetModel(layers=1): "3 layers (1 block + stem + head)",
        AmoebaNetModel(layers=18): "22 layers (18 normal cells + 2 reduction cells + stem + head)",
        UniformModel(layers=16): "16 layers",
        TableModel(layers=[{"name": "only", "forward_s_per_sample": 1.0, "backward_s_per_sample": 2.0}]): "1 layer",
    }
    for model, text in expected.items():
        assert describe_layer_count(model) == text
        n = len(build_layers(model))
        assert text.startswith(f"{n} layers" if n > 1 else "1 layer")
