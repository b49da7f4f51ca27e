"""The pipelined step equals plain single-process training (gradients and parameters, fp32, 1e-5),
for every schedule, chunks per rank, re-materialization mode and split (I/W) backward, and with
data parallelism (D replicas of the pipeline on the global batch, with and without ZeRO-1); in
bf16 with fp32 master weights, within bf16's rounding."""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import pytest

torch = pytest.importorskip("torch")

from gpipe_exec.execute import check_runnable  # noqa: E402

from gpipe_exec.measure.steps import step_timelines  # noqa: E402

from gpipe_exec.runtime.job import job_for  # noqa: E402
from gpipe_exec.launch.spawn import LaunchOptions, launch  # noqa: E402
from gpipe_sim.plan.rescheduled import with_schedule  # noqa: E402
from gpipe_sim.schedule.split_backward import split_backward  # noqa: E402
from gpipe_exec.reference import reference_step  # noqa: E402
from gpipe_sim.schedule import SCHEDULES  # noqa: E402
from gpipe_sim.model.layers import layer_count  # noqa: E402
from gpipe_sim.scenario.scenario import Scenario, parse_scenario  # noqa: E402

# Eight layers each, so that K=4 ranks x v=2 chunks has a layer per chunk.
MODELS: dict[str, dict[str, Any]] = {
    "transformer": dict(preset="transformer", layers=6, d_model=16, d_ff=32, heads=2, seq_len=6, vocab=23),
    "mlp": dict(preset="mlp", layers=6, width=16, input_dim=12, num_classes=5),
    "convnet": dict(preset="convnet", layers=6, channels=4, image_size=8, num_classes=5),
}
OPTIONS = LaunchOptions(comm_timeout_s=60, run_timeout_s=900)


class Case(NamedTuple):
    """One configuration: `split` turns every backward into backward_input + backward_weight, the
    weight pass right after ("adjacent") or at the end of the rank's program ("deferred")."""

    model: str
    K: int
    M: int
    schedule: str
    remat: str
    optimizer: str = "sgd"
    v: int = 1
    split: str | None = None
    weight_pass: str = "reuse"
    D: int = 1  # data-parallel replicas
    zero: int = 0  # ZeRO-1 (with D > 1)
    dtype: str = "fp32"

    def __str__(self) -> str:
        split = f" split {self.split} ({self.weight_pass})" if self.split else ""
        dp = f" D={self.D}{f' zero{self.zero}' if self.zero else ''}" if self.D > 1 else ""
        return (f"{self.model} K={self.K} v={self.v} M={self.M} {self.schedule}{split} remat={self.remat} "
                f"{self.optimizer}{dp} {self.dtype}")

    @property
    def world(self) -> int:
        return self.D * self.K


def scenario(case: Case) -> Scenario:
    return parse_scenario({
        "model": MODELS[case.model], "hardware": {"preset": "cpu"},
        "pipeline": {"stages": case.K, "chunks": case.v, "micro_batches": case.M,
                     "batch_size": 8 if case.M > 1 or case.D > 1 else 5, "schedule": case.schedule,
                     "remat": case.remat, "data_parallel": case.D},
        "training": {"optimizer": case.optimizer, "zero": case.zero, "dtype": case.dtype},
    })


def plan_of(case: Case):
    plan = check_runnable(scenario(case))
    return with_schedule(plan, split_backward(plan.schedule, case.split)) if case.split else plan


