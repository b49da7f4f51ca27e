"""The Streamlit app driven with AppTest: every page on defaults, the bubble metric, bad input."""

from __future__ import annotations

import json
import statistics

import pytest
import yaml

from gpipe_sim.results.result import analytic_bubble
from test_app_support import (
    UNIFORM, app_test, metric, page_ms, plotly_specs, set_widget, sweep_table, write_validation,
)

pytest.importorskip("streamlit")

K_M = [(2, 4), (4, 8), (8, 32), (16, 64), (16, 16)]


def uniform_app():
    at = app_test().run()
    for key, value in UNIFORM.items():
        set_widget(at, "cfg." + key, value)
    return at.run()


def assert_clean(at):
    assert not at.exception, [e.message for e in at.exception]


# --- Explore -------------------------------------------------------------------------------------


def test_explore_defaults_render_every_part():
    at = app_test().run()
    assert_clean(at)
    assert not at.error
    K = at.sidebar.number_input(key="cfg.pipeline.stages").value
    M = at.sidebar.number_input(key="cfg.pipeline.micro_batches").value
    assert metric(at, "Analytic (K-1)/(M+K-1)") == f"{analytic_bubble(K, M):.4f}"
    bubble = float(metric(at, "Bubble fraction"))
    assert 0.0 < bubble < 1.0
    specs = plotly_specs(at)
    assert len(specs) == 4  # Gantt, stage memory, memory over time, bubble vs M
    gantt = specs[0]
    kinds = {trace["name"] for trace in gantt["data"]}
    assert {"forward", "backward", "recompute", "send", "recv"} <= kinds  # default remat: always
    assert sorted({y for t in gantt["data"] for y in t["y"]}) == list(range(K))  # one row per stage
    assert [b.label for b in at.get("download_button")] == [
        "Scenario (YAML)", "Result (JSON)", "Timeline (Chrome trace)"]


def test_explore_bubble_follows_k_and_m_to_the_analytic_value():
    at = uniform_app()
    assert_clean(at)
    shown, timings = [], []
    for K, M in K_M:
        at.sidebar.number_input(key="cfg.pipeline.stages").set_value(K)
        at.sidebar.number_input(key="cfg.pipeline.micro_batches").set_value(M).run()
        assert_clean(at)
        expected = f"{analytic_bubble(K, M):.4f}"
        assert metric(at, "Bubble fraction") == expected, (K, M)
        assert metric(at, "Analytic (K-1)/(M+K-1)") == expected
        shown.append(metric(at, "Bubble fraction"))
        timings.append(page_ms(at))
    assert len(set(shown)) == len(K_M)  # every change of K or M changed the metric
    print(f"\nExplore page server time per K/M change (ms): {timings}")
    assert statistics.median(timings) < 500


def test_explore_every_preset_schedule_and_remat_renders():
    from gpipe_sim.spec.presets import hardware_presets
    from gpipe_sim.schedule import SCHEDULES

    at = app_test().run()
    settings = [("cfg.model.preset", p) for p in ("uniform", "mlp", "convnet", "amoebanet", "transformer")]
    settings += [("cfg.hardware.preset", h) for h in hardware_presets()]
    settings += [("cfg.pipeline.schedule", s) for s in SCHEDULES]
    settings += [("cfg.pipeline.remat", r) for r in ("none", "except_last", "always")]
    settings += [("cfg.pipeline.partition", p) for p in ("uniform", "memory", "time")]
    for key, value in settings:
        set_widget(at, key, value)
        at.run()
        assert_clean(at)
        assert [e.value for e in at.error if not e.value.startswith("Does not fit")] == [], (key, value)
        assert len(plotly_specs(at)) == 4, (key, value)
        if value == "naive":
            assert metric(at, "Analytic (K-1)/(M+K-1)") == f"{analytic_bubble(4, 1):.4f}"  # M = 1


def test_explore_impossible_inputs_show_one_line_errors():
    at = app_test().run()
    at.sidebar.number_input(key="cfg.pipeline.stages").set_value(100).run()
    assert_clean(at)
    assert len(at.error) == 1 and at.error[0].value.startswith("pipeline.stages:")
    assert "only 26 layers" in at.error[0].value
    assert not at.metric
    at.sidebar.number_input(key="cfg.pipeline.stages").set_value(4)
    at.sidebar.number_input(key="cfg.pipeline.micro_batches").set_value(128).run()
    assert_clean(at)
    assert at.error[0].value.startswith("pipeline.micro_batches:")
    at.sidebar.number_input(key="cfg.pipeline.micro_batches").set_value(8)
    set_widget(at, "cfg.hw.a100-80gb.memory", "lots")
    at.run()
    assert_clean(at)
    assert at.error[0].value.startswith("hardware.accelerator.memory_bytes:")


