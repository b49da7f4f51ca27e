"""The app's building blocks without a browser: figure builders, file loaders, unit formatting."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpipe_sim import load_scenario, parse_scenario, simulate
from gpipe_sim.api import simulate_plan
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.schedule import ACTION_KINDS, SCHEDULES
from gpipe_sim.model.recompute import per_layer
from gpipe_sim.scenario.scenario import REMAT_MODES

CHUNK_REMAT_MODES = [m for m in REMAT_MODES if not per_layer(m)]  # the uniform model has no blocks
from gpipe_sim import charts as plots
from gpipe_sim.hardware.presets import hardware_presets
from gpipe_sim.results.result import Result, Timeline
from gpipe_sim.schedule.registry import fill_drain_bubble
from gpipe_sim.schema.units import parse_quantity
from test_app_support import ROOT, sweep_table, uniform_data, write_validation

from gpipe_app.ui_data import read_layer_table, read_sweep_bytes, split_sweep  # noqa: E402
from gpipe_sim.results.validation import ValidationDocument  # noqa: E402


def run(stages: int, micro: int, **pipeline) -> Result:
    return simulate(parse_scenario(uniform_data(stages, micro, **pipeline)), engine="auto")


# --- Gantt ---------------------------------------------------------------------------------------


def _segments(key: np.ndarray, start: np.ndarray, end: np.ndarray):
    """Per key, the maximal stretches where at least one interval runs: (key, start, end), sorted."""
    n = len(key)
    k = np.concatenate([key, key])
    t = np.concatenate([start, end])
    d = np.concatenate([np.ones(n), -np.ones(n)])
    order = np.lexsort((-d, t, k))  # by key, then time, starts before ends (touching ones join)
    k, t, d = k[order], t[order], d[order]
    depth = np.cumsum(d)
    opens, closes = (d > 0) & (depth == 1), (d < 0) & (depth == 0)
    return k[opens], t[opens], t[closes]


def assert_bars_honest(t: Timeline, bars: "plots.GanttBars", max_bars: int) -> None:
    """The drawing never misstates: per rank and kind the drawn length is the true busy time
    (within 1%); no bar lies where its rank ran no action of its kind (beyond the bar's run's
    longest closed gap, which the drawing reports); bars of one lane never overlap; the bars fit."""
    step = float(t.end_s.max())
    eps = 1e-9 * step
    kinds = len(ACTION_KINDS)
    key_t = t.rank.astype(np.int64) * kinds + t.kind
    key_b = bars.rank.astype(np.int64) * kinds + bars.kind
    size = int(key_t.max()) + 1
    groups = len(np.unique(key_t))
    assert len(bars) <= max(max_bars, 2 * groups)
    true = np.bincount(key_t, weights=t.end_s - t.start_s, minlength=size)
    drawn = np.bincount(key_b, weights=bars.end_s - bars.start_s, minlength=size)
    assert np.all(np.abs(drawn - true) <= 0.01 * true + eps), np.max(np.abs(drawn - true) / (true + eps))
    assert np.all(bars.end_s >= bars.start_s)
    # Each bar inside the true actions of its rank and kind, dilated by half its longest gap.
    reach = np.zeros(size)
    np.maximum.at(reach, key_b, bars.gap_s / 2)
    seg_key, seg_start, seg_end = _segments(key_t, t.start_s - reach[key_t] - eps, t.end_s + reach[key_t] + eps)
    span = 4.0 * (step + reach.max() + 1.0)
    at = np.searchsorted(seg_key * span + seg_start, key_b * span + bars.start_s, side="right") - 1
    assert np.all(at >= 0) and np.all(seg_key[at] == key_b)
    assert np.all(bars.end_s <= seg_end[at]), "a bar covers time where its rank ran no action of its kind"
    # One lane (compute, send, recv, all-reduce: the chart's lanes) of one rank: bars never overlap.
    lane = np.select([bars.kind == ACTION_KINDS.index(k) for k in ("send", "recv", "allreduce")], [1, 2, 3], 0)
    lane_key = bars.rank.astype(np.int64) * 4 + lane
    order = np.lexsort((bars.start_s, lane_key))
    same = lane_key[order][1:] == lane_key[order][:-1]
    if bars.merged:
        assert np.all(bars.end_s[order][:-1][same] <= bars.start_s[order][1:][same] + eps)


def test_gantt_draws_every_action_when_few():
    result = run(4, 8, remat="always")
    bars = plots.gantt_bars(result.timeline, max_bars=10_000)
    assert len(bars) == len(result.timeline) and not bars.merged and bars.note == ""
    assert_bars_honest(result.timeline, bars, 10_000)
    fig, _ = plots.timeline_figure(result.timeline)
    kinds = {t.name for t in fig.data}
    assert kinds == {"forward", "backward", "recompute", "send", "recv", "update"}
    forward = next(t for t in fig.data if t.name == "forward")
    shown = sorted((int(y), int(text.split("micro-batch ")[1].split("<br>")[0]))
                   for y, text in zip(forward.y, forward.hovertext))
    assert shown == sorted((k, m) for k in range(4) for m in range(8))  # micro-batch on hover
    assert all(text.startswith(f"chunk {y}<br>") for y, text in zip(forward.y, forward.hovertext))
    assert list(fig.layout.yaxis.ticktext) == [f"rank {k}" for k in range(4)]


def test_gantt_hover_shows_chunks_of_interleaved_ranks():
    t = run(4, 8, schedule="interleaved_1f1b", chunks=2).timeline
    fig, bars = plots.timeline_figure(t, max_bars=100)
    assert bars.merged and len(bars) <= 100
    assert_bars_honest(t, bars, 100)
    texts = [text for trace in fig.data if trace.name == "forward" for text in trace.hovertext]
    assert any(text.startswith("chunks 0, 4<br>micro-batches") for text in texts)
    assert "merged into" in bars.note


@st.composite
def gantt_cases(draw):
    schedule = draw(st.sampled_from(sorted(SCHEDULES)))
    stages = draw(st.integers(1, 24))
    family = SCHEDULES[schedule]
    first = draw(st.sampled_from([1, 2]))
    for chunks in (first, 3 - first):  # the other v where the schedule takes no M with this one
        valid = [m for m in range(1, 97) if family.problem(stages, m, chunks) is None]
        if valid:
            break
    assume(valid)
    micro = draw(st.sampled_from(valid))
    data = uniform_data(stages, micro, draw(st.sampled_from(["ideal", "a100-80gb", "v100"])), schedule=schedule,
                        chunks=chunks, remat=draw(st.sampled_from(CHUNK_REMAT_MODES)), batch_size=4 * micro)
    data["model"]["layers"] = 64
    return data, draw(st.sampled_from([20, 100, 400, 1000, 2500]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gantt_cases())
def test_gantt_never_misstates_busy_time(case):
    data, max_bars = case
    t = simulate(parse_scenario(data), engine="auto").timeline
    bars = plots.gantt_bars(t, max_bars=max_bars)
    assert bars.merged == (len(t) > max_bars)
    assert_bars_honest(t, bars, max_bars)


# Large timelines: merged into at most 2,500 bars, they keep compute gaps over 1% of the step.
@pytest.mark.parametrize("schedule, chunks, stages, micro, hardware", [
    ("1f1b", 1, 26, 256, "a100-80gb"),
    ("gpipe", 1, 128, 1024, "ideal"),
    ("interleaved_1f1b", 2, 128, 512, "a100-80gb"),  # K*v*M at the scenario limit
])
def test_gantt_large_timelines_stay_honest(schedule, chunks, stages, micro, hardware):
    data = uniform_data(stages, micro, hardware, schedule=schedule, chunks=chunks, remat="always",
                        batch_size=micro)
    data["model"]["layers"] = stages * chunks
    t = simulate(parse_scenario(data), engine="auto").timeline
    started = time.perf_counter()
    bars = plots.gantt_bars(t, max_bars=2500)
    elapsed = time.perf_counter() - started
    assert bars.merged and len(bars) <= 2500
    assert_bars_honest(t, bars, 2500)
    step = float(t.end_s.max())
    assert bars.max_gap_s(compute=True) <= 0.01 * step
    assert bars.max_gap_s(compute=False) <= 0.05 * step
    print(f"\n{schedule} K={stages} M={micro}: {len(t):,} actions -> {len(bars):,} bars in {elapsed:.2f} s; "
          f"compute gaps kept over {bars.max_gap_s(True) / step:.2%} of the step")


@pytest.mark.parametrize("stages, micro", [(8, 32), (4, 64), (26, 256)])
def test_gantt_does_not_paint_the_bubble_as_recompute(stages, micro):
    """Issue 15: merging drew rank 0 'recomputing' through its bubble (5.96 s drawn, 2.11 true)."""
    scenario = load_scenario(ROOT / "gpipe_sim" / "scenarios" / "default.yaml").with_updates(
        {"pipeline.stages": stages, "pipeline.micro_batches": micro, "pipeline.batch_size": 4 * micro,
         "pipeline.remat": "always"})
    t = simulate(scenario, engine="auto").timeline
    bars = plots.gantt_bars(t, max_bars=1000)
    assert bars.merged
    assert_bars_honest(t, bars, 1000)
    code = ACTION_KINDS.index("recompute")
    # Rank 0's longest idle stretch (the bubble): no compute bar is drawn in it.
    compute = (t.rank == 0) & t.is_compute
    order = np.argsort(t.start_s[compute])
    starts, ends = t.start_s[compute][order], np.maximum.accumulate(t.end_s[compute][order])
    longest = int(np.argmax(starts[1:] - ends[:-1]))
    idle_from, idle_to = ends[longest], starts[longest + 1]
    assert idle_to - idle_from > 0.05 * t.end_s.max()
    drawn = (bars.rank == 0) & ~np.isin(bars.kind, [ACTION_KINDS.index("send"), ACTION_KINDS.index("recv")])
    painted = np.clip(np.minimum(bars.end_s[drawn], idle_to) - np.maximum(bars.start_s[drawn], idle_from), 0, None)
    assert painted.sum() <= 1e-9 * t.end_s.max()
    assert (bars.end_s - bars.start_s)[bars.kind == code].sum() == pytest.approx(
        (t.end_s - t.start_s)[t.kind == code].sum(), rel=1e-9)


def test_gantt_budget_below_the_actions_still_honest():
    n = 50
    gaps = Timeline(rank=np.zeros(n, np.int32), chunk=np.zeros(n, np.int32), kind=np.zeros(n, np.int8),
                    micro_batch=np.arange(n, dtype=np.int32),
                    start_s=np.arange(n) * 100.0, end_s=np.arange(n) * 100.0 + 1.0)
    bars = plots.gantt_bars(gaps, max_bars=10)
    assert bars.merged and len(bars) == 9  # 90% of the budget, the rest kept for laying runs out
    assert_bars_honest(gaps, bars, 10)
    assert bars.busy_s.sum() == pytest.approx(sum(bars.end_s - bars.start_s))
    assert "50 actions" in bars.note and "merged into 9 bars" in bars.note


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


def test_memory_over_time_at_many_micro_batches_is_an_envelope_with_the_exact_peaks():
    """M=32: each rank a band (least, most per time slice), no sawtooth; the top line's highest
    point is the rank's peak, the band's bottom never above its top, and a slice's level is one
    the step function really takes in it."""
    from gpipe_sim.charts.memory import CHANGES_PER_SLICE, STEP_LINES_MAX_CHANGES, _envelope

    result = run(4, 32, remat="none")
    assert max(len(t) for t, _ in result.memory_timeline) > STEP_LINES_MAX_CHANGES
    fig = plots.memory_timeline_figure(result)
    assert len(fig.data) == 8 and "band" in fig.layout.title.text
    for k, stage in enumerate(result.stages):
        least, most = fig.data[2 * k], fig.data[2 * k + 1]
        assert most.fill == "tonexty" and most.showlegend and not least.showlegend
        assert len(most.x) == -(-max(len(t) for t, _ in result.memory_timeline) // CHANGES_PER_SLICE) + 1 and np.all(np.array(least.y) <= np.array(most.y))
        static = stage.param_bytes + stage.state_bytes
        assert max(most.y) * plots.GIB == pytest.approx(static + stage.peak_activation_bytes)
    # levels 5 at 0.5, 8 at 1.2, 3 at 1.7, 2 at 3.5, over 4 slices of [0, 4]
    edges, low, high = _envelope(np.array([0.5, 1.2, 1.7, 3.5]), np.array([5.0, 8.0, 3.0, 2.0]), 4.0, 4)
    assert list(edges) == [0, 1, 2, 3, 4] and list(high) == [5, 8, 3, 3] and list(low) == [0, 3, 3, 2]
    assert len(plots.memory_timeline_figure(run(4, 8, remat="none")).data) == 4  # few changes: step lines


def test_memory_over_time_starts_at_zero_with_distinct_rank_colours():
    result = run(8, 16, remat="none")
    fig = plots.memory_timeline_figure(result)
    assert fig.layout.yaxis.rangemode == "tozero"  # never a zoom on the top of the curves
    assert list(fig.layout.xaxis.range) == pytest.approx([0, result.step_time_s / plots.time_unit(result.step_time_s)[1]])
    assert [t.line.color for t in fig.data] == plots.rank_colors(8)


def _rgb(color: str) -> np.ndarray:
    return np.array([int(color[i:i + 2], 16) for i in (1, 3, 5)], dtype=float)


@pytest.mark.parametrize("ranks", [2, 4, 8, 16, 32, 64])
def test_neighbouring_ranks_never_share_a_look(ranks):
    colors = plots.rank_colors(ranks)
    assert len(set(colors)) == ranks
    gaps = [np.linalg.norm(_rgb(a) - _rgb(b)) for a, b in zip(colors, colors[1:])]
    assert min(gaps, default=999) > 150  # of 441 (black to white)


def test_stage_memory_marks_stages_over_capacity():
    data = uniform_data(4, 8)
    data["hardware"] = {"preset": "ideal", "accelerator": {"memory_bytes": "1 GB"}}
    result = simulate(parse_scenario(data), engine="auto")
    fig = plots.stage_memory_figure(result)
    over = [t for t in fig.data if t.type == "scatter"][0]
    expected = [f"rank {s.index}" for s in result.stages if s.peak_memory_bytes > 1e9]
    assert list(over.x) == expected and expected
    # one legend entry, a marker on each bar: no per-bar text to overlap on a deep pipeline
    assert over.name == "does not fit" and over.mode == "markers" and over.text is None
    assert "do not fit" in fig.layout.title.text
    stacked = sum(np.asarray(t.y) for t in fig.data if t.type == "bar") * plots.GIB
    assert stacked == pytest.approx([s.peak_memory_bytes for s in result.stages])
    assert fig.layout.shapes[0].y0 == pytest.approx(1e9 / plots.GIB)


def test_stage_memory_bars_add_up_to_the_peak_when_the_update_is_the_peak():
    """Large weights, small activations, Adam on lists in bf16: each rank's peak is its update
    (no activation held then); the bars show that moment, not the activations of another one."""
    layers = [{"name": f"l{i}", "params": 50_000, "activation_bytes_per_sample": 64.0, "output_bytes_per_sample": 16.0,
               "forward_s_per_sample": 1e-3, "backward_s_per_sample": 2e-3} for i in range(4)]
    result = simulate(parse_scenario({
        "model": {"preset": "table", "input_bytes_per_sample": 16.0, "layers": layers},
        "hardware": {"preset": "v100"},
        "pipeline": {"stages": 2, "micro_batches": 4, "batch_size": 8, "schedule": "1f1b", "remat": "none"},
        "training": {"optimizer": "adam", "dtype": "bf16", "optimizer_step": "foreach"}}))
    fig = plots.stage_memory_figure(result)
    bars = {t.name: np.asarray(t.y) * plots.GIB for t in fig.data if t.type == "bar"}
    assert sum(bars.values()) == pytest.approx([s.peak_memory_bytes for s in result.stages])
    # the fp32 gradient copies and Adam's square roots: 8 B a parameter, 2 layers a rank
    assert bars["temporaries (running pass or update)"] == pytest.approx([8 * 100_000] * 2)
    assert "activations held" not in bars and all(s.peak_activation_bytes > 0 for s in result.stages)


def test_stage_memory_bars_name_each_part_of_the_breakdown():
    """Held tensors the breakdown names (sent outputs, all-reduce buckets, ZeRO shards) are bars of
    their own, not lumped into "runtime buffers"; the bars still add up to each rank's peak."""
    result = run(2, 4)
    for s in result.stages:  # a peak at which an output waits to be sent
        s.memory_breakdown["sent"] = 0.25 * s.memory_breakdown["activations"]
        s.memory_breakdown["activations"] *= 0.75
    fig = plots.stage_memory_figure(result)
    bars = {t.name: np.asarray(t.y) * plots.GIB for t in fig.data if t.type == "bar"}
    assert bars["sent"] == pytest.approx([s.memory_breakdown["sent"] for s in result.stages])
    assert sum(bars.values()) == pytest.approx([s.peak_memory_bytes for s in result.stages])
    assert "runtime buffers" not in bars or not np.any(bars["runtime buffers"] > 1e-6 * bars["sent"])


