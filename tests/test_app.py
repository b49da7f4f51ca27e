"""The Streamlit app driven with AppTest: every page on defaults, the bubble metric, bad input."""

from __future__ import annotations

import json
import re
import statistics

import pytest
import yaml

from gpipe_sim.schedule.registry import fill_drain_bubble
from test_app_support import (
    ANALYTIC, UNIFORM, app_test, metric, page_ms, plotly_specs, set_widget, sweep_table, write_validation,
)

pytest.importorskip("streamlit")
from gpipe_app.ui_run import label_error  # noqa: E402

STALE = "Showing the last result that ran"

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
    assert metric(at, ANALYTIC) == f"{fill_drain_bubble(K, M):.4f}"
    bubble = float(metric(at, "Bubble fraction"))
    assert 0.0 < bubble < 1.0
    specs = plotly_specs(at)
    assert len(specs) == 4  # Gantt, stage memory, memory over time, bubble vs M
    gantt = specs[0]
    kinds = {trace["name"] for trace in gantt["data"]}
    assert {"forward", "backward", "recompute", "send", "recv"} <= kinds  # default remat: always
    assert sorted({y for t in gantt["data"] for y in t["y"]}) == list(range(K))  # one row per stage
    assert [b.label for b in at.get("download_button")] == [
        "Scenario (YAML)", "Result (JSON)", "Timeline (Chrome trace)", "Download this scenario (YAML)"]
    assert [b.label for b in at.sidebar.get("download_button")] == ["Download this scenario (YAML)"]


def test_explore_bubble_follows_k_and_m_to_the_analytic_value():
    at = uniform_app()
    assert_clean(at)
    shown, timings = [], []
    for K, M in K_M:
        at.sidebar.number_input(key="cfg.pipeline.stages").set_value(K)
        at.sidebar.number_input(key="cfg.pipeline.micro_batches").set_value(M).run()
        assert_clean(at)
        expected = f"{fill_drain_bubble(K, M):.4f}"
        assert metric(at, "Bubble fraction") == expected, (K, M)
        assert metric(at, ANALYTIC) == expected
        shown.append(metric(at, "Bubble fraction"))
        timings.append(page_ms(at))
    assert len(set(shown)) == len(K_M)  # every change of K or M changed the metric
    print(f"\nExplore page server time per K/M change (ms): {timings}")
    assert statistics.median(timings) < 500


def test_explore_every_preset_schedule_and_remat_renders():
    from gpipe_sim.hardware.presets import hardware_presets
    from gpipe_sim.schedule import SCHEDULES

    at = app_test().run()
    assert at.sidebar.selectbox(key="cfg.pipeline.schedule").options == list(SCHEDULES)
    settings = [("cfg.model.preset", p) for p in ("uniform", "mlp", "convnet", "amoebanet", "transformer")]
    settings += [("cfg.hardware.preset", h) for h in hardware_presets()]
    settings += [("cfg.pipeline.schedule", s) for s in SCHEDULES]
    settings += [("cfg.pipeline.remat", r) for r in ("none", "except_last", "always")]
    settings += [("cfg.pipeline.partition", p) for p in ("uniform", "memory", "time", "fit")]
    for key, value in settings:
        set_widget(at, key, value)
        at.run()
        assert_clean(at)
        errors = [e.value for e in at.error if not e.value.startswith("Does not fit")]
        K, M, v = (at.sidebar.number_input(key=f"cfg.pipeline.{n}").value for n in ("stages", "micro_batches", "chunks"))
        problem = SCHEDULES[at.sidebar.selectbox(key="cfg.pipeline.schedule").value].problem(K, M, v)
        if problem is None:
            assert errors == [], (key, value)
            assert len(plotly_specs(at)) == 4, (key, value)
            assert not any(w.value.startswith(STALE) for w in at.warning)
        else:  # the schedule's own one-line rule (e.g. naive's M = 1) naming the widget; the last
            # good result stays below it, marked stale
            assert errors == [label_error(problem)] and "\n" not in problem, (key, value)
            assert not errors[0].startswith("pipeline.")
            assert any(w.value.startswith(STALE) for w in at.warning)
    set_widget(at, "cfg.pipeline.schedule", "naive")
    set_widget(at, "cfg.pipeline.partition", "time")  # `fit` names the failure when nothing fits
    at.sidebar.number_input(key="cfg.pipeline.micro_batches").set_value(1).run()
    assert_clean(at)
    assert not any(w.value.startswith(STALE) for w in at.warning)
    assert metric(at, ANALYTIC) == f"{fill_drain_bubble(4, 1):.4f}"


