"""ZeRO-2 and ZeRO-3/HSDP in gpipe-exec (PyTorch FSDP2 `fully_shard` over gloo): the data-parallel
step's gradients and parameters equal plain training's (fp32: 1e-5; bf16 with fp32 master shards:
within bf16's rounding)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_exec_correctness import OPTIONS, Case, assert_equal_to_reference, run_groups, scenario  # noqa: E402

from gpipe_exec.execute import check_runnable  # noqa: E402
from gpipe_exec.launch.spawn import launch  # noqa: E402
from gpipe_exec.reference import reference_step  # noqa: E402
from gpipe_exec.runtime.job import job_for  # noqa: E402
from gpipe_sim.errors import ScenarioError  # noqa: E402
from gpipe_sim.scenario.scenario import parse_scenario  # noqa: E402

CASES = [Case("mlp", 1, 2, "gpipe", "none", "adam", D=2, zero=3),
         Case("transformer", 1, 3, "1f1b", "always", "momentum", D=2, zero=3),
         Case("convnet", 1, 2, "1f1b", "none", "adam", D=2, zero=2),
         Case("transformer", 1, 2, "gpipe", "none", "sgd", D=2, zero=2)]
BF16 = [Case("mlp", 1, 2, "gpipe", "none", "adam", D=2, zero=3, dtype="bf16"),
        Case("mlp", 1, 4, "1f1b", "none", "momentum", D=2, zero=2, dtype="bf16")]
# Pipelined (K = 2, D = 2: four processes, one launch): torchtitan's FSDP2 under pipelining
PIPELINED = [Case("mlp", 2, 4, "1f1b", "none", "adam", D=2, zero=3),
             Case("transformer", 2, 3, "gpipe", "always", "momentum", D=2, zero=2),
             Case("mlp", 2, 4, "interleaved_1f1b", "none", "adam", v=2, D=2, zero=3),
             Case("transformer", 2, 4, "1f1b", "none", "sgd", D=2, zero=2)]
PIPELINED_BF16 = [Case("mlp", 2, 4, "1f1b", "none", "adam", D=2, zero=3, dtype="bf16")]
MLP = {"preset": "mlp", "layers": 6, "width": 16, "input_dim": 12, "num_classes": 5}


def test_fsdp_gradients_equal_plain_training() -> None:
    """Each replica's shard reduce-scattered in its backward, summed over the micro-batches and the
    replicas, stepped by the replica's own optimizer on its shard: what plain training computes."""
    results = run_groups(2, {"fp32": (CASES, {}), "bf16": (BF16, {"steps": 2})})
    assert_equal_to_reference(results["fp32"])
    assert_equal_to_reference(results["bf16"], steps=2, tolerance=2e-2)


@pytest.mark.slow
def test_pipelined_fsdp_gradients_equal_plain_training() -> None:
    """K = 2 stages (and an interleaved v = 2) over D = 2 replicas: the gathered parameters kept
    over the step, ZeRO-3's gradients reduce-scattered in each chunk's last backward, ZeRO-2's every
    micro-batch; two steps equal plain training's."""
    results = run_groups(4, {"fp32": (PIPELINED, {"steps": 2}), "bf16": (PIPELINED_BF16, {"steps": 2})})
    assert_equal_to_reference(results["fp32"], steps=2)
    assert_equal_to_reference(results["bf16"], steps=2, tolerance=2e-2)