def test_bubble_vs_m_curves_are_the_analytic_formula():
    fig = plots.bubble_vs_m_figure([2, 8], current_k=4, current_m=16, current_bubble=0.3, m_max=64)
    curves = {t.name: t for t in fig.data}
    for K in (2, 4, 8):
        trace = curves[f"K={K} analytic"]
        assert list(trace.y) == pytest.approx([fill_drain_bubble(K, int(m)) for m in trace.x])
    assert list(curves["current (simulated)"].x) == [16]


def test_bubble_vs_m_follows_the_schedule_and_its_rules():
    fig = plots.bubble_vs_m_figure([2, 8], current_k=4, current_m=16, current_bubble=0.1, m_max=64,
                                   schedule="interleaved_1f1b", chunks=2, current_analytic=3 / 35)
    curves = {t.name: t for t in fig.data}
    family = SCHEDULES["interleaved_1f1b"]
    for K in (2, 4, 8):
        trace = curves[f"K={K} analytic"]
        assert list(trace.x) and all(int(m) % K == 0 for m in trace.x)  # only the M it accepts
        assert list(trace.y) == pytest.approx([(K - 1) / (2 * int(m) + K - 1) for m in trace.x])
        assert list(trace.y) == pytest.approx([family.analytic_bubble(K, int(m), 2) for m in trace.x])
    assert list(curves["current (analytic)"].y) == pytest.approx([3 / 35])
    assert "v=2" in fig.layout.title.text
    single = plots.bubble_vs_m_figure([2], current_k=4, current_m=1, current_bubble=0.75, schedule="naive")
    assert [list(t.x) for t in single.data if t.name.endswith("analytic")] == [[1], [1]]