def test_explore_interleaved_bubble_is_the_schedules_own():
    """Interleaved 1F1B with v = 2 on the uniform model and ideal hardware: the shown bubble is
    (K-1)/(v*M+K-1), the ranks table shows each rank's two chunks and their layers."""
    at = uniform_app()
    set_widget(at, "cfg.pipeline.schedule", "interleaved_1f1b")
    set_widget(at, "cfg.pipeline.chunks", 2)
    v = 2
    for K, M in ((2, 4), (4, 8), (4, 16), (8, 32)):
        at.sidebar.number_input(key="cfg.pipeline.stages").set_value(K)
        at.sidebar.number_input(key="cfg.pipeline.micro_batches").set_value(M).run()
        assert_clean(at)
        assert not at.error, [e.value for e in at.error]
        expected = f"{(K - 1) / (v * M + K - 1):.4f}"
        assert metric(at, "Bubble fraction") == expected, (K, M)
        assert metric(at, ANALYTIC) == expected
        assert expected != f"{fill_drain_bubble(K, M):.4f}"  # not GPipe's
    table = at.dataframe[0].value
    assert list(table["rank"]) == list(range(8))
    assert list(table["chunks"]) == [f"{k}, {k + 8}" for k in range(8)]
    assert list(table["layers"]) == [f"{k}, {k + 8}" for k in range(8)]  # 16 layers in 16 chunks
    bubble_chart = plotly_specs(at)[3]
    curves = {t["name"]: t for t in bubble_chart["data"]}
    assert curves["K=8 analytic"]["y"] == pytest.approx([7 / (2 * m + 7) for m in curves["K=8 analytic"]["x"]])
    assert curves["current (analytic)"]["y"] == pytest.approx([7 / 71])
    gantt = plotly_specs(at)[0]
    shown_chunks = {text.split("<br>")[0] for t in gantt["data"] for text in t["hovertext"]}
    assert shown_chunks & {"chunk 8", "chunks 0, 8"}  # hover names the chunk (rank 0 holds 0 and 8)
    # Wrong combinations: the schedule's one-line message, nothing else.
    at.sidebar.number_input(key="cfg.pipeline.micro_batches").set_value(12).run()
    assert_clean(at)
    assert [e.value for e in at.error] == [
        "micro-batches M: interleaved_1f1b with 2 chunks per rank needs M to be a multiple of the 8 ranks, got 12"]
    assert metric(at, "Bubble fraction") == expected  # the last good result, marked stale
    at.sidebar.number_input(key="cfg.pipeline.micro_batches").set_value(16)
    set_widget(at, "cfg.pipeline.schedule", "gpipe")
    at.run()
    assert [e.value.split(":")[0] for e in at.error] == ["chunks per rank v"]
    set_widget(at, "cfg.pipeline.chunks", 3)
    set_widget(at, "cfg.pipeline.schedule", "interleaved_1f1b")
    at.run()
    assert [e.value.split(":")[0] for e in at.error] == ["chunks per rank v"]  # 24 chunks, 16 layers


def test_explore_impossible_inputs_show_one_line_errors_naming_the_widget():
    at = app_test().run()
    at.sidebar.number_input(key="cfg.pipeline.stages").set_value(100).run()
    assert_clean(at)
    assert len(at.error) == 1 and at.error[0].value.startswith("stages K:")
    assert "only 26 layers" in at.error[0].value
    at.sidebar.number_input(key="cfg.pipeline.stages").set_value(4)
    at.sidebar.number_input(key="cfg.pipeline.micro_batches").set_value(128).run()
    assert_clean(at)
    assert at.error[0].value.startswith("micro-batches M:")
    at.sidebar.number_input(key="cfg.pipeline.micro_batches").set_value(8)
    set_widget(at, "cfg.hw.a100-80gb.memory", "lots")
    at.run()
    assert_clean(at)
    assert at.error[0].value.startswith("device memory:")
    assert "hardware." not in at.error[0].value.split(":")[0]


