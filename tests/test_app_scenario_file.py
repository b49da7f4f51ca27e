"""The app opens a scenario file (an upload, or `streamlit run app/streamlit_app.py -- FILE`) into
the sidebar form and downloads the form's scenario as YAML; a bad file is one error line."""

from __future__ import annotations

import sys

import pytest
import yaml

from gpipe_sim import load_scenario, parse_scenario, simulate
from test_app_support import APP, ROOT, app_test, metric

pytest.importorskip("streamlit")
from gpipe_app.ui_scenario import command_line_path, differing_fields, scenario_download_yaml  # noqa: E402

# d_model 2560 (the default scenario's is 2048, so the form showing it proves the file was read)
SCENARIO = {
    "model": {"preset": "transformer", "layers": 12, "d_model": 2560, "d_ff": 10240, "heads": 20,
              "seq_len": 2048, "vocab": 50257},
    "hardware": {"preset": "a100-80gb"},
    "pipeline": {"stages": 2, "micro_batches": 8, "batch_size": 32, "schedule": "1f1b", "remat": "none",
                 "partition": "uniform"},
    "training": {"optimizer": "adam", "dtype": "bf16"},
}
YAML = "application/x-yaml"


def _form(at, key):
    widgets = [w for kind in ("number_input", "selectbox", "text_input")
               for w in getattr(at.sidebar, kind) if w.key == "cfg." + key]
    assert widgets, key
    return widgets[0].value


def _assert_shows_scenario(at):
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert _form(at, "model.transformer.d_model") == 2560
    assert _form(at, "model.transformer.seq_len") == 2048
    assert _form(at, "pipeline.stages") == 2 and _form(at, "pipeline.micro_batches") == 8
    assert _form(at, "pipeline.schedule") == "1f1b" and _form(at, "pipeline.remat") == "none"
    assert metric(at, "Step time")  # and the page simulated it


def _upload(at, name, data: bytes):
    at.sidebar.file_uploader(key="upload.scenario").set_value((name, data, YAML))
    return at.run()


def test_an_uploaded_scenario_fills_the_form_and_stays_across_pages():
    at = app_test().run()
    assert _form(at, "model.transformer.d_model") == 2048
    _upload(at, "gpt.yaml", yaml.safe_dump(SCENARIO).encode())
    _assert_shows_scenario(at)
    assert any(c.value == "Opened gpt.yaml." for c in at.sidebar.caption)
    at.sidebar.number_input(key="cfg.pipeline.micro_batches").set_value(16).run()  # then edited as usual
    assert _form(at, "pipeline.micro_batches") == 16 and _form(at, "model.transformer.d_model") == 2560
    at.switch_page("views/compare.py").run()
    at.switch_page("views/explore.py").run()
    assert _form(at, "model.transformer.d_model") == 2560 and _form(at, "pipeline.micro_batches") == 16


def test_a_json_upload_and_a_layer_table_scenario():
    import json

    at = _upload(app_test().run(), "gpt.json", json.dumps(SCENARIO).encode())
    _assert_shows_scenario(at)
    layers = [{"name": f"l{i}", "forward_s_per_sample": 1e-3, "backward_s_per_sample": 2e-3, "params": 1000,
               "activation_bytes_per_sample": 1e5, "output_bytes_per_sample": 1e4} for i in range(8)]
    table = {"model": {"preset": "table", "layers": layers}, "hardware": {"preset": "ideal"},
             "pipeline": {"stages": 4, "micro_batches": 4, "batch_size": 16, "remat": "none"}}
    at = _upload(app_test().run(), "table.yaml", yaml.safe_dump(table).encode())
    assert not at.error and not at.exception
    assert _form(at, "model.preset") == "table" and _form(at, "pipeline.stages") == 4
    assert any("Using table.yaml (8 layers)" in c.value for c in at.sidebar.caption)


@pytest.mark.parametrize("name, data, start", [
    ("broken.yaml", b"model: [", "Could not open broken.yaml: malformed YAML in 'broken.yaml' at line "),
    ("typo.yaml", b"pipeline: {micro_batchs: 4}",
     "Could not open typo.yaml: pipeline.micro_batchs: unknown key (did you mean micro_batches?)"),
    ("list.yaml", b"- 1\n- 2\n", "Could not open list.yaml: scenario: expected a mapping"),
    ("bad.json", b"{not json", "Could not open bad.json: malformed JSON in 'bad.json' at line 1"),
])
def test_a_bad_upload_is_one_error_line_and_the_form_keeps_its_values(name, data, start):
    at = app_test().run()
    before = metric(at, "Step time")
    _upload(at, name, data)
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and errors[0].startswith(start) and "\n" not in errors[0], errors
    assert "Traceback" not in errors[0] and "/tmp" not in errors[0]
    assert _form(at, "model.transformer.d_model") == 2048 and metric(at, "Step time") == before


