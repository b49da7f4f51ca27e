"""The planner searches context parallelism C (issue 34): only where the sequence is long and splits,
--context-parallel restricts it, its bounds stay below the simulator, and the pick's C is explained."""

from __future__ import annotations

import pytest

from gpipe_sim.api import simulate
from gpipe_sim.planner.bounds import CostTable, step_lower_bound
from gpipe_sim.planner.report import csv_rows, plan_text
from gpipe_sim.planner.search import PlanOptions, candidate_space, search_configurations
from gpipe_sim.planner.space import MIN_TOKENS_PER_CP_RANK, context_parallel_values
from gpipe_sim.scenario.scenario import parse_scenario

LONG = {
    "model": {"preset": "transformer", "layers": 4, "d_model": 256, "d_ff": 1024, "heads": 4, "seq_len": 32768,
              "vocab": 1000, "attention": "flash"},
    "hardware": {"preset": "a100-80gb", "devices_per_node": 4},
    "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": 4, "schedule": "1f1b"},
    "training": {"dtype": "bf16"},
}


def _base(**model):
    return parse_scenario({**LONG, "model": {**LONG["model"], **model}})


@pytest.mark.parametrize("model, devices, expected", [
    ({}, 4, [1, 2, 4]),  # 32,768 tokens: C = 2 and 4 leave 16,384 and 8,192 a device
    ({}, 2, [1, 2]),  # no more than N
    ({"seq_len": 8192}, 4, [1]),  # C = 2 would leave 4,096 < MIN_TOKENS_PER_CP_RANK
    ({"attention": "standard"}, 4, [1]),  # the ring runs flash attention only
])
def test_context_parallel_searched_only_on_long_sequences_it_splits(model, devices, expected):
    base = _base(**model)
    options = PlanOptions(devices=devices, schedules=("1f1b",), remat=("none",), micro_batches=(1,),
                          tensor_parallel=(1,))
    assert context_parallel_values(base, options, 1) == expected
    cands = candidate_space(base, options)
    assert sorted({c.context_parallel for c in cands}) == expected
    assert all(c.devices == devices for c in cands)
    assert MIN_TOKENS_PER_CP_RANK == 8192


def test_context_parallel_option_restricts_it():
    options = PlanOptions(devices=4, context_parallel=(2,), tensor_parallel=(1,))
    assert context_parallel_values(_base(), options, 1) == [2]
    assert context_parallel_values(_base(), options, 4) == []  # T x C over N


def test_bounds_stay_below_the_simulated_step_and_the_pick_simulates_as_planned():
    base = _base()
    options = PlanOptions(devices=4, schedules=("1f1b",), remat=("none", "full"), micro_batches=(1, 2),
                          tensor_parallel=(1, 2), reserve=0.0)
    costs = CostTable(base)
    for cand in candidate_space(base, options):
        if cand.context_parallel > 1:
            simulated = simulate(base.with_updates(cand.overrides())).step_time_s
            assert step_lower_bound(costs, cand) <= simulated
    search = search_configurations(base, options)
    for i, (code, figure, _) in search.pruned.items():  # what the search left out, by its bounds
        cand = search.candidates[i]
        if cand.context_parallel > 1 and code == "bound":
            assert figure <= simulate(search.base.with_updates(cand.overrides())).step_time_s
    pick = search.pick
    assert simulate(base.with_updates(pick.candidate.overrides())).step_time_s == pytest.approx(pick.step_time_s)
    text = plan_text(search)
    assert "context parallelism: picked C=" in text
    assert any(row.get("C") == 2 for row in csv_rows(search))


MOE = {**LONG, "model": {**LONG["model"], "seq_len": 1024, "experts": 8, "top_k": 2, "mlp": "swiglu",
                         "norm": "rmsnorm", "position": "rope", "bias": False, "dropout": 0.0}}


