"""The app's building blocks without a browser: figure builders, file loaders, unit formatting."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from gpipe_sim import parse_scenario, simulate
from gpipe_sim.studies import plots
from gpipe_sim.spec.presets import hardware_presets
from gpipe_sim.results.result import Result, Timeline, analytic_bubble
from gpipe_sim.spec.units import parse_quantity
from test_app_support import ROOT, sweep_table, uniform_data, write_validation

sys.path.insert(0, str(ROOT / "app"))
from ui_data import load_validation, read_layer_table, read_sweep_bytes, split_sweep  # noqa: E402


def run(stages: int, micro: int, **pipeline) -> Result:
    return simulate(parse_scenario(uniform_data(stages, micro, **pipeline)), engine="auto")


# --- Gantt ---------------------------------------------------------------------------------------


def test_gantt_draws_every_action_when_few():
    result = run(4, 8, remat="always")
    bars = plots.gantt_bars(result.timeline, max_bars=10_000)
    assert len(bars) == len(result.timeline) and not bars.merged and bars.note == ""
    fig, _ = plots.timeline_figure(result.timeline)
    kinds = {t.name for t in fig.data}
    assert kinds == {"forward", "backward", "recompute", "send", "recv", "update"}
    forward = next(t for t in fig.data if t.name == "forward")
    shown = sorted((int(y), int(label)) for y, label in zip(forward.y, forward.customdata[:, 0]))
    assert shown == sorted((k, m) for k in range(4) for m in range(8))  # micro-batch on hover


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_gantt_merging_covers_every_action(schedule):
    t = run(16, 64, schedule=schedule, remat="always").timeline
    bars = plots.gantt_bars(t, max_bars=600)
    assert bars.merged and not bars.truncated and len(bars) <= 600
    assert bars.count.sum() == len(t)
    assert "merged into" in bars.note
    for code in np.unique(t.kind):
        for stage in range(16):
            mine = (bars.kind == code) & (bars.stage == stage)
            starts, ends = bars.start_s[mine], bars.end_s[mine]
            order = np.argsort(starts)
            starts, ends = starts[order], ends[order]
            acts = (t.kind == code) & (t.stage == stage)
            i = np.searchsorted(starts, t.start_s[acts], side="right") - 1
            assert (i >= 0).all()
            assert (ends[i] >= t.end_s[acts] - 1e-12).all()  # each action lies inside a bar
            assert mine.sum() <= acts.sum()


def test_gantt_cuts_off_beyond_the_limit_and_says_so():
    n = 50
    gaps = Timeline(stage=np.zeros(n, np.int32), kind=np.zeros(n, np.int8),
                    micro_batch=np.arange(n, dtype=np.int32),
                    start_s=np.arange(n) * 100.0, end_s=np.arange(n) * 100.0 + 1.0)
    bars = plots.gantt_bars(gaps, max_bars=10)  # gaps above 1/50 of the step: nothing may merge
    assert bars.truncated and len(bars) == 10
    assert list(bars.start_s) == [100.0 * i for i in range(10)]
    assert "only the first 10 bars" in bars.note


# --- memory and bubble figures -------------------------------------------------------------------


@pytest.mark.parametrize("max_points", [100_000, 40])
def test_memory_over_time_peaks_match_the_result(max_points):
    result = run(4, 16, remat="none")
    fig = plots.memory_timeline_figure(result, max_points_per_stage=max_points)
    assert len(fig.data) == 4
    for stage, trace in zip(result.stages, fig.data):
        static = stage.param_bytes + stage.state_bytes
        assert max(trace.y) * plots.GIB == pytest.approx(static + stage.peak_activation_bytes)
        assert np.all(np.diff(trace.x) >= 0)


def test_stage_memory_marks_stages_over_capacity():
    data = uniform_data(4, 8)
    data["hardware"] = {"preset": "ideal", "accelerator": {"memory_bytes": "1 GB"}}
    result = simulate(parse_scenario(data), engine="auto")
    fig = plots.stage_memory_figure(result)
    over = [t for t in fig.data if t.type == "scatter"][0]
    expected = [f"stage {s.index}" for s in result.stages if s.peak_memory_bytes > 1e9]
    assert list(over.x) == expected and expected
    stacked = sum(np.asarray(t.y) for t in fig.data if t.type == "bar") * plots.GIB
    assert stacked == pytest.approx([s.peak_memory_bytes for s in result.stages])
    assert fig.layout.shapes[0].y0 == pytest.approx(1e9 / plots.GIB)


def test_bubble_vs_m_curves_are_the_analytic_formula():
    fig = plots.bubble_vs_m_figure([2, 8], current_k=4, current_m=16, current_bubble=0.3, m_max=64)
    curves = {t.name: t for t in fig.data}
    for K in (2, 4, 8):
        trace = curves[f"K={K} analytic"]
        assert list(trace.y) == pytest.approx([analytic_bubble(K, int(m)) for m in trace.x])
    assert list(curves["current (simulated)"].x) == [16]


def test_sweep_figure_groups_by_colour():
    table = split_sweep(sweep_table()).ok
    fig = plots.sweep_figure(table, "pipeline.micro_batches", "fits_in_memory", "pipeline.stages")
    assert [t.name for t in fig.data] == ["pipeline.stages=2", "pipeline.stages=4", "pipeline.stages=8"]
    assert all(set(t.y) == {1.0} for t in fig.data)  # booleans plotted as 0/1


# --- loaders -------------------------------------------------------------------------------------


def test_validation_round_trip(tmp_path):
    doc = write_validation(tmp_path / "v.json", 4, 8)
    v = load_validation((tmp_path / "v.json").read_text())
    assert v.predicted.bubble_fraction == pytest.approx(analytic_bubble(4, 8))
    assert v.measured.step_time_s == doc["measured"]["step_time_s"]
    assert len(v.measured.timeline) == len(doc["measured"]["timeline"])
    assert v.relative_error == doc["relative_error"]


@pytest.mark.parametrize("text, message", [
    ("{", "not valid JSON"),
    ("[]", "expected a JSON object"),
    ('{"predicted": {}}', "predicted: not a result"),
    ('{"measured": {}}', "predicted: missing"),
])
def test_validation_errors_are_one_line(text, message):
    with pytest.raises(ValueError, match=message) as info:
        load_validation(text)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_sweep_split_inputs_results_failures_and_stage_columns(tmp_path, fmt):
    table = sweep_table(stages=(2, 4), micro=(4,))
    path = tmp_path / f"results.{fmt}"
    getattr(table, f"to_{fmt}")(path, index=False)
    cols = split_sweep(read_sweep_bytes(path.name, path.read_bytes()))
    assert "sweep.index" not in cols.inputs and "pipeline.stages" in cols.inputs
    assert len(cols.ok) == 2 and len(cols.failed) == 1
    assert "32 stages" in cols.failed["error"].iloc[0]
    assert {"bubble_fraction", "stage_peak_memory_bytes[0]", "stage_peak_memory_bytes[3]"} <= set(cols.results)
    k4 = cols.ok[cols.ok["pipeline.stages"] == 4].iloc[0]
    expected = table[table["pipeline.stages"] == 4]["stage_peak_memory_bytes"].iloc[0]
    assert [k4[f"stage_peak_memory_bytes[{k}]"] for k in range(4)] == pytest.approx(expected)


def test_sweep_rejects_tables_without_inputs():
    with pytest.raises(ValueError, match="no input columns"):
        split_sweep(pd.DataFrame({"a": [1]}))
    with pytest.raises(ValueError, match="no rows"):
        split_sweep(pd.DataFrame())
    with pytest.raises(ValueError, match="cannot read 'x.parquet'"):
        read_sweep_bytes("x.parquet", b"not parquet")


def test_layer_table_upload_names_the_upload():
    model = read_layer_table("t.json", json.dumps([{"name": "a", "forward_s_per_sample": 1e-3,
                                                     "backward_s_per_sample": 2e-3}]).encode())
    assert model["preset"] == "table" and model["layers"][0]["name"] == "a"
    with pytest.raises(ValueError) as info:
        read_layer_table("mine.yaml", b"layers: [")
    assert "malformed YAML in 'mine.yaml'" in str(info.value) and "/tmp" not in str(info.value)


def test_quantities_shown_in_the_form_read_back():
    from ui_form import format_quantity

    for preset in hardware_presets().values():
        acc, link = preset["accelerator"], preset["link"]
        for value, kind in [(acc["memory_bytes"], "bytes"), (acc["memory_bandwidth"], "bandwidth"),
                            (acc["kernel_overhead_s"], "seconds"), (link["bandwidth"], "bandwidth"),
                            (link["latency_s"], "seconds"), *[(v, "flops") for v in acc["peak_flops"].values()]]:
            number = parse_quantity(value, kind)
            assert parse_quantity(format_quantity(number, kind), kind) == pytest.approx(number, rel=1e-6)
    assert format_quantity(32 * 2.0**30, "bytes") == "32 GiB"
    assert format_quantity(80e9, "bytes") == "80 GB"
    assert format_quantity(float("inf"), "bandwidth") == "inf"


def test_app_and_plots_import_no_torch():
    code = (
        "import sys; sys.path.insert(0, 'app');"
        "from streamlit.testing.v1 import AppTest;"
        "at = AppTest.from_file('app/streamlit_app.py', default_timeout=60).run();"
        "[at.switch_page(p).run() for p in ('views/compare.py', 'views/validate.py', 'views/sweep.py')];"
        "assert not at.exception;"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