def test_explore_stage_to_device_map_shares_devices():
    at = uniform_app()
    at.sidebar.number_input(key="cfg.pipeline.stages").set_value(4)
    at.sidebar.number_input(key="cfg.pipeline.micro_batches").set_value(8).run()
    alone = metric(at, "Step time")
    set_widget(at, "cfg.hardware.stage_to_device", "0, 0, 1, 1")
    at.run()
    assert_clean(at)
    assert not at.error
    assert metric(at, "Step time") != alone  # two stages per device take turns: a longer step
    for text, start in (("0,x", "hardware.stage_to_device:"), ("0,0,1", "hardware.stage_to_device: 3 entries")):
        set_widget(at, "cfg.hardware.stage_to_device", text)
        at.run()
        assert_clean(at)
        assert len(at.error) == 1 and at.error[0].value.startswith(start), at.error[0].value
    set_widget(at, "cfg.hardware.stage_to_device", "")
    at.run()
    assert metric(at, "Step time") == alone


def test_explore_warns_when_a_stage_does_not_fit():
    at = app_test().run()
    set_widget(at, "cfg.hw.a100-80gb.memory", "2 GiB")
    at.run()
    assert_clean(at)
    assert len(at.error) == 1 and at.error[0].value.startswith("Does not fit in memory: device 0")
    assert "has 2.00 GiB" in at.error[0].value
    stage_memory = plotly_specs(at)[1]
    texts = [t for trace in stage_memory["data"] for t in trace.get("text") or []]
    assert "does not fit" in texts


def test_explore_uploaded_layer_table():
    at = uniform_app()
    set_widget(at, "cfg.model.preset", "table")
    at.run()
    assert_clean(at)
    assert not at.metric and "Upload a per-layer table" in at.info[0].value
    layers = [{"name": f"l{i}", "forward_s_per_sample": 1e-3, "backward_s_per_sample": 2e-3,
               "kernels": 0, "params": 1000, "activation_bytes_per_sample": 1e5,
               "output_bytes_per_sample": 1e4} for i in range(8)]
    uploader = at.sidebar.file_uploader[0]
    uploader.set_value(("layers.yaml", yaml.safe_dump({"layers": layers}).encode(), "application/x-yaml"))
    at.sidebar.number_input(key="cfg.pipeline.stages").set_value(4)
    at.sidebar.number_input(key="cfg.pipeline.micro_batches").set_value(8).run()
    assert_clean(at)
    assert metric(at, "Bubble fraction") == f"{analytic_bubble(4, 8):.4f}"
    at.switch_page("views/validate.py").run()
    at.switch_page("views/explore.py").run()  # the upload widget is new: the table is kept
    assert_clean(at)
    assert metric(at, "Bubble fraction") == f"{analytic_bubble(4, 8):.4f}"
    assert any("Using layers.yaml (8 layers)" in c.value for c in at.sidebar.caption)
    at.button(key="btn.forget_table").click().run()
    assert not at.metric and "Upload a per-layer table" in at.info[0].value
    bad = app_test().run()
    set_widget(bad, "cfg.model.preset", "table")
    bad.run().sidebar.file_uploader[0].set_value(("bad.yaml", b"layers: [{name: x}]", "text/yaml"))
    bad.run()
    assert_clean(bad)
    assert [e.value for e in bad.error] == [
        "model.layers.0: layer 'x' needs forward_flops_per_sample, forward_s_per_sample or timings"]
    broken = app_test().run()
    set_widget(broken, "cfg.model.preset", "table")
    broken.run().sidebar.file_uploader[0].set_value(("broken.yaml", b"layers: [", "text/yaml"))
    broken.run()
    assert_clean(broken)
    assert broken.error[0].value.startswith("model: malformed YAML in 'broken.yaml' at line 1")


# --- Compare -------------------------------------------------------------------------------------


def test_compare_defaults_gpipe_against_1f1b():
    at = app_test().run()
    at.switch_page("views/compare.py").run()
    assert_clean(at)
    assert not at.error
    assert at.selectbox(key="cfg.cmp.b.pipeline.schedule").value == "1f1b"
    assert [m.label for m in at.metric].count("Bubble fraction") == 2
    inputs_table = at.dataframe[0].value
    assert list(inputs_table.index) == ["pipeline.schedule"]
    assert list(inputs_table.iloc[0]) == ["gpipe", "1f1b"]
    assert len(plotly_specs(at)) == 4  # a Gantt and a memory chart per configuration


