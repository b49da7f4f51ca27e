"""Tensor parallelism (issue 27): the split's exact figures, its collectives, T = 1 unchanged, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml

from gpipe_sim.api import simulate
from gpipe_sim.cli import main
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.model.kernels import Gemm
from gpipe_sim.model.layers import build_layers
from gpipe_sim.scenario.scenario import parse_scenario
from gpipe_sim.model.tensor_parallel import split_vocab

D, F, S, A = 1024, 4096, 512, 16
MODEL = {"preset": "transformer", "layers": 4, "d_model": D, "d_ff": F, "heads": A, "seq_len": S,
         "vocab": 50257, "dropout": 0.1}
BW, LAT = 100e9, 5e-6


def _scenario(tp: int = 1, sp: bool = False, **pipeline):
    return parse_scenario({
        "model": MODEL,
        "hardware": {"preset": "a100-80gb", "devices_per_node": 8,
                     "link": {"bandwidth": BW, "latency_s": LAT}, "accelerator": {"gpu": {"collective_efficiency": 1.0}}},
        "pipeline": {"stages": 2, "micro_batches": 4, "batch_size": 8, "schedule": "1f1b", "tensor_parallel": tp,
                     "sequence_parallel": sp, **pipeline},
        "training": {"optimizer": "adam", "dtype": "bf16"},
    })


def _gemm_flops(kernels) -> float:
    return sum(2.0 * math.prod(k.shape(1)) for k in kernels if isinstance(k, Gemm))


def test_t2_halves_a_blocks_gemms_and_weights():
    model = _scenario().model
    whole, half = build_layers(model, 2, 1)[1], build_layers(model, 2, 1, 2)[1]
    assert _gemm_flops(half.ops.forward) == pytest.approx(_gemm_flops(whole.ops.forward) / 2)
    assert _gemm_flops(half.ops.backward) == pytest.approx(_gemm_flops(whole.ops.backward) / 2)
    assert half.forward_flops_per_sample == whole.forward_flops_per_sample / 2
    # the weights and column-parallel biases split; the row-parallel biases and LayerNorms whole
    assert half.params == (4 * D * D + 3 * D + 2 * D * F + F) // 2 + 6 * D
    assert whole.params == 4 * D * D + 9 * D + 2 * D * F + F
    qkv = next(k for k in half.ops.forward if isinstance(k, Gemm) and k.name == "qkv")
    fc2 = next(k for k in half.ops.forward if isinstance(k, Gemm) and k.name == "fc2")
    assert (qkv.n, fc2.k) == (3 * D // 2, F // 2)


def test_vocabulary_split_as_megatron_pads_it():
    model = _scenario().model
    for tp in (2, 4, 8):
        v = split_vocab(model, tp)
        assert v % (128 * tp) == 0 and v >= 50257
        embed, *_, head = build_layers(model, 2, 1, tp)
        assert embed.params == v // tp * D + S * D
        assert head.params == D * v // tp + 2 * D
    assert split_vocab(model, 8) == 51200


def test_sequence_parallel_shards_layernorm_activations():
    model = _scenario().model
    whole, tp2, sp2 = (build_layers(model, 2, 1, t, sp)[1] for t, sp in ((1, False), (2, False), (2, True)))
    replicated = S * (4 * D * 2 + 2 * 8 + 2 * D * 1)  # LayerNorms' inputs, outputs, statistics; masks
    split = whole.activation_bytes_per_sample - replicated
    assert tp2.activation_bytes_per_sample == replicated + split / 2
    assert sp2.activation_bytes_per_sample == (replicated + split) / 2
    assert sp2.output_bytes_per_sample == tp2.output_bytes_per_sample / 2


def test_t1_changes_nothing():
    a, b = simulate(_scenario()), simulate(_scenario(sp=True))
    assert a.step_time_s == b.step_time_s and a.num_devices == 2 and a.tensor_parallel == 1
    assert all(s.tp_comm_s == 0.0 for s in a.stages)
    plan = compile_plan(_scenario())
    assert all(c.tp_forward_s is None for c in plan.chunks)


def test_four_all_reduces_per_block():
    """T=2: a block's forward carries 2 all-reduces of b*s*d*dtype bytes and its backward 2, each
    2(T-1)/T x bytes / bandwidth + 2(T-1) x latency; the embedding's forward one, the head's
    backward one and its loss three of 4 bytes a token. A rank reports what they add to its passes."""
    from gpipe_sim.plan.tensor_parallel import collective_work

    scenario = _scenario(2, partition=[3, 3])
    b = 2  # samples per micro-batch
    ring = 2 * (2 - 1) / 2 * b * S * D * 2 / BW + 2 * (2 - 1) * LAT
    loss = 3 * (2 * (2 - 1) / 2 * b * S * 4 / BW + 2 * LAT)
    work = [w[0] for w in collective_work(scenario, 0, [b])]  # embedding, 4 blocks, head
    assert [w.forward_s for w in work] == pytest.approx([ring, *[2 * ring] * 4, loss])
    assert [w.backward_s for w in work] == pytest.approx([0.0, *[2 * ring] * 4, ring])
    assert [(w.forward_launches, w.backward_launches) for w in work] == [(1, 0), *[(2, 2)] * 4, (3, 1)]
    plan = compile_plan(scenario)
    first = plan.chunks[0]  # embedding + 2 blocks
    assert 0.0 < first.tp_forward_s[0] <= ring + 2 * 2 * ring + 5 * 40e-6  # hidden or its launches' host time
    result = simulate(scenario)
    assert result.num_devices == 4 and result.stages[1].device == 2
    # 1f1b with remat: every micro-batch's forward, re-computation and backward
    assert result.stages[0].tp_comm_s == pytest.approx(4 * (2 * first.tp_forward_s[0] + first.tp_backward_s[0]))
    # sequence parallel: halves (a reduce-scatter or an all-gather) of the same bytes; a block 4
    # forward and 6 backward (the column-parallel inputs gathered again), the embedding's gradient
    # gathered, the head's input gathered forward and again backward beside its gradient's scatter
    half = ring / 2
    seq = [w[0] for w in collective_work(_scenario(2, True, partition=[3, 3]), 0, [b])]
    assert [w.forward_s for w in seq] == pytest.approx([half, *[4 * half] * 4, half + loss])
    assert [w.backward_s for w in seq] == pytest.approx([half, *[6 * half] * 4, 2 * half])


def test_memory_per_device_divides_weights_and_states():
    one, two = compile_plan(_scenario(partition=[3, 3])), compile_plan(_scenario(2, partition=[3, 3]))
    blocks = [one.layers[i].params - two.layers[i].params for i in (1, 2)]
    assert all(b > 0 for b in blocks)
    assert two.chunks[0].param_bytes < 0.55 * one.chunks[0].param_bytes
    assert two.chunks[0].state_bytes / two.chunks[0].param_bytes == one.chunks[0].state_bytes / one.chunks[0].param_bytes


def test_figures_count_the_whole_model_and_every_device():
    one, two = simulate(_scenario()), simulate(_scenario(2))
    assert one.parameters == two.parameters
    assert two.devices == 4
    assert 0.0 <= two.bubble_fraction < 1.0


def test_json_and_summary(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_scenario(4).to_dict()))
    assert main(["simulate", str(path), "--json", "--no-timeline"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tensor_parallel"] == 4 and out["num_devices"] == 8 and out["stages"][0]["tp_comm_s"] > 0
    assert main(["simulate", str(path)]) == 0
    text = capsys.readouterr().out
    assert "T=4" in text and "all-reduce in the passes" in text


@pytest.mark.parametrize("sets, message", [
    (["pipeline.tensor_parallel=3"], "pipeline.tensor_parallel: 3 is not a power of two"),
    (["hardware.devices_per_node=12", "pipeline.tensor_parallel=8"],
     "pipeline.tensor_parallel: 8 devices per rank do not tile nodes of 12"),
    (["model.heads=2", "pipeline.tensor_parallel=4"], "model.heads: 2 does not split over pipeline.tensor_parallel 4"),
    (["model.d_ff=4100", "pipeline.tensor_parallel=8"], "model.d_ff: 4,100 does not split"),
    (["model.preset=uniform", "pipeline.tensor_parallel=2"], "pipeline.tensor_parallel: 2 needs the transformer preset"),
])
def test_hostile_input_is_one_line(tmp_path, capsys, sets, message):
    path = tmp_path / "s.yaml"
    data = _scenario().to_dict()
    if "model.preset=uniform" in sets:
        data["model"] = {"preset": "uniform", "layers": 8}
        sets = sets[1:]
    path.write_text(yaml.safe_dump(data))
    argv = ["simulate", str(path)]
    for item in sets:
        argv += ["--set", item]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_sweep_axis_over_tensor_parallel():
    from gpipe_sim.sweeps.runner import result_columns

    rows = [result_columns(_scenario(tp), "auto") for tp in (1, 2, 4)]
    assert [r["num_devices"] for r in rows] == [2, 4, 8]
    assert rows[0]["max_stage_tp_comm_s"] == 0.0 < rows[1]["max_stage_tp_comm_s"] < rows[2]["max_stage_tp_comm_s"]


def test_vtrain_tp_study_figures():
    from gpipe_sim.studies.vtrain_tp import tp_study

    figures = tp_study(by_tp=False)["all"]  # docs/measurements/accuracy.md: 6.5%, 17.8%, tau 1.00
    assert figures["rows"] == 400 and figures["median_error"] < 0.07 and figures["p90_error"] < 0.20
    assert figures["tau_median"] >= 0.9


def test_executor_takes_tensor_and_sequence_parallel_where_the_sequence_splits():
    # gpipe-exec runs T > 1 with or without sequence parallelism (tests/test_exec_tensor_parallel.py);
    # sequence parallelism needs each device's share of the sequence whole
    from gpipe_exec.execute import check_model
    from gpipe_sim.errors import ScenarioError

    check_model(_scenario(2))
    check_model(_scenario(2, sp=True))
    odd = _scenario(2, sp=True).with_updates({"model.seq_len": S + 1})
    with pytest.raises(ScenarioError, match=r"^model.seq_len: 513 does not split over pipeline.tensor_parallel 2"):
        check_model(odd)


def test_megatron_softmax_falls_back_where_samples_x_heads_is_not_a_multiple_of_4():
    from gpipe_sim.model.kernels import Softmax, transformer_block
    split = transformer_block(1024, 4096, 1024, 16, "standard", True, 2, 1, tp=8)
    soft = next(k for k in split.forward if isinstance(k, Softmax))
    assert soft.heads == 2 and not soft.fused(1) and soft.fused(2)
    assert soft.launches(1) == 5 and soft.launches(2) == 1
    assert sum(soft.kernel_bytes(1)) == 37.0 * 2 * 1024 * 1024
    whole = transformer_block(1024, 4096, 1024, 16, "standard", True, 2, 1, tp=1)
    assert not any(isinstance(k, Softmax) for k in (*whole.forward, *whole.backward))


@pytest.mark.parametrize("pipeline", [{"partition": [3, 3]}, {"data_parallel": 2, "schedule": "zb_h1"},
                                      {"partition": [3, 3], "remat": "none"}])
def test_per_action_collectives_add_up_to_each_ranks_tp_comm_s(pipeline):
    """`action_tp_seconds`: every replica's passes carry their chunk's collectives on that
    micro-batch, nothing else does; summed per rank of replica 0 they are its `tp_comm_s`."""
    from gpipe_sim.plan.tensor_parallel import action_tp_seconds, rank_tp_comm_seconds
    from gpipe_sim.schedule import Kind

    plan = compile_plan(_scenario(2, **pipeline))
    seconds, c = action_tp_seconds(plan), plan.global_program.columns
    assert seconds.shape == c.kind.shape and np.all(seconds >= 0)
    passes = np.isin(c.kind, [int(k) for k in (Kind.FORWARD, Kind.RECOMPUTE, Kind.BACKWARD, Kind.BACKWARD_INPUT)])
    assert np.all(seconds[passes] > 0) and not np.any(seconds[~passes])
    K, result = len(plan.ranks), simulate(_scenario(2, **pipeline))
    per_rank = np.bincount(c.rank, weights=seconds)
    assert [s.tp_comm_s for s in result.stages] == pytest.approx(per_rank[:K].tolist(), rel=1e-12)
    assert rank_tp_comm_seconds(plan) == pytest.approx(per_rank[:K].tolist(), rel=1e-12)
    np.testing.assert_allclose(per_rank, np.tile(per_rank[:K], len(per_rank) // K))  # every replica alike
    t = result.timeline
    np.testing.assert_array_equal(t.tp_s, seconds[c.rank <= t.rank.max()])  # replicas timed (alike: replica 0)
    assert np.all(t.tp_s <= (t.end_s - t.start_s) * (1 + 1e-9))  # inside the pass they add to
    assert not action_tp_seconds(compile_plan(_scenario(1, **pipeline))).any()


def test_timeline_records_carry_collectives_only_where_priced():
    """T = 2: each record's `tp_s` round-trips through the JSON; T = 1 (and files written before
    the column) has no such key and reads back as None."""
    from gpipe_sim.results.result import Result, Timeline

    two, one = simulate(_scenario(2, partition=[3, 3])), simulate(_scenario(partition=[3, 3]))
    back = Result.from_dict(json.loads(two.to_json())).timeline
    np.testing.assert_array_equal(back.tp_s, two.timeline.tp_s)
    np.testing.assert_array_equal(back.end_s, two.timeline.end_s)
    assert all("tp_s" in r for r in two.timeline.to_records())
    assert one.timeline.tp_s is None
    records = one.timeline.to_records()
    assert not any("tp_s" in r for r in records)
    assert set(records[0]) == {"rank", "chunk", "kind", "micro_batch", "start_s", "end_s"}
    assert Timeline.from_records(records).tp_s is None
    assert Result.from_dict(json.loads(one.to_json())).timeline.tp_s is None
    old = [{k: v for k, v in r.items() if k != "tp_s"} for r in two.timeline.to_records()]
    assert Timeline.from_records(old).tp_s is None


def test_explore_gantt_shows_the_collectives_at_t2():
    """The app's Explore page at T = 2 renders, its Gantt with the collectives' overlay."""
    from gpipe_sim.charts import TP_NAME
    from test_app_support import app_test, plotly_specs

    at = app_test().run()
    at.sidebar.selectbox(key="cfg.pipeline.tensor_parallel").set_value(2).run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    gantt = plotly_specs(at)[0]
    names = [trace["name"] for trace in gantt["data"]]
    assert TP_NAME in names and "forward" in names
    forward = next(trace for trace in gantt["data"] if trace["name"] == "forward")
    assert all("of which TP collectives" in text for text in forward["hovertext"])


def test_a_measured_step_reports_no_priced_collectives():
    """A measured timeline (no `tp_s`) gets no tensor-parallel seconds from the prediction: its
    collectives are inside the passes the executor timed, and the summary says so."""
    import dataclasses

    from gpipe_sim.api import summarize_plan
    from gpipe_sim.summary import tensor_parallel_text

    scenario = _scenario(2, partition=[3, 3])
    plan = compile_plan(scenario)
    simulated = simulate(scenario)
    assert simulated.timeline.tp_s is not None and max(s.tp_comm_s for s in simulated.stages) > 0
    timeline = dataclasses.replace(simulated.timeline, tp_s=None)
    measured = summarize_plan(
        plan, timeline, peak_activation_bytes=[s.peak_activation_bytes for s in simulated.stages],
        chunk_peak_activation_bytes=[c.peak_activation_bytes for c in simulated.chunks],
        param_bytes=[c.param_bytes for c in simulated.chunks], state_bytes=[c.state_bytes for c in simulated.chunks],
        device_peak_memory_bytes={}, source="measured")
    assert all(s.tp_comm_s == 0.0 for s in measured.stages)
    assert tensor_parallel_text(scenario, measured).endswith("the collectives are inside the measured passes "
                                                             "(not timed apart)")
