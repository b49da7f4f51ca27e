"""The gpipe-sim command line: `--set KEY=VALUE` on every command that takes a scenario, the layer
counts it prints, and the `schedule` command."""

from __future__ import annotations

import json

import pytest
import yaml

from gpipe_sim.cli import main
from gpipe_sim.errors import ScenarioError
from gpipe_sim.scenario.overrides import parse_override
from gpipe_sim.scenario.scenario import parse_scenario

BASE = {
    "model": {"preset": "uniform", "layers": 8},
    "hardware": {"preset": "ideal"},
    "pipeline": {"stages": 2, "micro_batches": 4, "batch_size": 16, "remat": "none"},
}


@pytest.fixture
def scenario_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(BASE))
    return path


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _refused(capsys, argv, *fragments):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpipe-sim: error: ") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err
    return err


def test_set_changes_the_simulated_scenario(scenario_file, tmp_path, capsys):
    argv = ["simulate", str(scenario_file), "--json", "--no-timeline"]
    changed = _json(capsys, [*argv, "--set", "pipeline.stages=4", "--set", "pipeline.schedule=1f1b"])
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump({**BASE, "pipeline": {**BASE["pipeline"], "stages": 4, "schedule": "1f1b"}}))
    expected = _json(capsys, ["simulate", str(edited), "--json", "--no-timeline"])
    assert len(changed["stages"]) == 4 and changed["step_time_s"] == expected["step_time_s"]
    assert _json(capsys, argv)["step_time_s"] != changed["step_time_s"]  # the file is untouched


def test_set_items_apply_together_and_the_last_of_a_key_wins(scenario_file, capsys):
    # 16 stages need 16 layers: neither item alone is valid, both together are
    out = _json(capsys, ["simulate", str(scenario_file), "--json", "--no-timeline", "--set", "pipeline.stages=16",
                         "--set", "model.layers=16", "--set", "pipeline.micro_batches=2",
                         "--set", "pipeline.micro_batches=8"])
    assert len(out["stages"]) == 16 and out["micro_batches"] == 8


def test_set_values_are_yaml():
    assert parse_override("pipeline.stages=8") == ("pipeline.stages", 8)
    assert parse_override("pipeline.schedule=1f1b") == ("pipeline.schedule", "1f1b")
    assert parse_override("model.forward_s_per_sample=1e-3") == ("model.forward_s_per_sample", 1e-3)
    assert parse_override("pipeline.partition=[3, 3, 1, 1]") == ("pipeline.partition", [3, 3, 1, 1])
    assert parse_override("hardware.accelerator.memory_bytes=16 GiB") == ("hardware.accelerator.memory_bytes", "16 GiB")
    assert parse_override(" pipeline.remat = none ") == ("pipeline.remat", "none")
    scenario = parse_scenario(BASE).with_overrides(["pipeline.stages=4", "pipeline.partition=[3, 3, 1, 1]",
                                                     "hardware.preset=a100-80gb", "training.dtype=bf16"])
    assert scenario.pipeline.partition == (3, 3, 1, 1) and scenario.hardware.preset == "a100-80gb"
    assert scenario.training.dtype == "bf16"


@pytest.mark.parametrize("item, fragments", [
    ("pipeline.stages", ["--set 'pipeline.stages': expected KEY=VALUE"]),
    ("=8", ["--set '=8': expected KEY=VALUE"]),
    ("stages=8", ["--set 'stages=8': 'stages' is not a dotted scenario field"]),
    ("pipline.stages=8", ["'pipline.stages' is not a dotted scenario field (did you mean pipeline.stages?)"]),
    ("pipeline.stagez=8", ["--set 'pipeline.stagez=8': pipeline.stagez: unknown key (did you mean stages?)"]),
    ("pipeline.micro_batchs=8",
     ["--set 'pipeline.micro_batchs=8': pipeline.micro_batchs: unknown key (did you mean micro_batches?)"]),
    ("pipeline.stages=zero", ["--set 'pipeline.stages=zero': pipeline.stages"]),
    ("pipeline.stages=9", ["--set 'pipeline.stages=9': pipeline.stages: 9 stages but the model has only 8 layers"]),
    ("pipeline.schedule=zigzag", ["--set 'pipeline.schedule=zigzag': pipeline.schedule: unknown schedule 'zigzag'"]),
    ("pipeline.partition=[1, 2", ["--set 'pipeline.partition=[1, 2': the value is not valid YAML"]),
    ("model.preset=resnet", ["--set 'model.preset=resnet': model.preset: unknown model preset 'resnet'"]),
    ("pipeline.stages=" + "9" * 5000, ["longer than the limit"]),
    ("pipeline.stages=1\n2", ["--set 'pipeline.stages=1\\n2': pipeline.stages"]),
])
def test_bad_set_items_are_one_line_naming_the_item(scenario_file, capsys, item, fragments):
    _refused(capsys, ["simulate", str(scenario_file), "--set", item], *fragments)