def test_the_command_line_scenario_opens_in_the_form(tmp_path, monkeypatch):
    path = tmp_path / "gpt.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    monkeypatch.setattr(sys, "argv", [str(APP), str(path)])
    at = app_test().run()
    _assert_shows_scenario(at)
    at.sidebar.number_input(key="cfg.pipeline.stages").set_value(4).run()
    assert _form(at, "pipeline.stages") == 4  # opened once per session, not on every rerun


@pytest.mark.parametrize("content", [None, "pipeline: {stages: -1}\n", "model: {preset: transformer\n"])
def test_a_bad_command_line_scenario_is_one_error_line_and_the_defaults_run(tmp_path, monkeypatch, content):
    path = tmp_path / "bad.yaml"
    if content is not None:
        path.write_text(content)
    monkeypatch.setattr(sys, "argv", [str(APP), str(path)])
    at = app_test().run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and errors[0].startswith("Could not open ") and "\n" not in errors[0], errors
    assert _form(at, "model.transformer.d_model") == 2048 and metric(at, "Step time")


def test_only_this_app_reads_the_command_line():
    assert command_line_path([str(APP), "s.yaml"], APP) == "s.yaml"
    assert command_line_path(["app/streamlit_app.py", "s.yaml"], ROOT / "app" / "streamlit_app.py") in (
        "s.yaml", None)  # relative to the current folder
    assert command_line_path(["/usr/bin/pytest", "tests/test_app.py"], APP) is None  # a test runner's argv
    assert command_line_path([str(APP)], APP) is None


# Fields the form has no widget for (host costs, the network's latency, ports and NICs, a goodput
# model) and values its lists do not offer (a list of layer counts, T = 128 is not needed here):
# carried through or offered, so the app runs the file as the CLI does.
CLUSTER = {**SCENARIO,
           "hardware": {"preset": "a100-80gb", "devices_per_node": 4, "host": {"action_s": 2e-5},
                        "network": {"bandwidth": "100 Gb/s", "latency_s": 2e-5, "per": "node", "nics": 2}},
           "pipeline": {**SCENARIO["pipeline"], "data_parallel": 4, "partition": [6, 8]},
           "training": {**SCENARIO["training"], "tokens": "1B",
                        "goodput": {"mtbf_device_hours": 50_000, "checkpoint_save_s": 30}}}