def _count_fsdp_collectives(rank: int, device, clock, jobs) -> list[int]:
    """The executor's task (`run_jobs`), counting FSDP2's all-gathers and reduce-scatters (one call
    per unit each) on this rank: [all-gathers, reduce-scatters]."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as group

    from gpipe_exec.launch.spawn import run_jobs

    counts = [0, 0]

    def counted(name: str, slot: int):
        original = getattr(group, name)

        def call(*args, **kwargs):
            counts[slot] += 1
            return original(*args, **kwargs)
        setattr(group, name, call)

    counted("foreach_all_gather", 0)
    counted("foreach_reduce", 1)
    run_jobs(rank, device, clock, jobs)
    return counts


def test_zero2_gathers_once_a_step_and_reduce_scatters_every_micro_batch() -> None:
    """ZeRO-2 at K = 1 (gpipe, M = 4): each unit's parameters gathered once a step, in the first
    forward, and kept to the last backward (DeepSpeed's stage 2 keeps the whole weights); its
    gradients reduce-scattered in every backward (FSDP2 units: the layers holding parameters)."""
    M, steps = 4, 2
    case = Case("mlp", 1, M, "gpipe", "none", "adam", D=2, zero=2)
    plan = check_runnable(scenario(case))
    gathers, reduces = launch([job_for(plan, steps=steps, warmup=0, memory_step=False)], [0, 1], OPTIONS,
                              task=_count_fsdp_collectives)
    units = sum(1 for layer in plan.layers if layer.params)
    assert (gathers, reduces) == (units * steps, units * M * steps)


def _hsdp(D: int = 4, per_node: int = 2):
    return parse_scenario({"model": MLP, "hardware": {"preset": "cpu", "devices_per_node": per_node},
                           "pipeline": {"stages": 1, "data_parallel": D, "micro_batches": 2, "batch_size": 8,
                                        "schedule": "1f1b", "remat": "none"},
                           "training": {"optimizer": "adam", "zero": 3, "shard_within_node": True}})


@pytest.mark.slow
def test_hybrid_sharding_equals_plain_training() -> None:
    """HSDP over 4 replicas in nodes of 2: shards of 2 reduce-scattered, then all-reduced across
    the two nodes (FSDP2 on a replicate x shard mesh)."""
    plan = check_runnable(_hsdp())
    job = job_for(plan, warmup=0, return_params=True, steps=1, dropout=0.0)
    out = launch([job], list(range(4)), OPTIONS)[0]
    plain = _hsdp().with_updates({"pipeline.data_parallel": 1, "training.zero": 0,
                                  "training.shard_within_node": False, "pipeline.micro_batches": 1})
    ref = reference_step(plain, steps=1)
    for rank in out["ranks"]:
        for key, (param, grad) in rank["params"].items():
            torch.testing.assert_close(grad, ref[key][1], rtol=1e-5, atol=1e-5, msg=key)
            torch.testing.assert_close(param, ref[key][0], rtol=1e-5, atol=1e-5, msg=key)


@pytest.mark.parametrize("updates", [{"pipeline.schedule": "zb_h1"},
                                     {"training.zero": 2, "pipeline.tensor_parallel": 2, "pipeline.context_parallel": 2,
                                      "model.attention": "flash", "model.seq_len": 8}])
def test_what_fsdp2_cannot_run_is_refused_with_one_line(updates: dict) -> None:
    """A split input/weight backward (FSDP2 reduces in autograd hooks the split does not fire) and
    context parallelism under pipelined ZeRO-2 are refused naming training.zero."""
    case = Case("transformer", 2, 4, "1f1b", "none", "adam", D=2, zero=3)
    with pytest.raises(ScenarioError) as info:
        check_runnable(scenario(case).with_updates(updates))
    assert str(info.value).startswith("training.zero:") and "\n" not in str(info.value)


def _memory_case(zero: int):
    model = {"preset": "transformer", "layers": 4, "d_model": 128, "d_ff": 512, "heads": 4, "seq_len": 64,
             "vocab": 512}
    return parse_scenario({"model": model, "hardware": {"preset": "cpu", "host": {"step_buffers": True}},
                           "pipeline": {"stages": 1, "data_parallel": 2, "micro_batches": 4, "batch_size": 16,
                                        "schedule": "gpipe", "remat": "none"},
                           "training": {"optimizer": "adam", "zero": zero}})


@pytest.mark.slow
def test_peak_memory_against_the_prediction() -> None:
    """The tensor tracker's peak (storages FSDP2 resizes re-read: `StorageTracker(resized=True)`)
    against gpipe-sim's. ZeRO-2: within 1% (FSDP2 keeps its sharded fp32 parameter beside the
    gathered one, as DeepSpeed's stage 2 its fp32 partition). ZeRO-3: within 3.5% (the gathered
    units in flight predicted a little high)."""
    from gpipe_exec.measure.steps import measured_result
    from gpipe_sim.api import simulate

    scenarios = {zero: _memory_case(zero) for zero in (2, 3)}
    plans = {zero: check_runnable(sc) for zero, sc in scenarios.items()}
    outs = launch([job_for(plans[z], steps=1, warmup=1) for z in (2, 3)], [0, 1], OPTIONS)
    for zero, out in zip((2, 3), outs):
        measured = measured_result(plans[zero], out).result.stages[0].peak_memory_bytes
        predicted = simulate(scenarios[zero]).stages[0].peak_memory_bytes
        assert abs(predicted / measured - 1) <= (0.035 if zero == 3 else 0.01), (zero, predicted, measured)


@pytest.mark.slow
def test_peak_memory_at_four_replicas_against_the_prediction() -> None:
    """D = 4 (one launch of four processes), each device's peak within 3% of gpipe-sim's: the
    transformer above under ZeRO-1 and ZeRO-2 (the forward's peak), and the MoE test model at E = 1
    under ZeRO-2, whose peak is a backward's reduce-scatter: the running layer's unsharded gradient
    beside its copy (-10.9% when neither was counted and gloo's flat reduce-scatter copied it again)."""
    from test_sim_zero_experts import _scenario

    from gpipe_exec.measure.steps import measured_result
    from gpipe_sim.api import simulate

    scenarios = [_memory_case(zero).with_updates({"pipeline.data_parallel": 4}) for zero in (1, 2)]
    scenarios.append(_scenario(4, 1).with_updates({"training.zero": 2}))
    plans = [check_runnable(sc) for sc in scenarios]
    outs = launch([job_for(plan, steps=1, warmup=1) for plan in plans], list(range(4)), OPTIONS)
    for sc, plan, out in zip(scenarios, plans, outs):
        measured = measured_result(plan, out).result
        predicted = simulate(sc).stages[0].peak_memory_bytes
        for device, peak in measured.device_peak_memory_bytes.items():
            assert abs(predicted / peak - 1) <= 0.03, (sc.training.zero, device, predicted, peak)


def _pipelined_memory_case(zero: int, schedule: str):
    return _memory_case(zero).with_updates({"pipeline.stages": 2, "pipeline.schedule": schedule})


@pytest.mark.slow
def test_pipelined_peak_memory_against_the_prediction() -> None:
    """K = 2 x D = 2 (gpipe and 1F1B): each stage's measured peak within 3% of gpipe-sim's. ZeRO-3:
    the gathered stage held all step, its gradients from its first backward on; ZeRO-2: the shard
    of the gradients, each backward's reduce-scatter buffers freed at its end."""
    from gpipe_exec.measure.steps import measured_result
    from gpipe_sim.api import simulate

    keys = [(zero, schedule) for zero in (2, 3) for schedule in ("gpipe", "1f1b")]
    scenarios = {key: _pipelined_memory_case(*key) for key in keys}
    plans = {key: check_runnable(sc) for key, sc in scenarios.items()}
    outs = launch([job_for(plans[key], steps=1, warmup=1) for key in keys], list(range(4)), OPTIONS)
    for key, out in zip(keys, outs):
        measured = measured_result(plans[key], out).result.stages
        predicted = simulate(scenarios[key]).stages
        for stage, (got, want) in enumerate(zip(measured, predicted)):
            error = want.peak_memory_bytes / got.peak_memory_bytes - 1
            assert abs(error) <= 0.03, (key, stage, error)