def test_compare_bubble_of_b_follows_its_k_and_m():
    at = uniform_app()
    at.switch_page("views/compare.py").run()
    for K, M in K_M[:3]:
        at.number_input(key="cfg.cmp.b.pipeline.stages").set_value(K)
        at.number_input(key="cfg.cmp.b.pipeline.micro_batches").set_value(M).run()
        assert_clean(at)
        bubbles = [m.value for m in at.metric if m.label == "Bubble fraction"]
        analytic = [m.value for m in at.metric if m.label == "Analytic (K-1)/(M+K-1)"]
        assert bubbles[1] == analytic[1] == f"{analytic_bubble(K, M):.4f}", (K, M)
    at.button(key="btn.cmp.reset").click().run()
    assert at.number_input(key="cfg.cmp.b.pipeline.stages").value == at.sidebar.number_input(
        key="cfg.pipeline.stages").value


def test_pages_keep_the_form_and_b_when_switching():
    at = app_test().run()
    at.sidebar.number_input(key="cfg.pipeline.stages").set_value(8).run()
    at.switch_page("views/compare.py").run()
    at.number_input(key="cfg.cmp.b.pipeline.micro_batches").set_value(32).run()
    at.switch_page("views/sweep.py").run()
    at.switch_page("views/compare.py").run()
    assert_clean(at)
    assert at.sidebar.number_input(key="cfg.pipeline.stages").value == 8
    assert at.number_input(key="cfg.cmp.b.pipeline.micro_batches").value == 32


def test_compare_impossible_b_shows_error():
    at = app_test().run()
    at.switch_page("views/compare.py").run()
    at.number_input(key="cfg.cmp.b.pipeline.stages").set_value(100).run()
    assert_clean(at)
    assert [e.value.split(":")[0] for e in at.error] == ["Configuration B"]
    assert "pipeline.stages" in at.error[0].value


# --- Validate ------------------------------------------------------------------------------------


def test_validate_empty_state():
    at = app_test().run()
    at.switch_page("views/validate.py").run()
    assert_clean(at)
    assert not at.error and "No validation loaded" in at.info[0].value
    assert not plotly_specs(at)


def test_validate_plots_prediction_against_measurement(tmp_path):
    at = app_test().run()
    at.switch_page("views/validate.py").run()
    for K, M in ((4, 8), (8, 16)):
        path = tmp_path / f"validate_{K}_{M}.json"
        doc = write_validation(path, K, M)
        at.text_input(key="cfg.validate.path").set_value(str(path)).run()
        assert_clean(at)
        assert not at.error
        assert metric(at, "Predicted bubble") == f"{analytic_bubble(K, M):.4f}"
        assert metric(at, "Measured bubble") == f"{doc['measured']['bubble_fraction']:.4f}"
        specs = plotly_specs(at)
        gantt, errors = specs[0], specs[1]
        assert {t["name"] for t in gantt["data"]} >= {"forward", "backward", "send", "recv"}
        assert len({t["yaxis"] for t in gantt["data"] if "yaxis" in t}) == 2  # predicted, measured
        bars = dict(zip(errors["data"][0]["x"], errors["data"][0]["y"]))
        assert bars == pytest.approx({k: 100 * v for k, v in doc["relative_error"].items()})
        assert len(specs) == 5  # Gantt, errors, busy, activations, step times
        assert specs[4]["data"][0]["y"] == pytest.approx(doc["measured_step_times_s"])
        assert any("Calibrated link" in c.value and "2 GB/s" in c.value for c in at.caption)
        table = at.dataframe[0].value
        step = table[table["figure"] == "step time"].iloc[0]
        assert step["relative error"] == f"{100 * doc['relative_error']['step_time_s']:.1f}%"


def test_validate_shows_every_round(tmp_path):
    at = app_test().run()
    at.switch_page("views/validate.py").run()
    path = tmp_path / "rounds.json"
    doc = write_validation(path)
    doc["rounds"] = [{"predicted_step_s": 0.1, "measured_step_s": 0.08},
                     {"predicted_step_s": 0.1, "measured_step_s": 0.1}, {"predicted_step_s": 0.1, "measured_step_s": 0.125}]
    path.write_text(json.dumps(doc))
    at.text_input(key="cfg.validate.path").set_value(str(path)).run()
    assert_clean(at)
    frames = [df.value for df in at.dataframe]
    rounds = [f for f in frames if "round" in f.columns]
    assert len(rounds) == 1 and list(rounds[0]["relative error"]) == ["25.0%", "0.0%", "20.0%"]
    doc["rounds"] = [{"predicted_step_s": "x"}, {"measured_step_s": 1}]
    (tmp_path / "bad_rounds.json").write_text(json.dumps(doc))
    at.text_input(key="cfg.validate.path").set_value(str(tmp_path / "bad_rounds.json")).run()
    assert_clean(at)
    assert any("rounds could not be read" in w.value for w in at.warning)