def run_groups(K: int, groups: dict[str, tuple[list[Case], dict[str, Any]]]) -> dict[str, list[tuple[Case, dict]]]:
    """Launch K processes once and run every group's cases (each group with its own job settings:
    steps, dropout, receive window...) in that one process group: cases of D replicas of K/D ranks
    share the launch. Each case's measured timelines are checked against its programs
    (`step_timelines` refuses any difference). A case's parameters are those every replica holds
    (checked equal across replicas)."""
    entries = []
    for name, (cases, settings) in groups.items():
        settings = {"steps": 1, "dropout": 0.0, **settings}
        for case in cases:
            assert case.world == K, f"{case}: {case.world} processes, the launch has {K}"
            plan = plan_of(case)
            job = job_for(plan, warmup=0, return_params=True, tag=f"{name}: {case}",
                          weight_pass=case.weight_pass, **settings)
            entries.append((name, case, plan, job))
    outs = launch([e[3] for e in entries], list(range(K)), OPTIONS)
    merged: dict[str, list[tuple[Case, dict]]] = {name: [] for name in groups}
    for (name, case, plan, job), out in zip(entries, outs):
        assert out["tag"] == job.tag
        assert len(step_timelines(plan, out)) == job.steps, case
        params: dict[str, Any] = {}
        for rank in out["ranks"]:
            for key, (param, grad) in rank["params"].items():
                if key in params:  # another replica's copy: the same parameters and reduced gradients
                    torch.testing.assert_close(param, params[key][0], rtol=0, atol=0, msg=f"{key}: {case}")
                    torch.testing.assert_close(grad, params[key][1], rtol=0, atol=0, msg=f"{key}: {case}")
                params[key] = (param, grad)
        merged[name].append((case, params))
    return merged


def run_all(K: int, cases: list[Case], **settings: Any) -> list[tuple[Case, dict]]:
    """One launch of K ranks running every case with the same job settings."""
    return run_groups(K, {"all": (cases, settings)})["all"]


def reference(case: Case, steps: int = 1) -> dict[str, Any]:
    """Plain training of the case's model, mini-batch and optimizer (schedules play no part)."""
    return reference_step(scenario(case._replace(K=1, v=1, schedule="gpipe", remat="none", D=1, zero=0)),
                          steps=steps)


def assert_equal_to_reference(results: list[tuple[Case, dict]], steps: int = 1, tolerance: float = 1e-5) -> None:
    for case, got in results:
        ref = reference(case, steps)
        assert got.keys() == ref.keys(), case
        for name, (param, grad) in ref.items():
            assert got[name][0].dtype == param.dtype, f"{name}: {case}"
            torch.testing.assert_close(got[name][1], grad, rtol=tolerance, atol=tolerance, msg=f"grad {name}: {case}")
            torch.testing.assert_close(got[name][0], param, rtol=tolerance, atol=tolerance, msg=f"param {name}: {case}")


REMATS = ("none", "except_last", "always")
SCHEDULES_V1 = ("gpipe", "1f1b")
WINDOWS = {"all ahead": None, "at the action": 0, "one ahead": 1}


def backward_in_order(ranks: int, micro_batches: int, chunks: int) -> list:
    """A schedule registered by a test: every forward through the rank's chunks, then the
    backwards in micro-batch order."""
    from gpipe_sim.schedule import Kind

    orders = []
    for r in range(ranks):
        mine = [r + i * ranks for i in range(chunks)]
        order = [(Kind.FORWARD, c, m) for c in mine for m in range(micro_batches)]
        order += [(Kind.BACKWARD, c, m) for c in reversed(mine) for m in range(micro_batches)]
        orders.append(order)
    return orders


# Data parallelism by default: D=2 x K=1 (in the two-process launch) and D=2 x K=2 (in the
# four-process one), every schedule family, remat none/always, ZeRO 0/1; the full product under -m slow.
DP_TWO = [Case("mlp", 1, 2, "gpipe", "none", D=2), Case("transformer", 1, 3, "1f1b", "always", "momentum", D=2, zero=1),
          Case("convnet", 1, 2, "interleaved_1f1b", "always", "adam", v=2, D=2, zero=1),
          Case("mlp", 1, 4, "interleaved_1f1b", "none", "momentum", v=2, D=2)]
