"""Data-parallel memory: the all-reduce buckets and ZeRO-1's flat copies, predicted by hand and measured."""

from __future__ import annotations

import numpy as np
import pytest

from gpipe_sim.api import simulate
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.plan.memory_timeline import data_parallel_bytes
from gpipe_sim.schedule import Kind, Tensor
from gpipe_sim.scenario.scenario import parse_scenario


def _layer(name: str, params: int) -> dict:
    # each layer saves its input (8 B a sample) and sends 8 B a sample
    return {"name": name, "params": params, "activation_bytes_per_sample": 8.0, "output_bytes_per_sample": 8.0,
            "forward_s_per_sample": 1e-3, "backward_s_per_sample": 2e-3}


def _scenario(zero: int, step_buffers: bool = True, dtype: str = "fp32", D: int = 2):
    """K = 2 (11 and 7 parameters), D replicas, GPipe, M = 2 of one sample each, momentum."""
    return parse_scenario({
        "model": {"preset": "table", "input_bytes_per_sample": 8.0, "layers": [_layer("a", 11), _layer("b", 7)]},
        "hardware": {"preset": "ideal", "host": {"step_buffers": step_buffers}},
        "pipeline": {"stages": 2, "data_parallel": D, "micro_batches": 2, "batch_size": 2 * D, "schedule": "gpipe",
                     "remat": "none", "partition": [1, 1]},
        "training": {"optimizer": "momentum", "zero": zero, "dtype": dtype}})


def _at(plan, g: int, kind: Kind, chunk: int | None = None) -> list[int]:
    """Indices (in the flat program) of global rank g's actions of `kind` (and chunk)."""
    prog = plan.program
    lo, hi = int(prog.offsets[g]), int(prog.offsets[g + 1])
    return [i for i in range(lo, hi) if prog.kind[i] == int(kind) and (chunk is None or prog.chunk[i] == chunk)]


def test_allreduce_bucket_lives_from_the_allreduce_to_the_wait() -> None:
    plan = compile_plan(_scenario(zero=0))
    dp = data_parallel_bytes(plan)
    bucket = {0: 11 * 4.0, 1: 7 * 4.0}  # one flat fp32 copy of the chunk's gradients
    for g in range(4):
        c = g % 2
        start = _at(plan, g, Kind.ALLREDUCE, c)
        wait = [i for i in _at(plan, g, Kind.RECV, c) if plan.program.tensor[i] == int(Tensor.REDUCED)]
        assert len(start) == len(wait) == 1
        alloc, free = np.zeros(len(dp.bucket_alloc)), np.zeros(len(dp.bucket_free))
        alloc[start], free[wait] = bucket[c], bucket[c]
        lo, hi = int(plan.program.offsets[g]), int(plan.program.offsets[g + 1])
        assert dp.bucket_alloc[lo:hi].tolist() == alloc[lo:hi].tolist()  # at the allreduce's start
        assert dp.bucket_free[lo:hi].tolist() == free[lo:hi].tolist()  # at the wait's end
    assert not dp.shard_gradient.any() and not dp.gather.any() and not dp.master_shard.any()


def test_bucket_on_top_of_static_buffers_and_sent_tensors() -> None:
    result = simulate(_scenario(zero=0))
    # rank 0: weights 44 + gradients 44 + momentum 44; buffers: 2 gradient receives (8) and the data
    # (2 x 8); its 2 sent activations (16); the bucket (44) at its wait; the held activations are the data's
    s0 = result.stages[0]
    assert s0.peak_memory_bytes == 44 * 3 + 32 + 16 + 44
    assert s0.memory_breakdown["allreduce_buckets"] == 44
    # rank 1: 28 x 3 static, 2 activation buffers (16), both gradients sent (the second one after
    # its allreduce, before its wait), the bucket (28)
    s1 = result.stages[1]
    assert s1.peak_memory_bytes == 28 * 3 + 16 + 16 + 28
    assert s1.memory_breakdown["allreduce_buckets"] == 28 and s1.memory_breakdown["sent"] == 16
    # the same runtime, one replica: no bucket; no runtime buffers: none either
    for sc in (_scenario(zero=0, D=1), _scenario(zero=0, step_buffers=False)):
        plain = simulate(sc)
        assert all("allreduce_buckets" not in s.memory_breakdown for s in plain.stages)
    # without them, static bytes + both micro-batches' held activations exactly
    assert simulate(_scenario(zero=0, step_buffers=False)).stages[1].peak_memory_bytes == 28 * 3 + 2 * 8


