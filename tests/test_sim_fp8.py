"""FP8 training (`training.dtype: fp8`): GEMMs from the bf16 tables at the spec sheet's FP8 rate,
the weights' FP8 copies, GEMM inputs saved in FP8, and the accelerators without FP8 refused."""

from __future__ import annotations

import pytest

from gpipe_sim.api import simulate
from gpipe_sim.errors import ScenarioError
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.costs.gpu_model import gemm_seconds
from gpipe_sim.model.kernels import Gemm
from gpipe_sim.scenario.scenario import parse_scenario

MODEL = {"preset": "transformer", "layers": 4, "d_model": 1024, "d_ff": 4096, "heads": 16, "seq_len": 512,
         "vocab": 32000}


def _scenario(dtype: str, hardware: str = "h100-sxm", **model):
    return parse_scenario({"model": MODEL | model, "hardware": {"preset": hardware},
                           "pipeline": {"stages": 2, "micro_batches": 4, "batch_size": 8, "schedule": "1f1b",
                                        "remat": "none"},
                           "training": {"dtype": dtype, "optimizer": "adam"}})


def test_an_fp8_gemm_is_the_bf16_table_at_the_fp8_rate() -> None:
    """H100 SXM: 1,979 dense FP8 TFLOP/s against 989 bf16; the tile waves and penalties as bf16's."""
    tables = _scenario("fp8").hardware.accelerator
    for shape in ((4096, 4096, 4096), (512, 50257, 1024), (8192, 1024, 64)):
        g = Gemm("g", *shape)
        fp8 = gemm_seconds(g, 1, "fp8", 2, tables.peak_flops, tables.memory_bandwidth, tables.gpu)
        bf16_at_fp8 = gemm_seconds(g, 1, "bf16", 2, {"bf16": 1979e12}, tables.memory_bandwidth, tables.gpu)
        assert fp8 == bf16_at_fp8
    big = Gemm("big", 8192, 8192, 8192)
    ratio = (gemm_seconds(big, 1, "fp8", 2, tables.peak_flops, tables.memory_bandwidth, tables.gpu)
             / gemm_seconds(big, 1, "bf16", 2, tables.peak_flops, tables.memory_bandwidth, tables.gpu))
    assert ratio == pytest.approx(989 / 1979, rel=1e-12)  # compute-bound: the spec sheets' ratio


def test_fp8_steps_faster_than_bf16_but_not_twice() -> None:
    """Only the GEMMs speed up: attention's core and the memory-bound kernels stay bf16."""
    bf16, fp8 = simulate(_scenario("bf16")).step_time_s, simulate(_scenario("fp8")).step_time_s
    assert bf16 / 2 < fp8 < bf16


def test_weights_keep_fp8_copies_and_gemm_inputs_are_saved_in_fp8() -> None:
    bf16, fp8 = compile_plan(_scenario("bf16")), compile_plan(_scenario("fp8"))
    for a, b in zip(bf16.ranks, fp8.ranks):
        params = sum(bf16.chunks[c].params for c in a.chunks)
        assert b.param_bytes - a.param_bytes == 2 * params  # row-wise and column-wise FP8 copies
        assert b.state_bytes == a.state_bytes
    d, f, s = MODEL["d_model"], MODEL["d_ff"], MODEL["seq_len"]
    for x, y in zip(bf16.layers, fp8.layers):
        # a byte less an element: both norm outputs, the attention output, the down-projection input
        less = s * (2 * d + d + f) if x.name.startswith("block") else 0
        assert x.activation_bytes_per_sample - y.activation_bytes_per_sample == less


@pytest.mark.parametrize("hardware", ["a100-80gb", "v100", "cpu"])
def test_accelerators_without_fp8_are_refused_with_one_line(hardware: str) -> None:
    with pytest.raises(ScenarioError) as info:
        simulate(_scenario("fp8", hardware))
    assert str(info.value).startswith("training.dtype: fp8") and "\n" not in str(info.value)


def test_the_executor_refuses_fp8_with_one_line() -> None:
    pytest.importorskip("torch")
    from gpipe_exec.execute import check_model

    with pytest.raises(ScenarioError) as info:
        check_model(_scenario("fp8"))
    assert str(info.value).startswith("training.dtype:") and "\n" not in str(info.value)


def test_megatron_arguments_carry_fp8_both_ways() -> None:
    from gpipe_sim.frameworks.megatron import write_megatron
    from gpipe_sim.frameworks.megatron_read import read_megatron

    written = write_megatron(_scenario("fp8"))
    assert "--bf16" in written.text and "--fp8-format hybrid" in written.text
    assert read_megatron(written.text, _scenario("bf16")).scenario.training.dtype == "fp8"


def test_simulate_says_the_fp8_gemm_times_are_derived(tmp_path, capsys) -> None:
    from gpipe_sim.cli import main

    path = tmp_path / "fp8.yaml"
    path.write_text(_scenario("fp8").to_yaml())
    assert main(["simulate", str(path)]) == 0
    err = capsys.readouterr().err
    assert "training.dtype fp8: GEMM times are derived" in err and len(err.strip().splitlines()) == 1