def test_a_problem_of_several_items_together_is_one_line(scenario_file, capsys):
    _refused(capsys, ["simulate", str(scenario_file), "--set", "pipeline.batch_size=16",
                      "--set", "pipeline.micro_batches=32"],
             "--set 'pipeline.micro_batches=32': pipeline.micro_batches: 32 micro-batches exceed")


def test_set_on_the_default_scenario_and_on_max_model(scenario_file, capsys):
    out = _json(capsys, ["simulate", "--json", "--no-timeline", "--set", "pipeline.stages=2",
                         "--set", "pipeline.micro_batches=4"])
    assert len(out["stages"]) == 2 and out["micro_batches"] == 4
    common = ["max-model", str(scenario_file), "--grow", "layers", "--limit", "256"]
    assert main([*common, "--set", "hardware.preset=v100"]) == 0
    small = capsys.readouterr().out
    assert main([*common, "--set", "hardware.preset=v100", "--set", "hardware.accelerator.memory_bytes=8 GiB"]) == 0
    smaller = capsys.readouterr().out
    largest = [int(text.split("largest model.layers that fits: ")[1].split()[0]) for text in (small, smaller)]
    assert largest[1] < largest[0]
    assert "  layers:                 " in small
    _refused(capsys, [*common, "--set", "pipeline.stagez=2"], "--set 'pipeline.stagez=2': pipeline.stagez: unknown key")


def test_set_applies_to_a_sweeps_base(tmp_path, capsys):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"base": BASE, "axes": {"pipeline.micro_batches": [1, 2]}}))
    out = tmp_path / "out"
    assert main(["sweep", str(sweep), "--out", str(out), "--workers", "0", "--quiet", "--no-report",
                 "--set", "pipeline.stages=4", "--set", "pipeline.micro_batches=8"]) == 0
    capsys.readouterr()
    import pandas as pd

    table = pd.read_csv(out / "results.csv")
    assert table["pipeline.stages"].tolist() == [4, 4]
    assert table["pipeline.micro_batches"].tolist() == [1, 2]  # the axes still apply on top of the base
    _refused(capsys, ["sweep", str(sweep), "--out", str(out), "--set", "pipeline.stages=99"],
             "--set 'pipeline.stages=99': pipeline.stages: 99 stages")


def test_simulate_and_presets_say_what_the_layers_are(capsys):
    assert main(["simulate", "--set", "model.preset=transformer", "--set", "model.layers=8",
                 "--set", "model.d_model=64", "--set", "model.d_ff=128", "--set", "model.heads=4",
                 "--set", "model.seq_len=16", "--set", "model.vocab=100",
                 "--set", "pipeline.stages=2", "--set", "pipeline.micro_batches=2"]) == 0
    assert "transformer, 10 layers (8 blocks + embedding + head)" in capsys.readouterr().out
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for text in ("26 layers (24 blocks + embedding + head)", "10 layers (8 blocks + input + head)",
                 "10 layers (8 blocks + stem + head)", "16 layers"):
        assert text in out
    # What tells the published architectures apart is shown: the long-context preset's sequence,
    # the mixtures' experts (rich wraps the cell between fields, never inside one).
    for text in ("seq_len=131072", "seq_len=8192", "experts=8", "top_k=2", "experts=256", "shared_experts=1"):
        assert text in out


def test_schedule_command_prints_pass_counts_and_writes_torchs_csv(scenario_file, tmp_path, capsys):
    out_csv = tmp_path / "1f1b.csv"
    assert main(["schedule", str(scenario_file), "--set", "pipeline.schedule=1f1b", "--csv", str(out_csv)]) == 0
    out = capsys.readouterr().out
    assert "schedule 1f1b: K=2 ranks x v=1 chunk per rank, M=4 micro-batches, remat=none" in out
    assert "0F0 0F1 0B0 0F2 0B1 0F3 ..." in out and f"schedule written to {out_csv}" in out
    rows = [line.split(",") for line in out_csv.read_text().splitlines()]
    assert rows[1] == ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2", "1F3", "1B3"]
    _refused(capsys, ["schedule", str(scenario_file), "--csv", str(tmp_path / "no" / "such" / "dir.csv")],
             "--csv: cannot write")


