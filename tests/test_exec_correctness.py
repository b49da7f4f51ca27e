"""The pipelined step equals plain single-process training (gradients and parameters, fp32, 1e-5)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gpipe_exec.execute import check_runnable, job_for  # noqa: E402
from gpipe_exec.launch.spawn import LaunchOptions, launch  # noqa: E402
from gpipe_exec.reference import reference_step  # noqa: E402
from gpipe_sim.spec.scenario import Scenario, parse_scenario  # noqa: E402

MODELS: dict[str, dict[str, Any]] = {
    "transformer": dict(preset="transformer", layers=2, d_model=16, d_ff=32, heads=2, seq_len=6, vocab=23),
    "mlp": dict(preset="mlp", layers=3, width=16, input_dim=12, num_classes=5),
    "convnet": dict(preset="convnet", layers=3, channels=4, image_size=8, num_classes=5),
}
OPTIONS = LaunchOptions(comm_timeout_s=60, run_timeout_s=600)


def scenario(model: str, K: int, M: int, schedule: str, remat: str, optimizer: str = "sgd") -> Scenario:
    return parse_scenario({
        "model": MODELS[model], "hardware": {"preset": "cpu"},
        "pipeline": {"stages": K, "micro_batches": M, "batch_size": 8 if M > 1 else 5,
                     "schedule": schedule, "remat": remat},
        "training": {"optimizer": optimizer},
    })


def run_all(K: int, configs: list[tuple], dropout: float = 0.0, steps: int = 1,
            **job: Any) -> list[tuple[Scenario, dict]]:
    """Launch K ranks once and run every configuration in that one process group."""
    scenarios = [scenario(*c) for c in configs]
    jobs = []
    for i, sc in enumerate(scenarios):
        plan = check_runnable(sc)
        jobs.append(job_for(sc, plan, steps=steps, warmup=0, dropout=dropout, return_params=True, tag=str(i),
                            **job))
    outs = launch(jobs, list(range(K)), OPTIONS)
    merged = []
    for sc, out in zip(scenarios, outs):
        params: dict[str, Any] = {}
        for rank in out["ranks"]:
            params.update(rank["params"])
        merged.append((sc, params))
    return merged


def assert_equal_to_reference(results: list[tuple[Scenario, dict]], steps: int = 1) -> None:
    for sc, got in results:
        ref = reference_step(sc, steps=steps)
        where = f"{sc.model.preset} K={sc.pipeline.stages} M={sc.pipeline.micro_batches} " \
                f"{sc.pipeline.schedule} remat={sc.pipeline.remat}"
        assert got.keys() == ref.keys(), where
        for name, (param, grad) in ref.items():
            torch.testing.assert_close(got[name][1], grad, rtol=1e-5, atol=1e-5, msg=f"grad {name}: {where}")
            torch.testing.assert_close(got[name][0], param, rtol=1e-5, atol=1e-5, msg=f"param {name}: {where}")


REMATS = ("none", "except_last", "always")
SCHEDULES = ("gpipe", "1f1b")


def test_two_stages_every_schedule_and_remat_mode() -> None:
    configs = [("transformer", 2, M, s, r) for s, r, M in itertools.product(SCHEDULES, REMATS, (1, 3))]
    # Adam on the transformer would amplify rounding in gradients that are exactly zero in theory
    # (the key bias): Adam is checked on the MLP and the convnet.
    configs += [("convnet", 2, 4, "1f1b", "always", "adam"), ("mlp", 2, 4, "gpipe", "except_last", "momentum")]
    configs += [("mlp", 2, 3, "1f1b", "none", "adam")]
    configs += [("mlp", 2, 1, "naive", "none")]
    assert_equal_to_reference(run_all(2, configs))


def test_four_stages() -> None:
    configs = [("transformer", 4, 4, s, r) for s, r in itertools.product(SCHEDULES, ("none", "always"))]
    configs += [("convnet", 4, 3, "gpipe", "except_last"), ("mlp", 4, 1, "1f1b", "always", "adam")]
    assert_equal_to_reference(run_all(4, configs))


@pytest.mark.parametrize("recv_window", [None, 0, 1])
def test_several_steps_reuse_receive_buffers_safely(recv_window: int | None) -> None:
    # Receive buffers are allocated once and reused every step; a step's receives are posted
    # before it starts (None, on CPU), each at its own action (0, as on CUDA) or one ahead (1):
    # three steps equal three plain steps.
    configs = [("transformer", 2, 3, "1f1b", "always", "momentum"), ("convnet", 2, 4, "gpipe", "none", "adam")]
    assert_equal_to_reference(run_all(2, configs, steps=3, recv_window=recv_window), steps=3)


def test_activations_and_gradients_in_groups_of_their_own() -> None:
    # The CUDA default (one process group per direction, so NCCL's in-order streams cannot
    # deadlock 1F1B), checked here on gloo with receives posted at their action as on CUDA.
    configs = [("transformer", 4, 4, "1f1b", "none"), ("mlp", 4, 3, "gpipe", "always", "adam")]
    assert_equal_to_reference(run_all(4, configs, steps=2, recv_window=0, split_directions=True), steps=2)


def test_one_stage() -> None:
    configs = [("mlp", 1, 3, "gpipe", "always"), ("transformer", 1, 4, "1f1b", "except_last")]
    assert_equal_to_reference(run_all(1, configs))


def test_recompute_restores_dropout_masks() -> None:
    """With dropout on, re-materialization gives exactly the gradients of keeping activations."""
    configs = [("transformer", 2, 3, "gpipe", r) for r in REMATS]
    results = run_all(2, configs, dropout=0.3)
    base = results[0][1]
    for _, other in results[1:]:
        for name in base:
            torch.testing.assert_close(other[name][1], base[name][1], rtol=0, atol=0)
    # and dropout really acted: the gradients differ from training without it
    ref = reference_step(results[0][0])
    assert any(not torch.allclose(base[n][1], ref[n][1], atol=1e-5) for n in ref)


@pytest.mark.slow
@pytest.mark.parametrize("K", [1, 2, 4])
def test_full_matrix(K: int) -> None:
    configs = [
        (model, K, M, s, r)
        for model, M, s, r in itertools.product(MODELS, (1, 3, 4), SCHEDULES, REMATS)
    ]
    assert_equal_to_reference(run_all(K, configs))


def test_a_newly_registered_schedule_runs_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """A schedule added to gpipe_sim.schedule's registry runs with no executor change."""
    from gpipe_sim import schedule as schedules

    def backward_in_order(stages: int, micro_batches: int) -> list:
        order = [("F", m) for m in range(micro_batches)] + [("B", m) for m in range(micro_batches)]
        return [list(order) for _ in range(stages)]

    monkeypatch.setitem(schedules.SCHEDULES, "backward-in-order", backward_in_order)
    assert_equal_to_reference(run_all(2, [("mlp", 2, 3, "backward-in-order", "always"),
                                          ("transformer", 2, 4, "backward-in-order", "none")]))