def test_expert_parallelism_searched_where_it_divides_the_experts_and_d():
    from gpipe_sim.planner.space import expert_parallel_values

    base = parse_scenario(MOE)
    assert expert_parallel_values(base, PlanOptions(devices=8), 8) == [1, 2, 4, 8]
    assert expert_parallel_values(base, PlanOptions(devices=8), 2) == [1, 2]
    assert expert_parallel_values(base, PlanOptions(devices=8, expert_parallel=(4, 3)), 8) == [4]
    assert expert_parallel_values(_base(), PlanOptions(devices=8), 8) == [1]  # dense


def test_expert_bounds_stay_below_the_simulator_and_the_pick_says_why():
    base = parse_scenario(MOE)
    options = PlanOptions(devices=4, schedules=("1f1b",), remat=("none",), micro_batches=(1,), tensor_parallel=(1,),
                          reserve=0.0)
    search = search_configurations(base, options)
    assert {c.expert_parallel for c in search.candidates} == {1, 2, 4}
    for i, (code, figure, _) in search.pruned.items():
        cand = search.candidates[i]
        if code == "bound" and cand.expert_parallel > 1:
            assert figure <= simulate(search.base.with_updates(cand.overrides())).step_time_s
    pick = search.pick
    assert simulate(base.with_updates(pick.candidate.overrides())).step_time_s == pytest.approx(pick.step_time_s)
    assert "expert parallelism: picked E=" in plan_text(search)


@pytest.mark.parametrize("field, flag", [("context_parallel", "--context-parallel"),
                                         ("expert_parallel", "--expert-parallel")])
@pytest.mark.parametrize("values", [(), (0,), (2, -1), (True,)])
def test_bad_cp_or_ep_values_name_their_flag(field, flag, values):
    from gpipe_sim.errors import ScenarioError
    from gpipe_sim.planner.space import check_options

    with pytest.raises(ScenarioError, match=f"^{flag}: expected whole numbers >= 1"):
        check_options(PlanOptions(devices=4, **{field: values}))


def test_values_the_space_cannot_use_are_named_with_why():
    """One note line per option naming what it leaves out and why; nothing where all are used."""
    from gpipe_sim.planner.dropped import dropped_notes

    assert dropped_notes(_base(), PlanOptions(devices=4, context_parallel=(1, 2, 4))) == []
    assert dropped_notes(_base(), PlanOptions(devices=4, context_parallel=(1, 3, 5, 8), tensor_parallel=(1, 8))) == [
        "--tensor-parallel: left out 8 (more than the 4 devices)",
        "--context-parallel: left out 3 (model.seq_len: 32,768 tokens do not cut into 6 equal chunks (2 x "
        "pipeline.context_parallel 3, two per device for the causal load balance)); 5, 8 (more than the 4 devices "
        "over T)"]
    assert dropped_notes(_base(attention="standard"), PlanOptions(devices=4, context_parallel=(2,)))[0].startswith(
        "--context-parallel: left out 2 (model.attention: context parallelism runs flash attention")
    assert dropped_notes(_base(), PlanOptions(devices=4, expert_parallel=(1, 2))) == [
        "--expert-parallel: left out 2 (the model has no experts)"]
    moe = parse_scenario(MOE)
    assert dropped_notes(moe, PlanOptions(devices=2, expert_parallel=(2, 3, 4), tensor_parallel=(1,))) == [
        "--expert-parallel: left out 3 (does not divide its 8 experts); "
        "4 (divides no data-parallel size D of the layouts (E is carved from D))"]


def test_plan_prints_the_notes_on_stderr(tmp_path, capsys):
    import yaml

    from gpipe_sim.cli import main

    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(LONG))
    assert main(["plan", str(path), "--devices", "4", "--context-parallel", "1,3", "--quiet", "--top", "1"]) == 0
    err = capsys.readouterr().err
    assert "gpipe-sim: note: --context-parallel: left out 3 (model.seq_len: 32,768 tokens do not cut into 6" in err
