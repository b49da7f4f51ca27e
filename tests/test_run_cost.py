"""Time and cost to train (issue 36, item 4): training.tokens, hardware.price_per_device_hour and the
goodput model give days, device-hours and cost in simulate, plan and sweeps; absent, nothing changes."""

from __future__ import annotations

import csv
import json
import math

import pytest

from gpipe_sim.api import simulate
from gpipe_sim.cli import main
from gpipe_sim.results.result import Result
from gpipe_sim.results.run_cost import goodput_figures, goodput_share, optimal_interval, run_cost_rows
from gpipe_sim.scenario.scenario import parse_scenario
from gpipe_sim.scenario.training_run import Goodput
from gpipe_sim.schema.units import parse_count
from gpipe_sim.summary import summary_text

SEQ, BATCH = 128, 8
BASE = {
    "model": {"preset": "transformer", "layers": 4, "d_model": 256, "d_ff": 1024, "heads": 4, "seq_len": SEQ,
              "vocab": 1000},
    "hardware": {"preset": "a100-80gb"},
    "pipeline": {"stages": 2, "micro_batches": 4, "batch_size": BATCH, "schedule": "1f1b", "remat": "none"},
    "training": {"dtype": "bf16"},
}
RUN = {"training.tokens": "300B", "hardware.price_per_device_hour": 2.5}
GOODPUT = {"mtbf_device_hours": 50_000, "checkpoint_save_s": 30, "restart_s": 600}


def _scenario(**updates):
    return parse_scenario(BASE).with_updates(updates)


@pytest.mark.parametrize("text, value", [("1T", 1e12), ("15T", 1.5e13), ("300B", 3e11), ("2.5M", 2.5e6),
                                         ("1.5e12", 1.5e12), (7_000, 7e3), ("40k", 4e4)])
def test_token_counts_read_as_people_write_them(text, value):
    assert parse_count(text) == pytest.approx(value, rel=1e-15)


def test_days_device_hours_and_cost_are_steps_times_step_time():
    result = simulate(_scenario(**RUN))
    run = result.run
    steps = math.ceil(300e9 / (BATCH * SEQ))
    assert run.steps == steps and run.tokens_per_step == BATCH * SEQ
    assert run.time_s == run.failure_free_time_s == pytest.approx(steps * result.step_time_s, rel=1e-12)
    assert run.days == pytest.approx(run.time_s / 86400, rel=1e-12)
    assert run.device_hours == pytest.approx(run.time_s * 2 / 3600, rel=1e-12)  # K=2 devices
    assert run.cost == pytest.approx(run.device_hours * 2.5, rel=1e-12)
    assert run.cost_per_hour == 5.0


def test_nothing_asked_nothing_shown():
    scenario = _scenario()
    result = simulate(scenario)
    assert result.run is None and "training_run" not in result.to_dict(timeline=False)
    text = summary_text(scenario, result)
    assert all(word not in text for word in ("time to train", "goodput", "cost"))


def test_the_run_is_in_the_summary_and_survives_json():
    scenario = _scenario(**RUN, **{"training.goodput": GOODPUT})
    result = simulate(scenario)
    text = summary_text(scenario, result)
    assert "time to train" in text and "goodput" in text and "for the run" in text
    back = Result.from_dict(json.loads(result.to_json(timeline=False)))
    assert back.run == result.run


def test_goodput_matches_dalys_exact_expectation_where_first_order_holds():
    """Independent reference: with exponential failures (mean M, also during restarts), a segment of
    tau seconds of work plus a delta-second save takes M e^(R/M) (e^((tau+delta)/M) - 1) on average
    (Daly 2006, eq. 11); the first-order model agrees to O(((tau+delta)/M)^2)."""
    M, tau, delta, R = 100_000.0, 1_800.0, 60.0, 1_000.0
    exact = tau / (M * math.exp(R / M) * math.expm1((tau + delta) / M))
    assert goodput_share(tau, delta, R, M) == pytest.approx(exact, rel=1e-3)


def test_the_default_interval_is_the_goodput_maximum():
    M, delta, R = 20_000.0, 45.0, 300.0
    best = optimal_interval(delta, R, M)
    assert best == pytest.approx(math.sqrt(2 * delta * (M - R)) - delta)
    grid = [best * (0.5 + i / 1000) for i in range(1001)]
    top = max(grid, key=lambda t: goodput_share(t, delta, R, M))
    assert top == pytest.approx(best, rel=2e-3)
    spec = Goodput(mtbf_device_hours=M * 64 / 3600, checkpoint_save_s=delta, restart_s=R)
    g = goodput_figures(spec, 64)
    assert g.system_mtbf_s == pytest.approx(M) and g.checkpoint_interval_s == pytest.approx(best)


def test_goodput_falls_with_devices_and_lengthens_the_run():
    small = simulate(_scenario(**RUN, **{"training.goodput": GOODPUT})).run
    assert 0 < small.goodput.goodput < 1
    assert small.time_s == pytest.approx(small.failure_free_time_s / small.goodput.goodput)
    many = goodput_figures(Goodput(**GOODPUT), 16_384)
    assert many.goodput < small.goodput.goodput
    hopeless = goodput_figures(Goodput(mtbf_device_hours=1, checkpoint_save_s=600, restart_s=600), 16_384)
    assert hopeless.goodput == 0 and hopeless.checkpoint_interval_s is None