def test_zero1_master_shard_shard_gradient_and_gather() -> None:
    """Megatron-LM's distributed optimizer, one bucket a chunk: padded to D parts, reduce-scattered
    (the padded copy and the received part from the allreduce to the wait), the parts stepped, and
    all-gathered bucket by bucket (a part and the whole)."""
    plan = compile_plan(_scenario(zero=1))
    dp = data_parallel_bytes(plan)
    # parts of ceil(11 / 2) = 6 and ceil(7 / 2) = 4 elements; replica 1 holds the rest: 5 and 3
    assert dp.master_shard.tolist() == [6 * 4, 4 * 4, 5 * 4, 3 * 4]  # global ranks d*K + r
    for g, (mine, s) in enumerate([(6, 6), (4, 4), (5, 6), (3, 4)]):
        update = _at(plan, g, Kind.UPDATE)
        lo, hi = int(plan.program.offsets[g]), int(plan.program.offsets[g + 1])
        assert np.flatnonzero(dp.shard_gradient[lo:hi]).tolist() == [update[0] - lo]
        assert dp.shard_gradient[update[0]] == mine * 4  # the parts' gradient, to the step's end
        assert dp.gather[update[0]] == (2 + 1) * s * 4  # the part sent and the D parts received
        assert dp.bucket_alloc[_at(plan, g, Kind.ALLREDUCE)[0]] == (2 * s + s) * 4  # padded copy and part
    result = simulate(_scenario(zero=1))
    s0 = result.stages[0]
    # weights 44, gradients 44, momentum of the shard 22, master shard 24; buffers 32, sent 16;
    # at the update: the shard's gradient 24 and the gather's 72 (above the bucket's 72 at the wait)
    assert s0.memory_breakdown["gradients_and_optimizer_states"] == 44 + 22
    assert s0.memory_breakdown["zero_master_shard"] == 24
    assert s0.peak_memory_bytes == 44 + 66 + 24 + 32 + 16 + 24 + 72
    assert s0.memory_breakdown["zero_gather"] == 72 and s0.memory_breakdown["zero_shard_gradient"] == 24
    assert result.stages[1].peak_memory_bytes == 28 + 42 + 16 + 16 + 16 + 16 + 48
    # replica 1's devices (placement: device 1 for its rank 0, 3 for its rank 1) hold smaller parts
    assert result.device_peak_memory_bytes[1] == 44 + 66 + 20 + 32 + 16 + 20 + 72
    assert result.device_peak_memory_bytes[3] == 28 + 42 + 12 + 16 + 16 + 12 + 48


def test_zero1_in_mixed_precision_counts_no_second_master() -> None:
    """bf16: the state bytes hold the sharded fp32 master already; the copies are bf16 (2 B) but
    the master shard's gradient, fp32 (4 B)."""
    plan = compile_plan(_scenario(zero=1, dtype="bf16"))
    dp = data_parallel_bytes(plan)
    assert not dp.master_shard.any()
    update = _at(plan, 0, Kind.UPDATE)[0]
    assert dp.gather[update] == 3 * 6 * 2 and dp.shard_gradient[update] == 6 * 4
    assert not data_parallel_bytes(compile_plan(_scenario(zero=1, D=1))).gather.any()


def test_executor_peak_matches_the_prediction_with_data_parallelism() -> None:
    """A tiny transformer, D = 2 x K = 2, 1F1B, without and with ZeRO-1 (one launch): the tracker's
    per-stage peak within 5% of the prediction from its profile, at a moment the data-parallel
    terms count (a bucket; the all-gather)."""
    from gpipe_exec.measure.steps import measured_result
    from gpipe_exec.runtime.job import job_for
    from gpipe_exec.launch.spawn import LaunchOptions, launch
    from gpipe_exec.profile import ProfileOptions, default_sizes, profile_model
    from gpipe_exec.checks.rounds import predict_with_profile

    base = {"model": {"preset": "transformer", "layers": 2, "d_model": 32, "d_ff": 64, "heads": 2, "seq_len": 4,
                      "vocab": 64},
            "hardware": {"preset": "cpu", "placement": [[0, 1], [0, 1]]},
            "pipeline": {"stages": 2, "data_parallel": 2, "micro_batches": 2, "batch_size": 4, "schedule": "1f1b",
                         "remat": "none", "partition": "time"}}
    cases = [parse_scenario({**base, "training": {"optimizer": "momentum", "zero": zero}}) for zero in (0, 1)]
    table = profile_model(cases[0], ProfileOptions(micro_batches=default_sizes(cases[0]), warmup=0, repeats=1,
                                                   min_time_s=0.0, max_repeats=1))
    runs = [predict_with_profile(sc, table, None) for sc in cases]
    jobs = [job_for(run.plan, model=sc.model, steps=1, warmup=1) for run, sc in zip(runs, cases)]
    outputs = launch(jobs, runs[0].plan.device_map, LaunchOptions())
    for (_, plan, predicted), output, term in zip(runs, outputs, ("allreduce_buckets", "zero_gather")):
        measured = measured_result(plan, output).result
        for p, m in zip(predicted.stages, measured.stages):
            assert p.peak_memory_bytes == pytest.approx(m.peak_memory_bytes, rel=0.05)
            assert p.memory_breakdown[term] > 0.1 * p.peak_memory_bytes  # the peak is where D adds


def test_one_replica_with_context_parallelism_holds_the_bucket() -> None:
    """D = 1, C = 2: the C devices still all-reduce their gradients, through the same flat copy
    (counted under step_buffers as for D > 1); C = 1 reduces nothing and holds none."""
    def plan_at(cp: int):
        return compile_plan(parse_scenario({
            "model": {"preset": "transformer", "layers": 2, "d_model": 16, "d_ff": 32, "heads": 4, "seq_len": 8,
                      "vocab": 23, "attention": "flash"},
            "hardware": {"preset": "cpu", "host": {"step_buffers": True}},
            "pipeline": {"stages": 1, "context_parallel": cp, "micro_batches": 2, "batch_size": 2,
                         "schedule": "1f1b", "remat": "full"},
            "training": {"optimizer": "momentum"}}))

    plan = plan_at(2)
    dp = data_parallel_bytes(plan)
    grads = plan.chunks[0].param_bytes
    assert grads > 0 and dp.bucket_alloc.sum() == grads and dp.bucket_free.sum() == grads
    assert simulate(plan.scenario).stages[0].memory_breakdown.get("allreduce_buckets") == grads  # at the peak
    assert not data_parallel_bytes(plan_at(1)).bucket_alloc.any()
