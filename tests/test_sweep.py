"""Sweeps: expansion, output columns, failing scenarios, resume after a kill, the report, the CLI."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
import yaml

from gpipe_sim.cli import main
from gpipe_sim.scenario.scenario import parse_scenario
from gpipe_sim.api import simulate
from gpipe_sim.sweeps import SweepError, expand, load_sweep, parse_sweep, resolve_base, run_sweep

BASE = {
    "model": {"preset": "uniform", "layers": 8},
    "hardware": {"preset": "ideal"},
    "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 16, "remat": "none"},
}


def _spec(**extra):
    spec = parse_sweep({"base": BASE, **extra})
    return spec, resolve_base(spec)


def test_product_expansion_covers_every_combination_in_order():
    spec, base = _spec(axes={"pipeline.stages": [1, 2, 4], "pipeline.micro_batches": [1, 4]})
    points = expand(spec, base)
    got = [(p.scenario["pipeline"]["stages"], p.scenario["pipeline"]["micro_batches"]) for p in points]
    assert got == [(1, 1), (1, 4), (2, 1), (2, 4), (4, 1), (4, 4)]
    assert len({p.key for p in points}) == 6
    # The rest of the scenario is the base's.
    assert all(p.scenario["model"] == points[0].scenario["model"] for p in points)


def test_points_mode_and_points_times_axes():
    spec, base = _spec(points=[{"pipeline.stages": 4}, {"pipeline.schedule": "1f1b"}])
    assert spec.resolved_mode == "points"
    points = expand(spec, base)
    assert [p.updates for p in points] == [{"pipeline.stages": 4}, {"pipeline.schedule": "1f1b"}]
    assert points[1].scenario["pipeline"]["stages"] == 2  # untouched fields keep the base's value
    spec, base = _spec(points=[{"pipeline.remat": "none"}, {"pipeline.remat": "always"}],
                       axes={"pipeline.stages": [1, 2]})
    combos = [(p.scenario["pipeline"]["remat"], p.scenario["pipeline"]["stages"]) for p in expand(spec, base)]
    assert combos == [("none", 1), ("none", 2), ("always", 1), ("always", 2)]


def test_key_is_stable_and_depends_on_the_scenario():
    spec, base = _spec(axes={"pipeline.stages": [1, 2]})
    a, b = expand(spec, base), expand(spec, base)
    assert [p.key for p in a] == [p.key for p in b]
    assert a[0].key != a[1].key


@pytest.mark.parametrize(
    "data, message",
    [
        ({"axes": {"pipeline.stages": 3}}, "axes.pipeline.stages"),
        ({"axes": {"stages": [1]}}, "axes.stages: not a dotted scenario field"),
        ({"axes": {"pipeline.stages": []}}, "axes.pipeline.stages: needs at least one value"),
        ({"axis": {"pipeline.stages": [1]}}, "axis: unknown key"),
        ({"mode": "points"}, "points: `mode: points` needs at least one point"),
        ({"mode": "grid", "axes": {"pipeline.stages": [1]}}, "mode"),
    ],
)
def test_bad_sweep_files_name_the_field(data, message):
    with pytest.raises(SweepError) as info:
        parse_sweep({"base": BASE, **data})
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_misspelled_axis_field_is_refused_before_running():
    spec, base = _spec(axes={"pipeline.stagez": [1, 2]})
    with pytest.raises(SweepError, match="pipeline.stagez: unknown key"):
        expand(spec, base)


def test_results_have_every_input_and_result_column_and_match_simulate(tmp_path):
    spec, base = _spec(axes={"pipeline.stages": [1, 2, 4], "pipeline.micro_batches": [1, 4]})
    points = expand(spec, base)
    run = run_sweep(points, base, tmp_path, workers=0, progress=False)
    table = pd.read_parquet(tmp_path / "results.parquet")
    csv = pd.read_csv(tmp_path / "results.csv")
    assert len(table) == len(csv) == 6 and run.computed == 6 and run.failed == 0
    for column in ("pipeline.stages", "pipeline.micro_batches", "pipeline.schedule", "model.preset",
                   "model.layers", "hardware.preset", "hardware.accelerator.memory_bytes",
                   "training.optimizer", "step_time_s", "throughput_samples_per_s", "bubble_fraction",
                   "fits_in_memory", "max_stage_peak_memory_bytes", "stage_peak_memory_bytes",
                   "status", "error"):
        assert column in table.columns and column in csv.columns
    for point, (_, row) in zip(points, table.iterrows()):
        expected = simulate(parse_scenario(point.scenario), engine="simpy")
        assert row["step_time_s"] == pytest.approx(expected.step_time_s, rel=1e-9)
        assert row["bubble_fraction"] == pytest.approx(expected.bubble_fraction, abs=1e-12)
        assert list(row["stage_peak_memory_bytes"]) == pytest.approx(
            [s.peak_memory_bytes for s in expected.stages])
        assert bool(row["fits_in_memory"]) == expected.fits_in_memory


def test_failing_scenarios_are_recorded_and_the_sweep_goes_on(tmp_path):
    # 16 stages > 8 layers and 32 micro-batches > 16 samples are invalid combinations.
    spec, base = _spec(axes={"pipeline.stages": [2, 16], "pipeline.micro_batches": [4, 32]})
    run = run_sweep(expand(spec, base), base, tmp_path, workers=0, progress=False)
    table = run.table.set_index(["pipeline.stages", "pipeline.micro_batches"])
    assert table.loc[(2, 4), "status"] == "ok"
    assert table.loc[(16, 4), "status"] == "error"
    assert "pipeline.stages" in table.loc[(16, 4), "error"]
    assert "pipeline.micro_batches" in table.loc[(2, 32), "error"]
    assert pd.isna(table.loc[(16, 32), "step_time_s"])
    assert run.failed == 3
    # A failure is a finished point: running again computes nothing.
    again = run_sweep(expand(spec, base), base, tmp_path, workers=0, progress=False)
    assert again.computed == 0 and again.reused == 4


def test_a_failing_simulation_is_recorded(tmp_path, monkeypatch):
    import gpipe_sim.sweeps.runner as sweep

    spec, base = _spec(axes={"pipeline.stages": [1, 2]})
    real = sweep.result_columns

    def flaky(scenario, engine):
        if scenario.pipeline.stages == 2:
            raise RuntimeError("engine exploded\nsecond line")
        return real(scenario, engine)

    monkeypatch.setattr(sweep, "result_columns", flaky)
    run = run_sweep(expand(spec, base), base, tmp_path, workers=0, progress=False)
    assert list(run.table["status"]) == ["ok", "error"]
    assert run.table["error"].iloc[1] == "RuntimeError: engine exploded"


def test_any_executor_can_run_the_sweep(tmp_path):
    spec, base = _spec(axes={"pipeline.stages": [1, 2, 4]})
    with ThreadPoolExecutor(2) as pool:
        run = run_sweep(expand(spec, base), base, tmp_path, executor=pool, chunk_size=1, progress=False)
    assert run.computed == 3 and list(run.table["status"]) == ["ok"] * 3


def test_process_pool_gives_the_same_table_as_serial(tmp_path):
    spec, base = _spec(axes={"pipeline.stages": [1, 2, 4], "pipeline.schedule": ["gpipe", "1f1b"]})
    serial = run_sweep(expand(spec, base), base, tmp_path / "a", workers=0, progress=False).table
    pooled = run_sweep(expand(spec, base), base, tmp_path / "b", workers=2, progress=False).table
    cols = ["sweep.key", "step_time_s", "bubble_fraction", "max_stage_peak_memory_bytes"]
    pd.testing.assert_frame_equal(serial[cols], pooled[cols])


def test_resume_after_the_sweep_is_killed(tmp_path):
    """Kill a running sweep with SIGKILL, re-run it: finished scenarios are neither lost nor redone."""
    sweep_file = tmp_path / "sweep.yaml"
    base = {
        "model": {"preset": "uniform", "layers": 64},
        "hardware": {"preset": "v100"},
        "pipeline": {"stages": 32, "micro_batches": 64, "batch_size": 256},
    }
    sweep_file.write_text(yaml.safe_dump({
        "base": base, "engine": "simpy",
        "axes": {"pipeline.micro_batches": list(range(64, 112, 2)), "pipeline.schedule": ["gpipe", "1f1b"]},
    }))
    out = tmp_path / "out"
    runs = out / "runs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpipe_sim.cli", "sweep", str(sweep_file), "--out", str(out),
         "--workers", "1", "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if runs.exists() and len(list(runs.glob("*.json"))) >= 3:
                break
            if proc.poll() is not None:
                pytest.fail(f"sweep ended before it was killed: {proc.stderr.read().decode()}")
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert not (out / "results.parquet").exists()  # it really was killed part-way
    finished = {p.name: p.read_text() for p in runs.glob("*.json")}
    spec, base_data = load_sweep(sweep_file)
    points = expand(spec, base_data)
    assert 3 <= len(finished) < len(points)
    run = run_sweep(points, base_data, out, workers=0, progress=False, engine=spec.engine)
    assert run.reused == len(finished)
    assert run.computed == len(points) - len(finished)
    assert len(run.table) == len(points) and (run.table["status"] == "ok").all()
    for name, text in finished.items():  # nothing finished was recomputed
        assert (runs / name).read_text() == text


def test_cli_sweep_writes_tables_and_a_self_contained_report(tmp_path, capsys):
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "base": BASE,
        "axes": {"pipeline.stages": [1, 2, 4], "pipeline.micro_batches": [1, 2, 4],
                 "pipeline.schedule": ["gpipe", "1f1b"]},
    }))
    out = tmp_path / "out"
    assert main(["sweep", str(sweep_file), "--out", str(out), "--workers", "0", "--quiet"]) == 0
    assert "18 scenarios: 18 computed, 0 reused, 0 failed" in capsys.readouterr().out
    html = (out / "report.html").read_text()
    assert len(html) > 1_000_000 and html.count("window.PlotlyConfig") == 1  # plotly.js inlined once
    assert "<script src=" not in html  # nothing fetched from a CDN
    for title in ("Bubble fraction against M", "Throughput against K", "Per-stage peak memory",
                  "by pipeline.schedule"):
        assert title in html
    assert main(["sweep", str(sweep_file), "--out", str(out), "--workers", "0", "--quiet"]) == 0
    assert "0 computed, 18 reused" in capsys.readouterr().out


def test_cli_bad_sweep_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: {pipeline: {stages: 0}}\n")
    assert main(["sweep", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpipe-sim: error: base.pipeline.stages") and err.count("\n") == 1
    assert main(["sweep", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "o")]) == 2
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({"base": BASE, "axes": {"pipeline.stages": [1, 2]}}))
    (tmp_path / "file").write_text("")
    capsys.readouterr()
    assert main(["sweep", str(good), "--out", str(tmp_path / "file" / "o"), "--quiet"]) == 2
    assert capsys.readouterr().err.startswith("gpipe-sim: error: --out: cannot write")


def test_ctrl_c_keeps_what_finished(tmp_path):
    spec, base = _spec(axes={"pipeline.stages": [1, 2, 4, 8], "pipeline.micro_batches": [1, 2, 4]})
    points = expand(spec, base)

    def interrupt_after_five(done, total):
        if done >= 5:
            raise KeyboardInterrupt

    run = run_sweep(points, base, tmp_path, workers=0, chunk_size=1, progress=interrupt_after_five)
    assert run.interrupted and len(run.table) == 5
    (tmp_path / "runs" / "junk.tmp123").write_text("{half a row")  # a write cut short
    again = run_sweep(points, base, tmp_path, workers=0, progress=False)
    assert not again.interrupted and again.reused == 5 and again.computed == len(points) - 5
    assert not list((tmp_path / "runs").glob("*.tmp*"))


@pytest.mark.parametrize("path", sorted((Path(__file__).parent.parent / "scenarios" / "sweeps").glob("*.yaml")))
def test_shipped_sweep_files_expand_to_valid_scenarios(path):
    spec, base = load_sweep(path)
    points = expand(spec, base)
    assert points and all(p.error is None for p in points)
    sizes = 1
    for values in spec.axes.values():
        sizes *= len(values)
    assert len(points) == sizes * max(1, len(spec.points))


# ---------------------------------------------------------------------------------------------
# hostile sweeps (issue 16)

_BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    + [f"{n}: &{n} [{', '.join(['*' + p] * 10)}]" for p, n in zip("abcdefgh", "bcdefghi")]
)


def test_empty_links_in_a_sweep_run(tmp_path):
    spec = parse_sweep({"base": {"model": {"preset": "uniform"}, "hardware": {"preset": "h200", "links": []},
                                 "pipeline": {"stages": 1}},
                        "axes": {"pipeline.micro_batches": [1, 2, 4]}})
    base = resolve_base(spec)
    run = run_sweep(expand(spec, base), base, tmp_path / "out", workers=0, progress=False)
    assert list(run.table["status"]) == ["ok"] * 3


@pytest.mark.parametrize("where", ["base", "axis"])
def test_alias_bomb_in_a_sweep_is_refused_without_expanding(tmp_path, capsys, where):
    indented = "\n".join("    " + line for line in _BOMB.splitlines())
    if where == "base":
        text = f"base:\n  model: {{preset: uniform}}\n  pipeline:\n{indented}\naxes:\n  pipeline.stages: [1, 2]\n"
    else:
        text = f"defs:\n{indented}\nbase: {{model: {{preset: uniform}}}}\naxes:\n  model.layers: [*i, 4]\n"
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    t0 = time.perf_counter()
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "0", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "YAML aliases are expanded" in err
    assert time.perf_counter() - t0 < 10


def test_alias_bomb_given_in_process_is_refused():
    row = ["x"] * 10
    for _ in range(8):
        row = [row] * 10  # shared, as YAML aliases build it: 10**9 values once expanded
    with pytest.raises(SweepError, match="YAML aliases"):
        parse_sweep({"base": BASE, "axes": {"model.layers": [row, 4]}})


def test_too_many_points_are_refused_before_expanding():
    axes = {f"model.{name}": list(range(1, 101)) for name in ("layers", "forward_s_per_sample", "params_per_layer")}
    with pytest.raises(SweepError, match=r"axes: 1,000,000 points, over the limit of 100,000"):
        parse_sweep({"base": BASE, "axes": axes})


def test_absurd_axis_values_fail_their_own_rows_only(tmp_path):
    spec = parse_sweep({"base": BASE, "axes": {"model.layers": [8, 10**30, 10**5000, math.nan, "a\nb", 10**6]}})
    base = resolve_base(spec)
    points = expand(spec, base)
    assert len({p.key for p in points}) == 6
    run = run_sweep(points, base, tmp_path / "out", workers=0, progress=False)
    table = run.table
    assert list(table["status"]) == ["ok"] + ["error"] * 5
    assert all("\n" not in e for e in table["error"].dropna())
    assert "limit of 100,000 layers" in table["error"].iloc[1]
    assert pd.read_csv(tmp_path / "out" / "results.csv").shape[0] == 6


def test_a_degenerate_result_in_a_sweep_is_an_error_row(tmp_path):
    spec = parse_sweep({"base": {**BASE, "model": {"preset": "uniform", "layers": 8}},
                        "axes": {"model.forward_s_per_sample": [1e-3, 0.0]},
                        "points": [{"model.backward_s_per_sample": 0.0}]})
    base = resolve_base(spec)
    run = run_sweep(expand(spec, base), base, tmp_path / "out", workers=0, progress=False)
    assert list(run.table["status"]) == ["ok", "error"]
    assert "takes no time" in run.table["error"].iloc[1]


def test_a_large_shared_axis_value_is_summarised_not_expanded(tmp_path):
    value: object = {f"k{i}": "x" for i in range(10)}
    for _ in range(4):
        value = {f"k{i}": value for i in range(10)}  # 222,221 keys and values once expanded, 5 objects
    spec = parse_sweep({"base": BASE, "axes": {"model.layers": [8, value], "pipeline.micro_batches": [1, 2]}})
    base = resolve_base(spec)
    t0 = time.perf_counter()
    points = expand(spec, base)
    run = run_sweep(points, base, tmp_path / "out", workers=0, progress=False)
    assert time.perf_counter() - t0 < 10
    assert list(run.table["status"]) == ["ok", "ok", "error", "error"]
    assert run.table["model.layers"].iloc[2].startswith("<a mapping of 222,221 values, sha256 ")
    assert "expected a whole number, got a mapping" in run.table["error"].iloc[2]


def _table_lines(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("│").split("│")] for line in text.splitlines() if line.startswith("│")]


def test_cli_sweep_prints_the_best_configurations_that_fit(tmp_path, capsys):
    """On one device count, the top 5 by throughput among the rows that fit; over several, the
    fastest of each device count (like with like), with throughput per device."""
    sweep_file = tmp_path / "s.yaml"
    base = {**BASE, "hardware": {"preset": "ideal", "accelerator": {"memory_bytes": "300 MB"}},
            "model": {**BASE["model"], "params_per_layer": 1_000_000}}
    sweep_file.write_text(yaml.safe_dump({
        "base": base,
        "axes": {"pipeline.stages": [1, 2, 4], "pipeline.micro_batches": [1, 2, 4],
                 "pipeline.remat": ["none", "always"]},
    }))
    out = tmp_path / "out"
    assert main(["sweep", str(sweep_file), "--out", str(out), "--workers", "0", "--quiet", "--no-report"]) == 0
    text = capsys.readouterr().out
    table = pd.read_parquet(out / "results.parquet")
    fits = table[table["fits_in_memory"].astype(bool)]
    assert 5 < len(fits) < len(table)  # some do not fit: they must not be listed
    assert f"the fastest of each device count among the {len(fits)} configurations that fit in memory" in text
    header = next(line for line in text.splitlines() if "stages" in line and "step time" in line)
    for name in ("stages", "micro_batches", "remat", "N", "step time", "samples/s", "per device", "bubble", "peak"):
        assert name in header
    lines = _table_lines(text)
    assert [int(cells[4]) for cells in lines] == sorted(fits["num_devices"].unique())
    for cells in lines:
        same = fits[fits["num_devices"] == int(cells[4])]
        row = same.loc[same["throughput_samples_per_s"].idxmax()]
        assert cells[1:4] == [str(row["pipeline.stages"]), str(row["pipeline.micro_batches"]), row["pipeline.remat"]]
        assert cells[6] == f"{row['throughput_samples_per_s']:,.1f}"
        assert cells[7] == f"{row['throughput_samples_per_s'] / row['num_devices']:,.2f}"
    # one device count: the five fastest
    roomy = {**base, "hardware": {"preset": "ideal"}, "pipeline": {**base["pipeline"], "stages": 2}}
    sweep_file.write_text(yaml.safe_dump({"base": roomy, "axes": {
        "pipeline.micro_batches": [1, 2, 4], "pipeline.remat": ["none", "always"]}}))
    assert main(["sweep", str(sweep_file), "--out", str(tmp_path / "o1"), "--workers", "0", "--quiet",
                 "--no-report"]) == 0
    text = capsys.readouterr().out
    table = pd.read_parquet(tmp_path / "o1" / "results.parquet")
    fits = table[table["fits_in_memory"].astype(bool)]
    best = fits.sort_values("throughput_samples_per_s", ascending=False, kind="stable").head(5)
    assert f"best 5 of the {len(fits)} configurations that fit in memory" in text
    lines = _table_lines(text)
    assert [(cells[1], cells[2]) for cells in lines] == [
        (str(r["pipeline.micro_batches"]), r["pipeline.remat"]) for _, r in best.iterrows()]
    # none fits: one line naming the nearest miss
    sweep_file.write_text(yaml.safe_dump({"base": {**base, "hardware": {"preset": "ideal", "accelerator": {
        "memory_bytes": "1 MB"}}}, "axes": {"pipeline.stages": [1, 2]}}))
    assert main(["sweep", str(sweep_file), "--out", str(tmp_path / "o2"), "--workers", "0", "--quiet",
                 "--no-report"]) == 0
    assert "none of the 2 configurations that ran fits in memory; the nearest, sweep.index 1" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# the fields a schedule needs, notes, and the report's charts (issue 26 item 5)

SCHEDULE_AXIS = ["gpipe", "1f1b", "interleaved_1f1b", "zbv", "dualpipev"]


def test_a_schedule_axis_fills_the_chunks_each_schedule_needs(tmp_path):
    spec, base = _spec(axes={"pipeline.schedule": SCHEDULE_AXIS, "pipeline.micro_batches": [4, 8]})
    run = run_sweep(expand(spec, base), base, tmp_path, workers=0, progress=False)
    table = run.table
    assert (table["status"] == "ok").all(), table[["pipeline.schedule", "error"]]
    chunks = table.groupby("pipeline.schedule")["pipeline.chunks"].unique().map(list).to_dict()
    assert chunks == {"gpipe": [1], "1f1b": [1], "interleaved_1f1b": [2], "zbv": [2], "dualpipev": [2]}
    zbv = table[table["pipeline.schedule"] == "zbv"]
    assert zbv["note"].str.contains("pipeline.chunks set to 2").all()
    assert table.loc[table["pipeline.schedule"] == "gpipe", "note"].isna().all()
    again = pd.read_parquet(tmp_path / "results.parquet")
    assert list(again["note"].fillna("")) == list(table["note"].fillna(""))


def test_chunks_given_by_the_user_are_kept_and_meaningless_values_noted():
    spec, base = _spec(axes={"pipeline.schedule": ["gpipe", "interleaved_1f1b", "zbv"], "pipeline.chunks": [1, 2]})
    points = {(p.updates["pipeline.schedule"], p.updates["pipeline.chunks"]): p for p in expand(spec, base)}
    assert points["zbv", 2].error is None and not points["zbv", 2].notes
    assert "means nothing to gpipe" in points["gpipe", 2].notes[0] and points["gpipe", 2].error
    assert "does not interleave" in points["interleaved_1f1b", 1].notes[0]
    assert points["interleaved_1f1b", 1].scenario["pipeline"]["chunks"] == 1  # run as asked
    # chunks: 1 written in the base is the user's choice: interleaved keeps it, with a note
    base_given = {**BASE, "pipeline": {**BASE["pipeline"], "chunks": 1}}
    spec = parse_sweep({"base": base_given, "axes": {"pipeline.schedule": ["interleaved_1f1b", "zbv"]}})
    kept = {p.updates["pipeline.schedule"]: p for p in expand(spec, resolve_base(spec))}
    assert kept["interleaved_1f1b"].scenario["pipeline"]["chunks"] == 1
    assert "does not interleave" in kept["interleaved_1f1b"].notes[0]
    assert kept["zbv"].scenario["pipeline"]["chunks"] == 2  # a V shape cannot run anything else


def test_an_interleaved_default_that_cannot_run_falls_back_with_a_note():
    spec, base = _spec(axes={"pipeline.schedule": ["interleaved_1f1b"], "pipeline.micro_batches": [3]})
    (point,) = expand(spec, base)  # M=3 is no multiple of K=2: v=2 cannot run, v=1 can
    assert point.error is None and point.scenario["pipeline"]["chunks"] == 1
    assert "not interleaved" in point.notes[0]


def test_cli_sweep_prints_its_notes(tmp_path, capsys):
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(yaml.safe_dump({"base": BASE, "axes": {"pipeline.schedule": ["1f1b", "zbv"]}}))
    assert main(["sweep", str(sweep_file), "--out", str(tmp_path / "out"), "--workers", "0", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "2 scenarios: 2 computed, 0 reused, 0 failed" in out
    assert "note: pipeline.chunks set to 2: zbv runs 2 chunks per rank (1 point)" in out
    html = (tmp_path / "out" / "report.html").read_text()
    assert "<h2>Notes</h2>" in html and "zbv runs 2 chunks per rank" in html


def _schedule_table(tmp_path):
    spec, base = _spec(axes={"pipeline.schedule": SCHEDULE_AXIS, "pipeline.micro_batches": [4, 8, 16]})
    table = run_sweep(expand(spec, base), base, tmp_path, workers=0, progress=False).table
    return table[table["status"] == "ok"], ["pipeline.schedule", "pipeline.micro_batches", "pipeline.chunks"]


def test_report_step_time_has_one_coloured_line_per_schedule(tmp_path):
    from gpipe_sim.sweeps.report import figure_step_time

    ok, varying = _schedule_table(tmp_path)
    fig = figure_step_time(ok, varying)
    assert "Step time against M, one line per schedule" in fig.layout.title.text
    names = [t.name for t in fig.data]
    assert sorted(names) == sorted(f"schedule={s}" for s in ok["pipeline.schedule"].unique())
    colours = [t.line.color for t in fig.data]
    assert len(set(colours)) == len(colours)  # one distinct colour per schedule
    for trace in fig.data:  # the hover names each point's configuration
        assert all(text.count("=") >= 3 and "schedule=" in text and "chunks=" in text for text in trace.text)
        assert "%{text}" in trace.hovertemplate
    ms = sorted(ok["pipeline.micro_batches"].unique())
    assert fig.layout.xaxis.type == "log"
    assert list(fig.layout.xaxis.tickvals) == ms  # ticks at the M values used
    assert list(fig.layout.xaxis.ticktext) == [str(m) for m in ms]


def test_report_memory_dots_name_their_configuration(tmp_path):
    from gpipe_sim.sweeps.report import figure_memory

    ok, varying = _schedule_table(tmp_path)
    fig = figure_memory(ok, varying)
    colours = [t.marker.color for t in fig.data]
    assert len(set(colours)) == len(colours) == ok["pipeline.schedule"].nunique()
    for trace in fig.data:
        assert trace.text and all("micro_batches=" in text and "schedule=" in text for text in trace.text)


def test_log_ticks_are_the_values_used_or_their_powers_of_two():
    from gpipe_sim.charts.style import category_colors, log_ticks

    assert log_ticks([4, 1, 2, 32, 8, 16, 8]) == [1, 2, 4, 8, 16, 32]
    many = log_ticks(list(range(1, 65)))
    assert many == [1, 2, 4, 8, 16, 32, 64]
    assert len(set(category_colors(14))) == 14


def test_report_bubble_references_are_each_schedules_own_analytic_bubble():
    """The dotted reference lines come from the rows' analytic bubble (the schedule family's
    formula), not GPipe's (K-1)/(M+K-1) for every schedule."""
    import pandas as pd

    from gpipe_sim.schedule import schedule_family
    from gpipe_sim.sweeps.report import figure_bubble

    rows = []
    for schedule, v in (("gpipe", 1), ("interleaved_1f1b", 2)):
        for m in (4, 8):
            rows.append({"pipeline.schedule": schedule, "pipeline.stages": 4, "pipeline.chunks": v,
                         "pipeline.micro_batches": m, "bubble_fraction": 0.5,
                         "analytic_bubble_fraction": schedule_family(schedule).analytic_bubble(4, m, v)})
    fig = figure_bubble(pd.DataFrame(rows), ["pipeline.schedule", "pipeline.micro_batches"])
    refs = {t.name: list(t.y) for t in fig.data if t.name.startswith("analytic")}
    interleaved = next(y for name, y in refs.items() if "interleaved_1f1b" in name)
    assert interleaved == pytest.approx([3 / (2 * 4 + 3), 3 / (2 * 8 + 3)])
    gpipe = next(y for name, y in refs.items() if "gpipe" in name)
    assert gpipe == pytest.approx([3 / 7, 3 / 11])