def test_sweep_figure_groups_by_colour():
    table = split_sweep(sweep_table()).ok
    fig = plots.sweep_figure(table, "pipeline.micro_batches", "fits_in_memory", "pipeline.stages")
    assert [t.name for t in fig.data] == ["pipeline.stages=2", "pipeline.stages=4", "pipeline.stages=8"]
    assert all(set(t.y) == {1.0} for t in fig.data)  # booleans plotted as 0/1


def test_sweep_figure_draws_one_line_per_variant():
    """Two schedules at each (K, M): split by schedule, no line joins the two into a zig-zag."""
    base = split_sweep(sweep_table()).ok
    table = pd.concat([base.assign(**{"pipeline.schedule": "gpipe"}),
                       base.assign(**{"pipeline.schedule": "1f1b",
                                      "step_time_s": base["step_time_s"] * 0.9})], ignore_index=True)
    fig = plots.sweep_figure(table, "pipeline.micro_batches", "step_time_s", "pipeline.stages",
                             split=["pipeline.schedule"])
    assert len(fig.data) == 6  # 3 K x 2 schedules
    for trace in fig.data:
        assert np.all(np.diff(np.asarray(trace.x, dtype=float)) > 0)  # one point per M: no zig-zag
        assert "pipeline.schedule=" in trace.name
    by_k = {}
    for trace in fig.data:
        by_k.setdefault(trace.name.split(",")[0], set()).add((trace.line.color, trace.line.dash))
    assert all(len({c for c, _ in v}) == 1 and len({d for _, d in v}) == 2 for v in by_k.values())
    joined = plots.sweep_figure(table, "pipeline.micro_batches", "step_time_s", "pipeline.stages")
    assert len(joined.data) == 3  # without the split: what the page no longer draws


