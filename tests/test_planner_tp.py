"""The planner searches tensor parallelism T (issue 27, item 2): only where the model splits and
T fits a node, --tensor-parallel restricts it, T=1 preferred in a tie, and the pick's T explained."""

from __future__ import annotations

import json

import pytest
import yaml

from gpipe_sim.cli import main
from gpipe_sim.scenario.scenario import parse_scenario
from gpipe_sim.planner.report import csv_rows, plan_dict, plan_text
from gpipe_sim.planner.search import PlanOptions, candidate_space, search_configurations, tensor_parallel_values

GPT = {
    "model": {"preset": "transformer", "layers": 4, "d_model": 256, "d_ff": 1024, "heads": 4, "seq_len": 128,
              "vocab": 1000},
    "hardware": {"preset": "a100-80gb", "devices_per_node": 2},
    "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": 8, "schedule": "1f1b"},
    "training": {"dtype": "bf16"},
}
UNIFORM = {
    "model": {"preset": "uniform", "layers": 4, "params_per_layer": 1_000_000},
    "hardware": {"preset": "v100", "devices_per_node": 8},
    "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": 8},
}


def _with(data, **hardware):
    return {**data, "hardware": {**data["hardware"], **hardware}}


@pytest.mark.parametrize("data, devices, expected", [
    (UNIFORM, 8, [1]),  # not the transformer preset: no split
    (GPT, 8, [1, 2]),  # nodes of 2
    (_with(GPT, devices_per_node=8), 8, [1, 2, 4]),  # 4 heads: T=8 does not split them
    (_with(GPT, devices_per_node=8), 2, [1, 2]),  # no more than N
    ({**GPT, "model": {**GPT["model"], "heads": 6, "d_model": 384, "d_ff": 1536}}, 8, [1, 2]),
    ({**_with(GPT, devices_per_node=None)}, 4, [1, 2, 4]),  # no nodes: up to N
])
def test_tensor_parallel_searched_only_where_valid(data, devices, expected):
    base = parse_scenario(data)
    options = PlanOptions(devices=devices, schedules=("1f1b",), remat=("none",), micro_batches=(1,))
    assert tensor_parallel_values(base, options) == expected
    cands = candidate_space(base, options)
    assert sorted({c.tensor_parallel for c in cands}) == expected
    assert all(c.devices == devices for c in cands)
    for c in cands:  # each a valid scenario of T x D x K devices
        assert base.with_updates(c.overrides()).pipeline.tensor_parallel == c.tensor_parallel


def test_only_t2_fits_and_the_pick_says_why():
    """40 MB a device: at K=1 the whole model on one device (T=1, D=2) does not fit unsharded
    (ZeRO 0), split over 2 it does."""
    base = parse_scenario(_with(GPT, accelerator={"memory_bytes": "40 MB"}))
    search = search_configurations(base, PlanOptions(devices=2, stages=(1,), reserve=0.0, zero=(0,)))
    assert search.pick.get("T") == 2 and search.pick.max_stage_tp_comm_s > 0
    assert all(e.get("T") == 2 for e in search.ranked)
    text = plan_text(search)
    assert "picked T=2" in text and "T=1: no configuration fits" in text and "TP collectives" in text
    data = plan_dict(search)
    assert data["pick"]["T"] == 2 and data["tensor_parallel"] == [1, 2]
    assert "T=1: no configuration fits" in data["why_tensor_parallel"]
    assert any(r["T"] == 1 and r["status"] != "fits" for r in csv_rows(search))


def test_t1_preferred_in_a_tie_and_other_t_reported():
    base = parse_scenario(GPT)
    options = PlanOptions(devices=2, schedules=("1f1b",), remat=("none",), reserve=0.0)
    wide = search_configurations(base, PlanOptions(**{**options.__dict__, "tie": 1.0}))
    assert wide.pick.get("T") == 1
    tied_t = sorted({e.get("T") for e in wide.order if e.tied})
    if tied_t == [1, 2]:
        assert [e.get("T") for e in wide.order[:wide.tied]] == sorted(e.get("T") for e in wide.order[:wide.tied])
    assert "T=2: best T=2" in plan_text(wide) or "T=2: not simulated" in plan_text(wide)


def test_tensor_parallel_option_restricts(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_with(GPT, devices_per_node=8)))
    argv = ["plan", str(path), "--devices", "4", "--schedules", "1f1b", "--remat", "none", "--json", "--quiet",
            "--csv", str(tmp_path / "p.csv")]
    assert main([*argv, "--tensor-parallel", "2"]) == 0
    data = json.loads(capsys.readouterr().out.split("\ncsv written")[0])
    assert data["tensor_parallel"] == [2] and all(r["T"] == 2 for r in data["ranked"])
    assert main([*argv, "--tensor-parallel", "1-4", "--sequence-parallel"]) == 0
    data = json.loads(capsys.readouterr().out.split("\ncsv written")[0])
    assert data["tensor_parallel"] == [1, 2, 4] and data["sequence_parallel"] is True
    for bad in ("3", "0", "x"):
        assert main([*argv, "--tensor-parallel", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--tensor-parallel" in err, err


def test_zero3_fits_where_only_t2_did_and_the_pick_says_why():
    """The same 40 MB a device with every ZeRO stage searched: ZeRO-3 shards the weights of one
    replica's whole model over D=2, so T=1 fits (and skips T=2's collectives); the reason names the
    stages that do not fit."""
    base = parse_scenario(_with(GPT, accelerator={"memory_bytes": "40 MB"}))
    search = search_configurations(base, PlanOptions(devices=2, stages=(1,), reserve=0.0))
    pick = search.pick
    assert (pick.get("T"), pick.get("D"), pick.get("zero")) == (1, 2, 3) and pick.fits
    text = plan_text(search)
    assert "ZeRO stage: picked 3" in text and "0: needs at least" in text and "does not fit" in text
    assert plan_dict(search)["why_zero"].startswith("ZeRO stage: picked 3")


def test_values_kept_out_name_the_least_bound_and_the_memory_count():
    """A T the search never simulated is explained from the pruned store: its least finite
    step-time bound and how many of its configurations need more memory, as read one by one
    from the pruned mapping (plain Python over every pruned configuration)."""
    from gpipe_sim.planner.tp_choice import _kept_out, _pruned_by_value
    from gpipe_sim.schema.units import format_seconds

    base = parse_scenario(_with(GPT, devices_per_node=8, accelerator={"memory_bytes": "60 MB"}))
    search = search_configurations(base, PlanOptions(devices=8, reserve=0.0))
    by_value = _pruned_by_value(search, "T")
    explained = 0
    for T in sorted(search.candidates.values("T")):
        memory = [f for i, (code, f, _) in search.pruned.items()
                  if code == "memory" and search.candidates[i].tensor_parallel == T]
        memory += [e.peak_memory_bytes for e in search.simulated_entries if e.get("T") == T and not e.fits]
        bounds = [f for i, (code, f, _) in search.pruned.items()
                  if code == "bound" and search.candidates[i].tensor_parallel == T and f == f and abs(f) != float("inf")]
        preferred = sum(1 for i, (code, _, _) in search.pruned.items()
                        if code == "preferred" and search.candidates[i].tensor_parallel == T)
        text = _kept_out(search, T, search.pick, "T", by_value)
        if preferred:
            assert text.startswith(f"not simulated: {preferred:,} configurations")
        elif bounds:
            explained += 1
            assert f"takes at least {format_seconds(min(bounds))} by the step-time bound" in text
            assert (f"; {len(memory):,} others need more than" in text) == bool(memory)
    assert explained >= 1
