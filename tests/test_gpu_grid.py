"""The selfcheck's grid: which cases are GPU-bound, where the executor does a plain loop's work, and
the host issue time the GPU model assigns a step (against the cost model's own pass times)."""

from __future__ import annotations

import math

import pytest

from gpipe_exec.checks.gpu_grid import (case, gpu_bound, gpu_cases, model_host_seconds, profiled_host_seconds,
                                        transformer)
from gpipe_sim.scenario.scenario import parse_scenario


def test_the_gpu_grid_covers_what_a_validated_gpu_needs():
    """At least 12 cases: K = 1, 2, 4; bf16 and fp32; flash and standard; remat none and always;
    GPipe, 1F1B, interleaved and ZB-H1; d_model 512..4096; GPU-bound and host-bound cases."""
    scenarios = [parse_scenario(data) for _, data in gpu_cases()]
    assert len(scenarios) >= 12
    pipe = [s.pipeline for s in scenarios]
    assert {p.stages for p in pipe} >= {1, 2, 4}
    assert {p.schedule for p in pipe} >= {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1"}
    assert {p.remat for p in pipe} >= {"none", "always"}
    assert {s.training.dtype for s in scenarios} >= {"bf16", "fp32"}
    models = [s.model for s in scenarios if s.model.preset == "transformer"]
    assert {m.attention for m in models} >= {"flash", "standard"}
    assert {512, 4096} <= {m.d_model for m in models}
    assert sum(gpu_bound(s) for s in scenarios) >= 4
    assert any(s.pipeline.batch_size == s.pipeline.micro_batches for s in scenarios)  # one-sample micro-batches


@pytest.mark.parametrize("d_model, seq, M, batch, bound", [
    (2048, 2048, 4, 8, True),    # 2 samples x 2,048 tokens
    (2048, 1024, 4, 8, False),   # 2,048 tokens per micro-batch
    (1024, 4096, 1, 4, False),   # too narrow
    (4096, 4096, 2, 2, True),
])
def test_gpu_bound_is_wide_models_on_large_micro_batches(d_model, seq, M, batch, bound):
    assert gpu_bound(parse_scenario(case(transformer(2, d_model, seq), 1, M, batch))) is bound


def test_model_host_time_is_the_pass_time_where_every_pass_is_host_bound():
    """A tiny model on the H100 tables: every pass is host-bound, so the GPU model prices each pass
    at its host issue time, and the step's passes add up to `model_host_seconds`."""
    from gpipe_sim.plan.balance import micro_batch_sizes
    from gpipe_sim.costs.layer_time import layer_seconds
    from gpipe_sim.model.layers import build_layers

    sc = parse_scenario(case(transformer(2, 64, 8, vocab=128), 1, 3, 5))
    accel, dtype, nbytes = sc.hardware.accelerator, sc.training.dtype, sc.training.dtype_bytes
    passes = math.fsum(sum(layer_seconds(layer, n, accel, dtype, nbytes))
                       for layer in build_layers(sc.model, nbytes, accel.dropout_mask_bytes(nbytes))
                       for n in micro_batch_sizes(5, 3))
    assert model_host_seconds(sc) == pytest.approx(passes, rel=1e-12)
    assert math.isnan(model_host_seconds(parse_scenario(case(transformer(2, 64, 8), 1, 1, 1, hardware="cpu"))))


def test_profiled_host_time_adds_every_layer_at_every_micro_batch_size():
    sc = parse_scenario(case(transformer(1, 64, 8), 1, 3, 5))  # micro-batches of 2, 2, 1
    table = {"layers": [{"timings": [{"micro_batch": 1, "forward_host_s": 1.0, "backward_host_s": 2.0},
                                     {"micro_batch": 2, "forward_host_s": 10.0, "backward_host_s": 20.0}]}] * 3}
    assert profiled_host_seconds(table, sc) == pytest.approx(3 * (2 * 30.0 + 3.0))
    assert math.isnan(profiled_host_seconds(None, sc))
