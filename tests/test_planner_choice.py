"""The planner's pick (issue 26): ties within the model's error broken toward simplicity and
memory headroom, the reserve and headroom, the K range, even M, K=1 named data parallelism, and a
CSV accounting for every configuration considered."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from gpipe_sim.cli import main
from gpipe_sim.scenario.scenario import parse_scenario
from gpipe_sim.planner.report import csv_rows, plan_dict, plan_html, plan_text
from gpipe_sim.planner.search import TIE, PlanEntry, PlanOptions, search_configurations
from gpipe_sim.planner.search import _ordered as ordered

UNIFORM = {
    "model": {"preset": "uniform", "layers": 6, "params_per_layer": 20_000_000},
    "hardware": {"preset": "v100", "accelerator": {"memory_bytes": "4 GB"}},
    "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 8, "schedule": "1f1b"},
}
SMALL = dict(devices=2, schedules=("gpipe", "1f1b", "zb_h1"), max_chunks=2, micro_batches=(1, 2, 3, 4, 8))


def _entry(i, K, step, peak, *, v=1, remat="none", zero=0, M=4, schedule="1f1b", even=True):
    o = {"pipeline.data_parallel": 1, "pipeline.stages": K, "pipeline.chunks": v, "pipeline.micro_batches": M,
         "pipeline.schedule": schedule, "pipeline.remat": remat, "pipeline.partition": "uniform",
         "training.zero": zero}
    return PlanEntry(i, o, step, 8 / step, K, 0.0, 0.0, 0.0, peak, 10.0, True, "bubble", even=even)


def test_ties_are_broken_toward_simplicity_then_headroom():
    """Within 5% of the fastest: fewer stages, no re-computation, no ZeRO, v=1, even M first, then
    the lower peak; outside the tie, by throughput."""
    fastest = _entry(0, 4, 1.00, 9.5, v=2, schedule="interleaved_1f1b")  # fastest, 95% full
    entries = [fastest,
               _entry(1, 2, 1.04, 5.0, remat="always"),
               _entry(2, 2, 1.03, 6.0),
               _entry(3, 2, 1.02, 7.0),  # same structure as 2, more memory
               _entry(4, 2, 1.01, 4.0, M=3, even=False),
               _entry(5, 1, 1.20, 3.0)]  # simplest, but 20% slow: not tied
    order, tied = ordered(entries, entries, TIE, 8)
    assert tied == 5
    assert [e.index for e in order] == [2, 3, 4, 1, 0, 5]
    assert order[0].vs_fastest == pytest.approx(0.03) and order[-1].tied is False
    order, tied = ordered(entries, entries, 0.0, 8)  # no tie: the fastest first
    assert tied == 1 and order[0] is fastest


def test_plan_picks_the_simplest_tied_configuration():
    base = parse_scenario(UNIFORM)
    wide = search_configurations(base, PlanOptions(**SMALL, tie=1.0))  # everything within 100%: all tied
    pick = wide.pick
    assert pick.get("K") == 1 and pick.get("remat") == "none" and pick.get("zero") == 0
    tied_dp = [e for e in wide.ranked if e.tied and e.get("K") == 1 and e.get("remat") == "none" and e.even
               and e.get("zero") == 0]
    assert pick.peak_memory_bytes == min(e.peak_memory_bytes for e in tied_dp)
    exact = search_configurations(base, PlanOptions(**SMALL, tie=0.0))
    assert exact.pick.step_time_s == exact.best.step_time_s == wide.best.step_time_s


def test_reserve_and_headroom_exclude_configurations():
    base = parse_scenario(UNIFORM)
    # no ZeRO: with the sharded stages' faster data parallelism the step-time bound prunes the large ones unsimulated
    small = dict(SMALL, zero=(0,))
    none = search_configurations(base, PlanOptions(**small, reserve=0.0))
    assert none.capacity_bytes == pytest.approx(4e9)
    reserved = search_configurations(base, PlanOptions(**small, reserve=0.5))
    assert reserved.capacity_bytes == pytest.approx(2e9)
    peaks = sorted(e.peak_memory_bytes for e in none.ranked)
    assert any(p > 2e9 for p in peaks) and all(e.peak_memory_bytes <= 2e9 for e in reserved.ranked)
    # the configurations that fit without the reserve but peak above 2 GB are left out with it
    over = {e.index for e in none.ranked if e.peak_memory_bytes > 2e9}
    assert reserved.ranked and not over & {e.index for e in reserved.ranked}
    roomy = search_configurations(base, PlanOptions(**small, reserve=0.0, headroom=0.5))
    assert roomy.limit_bytes == pytest.approx(2e9)
    assert roomy.ranked and all(e.peak_memory_bytes <= 2e9 for e in roomy.ranked)
    assert not over & {e.index for e in roomy.ranked}
    reasons = [row["reason"] for row in csv_rows(roomy) if row["status"] != "fits"]
    assert any("memory bound" in r or "headroom" in r for r in reasons)
    # a hardware that already reserves more keeps its own figure
    h100 = parse_scenario({**UNIFORM, "hardware": {"preset": "h100-sxm"}})
    assert search_configurations(h100, PlanOptions(**SMALL)).capacity_bytes == pytest.approx(85017493504 * 0.94)


def test_stage_range_and_even_micro_batches():
    base = parse_scenario({**UNIFORM, "pipeline": {**UNIFORM["pipeline"], "batch_size": 12}})
    options = dict(devices=4, schedules=("1f1b",), remat=("none",), partitions=("uniform",), reserve=0.0)
    only2 = search_configurations(base, PlanOptions(**options, stages=(2,)))
    assert {c.stages for c in only2.candidates} == {2}
    even = search_configurations(base, PlanOptions(**options, even_micro_batches=True))
    assert all((12 // c.data_parallel) % c.micro_batches == 0 for c in even.candidates)
    uneven = search_configurations(base, PlanOptions(**options, top=200))
    marked = [e for e in uneven.order if not e.even]
    assert marked and all((12 // e.get("D")) % e.get("M") for e in marked)
    text = plan_text(uneven, 200)
    assert f"{marked[0].get('M')}*" in text and "M does not divide the per-replica batch" in text


def test_k1_is_named_data_parallel_everywhere(tmp_path):
    base = parse_scenario(UNIFORM)
    search = search_configurations(base, PlanOptions(**SMALL, tie=1.0, top=50))
    dp = [e for e in search.order if e.get("K") == 1]
    assert dp and all(e.get("schedule") == "1f1b" and e.get("v") == 1 for e in dp)  # what runs
    text = plan_text(search, 50)
    rows = [line.split() for line in text.splitlines() if line.strip().split(" ")[0].isdigit()]
    k1 = [r for r in rows if r[3] == "1"]  # rank, T, D, K, v, M, schedule
    assert k1 and all(r[1] == "1" and r[4] == "-" and r[6:8] == ["data", "parallel"] for r in k1)
    data = plan_dict(search, 50)
    assert all(r["schedule"] == "data parallel" and r["v"] is None for r in data["ranked"] if r["K"] == 1)
    assert "data parallel" in plan_html(search, 50)
    assert all(r["schedule"] == "data parallel" for r in csv_rows(search) if r["K"] == 1)


def test_csv_lists_every_configuration_with_figures_or_a_reason(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(UNIFORM))
    out = tmp_path / "p.csv"
    assert main(["plan", str(path), "--devices", "2", "--csv", str(out), "--stages", "1-2", "--quiet"]) == 0
    rows = list(csv.DictReader(out.open()))
    statuses = {row["status"] for row in rows}
    assert {"fits", "pruned", "refused"} <= statuses
    considered = [r for r in rows if r["status"] != "refused"]
    search = search_configurations(parse_scenario(UNIFORM), PlanOptions(devices=2))
    assert len(considered) == search.enumerated
    for row in rows:
        if row["status"] == "fits":
            assert float(row["step_time_s"]) > 0
        else:
            assert row["reason"], row
    reasons = " ".join(r["reason"] for r in rows)
    assert "step-time bound" in reasons and "invalid for the schedule" in reasons


def test_command_options_are_read_and_refused_in_one_line(capsys, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(UNIFORM))
    argv = ["plan", str(path), "--devices", "2", "--json", "--tie", "2%", "--reserve", "0.5 GB",
            "--headroom", "10%", "--stages", "2", "--even-m"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tie"] == 0.02 and data["reserve"] == pytest.approx(0.125) and data["headroom"] == 0.1
    assert data["ranked"] and all(r["K"] == 2 and 8 % r["M"] == 0 for r in data["ranked"])
    for flag, value in (("--tie", "lots"), ("--headroom", "150%"), ("--stages", "0"), ("--reserve", "x")):
        assert main(["plan", str(path), "--devices", "2", flag, value]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and flag in err, err
