"""validate at C = 2 and E = 2: a profile of each device's share (the ring's and the all-to-alls'
exchanges inside its times), the simulator running that table at its C and E only, memory measured."""

from __future__ import annotations

import pytest

from gpipe_sim.errors import ScenarioError
from gpipe_sim.model.layers import build_layers
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.scenario.scenario import Scenario, parse_scenario

# validate's tolerance for the memory of ranks split over several processes (as for T > 1:
# tests/test_exec_tensor_parallel.py), and for the saved-tensor accounting
MEMORY_TOLERANCE = 0.10
ACCOUNTING_TOLERANCE = 0.02  # routing is data-dependent: the profile's batch is not the run's

MODEL = dict(preset="transformer", layers=4, d_model=16, d_ff=32, heads=4, kv_heads=2, seq_len=8, vocab=23,
             vocab_multiple=8, attention="flash")
MOE = dict(experts=4, top_k=2, expert_d_ff=24, shared_experts=1, moe_every=2, first_dense_layers=1)


def scenario(C: int = 1, E: int = 1, D: int = 1, K: int = 1, T: int = 1, moe: bool = False) -> Scenario:
    """The model at C, E, D, K and T (with sequence parallelism at T > 1, as experts need it)."""
    return parse_scenario({
        "model": {**MODEL, **(MOE if moe else {})}, "hardware": {"preset": "cpu"},
        "pipeline": {"stages": K, "micro_batches": 2, "batch_size": 4 * D, "schedule": "1f1b",
                     "data_parallel": D, "context_parallel": C, "expert_parallel": E, "tensor_parallel": T,
                     "sequence_parallel": T > 1},
        "training": {"optimizer": "momentum"}})


def table(**profiled: int) -> dict:
    row = {"params": 10, "activation_bytes_per_sample": 8.0, "output_bytes_per_sample": 8.0,
           "forward_s_per_sample": 1e-3, "backward_s_per_sample": 2e-3}
    return {"preset": "table", "input_bytes_per_sample": 8.0, **profiled,
            "layers": [{"name": "a", **row}, {"name": "b", **row, "params": 30, "expert_params": 20}]}


def table_scenario(C: int, E: int, model: dict) -> Scenario:
    return parse_scenario({"model": model, "hardware": {"preset": "cpu"},
                           "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": 2, "data_parallel": 2,
                                        "context_parallel": C, "expert_parallel": E}})


def test_a_table_runs_at_the_c_and_e_it_was_profiled_at_only() -> None:
    """Its rows are one device's share (the ring and the all-to-alls inside their times): run at
    its C and E as they are, refused at another in one line naming the field."""
    plan = compile_plan(table_scenario(2, 2, table(context_parallel=2, expert_parallel=2)))
    assert [layer.activation_bytes_per_sample for layer in plan.layers] == [8.0, 8.0]  # no ring added
    assert plan.mesh.gradient_group == 4 and plan.mesh.expert_gradient_group == 2
    with pytest.raises(ValueError, match=r"model.context_parallel: the layer table was profiled at context_parallel 2 "):
        table_scenario(1, 1, table(context_parallel=2))
    with pytest.raises(ValueError, match=r"model.context_parallel: the layer table was profiled at context_parallel 1 "):
        table_scenario(2, 1, table())
    with pytest.raises(ValueError, match=r"model.expert_parallel: the layer table was profiled at expert_parallel 1 "):
        table_scenario(1, 2, table())


def test_a_table_file_keeps_what_the_profile_wrote(tmp_path) -> None:
    """Read from a file (`model: {preset: table, path: ...}`), a table keeps the T, C and E it was
    profiled at and the whole model's figures, as written inline."""
    import yaml

    from gpipe_sim.model.model import TableModel

    written = {**table(tensor_parallel=2, context_parallel=2, expert_parallel=2), "parameters": 99,
               "flops_per_sample": 1e9, "tokens_per_sample": 8.0}
    path = tmp_path / "table.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in written.items() if k != "preset"}))
    read = TableModel(preset="table", path=str(path))
    assert (read.tensor_parallel, read.context_parallel, read.expert_parallel) == (2, 2, 2)
    assert (read.parameters, read.flops_per_sample, read.tokens_per_sample) == (99, 1e9, 8.0)
    assert read.layers == TableModel(**written).layers


@pytest.mark.slow
def test_validate_runs_c2_and_e2_and_predicts_their_memory() -> None:
    """C = 2 with two stages (4 processes), E = 2 over two replicas (2 processes), and at T = 2
    (sequence parallel) C = 2 and E = 2 (4 processes each): profiled on every device at once,
    predicted from that table, run; each rank's saved-tensor accounting and measured peak within
    validate's tolerances. The tables record what the simulator's preset
    counts: the whole model's parameters, s/C tokens of input, each MoE row's local experts."""
    from gpipe_exec.checks.validate import validate
    from gpipe_exec.launch.spawn import LaunchOptions
    from gpipe_exec.profile import ProfileOptions
    from gpipe_exec.zoo import build_layer

    options = LaunchOptions(comm_timeout_s=60, run_timeout_s=900)
    profile = ProfileOptions(warmup=0, repeats=1, min_time_s=0.0)
    for sc in (scenario(C=2, K=2), scenario(E=2, D=2, moe=True), scenario(C=2, T=2),
               scenario(E=2, D=2, T=2, moe=True)):
        v = validate(sc, steps=1, warmup=1, options=options, calibrate=False, profile=profile)
        p = sc.pipeline
        assert v.table is not None and v.measured.result.step_time_s > 0 and v.predicted.step_time_s > 0
        assert v.table.get("context_parallel", 1) == p.context_parallel
        assert v.table.get("expert_parallel", 1) == p.expert_parallel
        assert v.table.get("tensor_parallel", 1) == p.tensor_parallel
        whole = [build_layer(sc.model, i, tensor_parallel=p.tensor_parallel) for i in range(len(v.table["layers"]))]
        assert v.table["parameters"] == sum(q.numel() for layer in whole for q in layer.parameters())  # every expert
        assert v.table["input_bytes_per_sample"] == 8 * MODEL["seq_len"] / p.context_parallel  # int64 ids
        expected = [layer.expert_params for layer in build_layers(sc.model, tensor_parallel=p.tensor_parallel,
                                                                  sequence_parallel=p.sequence_parallel,
                                                                  expert_parallel=p.expert_parallel)]
        assert [row.get("expert_params", 0) for row in v.table["layers"]] == expected
        errors = v.relative_error
        for stage in range(p.stages):
            assert errors[f"stage{stage}.accounting.peak_activation_bytes"] < ACCOUNTING_TOLERANCE, (sc, errors)
            assert errors[f"stage{stage}.peak_memory_bytes"] < MEMORY_TOLERANCE, (sc, errors)
