"""CUDA/NCCL paths: the same equality with plain training on GPUs (skipped without CUDA)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _check_equal_to_plain_training(K: int, pipeline: dict[str, Any], split: str | None = None) -> None:
    from gpipe_exec.execute import check_runnable
    from gpipe_exec.measure.steps import measured_result
    from gpipe_exec.runtime.job import job_for
    from gpipe_exec.launch.spawn import LaunchOptions, launch
    from gpipe_exec.programs import split_backward, with_schedule
    from gpipe_exec.reference import reference_step
    from gpipe_sim.spec.scenario import parse_scenario

    sc = parse_scenario({
        "model": {"preset": "mlp", "layers": 6, "width": 32, "input_dim": 16},
        "hardware": {"preset": "a100-80gb", "stage_to_device": list(range(K))},
        "pipeline": {"stages": K, "micro_batches": 4, "batch_size": 8, **pipeline},
        "training": {"optimizer": "sgd"},
    })
    plan = check_runnable(sc)
    if split:
        plan = with_schedule(plan, split_backward(plan.schedule, split))
    job = job_for(plan, steps=1, warmup=0, dropout=0.0, return_params=True)
    out = launch([job], sc.device_map, LaunchOptions(comm_timeout_s=60))[0]
    assert all(r["records"][0].cuda_peak_bytes is not None for r in out["ranks"])
    measured_result(plan, out)  # the ranks ran their programs
    got = {}
    for rank in out["ranks"]:
        got.update(rank["params"])
    for name, (param, grad) in reference_step(sc).items():
        torch.testing.assert_close(got[name][1], grad, rtol=1e-5, atol=1e-5)  # both gathered on the CPU
        torch.testing.assert_close(got[name][0], param, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices (NCCL runs one rank per GPU)")
@pytest.mark.parametrize("pipeline, split", [
    ({"schedule": "1f1b", "remat": "always"}, None),
    ({"schedule": "interleaved_1f1b", "chunks": 2, "remat": "except_last"}, None),
    ({"schedule": "interleaved_1f1b", "chunks": 2, "remat": "none"}, "deferred"),
])
def test_nccl_pipeline_equals_plain_training(pipeline: dict[str, Any], split: str | None) -> None:
    _check_equal_to_plain_training(2, pipeline, split)


def test_one_gpu_runs_several_chunks_with_local_hand_overs() -> None:
    _check_equal_to_plain_training(1, {"schedule": "interleaved_1f1b", "chunks": 2, "remat": "always"}, "deferred")