def test_validate_upload_and_bad_files(tmp_path):
    at = app_test().run()
    at.switch_page("views/validate.py").run()
    good = write_validation(tmp_path / "v.json", 2, 4)
    at.file_uploader[0].set_value(("v.json", (tmp_path / "v.json").read_bytes(), "application/json")).run()
    assert_clean(at)
    assert metric(at, "Predicted bubble") == f"{analytic_bubble(2, 4):.4f}"
    at.file_uploader[0].set_value(("bad.json", b"{not json", "application/json")).run()
    assert_clean(at)
    assert at.error[0].value.startswith("bad.json: not valid JSON")
    missing = {"predicted": good["predicted"]}
    at.file_uploader[0].set_value(("half.json", str.encode(json.dumps(missing)),
                                   "application/json")).run()
    assert at.error[0].value.startswith("half.json: measured: missing")
    no_timeline = {k: {**good[k], "timeline": []} for k in ("predicted", "measured")}
    at.file_uploader[0].set_value(("short.json", str.encode(json.dumps(no_timeline)),
                                   "application/json")).run()
    assert_clean(at)
    assert "no timelines" in at.info[0].value and not at.error
    at.file_uploader[0].set_value(None)
    at.text_input(key="cfg.validate.path").set_value(str(tmp_path / "nope.json")).run()
    assert_clean(at)
    assert "cannot read" in at.error[0].value


# --- Sweep ---------------------------------------------------------------------------------------


def test_sweep_empty_state():
    at = app_test().run()
    at.switch_page("views/sweep.py").run()
    assert_clean(at)
    assert not at.error and "No sweep loaded" in at.info[0].value


def test_sweep_plots_any_result_against_any_input(tmp_path):
    table = sweep_table()
    table.to_parquet(tmp_path / "results.parquet", index=False)
    at = app_test().run()
    at.switch_page("views/sweep.py").run()
    at.text_input(key="cfg.sweep.path").set_value(str(tmp_path)).run()
    assert_clean(at)
    assert not at.error
    assert "16 scenarios, 1 failed" in at.caption[0].value
    assert at.selectbox(key="cfg.sweep.x").value == "pipeline.micro_batches"
    assert at.selectbox(key="cfg.sweep.color").value == "pipeline.stages"
    at.selectbox(key="cfg.sweep.y").set_value("bubble_fraction").run()
    (fig,) = plotly_specs(at)
    assert len(fig["data"]) == 3  # one series per K; the failed K=32 row is left out
    for trace in fig["data"]:
        K = int(trace["name"].split("=")[1])
        assert trace["y"] == pytest.approx([analytic_bubble(K, m) for m in trace["x"]])
    options = at.selectbox(key="cfg.sweep.y").options
    assert "stage_peak_memory_bytes[0]" in options and "sweep.index" not in options
    at.selectbox(key="cfg.sweep.x").set_value("pipeline.stages")
    at.selectbox(key="cfg.sweep.color").set_value("(none)")
    at.selectbox(key="cfg.sweep.y").set_value("step_time_s").run()
    assert_clean(at)
    (fig,) = plotly_specs(at)
    ok = table[table["error"].isna()].sort_values("pipeline.stages", kind="stable")
    assert fig["data"][0]["x"] == ok["pipeline.stages"].tolist()
    assert fig["data"][0]["y"] == pytest.approx(ok["step_time_s"].tolist())
    assert fig["layout"]["xaxis"].get("type") != "log"
    at.toggle(key="cfg.sweep.log_x").set_value(True).run()
    assert plotly_specs(at)[0]["layout"]["xaxis"]["type"] == "log"
    # One row rebuilt into its scenario and re-simulated gives the table's step time; downloads.
    index = int(table[(table["pipeline.stages"] == 4) & (table["pipeline.micro_batches"] == 8)].index[0])
    at.selectbox(key="cfg.sweep.row").set_value(index).run()
    assert_clean(at)
    (note,) = [c.value for c in at.caption if c.value.startswith("Re-simulated here")]
    again, in_table = note.removeprefix("Re-simulated here: step time ").split(" (the sweep's table: ")
    assert again == in_table.rstrip(").")
    assert [b.label for b in at.get("download_button")][1:] == [
        "Scenario (YAML)", "Result (JSON)", "Timeline (Chrome trace)"]


def test_sweep_csv_upload_and_bad_input(tmp_path):
    at = app_test().run()
    at.switch_page("views/sweep.py").run()
    csv = sweep_table(stages=(2, 4), micro=(2, 8)).to_csv(index=False).encode()
    at.file_uploader[0].set_value(("results.csv", csv, "text/csv")).run()
    assert_clean(at)
    assert "5 scenarios, 1 failed" in at.caption[0].value
    at.file_uploader[0].set_value(("results.csv", b"a,b\n1,2\n", "text/csv")).run()
    assert_clean(at)
    assert "no input columns" in at.error[0].value
    at.file_uploader[0].set_value(None)
    at.text_input(key="cfg.sweep.path").set_value(str(tmp_path / "missing")).run()
    assert_clean(at)
    assert "does not exist" in at.error[0].value
