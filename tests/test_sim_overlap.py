"""Bucketed data-parallel gradient reduction overlapping the backward (`training.overlap_grad_reduce`,
Megatron-LM's --overlap-grad-reduce) and ZeRO-1's parameter gather overlapping the next forward
(`training.overlap_param_gather`): the exposed reduction against the bucket schedule written out."""

from __future__ import annotations

import pytest

from gpipe_sim.api import simulate
from gpipe_sim.errors import ScenarioError
from gpipe_sim.plan.buckets import bucket_bytes, buckets, overlapped_seconds
from gpipe_sim.scenario.scenario import parse_scenario

LAYERS, PARAMS = 8, 25_000_000  # fp32: 100 MB of gradients a layer, 800 MB a replica
BACKWARD_S = 2e-3  # a layer's backward on one sample
BANDWIDTH, LATENCY = 50e9, 5e-6  # the v100 preset's link


def _scenario(overlap: bool, zero: int = 0, bucket: float | None = None, D: int = 2, gather: bool = False):
    training = {"dtype": "fp32", "optimizer": "sgd", "zero": zero, "overlap_grad_reduce": overlap,
                "overlap_param_gather": gather}
    if bucket is not None:
        training["bucket_bytes"] = bucket
    return parse_scenario({
        "model": {"preset": "uniform", "layers": LAYERS, "params_per_layer": PARAMS,
                  "forward_s_per_sample": 1e-3, "backward_s_per_sample": BACKWARD_S},
        "hardware": {"preset": "v100"},
        "pipeline": {"stages": 1, "data_parallel": D, "micro_batches": 2, "batch_size": 2 * D, "schedule": "1f1b",
                     "remat": "none"},
        "training": training})


def _ring(nbytes: float, D: int = 2) -> float:
    return 2 * (D - 1) / D * nbytes / BANDWIDTH + 2 * (D - 1) * LATENCY


def _exposed(scenario) -> float:
    r = simulate(scenario)
    assert r.step_time_s == pytest.approx(simulate(scenario, engine="fast").step_time_s, rel=1e-12)
    return r.stages[0].exposed_allreduce_s


def test_without_overlap_the_whole_reduction_follows_the_backward() -> None:
    assert _exposed(_scenario(False)) == pytest.approx(_ring(LAYERS * PARAMS * 4), rel=1e-9)


@pytest.mark.parametrize("bucket, per_bucket", [(None, 2), (100e6, 1), (250e6, 3)])
def test_buckets_reduce_while_the_backward_runs(bucket, per_bucket) -> None:
    """Buckets of whole layers, closed at `bucket` bytes (Megatron's default: 40M parameters, two
    100 MB layers here); each reduced once its last layer's backward is done, one after another."""
    ready, t, done = 0.0, 0.0, 0
    while done < LAYERS:
        n = min(per_bucket, LAYERS - done)
        done += n
        ready = done * BACKWARD_S
        t = max(ready, t) + _ring(n * PARAMS * 4)
    assert _exposed(_scenario(True, bucket=bucket)) == pytest.approx(t - LAYERS * BACKWARD_S, rel=1e-9)


def test_zero1_reduce_scatters_the_buckets_and_gathers_the_parameters_after() -> None:
    ready, t = 0.0, 0.0
    for layer in range(LAYERS):
        t = max((layer + 1) * BACKWARD_S, t) + _ring(PARAMS * 4) / 2
    t += _ring(LAYERS * PARAMS * 4) / 2
    assert _exposed(_scenario(True, zero=1, bucket=100e6)) == pytest.approx(t - LAYERS * BACKWARD_S, rel=1e-9)


@pytest.mark.parametrize("bucket, per_bucket", [(100e6, 1), (None, 2)])
def test_zero1_parameter_gather_overlaps_the_next_forward(bucket, per_bucket) -> None:
    """--overlap-param-gather: the buckets' all-gathers run one after another from the next step's
    first forward, each bucket's layers (1 ms each on one sample) waiting for theirs."""
    reduced, t = 0.0, 0.0
    for done in range(per_bucket, LAYERS + 1, per_bucket):
        t = max(done * BACKWARD_S, t) + _ring(per_bucket * PARAMS * 4) / 2
    gathered, computed = 0.0, 0.0
    for _ in range(LAYERS // per_bucket):
        gathered += _ring(per_bucket * PARAMS * 4) / 2
        computed = max(computed, gathered) + per_bucket * 1e-3
    expected = t - LAYERS * BACKWARD_S + computed - LAYERS * 1e-3
    assert _exposed(_scenario(True, zero=1, bucket=bucket, gather=True)) == pytest.approx(expected, rel=1e-9)


def test_megatron_default_bucket_grows_with_the_replicas() -> None:
    assert bucket_bytes(_scenario(True)) == 40e6 * 4
    assert bucket_bytes(_scenario(True, D=64)) == 64e6 * 4
    assert bucket_bytes(_scenario(True, bucket=1e6)) == 1e6


def test_bucket_rules() -> None:
    assert buckets([3, 3, 3], 5) == [(1, 6), (2, 3)]
    assert buckets([10], 5) == [(0, 10)]
    # a single bucket reduces after the whole backward: the reduction follows it
    assert overlapped_seconds([1.0, 1.0], [2.0, 3.0], float("inf"), lambda b: b) == 5.0 + 2.0


def test_bucket_bytes_without_overlap_is_refused() -> None:
    with pytest.raises(ScenarioError, match=r"^training.bucket_bytes: buckets are reduced apart only with"):
        parse_scenario({"training": {"bucket_bytes": 1e6}})
    with pytest.raises(ScenarioError, match=r"^training.overlap_param_gather: gathers ZeRO-1's parameter shards"):
        parse_scenario({"training": {"overlap_param_gather": True, "overlap_grad_reduce": True}})
    with pytest.raises(ScenarioError, match=r"^training.overlap_param_gather"):
        parse_scenario({"training": {"overlap_param_gather": True, "zero": 1}})


def test_context_parallel_gradients_overlap_in_buckets_as_replicas_do() -> None:
    """At D = 1, C = 2 the two context-parallel devices still reduce their weights' gradients
    (D x C = 2), so `overlap_grad_reduce` buckets them as it does replicas': each bucket (here
    every layer its own) reduced once its backward is done, so the embedding's, the backward's
    last, is exposed after it at least (it was reduced as if every gradient were ready at the
    last backward's start: nothing exposed)."""
    from gpipe_sim.plan.compile import compile_plan
    from gpipe_sim.plan.replicas import gradient_rings

    scenario = parse_scenario({
        "model": {"preset": "transformer", "layers": 2, "d_model": 1024, "d_ff": 4096, "heads": 8, "seq_len": 1024,
                  "vocab": 32000, "attention": "flash"},
        "hardware": {"preset": "a100-80gb"},
        "pipeline": {"stages": 1, "context_parallel": 2, "micro_batches": 2, "batch_size": 2, "schedule": "1f1b",
                     "remat": "none"},
        "training": {"dtype": "bf16", "optimizer": "adam", "overlap_grad_reduce": True, "bucket_bytes": 1}})
    plan = compile_plan(scenario)
    ring, _ = gradient_rings(scenario, 0, scenario.hardware.devices_per_node or 2)
    embedding = ring.allreduce(plan.layers[0].params * 2)
    assert embedding > 0
    assert _exposed(scenario) >= embedding * (1 - 1e-9)