def test_explore_keeps_the_last_good_result_greyed_under_an_error():
    """One bad input must not blank the page: the error (naming the widget) on top, then the last
    result that ran, in a container the page greys out, with a note that it is stale."""
    at = app_test().run()
    good = {m.label: m.value for m in at.metric}
    specs = len(plotly_specs(at))
    assert not at.warning
    at.sidebar.number_input(key="cfg.pipeline.stages").set_value(100).run()
    assert_clean(at)
    assert [e.value.split(":")[0] for e in at.error] == ["stages K"]
    assert [w.value for w in at.warning if w.value.startswith(STALE)]
    assert {m.label: m.value for m in at.metric} == good  # the same figures, still there
    assert len(plotly_specs(at)) == specs
    css = [m.value for m in at.markdown if "st-key-explore-stale" in m.value]
    assert css and "opacity" in css[0] and "grayscale" in css[0]
    at.sidebar.number_input(key="cfg.pipeline.stages").set_value(8).run()  # fixed: live again
    assert not at.error and not [w for w in at.warning if w.value.startswith(STALE)]
    assert metric(at, "Step time") != good["Step time"]
    first = app_test()  # an error before anything ran: nothing to show but the error
    first.session_state["cfg.pipeline.stages"] = 100
    first.run()
    assert [e.value.split(":")[0] for e in first.error] == ["stages K"] and not first.metric


def test_explore_metrics_are_short_and_split_the_bubble():
    """Metric values short enough never to be cut off; imbalance and fill/drain beside the bubble,
    with 1 - bubble = (1 - imbalance) x (1 - fill/drain)."""
    at = app_test().run()
    assert_clean(at)
    values = {m.label: m.value for m in at.metric}
    assert {"Step time", "Throughput (samples/s)", "Largest device peak", "Bubble fraction", "Imbalance",
            "Fill/drain (busiest rank idle)", ANALYTIC, "Parameters", "Tokens/s", "TFLOP/s per device",
            "MFU"} == set(values)
    assert all(len(v) <= 10 for v in values.values()), values
    assert values["Parameters"].endswith("B") and 0 < float(values["MFU"].rstrip("%")) < 100
    bubble, imbalance, idle = (float(values[k]) for k in ("Bubble fraction", "Imbalance",
                                                            "Fill/drain (busiest rank idle)"))
    assert 1 - bubble == pytest.approx((1 - imbalance) * (1 - idle), abs=2e-4)
    assert float(values["Throughput (samples/s)"].replace(",", "")) > 0


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
    for text, start in (("0,x", "rank → device map:"), ("0,0,1", "rank → device map: 3 entries")):
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
    text = at.error[0].value
    assert len(at.error) == 1 and text.startswith("Does not fit in memory: devices 0-"), text
    assert "do not fit; the fullest, device " in text and "has 2.00 GiB" in text
    assert text.count("(rank") == 1  # the fullest only, not a line per device
    stage_memory = plotly_specs(at)[1]
    marked = [trace for trace in stage_memory["data"] if trace.get("name") == "does not fit"]
    assert marked and marked[0]["x"] and not marked[0].get("text")  # a marker per rank, no labels


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
    assert metric(at, "Bubble fraction") == f"{fill_drain_bubble(4, 8):.4f}"
    at.switch_page("views/validate.py").run()
    at.switch_page("views/explore.py").run()  # the upload widget is new: the table is kept
    assert_clean(at)
    assert metric(at, "Bubble fraction") == f"{fill_drain_bubble(4, 8):.4f}"
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
    assert broken.error[0].value.startswith("model: malformed YAML in 'broken.yaml' at line ")


# --- Compare -------------------------------------------------------------------------------------

B = "cmp.w.B."  # B's widgets: A's values, or B's own changes


def compare_app(at=None):
    at = at or app_test().run()
    at.switch_page("views/compare.py").run()
    assert_clean(at)
    return at


def figures(at):
    """The figures table (rows: figures, columns: configurations)."""
    return next(df.value for df in at.dataframe if "step time" in df.value.index)


def differing_inputs(at):
    return next(df.value for df in at.dataframe if "A" in df.value.columns and "B" in df.value.columns
                and "step time" not in df.value.index)


def test_compare_defaults_gpipe_against_1f1b():
    at = compare_app()
    assert not at.error
    assert at.selectbox(key=B + "pipeline.schedule").value == "1f1b"
    assert [m.label for m in at.metric].count("Bubble fraction") == 2
    inputs_table = differing_inputs(at)
    assert list(inputs_table.index) == ["pipeline.schedule"]
    assert list(inputs_table.iloc[0]) == ["gpipe", "1f1b"]
    assert len(plotly_specs(at)) == 4  # a Gantt and a memory chart per configuration