def test_set_mends_a_file_and_blames_only_what_it_changed(tmp_path, capsys):
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text(yaml.safe_dump({**BASE, "pipeline": {**BASE["pipeline"], "stages": 12}}))
    _refused(capsys, ["simulate", str(invalid)], "pipeline.stages: 12 stages but the model has only 8 layers")
    assert _json(capsys, ["simulate", str(invalid), "--json", "--no-timeline", "--set", "model.layers=12"])
    # a problem of the file that the items do not touch is the file's, without a --set prefix
    err = _refused(capsys, ["simulate", str(invalid), "--set", "pipeline.remat=always"])
    assert err.startswith("gpipe-sim: error: pipeline.stages: 12 stages")
    # a valid file broken by the items together names them
    valid = tmp_path / "valid.yaml"
    valid.write_text(yaml.safe_dump(BASE))
    _refused(capsys, ["simulate", str(valid), "--set", "pipeline.partition=[4, 4]", "--set", "model.layers=9"],
             "--set 'pipeline.partition=[4, 4]': pipeline.partition: layer counts sum to 8, the model has 9 layers")
    _refused(capsys, ["simulate", str(valid), "--set", "model.preset=transformer", "--set", "model.d_model=100"],
             "--set 'model.d_model=100': model")


def test_the_apps_model_box_says_what_the_layers_are():
    pytest.importorskip("streamlit")
    from gpipe_app.ui_form import layer_count_caption

    assert layer_count_caption({"preset": "transformer", "layers": 24}) == \
        "This model has 26 layers (24 blocks + embedding + head)."
    assert layer_count_caption({"preset": "uniform", "layers": 16}) == "This model has 16 layers."
    assert layer_count_caption({"preset": "transformer", "layers": 0}) is None  # the scenario's check names it


def test_simulate_defaults_to_the_apis_engine_auto(scenario_file, capsys, monkeypatch):
    """`gpipe-sim simulate` without --engine runs what `api.simulate` does by default: auto, the
    fast evaluator where no device or link is shared, the SimPy engine where ranks share a device."""
    import gpipe_sim.api as api

    ran: list[str] = []
    fast, simpy = api.evaluate_fast, api.run_simpy
    monkeypatch.setattr(api, "evaluate_fast", lambda plan: (ran.append("fast"), fast(plan))[1])
    monkeypatch.setattr(api, "run_simpy", lambda plan: (ran.append("simpy"), simpy(plan))[1])
    default = _json(capsys, ["simulate", str(scenario_file), "--json", "--no-timeline"])
    assert ran == ["fast"]
    assert default == _json(capsys, ["simulate", str(scenario_file), "--json", "--no-timeline", "--engine", "auto"])
    assert _json(capsys, ["simulate", str(scenario_file), "--json", "--no-timeline",
                          "--set", "hardware.stage_to_device=[0, 0]"])["num_devices"] == 1
    assert ran == ["fast", "fast", "simpy"]


def test_every_tool_takes_the_one_default_engine():
    """The engine default is defined once (`engines.choice.DEFAULT_ENGINE`): the CLI, the API, sweep
    files and the sweep runner take it, and the CLI offers exactly the engines the API runs."""
    import inspect

    from gpipe_sim import api
    from gpipe_sim.cli import build_parser
    from gpipe_sim.engines.choice import DEFAULT_ENGINE, ENGINES
    from gpipe_sim.sweeps.runner import run_sweep
    from gpipe_sim.sweeps.spec import SweepSpec

    assert DEFAULT_ENGINE == "auto" and ENGINES == ("auto", "simpy", "fast")
    defaults = {f.__name__: inspect.signature(f).parameters["engine"].default
                for f in (api.simulate, api.simulate_plan, api.run_engine, run_sweep)}
    assert defaults == dict.fromkeys(defaults, DEFAULT_ENGINE)
    assert SweepSpec().engine == DEFAULT_ENGINE
    args = build_parser().parse_args(["simulate"])
    assert args.engine == DEFAULT_ENGINE
    with pytest.raises(SystemExit):
        build_parser().parse_args(["simulate", "--engine", "other"])


def test_a_set_key_starts_with_a_section_of_the_scenario():
    """`--set` keys, sweep columns and default sections all use the scenario's own sections."""
    from gpipe_sim.scenario.scenario import SECTIONS, Scenario
    from gpipe_sim.sweeps import SCENARIO_SECTIONS

    assert SECTIONS == tuple(Scenario.model_fields) and SCENARIO_SECTIONS is SECTIONS
    assert parse_override("training.dtype=bf16") == ("training.dtype", "bf16")
    with pytest.raises(ScenarioError, match="start with one of model, hardware, pipeline, training"):
        parse_override("optimizer.lr=1")
