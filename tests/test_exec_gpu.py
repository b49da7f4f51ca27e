"""CUDA/NCCL paths: the same equality with plain training on GPUs (skipped without CUDA)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                       reason="needs two CUDA devices (NCCL runs one rank per GPU)"),
]


def test_nccl_pipeline_equals_plain_training() -> None:
    from gpipe_exec.execute import check_runnable, job_for
    from gpipe_exec.launch.spawn import LaunchOptions, launch
    from gpipe_exec.reference import reference_step
    from gpipe_sim.spec.scenario import parse_scenario

    K = 2
    sc = parse_scenario({
        "model": {"preset": "mlp", "layers": 3, "width": 32, "input_dim": 16},
        "hardware": {"preset": "a100-80gb", "stage_to_device": list(range(K))},
        "pipeline": {"stages": K, "micro_batches": 4, "batch_size": 8, "schedule": "1f1b", "remat": "always"},
        "training": {"optimizer": "sgd"},
    })
    job = job_for(sc, check_runnable(sc), steps=1, warmup=0, dropout=0.0, return_params=True)
    out = launch([job], sc.device_map, LaunchOptions(comm_timeout_s=60))[0]
    assert all(r["records"][0].cuda_peak_bytes is not None for r in out["ranks"])
    got = {}
    for rank in out["ranks"]:
        got.update(rank["params"])
    for name, (param, grad) in reference_step(sc).items():
        torch.testing.assert_close(got[name][1], grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[name][0], param, rtol=1e-5, atol=1e-5)
