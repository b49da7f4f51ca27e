"""One default scenario: no file, an empty file and `{}` run scenarios/default.yaml; a file's
missing sections are the default scenario's."""

from __future__ import annotations

import json

import pytest
import yaml

from gpipe_sim.cli import main
from gpipe_sim.scenario.command_scenario import load_command_scenario
from gpipe_sim.schema.files import read_data_file
from gpipe_sim.scenario.scenario import DEFAULT_SCENARIO, load_scenario, parse_scenario


@pytest.mark.parametrize("text", ["", "{}\n", "# only a comment\n"])
def test_an_empty_file_is_the_default_scenario(tmp_path, text):
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    default = load_command_scenario(None).to_dict()
    assert load_scenario(path).to_dict() == default
    assert default["hardware"]["preset"] == "a100-80gb" == yaml.safe_load(DEFAULT_SCENARIO.read_text())["hardware"]["preset"]


def test_a_files_missing_sections_are_the_default_scenarios(tmp_path):
    path = tmp_path / "partial.yaml"
    path.write_text("pipeline: {stages: 2, micro_batches: 4, batch_size: 8}\n")
    got = load_scenario(path).to_dict()
    written = read_data_file(DEFAULT_SCENARIO, "scenario")
    for section in ("model", "hardware", "training"):
        assert got[section] == parse_scenario({**written, "pipeline": {"stages": 2}}).to_dict()[section]
    assert got["pipeline"] == parse_scenario({**written, "pipeline": {"stages": 2, "micro_batches": 4,
                                                                        "batch_size": 8}}).to_dict()["pipeline"]


def test_the_cli_runs_the_same_figures_on_an_empty_file_as_on_no_file(tmp_path, capsys):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert main(["simulate", "--json"]) == 0
    none = json.loads(capsys.readouterr().out)
    assert main(["simulate", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == none


def test_the_app_opens_an_empty_file_as_its_default_form():
    pytest.importorskip("streamlit")
    from gpipe_app.ui_form import default_scenario_data
    from gpipe_app.ui_scenario import read_scenario_upload

    assert read_scenario_upload("empty.yaml", b"") == default_scenario_data() == load_command_scenario(None).to_dict()


def test_a_sweeps_inline_base_takes_the_default_sections_too():
    from gpipe_sim.sweeps.spec import parse_sweep, resolve_base

    spec = parse_sweep({"base": {"pipeline": {"stages": 2}}, "axes": {"pipeline.micro_batches": [1, 2]}})
    got = resolve_base(spec)
    default = load_command_scenario(None).to_dict()
    assert {s: got[s] for s in ("model", "hardware", "training")} == {
        s: default[s] for s in ("model", "hardware", "training")}