DP_FOUR = [Case("transformer", 2, 2, "gpipe", "always", D=2), Case("mlp", 2, 4, "1f1b", "none", "adam", D=2, zero=1),
           Case("transformer", 2, 4, "interleaved_1f1b", "always", "momentum", v=2, D=2, zero=1),
           Case("convnet", 2, 2, "interleaved_1f1b", "none", v=2, D=2),
           Case("mlp", 2, 4, "interleaved_1f1b", "except_last", "adam", v=2, split="deferred", D=2, zero=1)]


# bf16 parameters and gradients, fp32 master weights and optimizer states (runtime.update.Update;
# ZeRO-1: an fp32 master shard)
BF16 = [Case("mlp", 2, 4, "1f1b", "none", "adam", dtype="bf16"),
        Case("transformer", 2, 3, "gpipe", "always", "momentum", dtype="bf16"),
        Case("mlp", 1, 2, "gpipe", "none", "adam", D=2, zero=1, dtype="bf16"),
        Case("mlp", 1, 4, "1f1b", "none", "momentum", D=2, dtype="bf16")]


@pytest.fixture(scope="module")
def two_ranks() -> dict[str, list[tuple[Case, dict]]]:
    """Every K=2 group of this module, in one launch (a launch costs seconds of start-up)."""
    from gpipe_sim.schedule import ScheduleFamily

    main = [Case("transformer", 2, M, s, r) for s, r, M in itertools.product(SCHEDULES_V1, REMATS, (1, 3))]
    # Adam on the transformer would amplify rounding in gradients that are exactly zero in theory
    # (the key bias): Adam is checked on the MLP and the convnet.
    main += [Case("convnet", 2, 4, "1f1b", "always", "adam"), Case("mlp", 2, 4, "gpipe", "except_last", "momentum"),
             Case("mlp", 2, 3, "1f1b", "none", "adam"), Case("mlp", 2, 1, "naive", "none")]
    # several chunks per rank: local hand-overs between a rank's chunks, transfers from the last rank to the first
    main += [Case("transformer", 2, 4, "interleaved_1f1b", r, v=2) for r in ("none", "always")]
    main += [Case("mlp", 2, 3, "interleaved_1f1b", "except_last"), Case("mlp", 2, 2, "looped_bfs", "none"),
             Case("convnet", 2, 3, "looped_bfs", "except_last", "adam", v=2)]
    # the backward split into input and weight passes, hand-made from the schedules' orders
    main += [Case("transformer", 2, 3, "1f1b", "always", split="adjacent"),
             Case("transformer", 2, 4, "interleaved_1f1b", "except_last", v=2, split="deferred"),
             Case("mlp", 2, 4, "interleaved_1f1b", "none", "momentum", v=2, split="deferred", weight_pass="simple"),
             Case("convnet", 2, 2, "looped_bfs", "always", v=2, split="deferred")]
    # the zero-bubble and V schedules (split backward built in; V: rank 0 holds the first and last chunks)
    main += [Case("transformer", 2, 4, "zb_h1", "none"), Case("mlp", 2, 4, "zb_h2", "always", "adam"),
             Case("convnet", 2, 4, "interleaved_zb", "except_last", v=2),
             Case("transformer", 2, 4, "zbv", "always", v=2),
             Case("mlp", 2, 5, "dualpipev", "except_last", "momentum", v=2)]
    groups: dict[str, tuple[list[Case], dict[str, Any]]] = {"main": (main, {})}
    groups["dropout"] = ([Case("transformer", 2, 3, "gpipe", r) for r in REMATS]
                         + [Case("transformer", 2, 4, "interleaved_1f1b", r, v=2, split="deferred") for r in REMATS],
                         {"dropout": 0.3})
    steps = [Case("transformer", 2, 3, "1f1b", "always", "momentum"), Case("convnet", 2, 4, "gpipe", "none", "adam"),
             Case("mlp", 2, 4, "interleaved_1f1b", "except_last", "momentum", v=2, split="deferred")]
    for name, window in WINDOWS.items():
        groups[name] = (steps, {"steps": 3, "recv_window": window})
    # data parallelism: two replicas of a one-rank pipeline (the same launch of two processes)
    groups["data_parallel"] = (DP_TWO, {"steps": 2})
    groups["bf16"] = (BF16, {"steps": 2})
    with pytest.MonkeyPatch.context() as patch:  # registered in this process only, while jobs are made
        patch.setitem(SCHEDULES, "backward-in-order", ScheduleFamily("backward-in-order", backward_in_order))
        groups["registered"] = ([Case("mlp", 2, 3, "backward-in-order", "always"),
                                 Case("transformer", 2, 4, "backward-in-order", "none", v=2)], {})
        return run_groups(2, groups)


