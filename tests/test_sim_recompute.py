"""Per-layer recomputation (`pipeline.remat: full | selective`) in the simulator: what each block
keeps, what its backward re-makes and re-runs, and the published Megatron-LM runs it must fit."""

from __future__ import annotations

import pytest
import yaml

from gpipe_sim.api import simulate
from gpipe_sim.cli import main
from gpipe_sim.errors import ScenarioError
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.plan.layer_table import scenario_layers
from gpipe_sim.schedule import Kind
from gpipe_sim.planner.space import PlanOptions, candidate_space
from gpipe_sim.scenario.scenario import parse_scenario

# A small GPT on a roofline accelerator (no kernel tables): times are FLOPs at a fixed rate.
SMALL = {
    "model": {"preset": "transformer", "layers": 4, "d_model": 256, "d_ff": 1024, "heads": 8, "seq_len": 512,
              "vocab": 1000, "dropout": 0.1},
    "hardware": {"preset": "v100"},
    "pipeline": {"stages": 2, "micro_batches": 4, "batch_size": 16, "schedule": "1f1b", "remat": "none",
                 "partition": [3, 3]},
    "training": {"dtype": "fp16"},
}


def _scenario(remat: str, **pipeline) -> object:
    data = yaml.safe_load(yaml.safe_dump(SMALL))
    data["pipeline"].update(remat=remat, **pipeline)
    return parse_scenario(data)


def _blocks(layers):
    return layers[1:-1]


def test_full_keeps_each_blocks_input_and_remakes_the_rest_before_its_backward() -> None:
    plain, full = scenario_layers(_scenario("none")), scenario_layers(_scenario("full"))
    s, d = 512, 256
    for before, after in zip(_blocks(plain), _blocks(full)):
        assert after.activation_bytes_per_sample == s * d * 2  # the block's input, fp16
        assert after.recompute_bytes_per_sample == before.activation_bytes_per_sample - s * d * 2
        assert after.backward_flops_per_sample == before.backward_flops_per_sample + before.forward_flops_per_sample
        assert after.forward_flops_per_sample == before.forward_flops_per_sample
    # the embedding and the head are not checkpointed (Megatron-LM, torchtitan)
    for i in (0, -1):
        assert full[i] == plain[i]


def test_selective_drops_the_attention_core_5as2b() -> None:
    plain, sel = scenario_layers(_scenario("none")), scenario_layers(_scenario("selective"))
    a, s, d, p, mask = 8, 512, 256, 2, 1  # fp16 activations, 1-byte dropout masks (v100)
    core = a * s * s * (p + p + mask)  # probabilities, their dropout mask, the dropped-out copy
    for before, after in zip(_blocks(plain), _blocks(sel)):
        assert before.activation_bytes_per_sample - after.activation_bytes_per_sample == core
        assert after.recompute_bytes_per_sample == core
        # re-made only once the block's MLP half (LayerNorm 2, both dropout masks, the projection's
        # input, fc1's and the GeLU's outputs) has been freed by its backward
        assert after.freed_before_recompute_bytes_per_sample == s * (2 * d * p + 8 + 2 * d * mask + d * p + 2 * 1024 * p)
        assert after.backward_flops_per_sample - before.backward_flops_per_sample == 4.0 * s * s * d


def test_flash_selective_drops_only_the_log_sum_exp() -> None:
    data = yaml.safe_load(yaml.safe_dump(SMALL))
    data["model"].update(attention="flash", dropout=0.0)
    plain = scenario_layers(parse_scenario(data))
    data["pipeline"]["remat"] = "selective"
    sel = scenario_layers(parse_scenario(data))
    for before, after in zip(_blocks(plain), _blocks(sel)):
        assert before.activation_bytes_per_sample - after.activation_bytes_per_sample == 4 * 8 * 512


def test_full_holds_block_inputs_and_backward_adds_one_blocks_forward() -> None:
    plain, full = compile_plan(_scenario("none")), compile_plan(_scenario("full"))
    per_sample_input = 512 * 256 * 2
    for c_plain, c_full in zip(plain.chunks, full.chunks):
        blocks = sum(1 for i in range(c_full.first_layer, c_full.last_layer + 1) if 1 <= i <= 4)
        others = [plain.layers[i] for i in (0, 5) if c_full.first_layer <= i <= c_full.last_layer]
        expected = blocks * per_sample_input + sum(layer.activation_bytes_per_sample for layer in others)
        assert c_full.activation_bytes[0] == pytest.approx(expected * 4, rel=1e-12)
        assert (c_full.forward_s == c_plain.forward_s).all()
        assert (c_full.backward_s > c_plain.backward_s).all()  # the blocks' forwards run again
        # one block's re-made activations are live in its backward, on top of its transient
        redo = max(layer.recompute_bytes_per_sample for layer in full.layers[c_full.first_layer:c_full.last_layer + 1])
        assert c_full.backward_transient_bytes[0] >= redo * 4
    # no whole-chunk re-computation in the schedule
    assert full.schedule.count(Kind.RECOMPUTE) == 0 and full.program.save.all()