def test_compare_b_follows_a_after_a_changes():
    """B is A with B's own changes: changing A afterwards changes B too, except the fields
    changed in B's column."""
    at = compare_app()
    at.number_input(key=B + "pipeline.micro_batches").set_value(32).run()  # B's own M
    for K in (8, 2):
        at.sidebar.number_input(key="cfg.pipeline.stages").set_value(K).run()
        assert_clean(at)
        assert at.number_input(key=B + "pipeline.stages").value == K  # follows A
        assert at.number_input(key=B + "pipeline.micro_batches").value == 32  # its own
        assert at.selectbox(key=B + "pipeline.schedule").value == "1f1b"
        inputs_table = differing_inputs(at)
        assert set(inputs_table.index) == {"pipeline.schedule", "pipeline.micro_batches"}
        assert inputs_table.loc["pipeline.stages" if "pipeline.stages" in inputs_table.index
                                else "pipeline.micro_batches"].tolist() == ["16", "32"]
        analytic = [m.value for m in at.metric if m.label == ANALYTIC]
        assert analytic[1] == f"{(K - 1) / (32 + K - 1):.4f}"  # B runs K (A's) and M = 32
    set_widget(at, "cfg.training.dtype", "fp32")  # a field B has no change of: followed
    at.run()
    assert at.selectbox(key=B + "training.dtype").value == "fp32"
    at.number_input(key=B + "pipeline.micro_batches").set_value(16).run()  # back to A's: no change left
    assert set(differing_inputs(at).index) == {"pipeline.schedule"}
    at.button(key="btn.cmp.reset.B").click().run()
    assert_clean(at)
    assert at.selectbox(key=B + "pipeline.schedule").value == "gpipe"
    assert any("The configurations are the same" in i.value for i in at.info)


def test_compare_up_to_four_columns_with_model_dtype_and_optimizer():
    at = compare_app()
    at.button(key="btn.cmp.add").click().run()
    at.selectbox(key="cmp.w.C.training.dtype").set_value("fp32").run()
    at.selectbox(key="cmp.w.C.training.optimizer").set_value("sgd").run()
    at.button(key="btn.cmp.add").click().run()
    at.selectbox(key="cmp.w.D.model.preset").set_value("mlp").run()
    at.number_input(key="cmp.w.D.model.layers").set_value(6).run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert not [b for b in at.button if b.key == "btn.cmp.add"]  # four columns at most
    table = figures(at)
    assert list(table.columns) == ["A", "B", "C", "D"]
    inputs_table = differing_inputs(at)
    assert inputs_table.loc["training.dtype"].tolist() == ["bf16", "bf16", "fp32", "bf16"]
    assert inputs_table.loc["training.optimizer"].tolist() == ["adam", "adam", "sgd", "adam"]
    assert inputs_table.loc["model.preset"].tolist() == ["transformer"] * 3 + ["mlp"]
    assert inputs_table.loc["model.layers"].tolist() == ["24", "24", "24", "6"]
    assert len(plotly_specs(at)) == 8
    set_widget(at, "cfg.pipeline.stages", 2)  # all three follow A
    at.run()
    assert [at.number_input(key=f"cmp.w.{n}.pipeline.stages").value for n in "BCD"] == [2, 2, 2]
    at.button(key="btn.cmp.remove.C").click().run()  # D becomes C, keeping its changes
    assert_clean(at)
    assert list(figures(at).columns) == ["A", "B", "C"]
    assert at.selectbox(key="cmp.w.C.model.preset").value == "mlp"


def test_compare_deltas_are_readable():
    """Differences with units, signs and percentages: never '-1.33e+03 ms'."""
    at = compare_app()
    at.number_input(key=B + "pipeline.stages").set_value(8).run()
    table = figures(at)
    cells = [str(v) for v in table["B"]]
    assert not any("e+" in c or "e-" in c for c in cells), cells
    step = table.loc["step time", "B"]
    assert re.fullmatch(r"[\d.]+ (ms|s|min|h) \([+-][\d.]+ (us|ms|s|min|h), [+-][\d.]+%\)", step), step
    peak = table.loc["largest device peak", "B"]
    assert re.fullmatch(r"[\d.]+ [KMGT]iB \([+-][\d.]+ [KMGT]iB, [+-][\d.]+%\)", peak), peak
    deltas = [m.proto.delta for m in at.metric if m.proto.delta]
    assert deltas and all(d[0] in "+-" or d == "no change" for d in deltas)
    assert not any("e+" in d for d in deltas)