def test_sweep_figure_colours_schedules_apart_and_ticks_a_log_axis_at_the_values_used():
    """One distinct colour per schedule (a qualitative palette, not near-identical blues); a log x
    axis ticked at the M values used (1 2 4 8 16), not plotly's minor 2 3 4 5 labels."""
    base = split_sweep(sweep_table()).ok
    names = ["gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv"]
    table = pd.concat([base.assign(**{"pipeline.schedule": n}) for n in names], ignore_index=True)
    fig = plots.sweep_figure(table, "pipeline.micro_batches", "step_time_s", "pipeline.schedule",
                             log_x=True, split=["pipeline.stages"])
    by_schedule = {}
    for trace in fig.data:
        by_schedule.setdefault(trace.name.split(",")[0], set()).add(trace.line.color)
    assert len(by_schedule) == len(names) and all(len(c) == 1 for c in by_schedule.values())
    colours = [next(iter(c)) for c in by_schedule.values()]
    assert len(set(colours)) == len(names)
    ms = sorted(table["pipeline.micro_batches"].unique())
    assert fig.layout.xaxis.type == "log" and list(fig.layout.xaxis.tickvals) == ms
    assert list(fig.layout.xaxis.ticktext) == [str(m) for m in ms]
    by_k = plots.sweep_figure(base, "pipeline.micro_batches", "step_time_s", "pipeline.stages")
    assert len({t.line.color for t in by_k.data}) == len(by_k.data) == 3