def test_price_without_tokens_gives_the_hourly_cost(capsys):
    assert main(["simulate", "--set", "hardware.price_per_device_hour=3", "--set", "model.preset=uniform"]) == 0
    out = capsys.readouterr().out
    assert "per hour on" in out and "give training.tokens" in out


@pytest.mark.parametrize("item, fragment", [
    ("training.tokens=lots", "training.tokens: cannot read 'lots'"),
    ("training.tokens=-1T", "training.tokens"),
    ("hardware.price_per_device_hour=nan", "hardware.price_per_device_hour"),
    ("training.goodput.restart_s=5", "training.goodput.mtbf_device_hours: required"),
    ("training.goodput={mtbf_device_hours: 1000, checkpoint_save_s: 0}", "training.goodput.checkpoint_save_s: 0 s"),
])
def test_bad_run_fields_are_one_line(capsys, item, fragment):
    assert main(["simulate", "--set", item]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err


def test_tokens_need_a_token_model(capsys):
    assert main(["simulate", "--set", "model.preset=uniform", "--set", "training.tokens=1T"]) == 2
    assert "training.tokens: a uniform model has no tokens" in capsys.readouterr().err


def test_plan_ranks_with_the_run_columns(capsys, tmp_path):
    import yaml

    path = tmp_path / "s.yaml"
    data = json.loads(json.dumps(BASE))
    data["training"].update(tokens="1B", goodput=GOODPUT)
    data["hardware"]["price_per_device_hour"] = 2
    path.write_text(yaml.safe_dump(data))
    assert main(["plan", str(path), "--devices", "4", "--quiet", "--top", "3", "--schedules", "1f1b",
                 "--tensor-parallel", "1", "--partitions", "uniform"]) == 0
    header = capsys.readouterr().out.splitlines()[2].split()
    assert header[-4:] == ["days", "device-hours", "goodput", "cost"]
    table, page = tmp_path / "plan.csv", tmp_path / "plan.html"
    assert main(["plan", str(path), "--devices", "4", "--quiet", "--top", "3", "--json", "--schedules", "1f1b",
                 "--tensor-parallel", "1", "--partitions", "uniform", "--csv", str(table), "--html", str(page)]) == 0
    assert "<th>days</th><th>device-hours</th><th>goodput</th><th>cost</th>" in page.read_text()
    pick = json.loads(capsys.readouterr().out)["pick"]
    first = next(csv.DictReader(table.open()))
    assert float(first["run_cost"]) == pytest.approx(float(first["run_device_hours"]) * 2)
    assert "training_run" not in first and float(first["run_goodput"]) == pytest.approx(
        pick["training_run"]["goodput"]["goodput"])
    run = pick["training_run"]
    steps = math.ceil(1e9 / (BATCH * SEQ))
    assert run["steps"] == steps and run["devices"] == pick["devices"]
    assert run["failure_free_time_s"] == pytest.approx(steps * pick["step_time_s"], rel=1e-12)
    assert run["cost"] == pytest.approx(run["device_hours"] * 2, rel=1e-12)


def test_sweep_rows_carry_the_run_only_when_asked():
    from gpipe_sim.results.run_cost import RUN_COLUMNS
    from gpipe_sim.sweeps.runner import result_columns

    assert not set(RUN_COLUMNS) & set(result_columns(_scenario(), "fast"))
    row = result_columns(_scenario(**RUN), "fast")
    assert row["run_cost"] == pytest.approx(row["run_device_hours"] * 2.5) and row["run_goodput"] is None


@pytest.mark.parametrize("run", [True, False])
def test_a_sweeps_best_table_shows_the_runs_days_and_cost(capsys, tmp_path, run):
    import yaml

    data = json.loads(json.dumps(BASE))
    if run:
        data["training"]["tokens"] = "1B"
        data["hardware"]["price_per_device_hour"] = 2
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({"name": "run", "base": "base.yaml",
                                                         "axes": {"pipeline.micro_batches": [2, 4]}}))
    assert main(["sweep", str(tmp_path / "sweep.yaml"), "--out", str(tmp_path / "out"), "--quiet",
                 "--no-report", "--workers", "0"]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if "step time" in line)
    assert (" days " in header and " cost " in header) == run


def test_a_given_interval_is_shown_beside_the_optimum():
    spec = {**GOODPUT, "checkpoint_interval_s": 600}
    scenario = _scenario(**RUN, **{"training.goodput": spec})
    result = simulate(scenario)
    best = optimal_interval(30, 600, 50_000 * 3600 / 2)
    assert result.run.goodput.checkpoint_interval_s == 600 and result.run.goodput.optimal_interval_s == best
    assert result.run.goodput.goodput < goodput_share(best, 30, 600, 50_000 * 3600 / 2)  # the optimum is better
    text = dict(run_cost_rows(result.run))["goodput"]  # the summary's row (before the table wraps it)
    assert "a checkpoint every 10.0 min (the optimum: " in text and text.endswith("Young/Daly)")