def test_two_ranks_every_schedule_chunking_and_remat_mode(two_ranks) -> None:
    assert_equal_to_reference(two_ranks["main"])


@pytest.mark.parametrize("window", WINDOWS)
def test_several_steps_reuse_receive_buffers_safely(two_ranks, window: str) -> None:
    # Receive buffers are allocated once and reused every step; a step's receives are posted
    # before it starts (all ahead, on CPU), each at its own action (as on CUDA) or one ahead:
    # three steps equal three plain steps.
    assert_equal_to_reference(two_ranks[window], steps=3)


def test_recompute_restores_dropout_masks(two_ranks) -> None:
    """With dropout on, re-materialization gives exactly the gradients of keeping activations."""
    results = two_ranks["dropout"]
    for g in (0, 3):
        base = results[g][1]
        for _, other in results[g + 1:g + 3]:
            for name in base:
                torch.testing.assert_close(other[name][1], base[name][1], rtol=0, atol=0)
    # and dropout really acted: the gradients differ from training without it
    ref = reference(results[0][0])
    assert any(not torch.allclose(results[0][1][n][1], ref[n][1], atol=1e-5) for n in ref)


def test_a_newly_registered_schedule_runs_unchanged(two_ranks) -> None:
    """A schedule added to gpipe_sim.schedule's registry runs with no executor change (the
    workers run the parent's programs; they never look the schedule up)."""
    assert "backward-in-order" not in SCHEDULES
    assert_equal_to_reference(two_ranks["registered"])


@pytest.fixture(scope="module")
def four_ranks() -> dict[str, list[tuple[Case, dict]]]:
    main = [Case("transformer", 4, 4, s, r) for s, r in itertools.product(SCHEDULES_V1, ("none", "always"))]
    main += [Case("convnet", 4, 3, "gpipe", "except_last"), Case("mlp", 4, 1, "1f1b", "always", "adam")]
    main += [Case("transformer", 4, 4, "interleaved_1f1b", "always", v=2),
             Case("mlp", 4, 3, "looped_bfs", "none", v=2),
             Case("convnet", 4, 4, "interleaved_1f1b", "none", v=2, split="deferred"),
             Case("mlp", 4, 4, "1f1b", "except_last", "adam", split="adjacent"),
             Case("transformer", 4, 8, "zbv", "none", v=2), Case("mlp", 4, 8, "dualpipev", "always", v=2),
             Case("convnet", 4, 4, "zb_h2", "except_last")]
    # The CUDA default (one process group per direction, so NCCL's in-order streams cannot
    # deadlock 1F1B), checked here on gloo with receives posted at their action as on CUDA.
    split = [Case("transformer", 4, 4, "1f1b", "none"), Case("mlp", 4, 3, "gpipe", "always", "adam"),
             Case("mlp", 4, 4, "interleaved_1f1b", "always", "momentum", v=2)]
    return run_groups(4, {"main": (main, {}),
                          "split": (split, {"steps": 2, "recv_window": 0, "split_directions": True}),
                          "data_parallel": (DP_FOUR, {"steps": 2})})


def test_four_ranks(four_ranks) -> None:
    assert_equal_to_reference(four_ranks["main"])


def test_activations_and_gradients_in_groups_of_their_own(four_ranks) -> None:
    assert_equal_to_reference(four_ranks["split"], steps=2)