def test_downloaded_yaml_has_no_raw_floats():
    from gpipe_app.ui_run import round_floats, scenario_yaml

    sc = load_scenario(ROOT / "gpipe_sim" / "scenarios" / "default.yaml")
    sc = sc.with_updates({"hardware.accelerator.memory_bandwidth": "2.039 TB/s",  # as the form writes it
                          "hardware.link.latency_s": "3 us"})
    assert "2039000000000.0002" in sc.to_yaml()  # what the download held before
    text = scenario_yaml(sc)
    for token in re.findall(r"\d+\.\d+(?:e[+-]?\d+)?", text):  # every float: 12 significant digits at most
        digits = token.split("e")[0].replace(".", "").lstrip("0").rstrip("0")
        assert len(digits) <= 12, token
    assert "memory_bandwidth: 2039000000000.0" in text
    again = parse_scenario(yaml.safe_load(text))  # the same scenario, to 12 digits

    def close(a, b):
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
        if isinstance(a, list):
            return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
        return a == pytest.approx(b, rel=1e-11) if isinstance(a, float) else a == b

    assert close(again.to_dict(), sc.to_dict())
    assert again.hardware.accelerator.memory_bandwidth == pytest.approx(2039e9, rel=1e-12)
    assert round_floats({"a": [0.1 + 0.2, 2039000000000.0002, 3, float("inf")]}) == {
        "a": [0.3, 2039000000000.0, 3, float("inf")]}