def test_compare_b_starts_from_a_v_its_schedule_takes():
    at = uniform_app()
    set_widget(at, "cfg.pipeline.schedule", "interleaved_1f1b")
    set_widget(at, "cfg.pipeline.chunks", 2)
    at.sidebar.number_input(key="cfg.pipeline.stages").set_value(4)
    at.sidebar.number_input(key="cfg.pipeline.micro_batches").set_value(8).run()
    at = compare_app(at)
    assert not at.error, [e.value for e in at.error]
    b_schedule = at.selectbox(key=B + "pipeline.schedule").value
    assert b_schedule != "interleaved_1f1b"
    from gpipe_sim.schedule import SCHEDULES
    v = at.number_input(key=B + "pipeline.chunks").value
    assert SCHEDULES[b_schedule].problem(4, 8, v) is None
    assert list(figures(at).index).count("analytic bubble") == 1


def test_compare_bubble_of_b_follows_its_k_and_m():
    at = compare_app(uniform_app())
    at.selectbox(key=B + "pipeline.schedule").set_value("gpipe").run()
    for K, M in K_M[:3]:
        at.number_input(key=B + "pipeline.stages").set_value(K)
        at.number_input(key=B + "pipeline.micro_batches").set_value(M).run()
        assert_clean(at)
        bubbles = [m.value for m in at.metric if m.label == "Bubble fraction"]
        analytic = [m.value for m in at.metric if m.label == ANALYTIC]
        assert bubbles[1] == analytic[1] == f"{fill_drain_bubble(K, M):.4f}", (K, M)
    at.selectbox(key=B + "pipeline.schedule").set_value("interleaved_1f1b")
    at.number_input(key=B + "pipeline.chunks").set_value(2).run()  # B changes v: K=8, M=32
    assert_clean(at)
    bubbles = [m.value for m in at.metric if m.label == "Bubble fraction"]
    assert bubbles[1] == f"{7 / (2 * 32 + 7):.4f}"
    inputs_table = differing_inputs(at)
    assert {"pipeline.chunks", "pipeline.schedule"} <= set(inputs_table.index)
    assert inputs_table.loc["pipeline.chunks"].tolist() == ["1", "2"]
    at.number_input(key=B + "pipeline.micro_batches").set_value(12).run()
    assert [e.value for e in at.error] == ["Configuration B: micro-batches M: interleaved_1f1b with 2 "
                                           "chunks per rank needs M to be a multiple of the 8 ranks, got 12"]


def test_pages_keep_the_form_and_b_when_switching():
    at = app_test().run()
    at.sidebar.number_input(key="cfg.pipeline.stages").set_value(8).run()
    at = compare_app(at)
    at.number_input(key=B + "pipeline.micro_batches").set_value(32).run()
    at.switch_page("views/sweep.py").run()
    at.switch_page("views/compare.py").run()
    assert_clean(at)
    assert at.sidebar.number_input(key="cfg.pipeline.stages").value == 8
    assert at.number_input(key=B + "pipeline.micro_batches").value == 32


def test_compare_impossible_b_shows_error():
    at = compare_app()
    at.number_input(key=B + "pipeline.stages").set_value(100).run()
    assert_clean(at)
    assert [e.value.split(":")[0] for e in at.error] == ["Configuration B"]
    assert at.error[0].value.startswith("Configuration B: stages K:")
    assert metric(at, "Step time")  # A is still shown


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
        assert metric(at, "Predicted bubble") == f"{fill_drain_bubble(K, M):.4f}"
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
    assert metric(at, "Predicted bubble") == f"{fill_drain_bubble(2, 4):.4f}"
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
        assert trace["y"] == pytest.approx([fill_drain_bubble(K, m) for m in trace["x"]])
    options = at.selectbox(key="cfg.sweep.y").options
    assert "stage_peak_memory_bytes[0]" in options and "sweep.index" not in options
    at.selectbox(key="cfg.sweep.x").set_value("pipeline.stages")
    at.selectbox(key="cfg.sweep.color").set_value("(none)")
    at.selectbox(key="cfg.sweep.y").set_value("step_time_s").run()
    assert_clean(at)
    (fig,) = plotly_specs(at)
    ok = table[table["error"].isna()].sort_values("pipeline.stages", kind="stable")
    assert len(fig["data"]) == 5  # one line per M (the other input that varies): never a zig-zag
    for trace, (m, part) in zip(fig["data"], ok.groupby("pipeline.micro_batches", sort=True)):
        assert trace["name"] == f"pipeline.micro_batches={m}"
        assert trace["x"] == part["pipeline.stages"].tolist()
        assert trace["y"] == pytest.approx(part["step_time_s"].tolist())
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


