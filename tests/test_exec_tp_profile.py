"""Profiling under tensor parallelism: a T = 2 table of split layers, the simulator's T check, validate at T = 2."""

from __future__ import annotations

import pytest
import yaml

from gpipe_exec.checks.validate import validate
from gpipe_exec.launch.spawn import LaunchOptions
from gpipe_exec.profile import ProfileOptions, profile_on_devices, table_scenario, write_table
from gpipe_exec.zoo import build_layer, layer_names
from gpipe_sim.api import simulate_plan
from gpipe_sim.cli import main as gpipe_sim_main
from gpipe_sim.errors import GpipeError, ScenarioError
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.model.layers import build_layers
from gpipe_sim.scenario.scenario import Scenario, parse_scenario

MODEL = {"preset": "transformer", "layers": 2, "d_model": 32, "d_ff": 64, "heads": 4, "seq_len": 8, "vocab": 96}
OPTIONS = LaunchOptions(comm_timeout_s=60, run_timeout_s=300)
QUICK = ProfileOptions(warmup=1, repeats=2, min_time_s=0.0)


def scenario(T: int, K: int = 1, **pipeline: object) -> Scenario:
    return parse_scenario({
        "model": MODEL, "hardware": {"preset": "cpu", "stage_to_device": [T * k for k in range(K)]},
        "pipeline": {"stages": K, "micro_batches": 2, "batch_size": 4, "schedule": "gpipe", "remat": "none",
                     "partition": "uniform", "tensor_parallel": T, **pipeline},
        "training": {"optimizer": "adam", "dtype": "fp32"}})


@pytest.fixture(scope="module")
def table_t2() -> dict:
    """The model profiled at T = 2 by its two processes (K = 1), each layer split over them."""
    return profile_on_devices(scenario(2), QUICK, OPTIONS)


def test_a_t2_profile_holds_one_devices_share_of_each_split_layer(table_t2: dict) -> None:
    sc = scenario(2)
    split = build_layers(sc.model, 4, 1, tensor_parallel=2)  # the simulator's Megatron split of the preset
    rows = table_t2["layers"]
    # each layer whole, as built before the split (its vocabulary padded for T = 2)
    whole = [sum(p.numel() for p in build_layer(sc.model, i, tensor_parallel=2).parameters()) for i in range(len(rows))]
    assert table_t2["tensor_parallel"] == 2 and table_t2["parameters"] == sum(whole)
    assert [r["name"] for r in rows] == layer_names(sc.model)
    assert [r["params"] for r in rows] == [layer.params for layer in split]  # the local shards, counted exactly
    assert all(r["params"] < w for r, w in zip(rows, whole))
    # between layers the activations are whole on every device; the head's logits are its vocabulary share
    assert [r["output_bytes_per_sample"] for r in rows[:-1]] == [layer.output_bytes_per_sample for layer in split[:-1]]
    assert rows[-1]["output_bytes_per_sample"] == 8 * (256 // 2) * 4  # seq_len x its half of the padded vocabulary
    for r in rows:
        assert r.get("forward_flops_per_sample") is None  # FlopCounterMode cannot count a split GEMM's share
        assert r["update_s"] > 0 and r["activation_bytes_per_sample"] > 0
        assert all(t["forward_s"] > 0 and t["backward_s"] > 0 for t in r["timings"])


def test_the_simulator_runs_a_t2_table_at_t2_and_refuses_it_at_another_t(table_t2: dict, tmp_path, capsys) -> None:
    plan = compile_plan(table_scenario(scenario(2), table_t2))
    result = simulate_plan(plan)
    preset = compile_plan(scenario(2))
    assert plan.num_devices == result.num_devices == 2 and result.tensor_parallel == 2
    assert plan.ranks[0].param_bytes == preset.ranks[0].param_bytes  # per device: the split weights
    assert result.stages[0].tp_comm_s == 0.0  # the collectives are in the measured passes, not added
    assert result.step_time_s > 0 and result.figures.parameters == table_t2["parameters"]
    # the step's FLOPs and tokens are the whole model's, as the preset counts them: MFU and tokens/s
    whole = simulate_plan(compile_plan(scenario(1))).figures
    assert table_t2["flops_per_sample"] == pytest.approx(whole.model_flops_per_step / 4)
    assert result.figures.model_flops_per_step == pytest.approx(whole.model_flops_per_step)
    assert result.figures.tokens_per_step == whole.tokens_per_step == 4 * 8
    assert result.mfu is not None and result.mfu > 0
    for T in (1, 4):
        with pytest.raises(ScenarioError, match=rf"^model.tensor_parallel: the layer table was profiled at "
                                                rf"tensor_parallel 2 .* but pipeline.tensor_parallel is {T}") as err:
            table_scenario(scenario(T), table_t2)
        assert "\n" not in str(err.value)
    write_table(table_t2, tmp_path / "t2.yaml")
    data = scenario(1).to_dict() | {"model": {"preset": "table", "path": str(tmp_path / "t2.yaml")}}
    (tmp_path / "t1.yaml").write_text(yaml.safe_dump(data))
    assert gpipe_sim_main(["simulate", str(tmp_path / "t1.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpipe-sim: error: model.tensor_parallel: ")


def test_validate_with_a_t2_table_predicts_per_device_memory(table_t2: dict) -> None:
    v = validate(scenario(2), table=table_t2, steps=1, warmup=1, options=OPTIONS, calibrate=False)
    errors = v.relative_error
    assert v.predicted.tensor_parallel == v.measured.result.tensor_parallel == 2
    assert errors["stage0.accounting.peak_activation_bytes"] < 0.01
    assert errors["stage0.peak_memory_bytes"] < 0.05, errors
    with pytest.raises(GpipeError, match="^model.tensor_parallel: "):
        validate(scenario(1), table=table_t2, steps=1, warmup=0, options=OPTIONS, calibrate=False)


@pytest.mark.slow
def test_validate_t2_k2_predicts_the_step_from_its_profile() -> None:
    """T = 2 x K = 2 (four processes) of a small transformer: profile, predict and run, three rounds.
    On two shared cores the steps spread 10-30% and the profile as much (docs/measurements/accuracy.md): the
    bound is for that noise, the median round was within 10% in most runs here."""
    sc = parse_scenario({
        "model": {"preset": "transformer", "layers": 4, "d_model": 64, "d_ff": 256, "heads": 4, "seq_len": 32,
                  "vocab": 256},
        "hardware": {"preset": "cpu", "stage_to_device": [0, 2]},
        "pipeline": {"stages": 2, "micro_batches": 4, "batch_size": 16, "schedule": "gpipe", "remat": "none",
                     "partition": "uniform", "tensor_parallel": 2},
        "training": {"optimizer": "adam", "dtype": "fp32"}})
    v = validate(sc, rounds=3, options=OPTIONS)
    errors = v.relative_error
    assert len(v.rounds) == 3 and v.scenario.model.preset == "transformer"
    assert errors["step_time_s"] < 0.35, (errors["step_time_s"], v.rounds)
    assert errors["stage0.peak_memory_bytes"] < 0.03 and errors["stage1.peak_memory_bytes"] < 0.03, errors