# --- loaders -------------------------------------------------------------------------------------


def test_validation_round_trip(tmp_path):
    doc = write_validation(tmp_path / "v.json", 4, 8)
    v = ValidationDocument.from_json((tmp_path / "v.json").read_text())
    assert v.predicted.bubble_fraction == pytest.approx(fill_drain_bubble(4, 8))
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
        ValidationDocument.from_json(text)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_sweep_split_inputs_results_failures_and_stage_columns(tmp_path, fmt):
    table = sweep_table(stages=(2, 4), micro=(4,)).assign(note=None)  # no row has a note
    path = tmp_path / f"results.{fmt}"
    getattr(table, f"to_{fmt}")(path, index=False)
    cols = split_sweep(read_sweep_bytes(path.name, path.read_bytes()))
    assert "sweep.index" not in cols.inputs and "pipeline.stages" in cols.inputs
    assert len(cols.ok) == 2 and len(cols.failed) == 1
    assert "32 stages" in cols.failed["error"].iloc[0]
    assert {"bubble_fraction", "stage_peak_memory_bytes[0]", "stage_peak_memory_bytes[3]"} <= set(cols.results)
    assert "note" not in cols.results  # an empty note column reads back as numbers from CSV
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
    from gpipe_app.ui_form import format_quantity

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
        "import sys;"
        "from streamlit.testing.v1 import AppTest;"
        "at = AppTest.from_file('app/streamlit_app.py', default_timeout=60).run();"
        "[at.switch_page(p).run() for p in ('views/compare.py', 'views/validate.py', 'views/sweep.py')];"
        "assert not at.exception;"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_data_parallel_reductions_get_a_lane_of_their_own():
    """An all-reduce runs beside the rank's compute: drawn in the compute lane it would overlap it."""
    from gpipe_sim.charts import _COMPUTE_LANE, _LANES, gantt_bars

    result = simulate(parse_scenario({
        "model": {"preset": "uniform", "layers": 8}, "hardware": {"preset": "v100"},
        "pipeline": {"stages": 2, "chunks": 2, "data_parallel": 2, "micro_batches": 4, "batch_size": 16,
                     "schedule": "interleaved_1f1b", "remat": "none"}}))
    bars = gantt_bars(result.timeline)
    assert (bars.kind == ACTION_KINDS.index("allreduce")).any()
    low, _ = _LANES["allreduce"]
    assert low >= _COMPUTE_LANE[0] + _COMPUTE_LANE[1] and low >= sum(_LANES["send"]) - 1e-12