def _variant_sweep():
    """Two schedules and two remat modes at every (K, M); the K=8 rows do not fit; a hash column."""
    import pandas as pd

    base = sweep_table()
    parts = []
    for schedule, remat, scale in (("gpipe", "none", 1.0), ("gpipe", "always", 1.3), ("1f1b", "none", 0.9),
                                   ("1f1b", "always", 1.2)):
        part = base.assign(**{"pipeline.schedule": schedule, "pipeline.remat": remat,
                              "step_time_s": base["step_time_s"] * scale})
        parts.append(part)
    table = pd.concat(parts, ignore_index=True)
    table["sweep.index"] = range(len(table))
    table.insert(1, "sweep.key", [f"{i:020x}" for i in range(len(table))])
    table["fits_in_memory"] = table["pipeline.stages"] != 8
    return table


def test_sweep_filters_to_fitting_orders_the_table_and_draws_one_line_per_variant(tmp_path):
    table = _variant_sweep()
    table.to_parquet(tmp_path / "results.parquet", index=False)
    at = app_test().run()
    at.switch_page("views/sweep.py").run()
    at.text_input(key="cfg.sweep.path").set_value(str(tmp_path)).run()
    assert_clean(at)
    at.selectbox(key="cfg.sweep.y").set_value("step_time_s").run()
    shown = at.dataframe[0].value
    assert "sweep.key" not in shown.columns  # no hash
    varying = ["pipeline.stages", "pipeline.micro_batches", "pipeline.schedule", "pipeline.remat"]
    assert set(shown.columns[:4]) == set(varying)  # the inputs that vary first
    assert list(shown.columns[4:7]) == ["step_time_s", "throughput_samples_per_s", "bubble_fraction"]
    constant = [c for c in shown.columns if c in ("model.preset", "model.layers", "hardware.preset",
                                                   "pipeline.batch_size", "pipeline.partition")]
    assert list(shown.columns[-len(constant):]) == constant  # constant inputs last
    (fig,) = plotly_specs(at)
    assert len(fig["data"]) == 3 * 4  # K x (schedule, remat)
    for trace in fig["data"]:
        assert all(b > a for a, b in zip(trace["x"], trace["x"][1:])), trace["name"]  # no zig-zag
        assert "pipeline.schedule=" in trace["name"] and "pipeline.remat=" in trace["name"]
    assert any("One line per combination" in c.value for c in at.caption)
    n_ok = len(shown)
    at.toggle(key="cfg.sweep.fits").set_value(True).run()
    assert_clean(at)
    fitting = at.dataframe[0].value
    assert len(fitting) == n_ok - 4 * 5 and bool(fitting["fits_in_memory"].all())
    (fig,) = plotly_specs(at)
    assert len(fig["data"]) == 2 * 4 and not any("=8" in t["name"].split(",")[0] for t in fig["data"])


def test_data_parallel_replicas_show_devices_and_the_exposed_all_reduce():
    at = app_test().run()
    K = at.sidebar.number_input(key="cfg.pipeline.stages").value
    batch = at.sidebar.number_input(key="cfg.pipeline.batch_size").value
    set_widget(at, "cfg.pipeline.batch_size", 2 * batch)
    set_widget(at, "cfg.pipeline.data_parallel", 2)
    at.run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert metric(at, "Devices") == f"{2 * K} (2 x {K})"
    assert metric(at, "Exposed all-reduce")
    gantt = plotly_specs(at)[0]  # alike replicas timed once: replica 0's ranks, the title says so
    assert sorted({y for t in gantt["data"] for y in t["y"]}) == list(range(K))
    assert "D=2 (alike: replica 0 shown" in gantt["layout"]["title"]["text"]