def test_full_and_selective_step_times_order_as_the_frameworks_spend_them() -> None:
    step = {remat: simulate(_scenario(remat)).step_time_s for remat in ("none", "selective", "full", "always")}
    assert step["none"] < step["selective"] < step["full"] <= step["always"] * 1.0001


def _megatron(layers: int, d: int, heads: int, stages: int, batch: int, remat: str, sp: bool) -> object:
    """Korthikanti et al. 2022 (Reducing Activation Recomputation in Large Transformer Models),
    Table 3: GPT, sequence 2048, vocabulary 51200, TP 8, micro-batch 1 (22B: 4), mixed precision
    Adam on A100-80GB, Megatron-LM's layer split (embedding on the first stage, head on the last)."""
    per = layers // stages
    partition = "uniform" if stages == 1 else [per + 1] + [per] * (stages - 2) + [per + 1]
    micro = 4 if stages == 1 else 1
    return parse_scenario({
        "model": {"preset": "transformer", "layers": layers, "d_model": d, "d_ff": 4 * d, "heads": heads,
                  "seq_len": 2048, "vocab": 51200},
        "hardware": {"preset": "a100-80gb"},
        "pipeline": {"stages": stages, "tensor_parallel": 8, "sequence_parallel": sp, "batch_size": batch,
                     "micro_batches": batch // micro, "schedule": "1f1b", "remat": remat, "partition": partition},
        "training": {"optimizer": "adam", "dtype": "bf16"}})


def test_22b_on_8_a100s_fits_with_full_and_selective_recompute_as_it_ran() -> None:
    # 22B: 48 layers, hidden 6144, 64 heads, TP 8, one stage, global batch 4 (one micro-batch of 4)
    assert not simulate(_megatron(48, 6144, 64, 1, 4, "always", False)).fits_in_memory  # rebuilds all 48
    assert not simulate(_megatron(48, 6144, 64, 1, 4, "none", False)).fits_in_memory
    assert simulate(_megatron(48, 6144, 64, 1, 4, "full", False)).fits_in_memory
    assert simulate(_megatron(48, 6144, 64, 1, 4, "selective", True)).fits_in_memory


def test_175b_with_selective_recompute_and_sequence_parallelism_fits() -> None:
    # 175B: 96 layers, hidden 12288, 96 heads, TP 8 x PP 8 on 64 GPUs, global batch 64
    assert simulate(_megatron(96, 12288, 96, 8, 64, "selective", True)).fits_in_memory


@pytest.mark.parametrize("data, message", [
    ({**SMALL, "model": {"preset": "convnet", "layers": 4}, "pipeline": {**SMALL["pipeline"], "partition": "uniform",
                                                                           "remat": "full"}},
     "pipeline.remat: full checkpoints a transformer's blocks"),
    ({**SMALL, "pipeline": {**SMALL["pipeline"], "schedule": "zb_h1", "remat": "selective"}},
     "pipeline.remat: selective recomputes inside each block's backward, which schedule zb_h1 splits"),
])
def test_per_layer_remat_it_cannot_run_gives_one_line(tmp_path, capsys, data, message) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_planner_searches_per_layer_remat_where_it_runs() -> None:
    options = PlanOptions(devices=2, schedules=("1f1b", "zb_h1"), micro_batches=(4,), max_chunks=1)
    cands = candidate_space(_scenario("none"), options)
    modes = {(c.schedule, c.stages): set() for c in cands}
    for c in cands:
        modes[(c.schedule, c.stages)].add(c.remat)
    assert {"full", "selective"} <= modes[("1f1b", 2)]
    assert not {"full", "selective"} & modes[("zb_h1", 2)]
    data = yaml.safe_load(yaml.safe_dump(SMALL))
    data["model"] = {"preset": "mlp", "layers": 4}
    assert not any(c.remat in ("full", "selective") for c in candidate_space(parse_scenario(data), options))
    with pytest.raises(ScenarioError, match=r"^--remat: selective checkpoints a transformer's blocks"):
        candidate_space(parse_scenario(data), PlanOptions(devices=2, remat=("none", "selective")))