def test_gantt_merges_data_parallel_timelines_honestly():
    """D=2 with all-reduces, merged: every rank's kinds keep their busy time, all-reduces drawn in
    their own lane (beside compute, as they run) and never over idle time; replica rows named."""
    t = simulate_plan(compile_plan(parse_scenario({  # both replicas timed (alike: else replica 0 alone)
        "model": {"preset": "uniform", "layers": 8}, "hardware": {"preset": "v100"},
        "pipeline": {"stages": 4, "chunks": 2, "data_parallel": 2, "micro_batches": 8, "batch_size": 32,
                     "schedule": "interleaved_1f1b", "remat": "always"}})), every_replica=True).timeline
    code = ACTION_KINDS.index("allreduce")
    assert (t.kind == code).any()
    fig, bars = plots.timeline_figure(t, stages=4, max_bars=60)
    assert bars.merged
    assert_bars_honest(t, bars, 60)
    assert sorted(set(bars.rank[bars.kind == code].tolist())) == sorted(set(t.rank[t.kind == code].tolist()))
    assert list(fig.layout.yaxis.ticktext) == [f"replica {d} · rank {r}" for d in range(2) for r in range(4)]


def test_gantt_draws_each_replica_from_its_own_rows():
    """D=2: every global rank (D x K) is a row of its own, named by replica, drawn from its own
    actions: replica 1 sharing devices runs later than replica 0, and the chart shows it."""
    result = simulate(parse_scenario({
        "model": {"preset": "uniform", "layers": 8},
        "hardware": {"preset": "ideal", "placement": [[0, 1, 2, 3], [4, 4, 5, 5]]},
        "pipeline": {"stages": 4, "micro_batches": 4, "batch_size": 16, "data_parallel": 2, "remat": "none"}}))
    t = result.timeline
    fig, bars = plots.timeline_figure(t, stages=4, max_bars=10_000)
    assert list(fig.layout.yaxis.ticktext) == [f"replica {d} · rank {r}" for d in range(2) for r in range(4)]
    assert len(fig.layout.shapes) == 1  # the line between the replicas
    for rank in range(8):
        sel = bars.rank == rank
        assert sel.any()
        np.testing.assert_allclose(sorted(bars.end_s[sel]), sorted(t.end_s[t.rank == rank]))
    assert t.end_s[t.rank == 7].max() != t.end_s[t.rank == 3].max()  # not a copy of replica 0
    forward = next(trace for trace in fig.data if trace.name == "forward")
    assert {str(c) for c in forward.customdata} >= {"replica 1 · rank 3", "replica 0 · rank 0"}
    assert forward.hovertemplate.startswith("%{customdata}<br>forward")
    one, _ = plots.timeline_figure(run(4, 8).timeline, stages=4)  # one replica: plain rank names
    assert list(one.layout.yaxis.ticktext) == [f"rank {k}" for k in range(4)] and not one.layout.shapes