def test_the_app_holds_every_field_of_an_opened_file_and_agrees_with_the_cli(tmp_path, monkeypatch, capsys):
    import json

    from gpipe_app.ui_run import duration_text
    from gpipe_sim.cli import main

    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(CLUSTER))
    assert main(["simulate", str(path), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    dropped = {**CLUSTER, "hardware": {**CLUSTER["hardware"], "network": {"bandwidth": "100 Gb/s"}}}
    assert parse_scenario(dropped).to_dict() != parse_scenario(CLUSTER).to_dict()
    without = simulate(parse_scenario(dropped)).step_time_s
    assert duration_text(without) != duration_text(cli["step_time_s"])  # the network fields matter here

    monkeypatch.setattr(sys, "argv", [str(APP), str(path)])
    at = app_test().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert not at.warning, [w.value for w in at.warning]  # nothing the file gives is left out
    assert _form(at, "pipeline.partition") == "layers: 6, 8"
    assert metric(at, "Step time") == duration_text(cli["step_time_s"])
    at.sidebar.number_input(key="cfg.pipeline.micro_batches").set_value(8).run()  # an edit keeps them
    want = simulate(parse_scenario({**CLUSTER, "pipeline": {**CLUSTER["pipeline"], "micro_batches": 8}}))
    assert metric(at, "Step time") == duration_text(want.step_time_s)


def test_a_schedule_csv_and_a_partition_list_are_form_choices():
    from gpipe_app.ui_scenario import choice_value, file_choice

    for value in ({"csv": "/tmp/s.csv"}, [6, 8], "1f1b", "time"):
        assert choice_value(file_choice(value)) == value
    assert file_choice({"csv": "s.csv"}) == "csv: s.csv" and file_choice((3, 4)) == "layers: 3, 4"


def test_the_sidebar_downloads_the_forms_scenario_as_yaml():
    at = _upload(app_test().run(), "gpt.yaml", yaml.safe_dump(SCENARIO).encode())
    assert "Download this scenario (YAML)" in [b.label for b in at.sidebar.get("download_button")]
    from gpipe_sim import parse_scenario

    want = parse_scenario(SCENARIO).to_dict()
    text = scenario_download_yaml(SCENARIO)
    assert differing_fields(parse_scenario(yaml.safe_load(text)).to_dict(), want) == []
    bad = scenario_download_yaml({**SCENARIO, "pipeline": {**SCENARIO["pipeline"], "stages": 99}})
    assert bad.startswith("# does not validate yet: pipeline.stages: ") and yaml.safe_load(bad)["pipeline"]["stages"] == 99


def test_differing_fields():
    assert differing_fields({"a": {"b": 1.0, "c": [1, 2]}}, {"a": {"b": 1.000001, "c": [1, 2]}}) == []
    assert differing_fields({"a": {"b": 1.0}}, {"a": {"b": 2.0, "d": "x"}}) == ["a.b", "a.d"]
    assert differing_fields({"p": [1, 2]}, {"p": [1, 3]}) == ["p"]


def test_carried_links_are_set_aside_while_k_differs_and_come_back(tmp_path, monkeypatch):
    """A file's per-pair links (no widget) are for its K: with another K they are left out and
    named, and with the file's K again the app runs the file's scenario."""
    data = {**SCENARIO, "pipeline": {**SCENARIO["pipeline"], "stages": 3, "batch_size": 48},
            "hardware": {"preset": "a100-80gb", "links": [{"bandwidth": "10 GB/s"}, {"bandwidth": "20 GB/s"}]}}
    path = tmp_path / "links.yaml"
    path.write_text(yaml.safe_dump(data))
    from gpipe_app.ui_run import duration_text

    want = duration_text(simulate(parse_scenario(data)).step_time_s)
    monkeypatch.setattr(sys, "argv", [str(APP), str(path)])
    at = app_test().run()
    assert not at.error and not at.warning and metric(at, "Step time") == want
    at.sidebar.number_input(key="cfg.pipeline.stages").set_value(2).run()
    assert not at.error, [e.value for e in at.error]
    assert [w.value for w in at.warning] == [
        "Not used while K or D differ from the file's: hardware.links (2 per-pair links, for 3 stages) "
        "(they come back with the file's K and D)."]
    at.sidebar.number_input(key="cfg.pipeline.stages").set_value(3).run()
    assert not at.warning and metric(at, "Step time") == want


def test_a_csv_schedule_file_runs_in_explore_and_compare(tmp_path, monkeypatch):
    """A schedule read from torch's CSV format is the schedule box's `csv: PATH` choice: Explore
    and Compare run it, with the same step as the CLI."""
    from gpipe_app.ui_run import duration_text

    (tmp_path / "k2.csv").write_text("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")
    data = {"model": {"preset": "uniform", "layers": 4}, "hardware": {"preset": "ideal"},
            "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 4, "remat": "none",
                         "schedule": {"csv": str(tmp_path / "k2.csv")}}}
    path = tmp_path / "csv.yaml"
    path.write_text(yaml.safe_dump(data))
    want = duration_text(simulate(load_scenario(path)).step_time_s)
    monkeypatch.setattr(sys, "argv", [str(APP), str(path)])
    at = app_test().run()
    assert not at.exception and not at.error and not at.warning, [e.value for e in at.error]
    assert _form(at, "pipeline.schedule") == f"csv: {tmp_path / 'k2.csv'}"
    assert metric(at, "Step time") == want
    at.switch_page("views/compare.py").run()
    assert not at.exception and not at.error, [e.value for e in at.error]


def test_a_mixture_of_experts_file_keeps_its_optional_sizes_and_parallel_sizes(tmp_path, monkeypatch):
    """An opened file's expert_d_ff, kv_heads, capacity factor, C and E stay in the form (each an
    input) and the page simulates the file's own scenario."""
    from gpipe_app.ui_run import duration_text

    data = {**SCENARIO, "model": {**SCENARIO["model"], "attention": "flash", "kv_heads": 4, "experts": 4,
                                  "top_k": 2, "expert_d_ff": 2560, "capacity_factor": 1.25},
            "pipeline": {**SCENARIO["pipeline"], "data_parallel": 2, "expert_parallel": 2, "context_parallel": 2}}
    path = tmp_path / "moe.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.setattr(sys, "argv", [str(APP), str(path)])
    at = app_test().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert _form(at, "model.transformer.expert_d_ff") == 2560 and _form(at, "model.transformer.kv_heads") == 4
    assert _form(at, "pipeline.expert_parallel") == 2 and _form(at, "pipeline.context_parallel") == 2
    assert metric(at, "Step time") == duration_text(simulate(parse_scenario(data)).step_time_s)
