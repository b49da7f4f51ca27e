"""The profiler's backward split (zero-bubble's I and W passes, `ProfileOptions(split_backward=True)`),
what the weight pass still needs of the forward's saved tensors, and the accuracy study's schedules."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpipe_exec.profile import ProfileOptions, profile_model, split_saved_bytes, write_table  # noqa: E402
from gpipe_exec.zoo import build_layer, make_batch  # noqa: E402
from gpipe_sim.scenario.scenario import parse_scenario  # noqa: E402

SCENARIO = {
    # the accuracy study's transformer, two blocks: on smaller layers the split's fixed cost per call
    # (the reuse mode walks the graph in Python) dominates, and I + W exceeds 2 B
    "model": {"preset": "transformer", "layers": 2, "d_model": 128, "d_ff": 512, "heads": 4, "seq_len": 64,
              "vocab": 512},
    "hardware": {"preset": "cpu", "stage_to_device": [0, 1]},
    "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 8, "schedule": "zbv", "chunks": 2},
}
SPLIT_FIELDS = ("backward_input_s_per_sample", "backward_weight_s_per_sample")


def test_split_backward_is_timed_only_when_asked(tmp_path: Path) -> None:
    sc = parse_scenario(SCENARIO)
    plain = profile_model(sc, ProfileOptions(micro_batches=(2,), warmup=0, repeats=1, min_time_s=0.0))
    assert not any(f in row for row in plain["layers"] for f in SPLIT_FIELDS)
    assert not any("backward_input_s" in t for row in plain["layers"] for t in row["timings"])

    options = ProfileOptions(micro_batches=(1, 4), warmup=1, repeats=3, min_time_s=0.2, split_backward=True)
    table = profile_model(sc, options)  # each row validated as gpipe_sim's LayerSpec
    total_iw = total_b = 0.0
    for i, row in enumerate(table["layers"]):
        for t in row["timings"]:
            assert t["backward_weight_s"] >= 0
            assert t["backward_input_s"] > 0 if i > 0 else t["backward_input_s"] >= 0
        big = row["timings"][-1]
        assert big["micro_batch"] == 4
        assert row["backward_input_s_per_sample"] == pytest.approx(big["backward_input_s"] / 4)
        assert row["backward_weight_s_per_sample"] == pytest.approx(big["backward_weight_s"] / 4)
        if i > 0:  # the first layer's input takes no gradient: no I, W is its whole backward
            total_iw += big["backward_input_s"] + big["backward_weight_s"]
            total_b += big["backward_s"]
    # I + W is the backward done in two calls (noisy machine: a loose bound, not a few percent)
    assert 0.5 <= total_iw / total_b <= 2.0
    path = tmp_path / "table.yaml"
    write_table(table, path)
    loaded = parse_scenario({**SCENARIO, "model": {"preset": "table", "path": str(path)}})
    assert loaded.model.layers[1].backward_input_s_per_sample == pytest.approx(
        table["layers"][1]["backward_input_s_per_sample"])


@pytest.mark.parametrize("preset", ["transformer", "convnet"])
def test_weight_pass_needs_part_of_the_saved_tensors(preset: str) -> None:
    model = parse_scenario({**SCENARIO, "model": {"preset": preset, "layers": 2}} if preset == "convnet" else
                           SCENARIO).model
    x, _ = make_batch(model, 2)
    first = build_layer(model, 0, dropout=0.0)
    with torch.no_grad():
        h = first(x)
    whole = split_saved_bytes(first, x, first=True)
    assert whole["mode"] == "full" and whole["read_by_w"] == whole["forward"]  # no I: W is all the backward
    block = build_layer(model, 1, dropout=0.0)
    got = split_saved_bytes(block, h)
    assert got["mode"] == "reuse"
    assert 0 < got["read_by_w"] < got["forward"]
    assert got["read_by_w"] + got["read_by_i_only"] <= got["forward"]
    assert got["kept_gradients"] > 0  # the gradients I leaves at the weights' branches
    assert all(p.grad is None for p in block.parameters())


def test_accuracy_study_runs_zero_bubble_schedules() -> None:
    from gpipe_exec.checks.accuracy import DEFAULT_SCHEDULES, base_scenario, grid, main

    assert "zb_h1" in DEFAULT_SCHEDULES and "zbv" in DEFAULT_SCHEDULES
    cases = grid(base_scenario("transformer", 2, 32), [1, 2, 4], ["zb_h1", "zbv", "dualpipev"], [1, 2], ["none"])
    got = {(sc.pipeline.schedule, sc.pipeline.chunks, sc.pipeline.micro_batches) for sc in cases}
    assert {("zb_h1", 1, 1), ("zbv", 2, 1), ("zbv", 2, 4), ("dualpipev", 2, 4)} <= got
    assert ("zbv", 1, 1) not in got and ("zb_h1", 2, 2) not in got and ("dualpipev", 2, 2) not in got
    with pytest.raises(SystemExit):
        main(["--schedules", "gpipe,no_such_schedule"])
