"""The benchmark's zero-bubble contenders beside torch.distributed.pipelining's (one tiny launch)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.pipelining")

from gpipe_exec.checks.executor_bench import (CONTENDERS, TORCH_NAMES, _torch_schedule, bench_order,  # noqa: E402
                                      contender_cases, report, run_benchmark)
from gpipe_sim.schedule import schedule_family  # noqa: E402
from gpipe_sim.scenario.scenario import parse_scenario  # noqa: E402


def _scenario(M: int) -> object:
    return parse_scenario({
        "model": {"preset": "transformer", "layers": 2, "d_model": 16, "d_ff": 32, "heads": 2, "seq_len": 8,
                  "vocab": 32},
        "hardware": {"preset": "cpu", "stage_to_device": [0, 1]},
        "pipeline": {"stages": 2, "micro_batches": M, "batch_size": 8, "remat": "none", "partition": "uniform"},
        "training": {"optimizer": "momentum"},
    })


def test_contenders_take_the_chunks_and_placement_their_family_needs() -> None:
    for name, _ in CONTENDERS:
        assert _torch_schedule(name).__name__ == TORCH_NAMES[name]
    cases, skipped = contender_cases(_scenario(2), chunks=2)
    got = {schedule: v for schedule, v, _, _ in cases}
    assert got == {"gpipe": 1, "1f1b": 1, "interleaved_1f1b": 2, "interleaved_zb": 2, "zbv": 2}
    assert "dualpipev" in skipped and "micro_batches" in skipped["dualpipev"]  # M < 2K
    assert schedule_family("zbv").placement(2, 2) == (0, 1, 1, 0)  # stage r and 2K-1-r on rank r, as torch's "v"
    for schedule, v, variant, plan in cases:
        assert sum(plan.layer_counts) == 4 and len(plan.layer_counts) == 2 * v


def test_ours_and_torchs_run_back_to_back_reversed_every_other_round() -> None:
    once = [("ours", 0), ("ours", 2), ("torch", 0), ("ours", 1), ("ours", 3), ("torch", 1)]
    assert bench_order(4, 2, 1) == once  # jobs 2 and 3: schedules 0 and 1 without the device lock
    assert bench_order(4, 2, 3) == once + once[::-1] + once


@pytest.mark.slow  # one launch, 12 s here
def test_zero_bubble_schedules_run_beside_torch() -> None:
    results = run_benchmark(_scenario(4), steps=1, warmup=0, schedules=["zbv", "dualpipev"], extras=False)
    for name in ("gpipe_exec zbv (v=2)", "gpipe_exec dualpipev (v=2)",
                 "torch.distributed.pipelining ScheduleZBVZeroBubble (v=2)",
                 "torch.distributed.pipelining ScheduleDualPipeV (v=2)"):
        assert isinstance(results[name], float) and results[name] > 0
    text = report(_scenario(4), results)
    assert "zbv (v=2): gpipe_exec / torch.distributed.pipelining ScheduleZBVZeroBubble = " in text
    assert "dualpipev (v=2): gpipe_exec / torch.distributed.pipelining ScheduleDualPipeV = " in text