def assert_overlay_honest(result: Result, fig, bars: "plots.GanttBars") -> None:
    """The collectives overlay never misstates: per rank its drawn lengths add up to the rank's
    `tp_comm_s`, each drawn inside its pass bar, at its end, in the compute lane."""
    from gpipe_sim.charts.gantt import _COMPUTE_LANE

    K = len(result.stages)
    want = np.array([result.stages[g % K].tp_comm_s for g in range(int(bars.rank.max()) + 1)])
    drawn = bars.drawn_tp_s
    assert np.all(drawn >= 0) and np.all(drawn <= bars.end_s - bars.start_s)
    np.testing.assert_allclose(np.bincount(bars.rank, weights=drawn, minlength=len(want)), want, rtol=1e-6)
    assert not drawn[np.isin(bars.kind, list(plots.gantt._LANE_CODES))].any()
    trace = next(t for t in fig.data if t.name == plots.TP_NAME)
    _, scale = plots.time_unit(float(bars.end_s.max()))
    on = drawn > 0
    np.testing.assert_allclose(np.asarray(trace.x) * scale, drawn[on], rtol=1e-9)
    np.testing.assert_allclose((np.asarray(trace.base, dtype=float) + np.asarray(trace.x)) * scale, bars.end_s[on], rtol=1e-9)
    np.testing.assert_allclose(np.bincount(np.asarray(trace.y), weights=np.asarray(trace.x) * scale,
                                           minlength=len(want)), want, rtol=1e-6)
    low, high = _COMPUTE_LANE[0], sum(_COMPUTE_LANE)
    assert low < trace.offset and trace.offset + trace.width < high and trace.width < _COMPUTE_LANE[1]


@pytest.mark.parametrize("max_bars", [10_000, 12, 40])
def test_gantt_shows_tensor_parallel_collectives_inside_their_passes(max_bars):
    """T = 2: each pass bar carries a darker overlay as long as the seconds its collectives add
    (merged: its run's, summed), and the hover says so; the bars stay honest."""
    from test_tensor_parallel import _scenario

    result = simulate(_scenario(2, partition=[3, 3], data_parallel=2, micro_batches=16, batch_size=32))
    t = result.timeline
    fig, bars = plots.timeline_figure(t, max_bars=max_bars, stages=2)
    assert bars.merged == (len(t) > max_bars)
    assert_bars_honest(t, bars, max_bars)
    assert_overlay_honest(result, fig, bars)
    assert [tr.name for tr in fig.data].count(plots.TP_NAME) == 1 and fig.data[-1].name == plots.TP_NAME
    forward = next(tr for tr in fig.data if tr.name == "forward")
    assert all("<br>of which TP collectives " in text for text in forward.hovertext)
    send = next(tr for tr in fig.data if tr.name == "send")
    assert not any("TP collectives" in text for text in send.hovertext)
    if bars.merged:
        assert all(re.search(r"busy [\d.]+ \S+ within .*<br>of which TP collectives", s) for s in forward.hovertext)
    one = simulate(_scenario(1, partition=[3, 3], data_parallel=2, micro_batches=16, batch_size=32))
    plain, plain_bars = plots.timeline_figure(one.timeline, max_bars=max_bars, stages=2)
    assert plain_bars.tp_s is None and plots.TP_NAME not in {tr.name for tr in plain.data}
    assert not any("TP collectives" in str(text) for tr in plain.data for text in tr.hovertext)
    both, _ = plots.compare_timelines_figure([("T=1", one.timeline), ("T=2", t)], max_bars=max_bars)
    tp = [tr for tr in both.data if tr.name == plots.TP_NAME]
    assert len(tp) == 1 and tp[0].showlegend  # the legend entry on the first row that has any