def test_data_parallel_equals_training_on_the_global_batch(two_ranks, four_ranks) -> None:
    """D=2 replicas (K=1 and K=2), each on its half of the global batch, gradients all-reduced per
    chunk (ZeRO-1: each replica updates its shard, then all-gathers): two steps equal two plain
    steps on the whole batch, and both replicas hold the same parameters."""
    assert_equal_to_reference(two_ranks["data_parallel"], steps=2)
    assert_equal_to_reference(four_ranks["data_parallel"], steps=2)


def test_mixed_precision_equals_plain_mixed_precision_training(two_ranks) -> None:
    """bf16 with fp32 master weights: two pipelined (and data-parallel) steps equal two plain ones
    within bf16's rounding (the micro-batches' gradients are summed in bf16 in another order)."""
    assert_equal_to_reference(two_ranks["bf16"], steps=2, tolerance=2e-2)


def test_one_rank() -> None:
    cases = [Case("mlp", 1, 3, "gpipe", "always"), Case("transformer", 1, 4, "1f1b", "except_last"),
             Case("transformer", 1, 3, "interleaved_1f1b", "always", v=2),
             Case("mlp", 1, 2, "looped_bfs", "except_last", v=2, split="deferred", weight_pass="simple")]
    assert_equal_to_reference(run_all(1, cases))


def matrix(K: int) -> list[Case]:
    """Every model, M, schedule (with its chunk counts and splits) and remat mode that K admits."""
    variants = [("gpipe", 1, None), ("1f1b", 1, None), ("interleaved_1f1b", 1, None),
                ("interleaved_1f1b", 2, None), ("looped_bfs", 1, None), ("looped_bfs", 2, None),
                ("1f1b", 1, "adjacent"), ("1f1b", 1, "deferred"), ("interleaved_1f1b", 2, "adjacent"),
                ("interleaved_1f1b", 2, "deferred"), ("looped_bfs", 2, "deferred"),
                ("zb_h1", 1, None), ("zb_h2", 1, None), ("interleaved_zb", 2, None), ("zbv", 2, None),
                ("dualpipev", 2, None)]
    cases = []
    for model, M, (s, v, split), r in itertools.product(MODELS, (1, 3, 4, 8), variants, REMATS):
        if SCHEDULES[s].problem(K, M, v) is None and (M < 8 or s in ("zbv", "dualpipev")):
            cases.append(Case(model, K, M, s, r, v=v, split=split))
    cases.append(Case("transformer", K, 2 * K, "interleaved_1f1b", "always", v=2, split="deferred",
                      weight_pass="simple"))
    return cases


def dp_matrix() -> dict[int, list[Case]]:
    """D in {1, 2} x K in {1, 2} x {gpipe, 1f1b, interleaved_1f1b v=2} x remat {none, always} x
    ZeRO {0, 1}, models and optimizers in turn; by number of processes."""
    variants = [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)]
    models, optimizers = list(MODELS), ("sgd", "momentum", "adam")
    out: dict[int, list[Case]] = {}
    for i, (D, K, (s, v), r, zero) in enumerate(itertools.product((1, 2), (1, 2), variants, ("none", "always"), (0, 1))):
        model = models[i % len(models)]
        optimizer = optimizers[(i // 3) % 3] if model != "transformer" else ("sgd", "momentum")[i % 2]
        case = Case(model, K, 4 if D == 1 else (2, 4)[i % 2], s, r, optimizer, v=v, D=D, zero=zero)
        out.setdefault(case.world, []).append(case)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 4])
def test_full_data_parallel_matrix(world: int) -> None:
    assert_equal_to_reference(run_all(world, dp_matrix()[world], steps=2), steps=2)


def test_matrix_fits_the_models() -> None:
    for K in (1, 2, 4):
        for case in matrix(K):
            assert case.K * case.v <= layer_count(scenario(case).model), case


@pytest.mark.slow
@pytest.mark.parametrize("K", [1, 2, 4])
def test_full_matrix(K: int) -> None:
    assert_equal_to_reference(run_all(K, matrix(K)))
