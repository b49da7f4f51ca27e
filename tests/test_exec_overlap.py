"""`training.overlap_grad_reduce` in gpipe-exec (CPU, gloo, D=2): each chunk's gradients summed in the
simulator's buckets, each bucket's all-reduce started from the post-accumulate-grad hooks of the
chunk's last backward pass (or, splitting the backward, as its last weight pass adds them), equal
plain training (fp32, 1e-5), started before that pass ends, and the step's peak memory within 3% of
gpipe-sim's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_exec_correctness import OPTIONS, Case, assert_equal_to_reference, scenario  # noqa: E402

from gpipe_exec.execute import check_runnable  # noqa: E402
from gpipe_exec.launch.spawn import launch  # noqa: E402
from gpipe_exec.measure.steps import step_timelines  # noqa: E402
from gpipe_exec.runtime.job import job_for  # noqa: E402
from gpipe_sim.plan.buckets import buckets  # noqa: E402
from gpipe_sim.schedule import Kind  # noqa: E402

BUCKET_BYTES = 2_000  # an MLP layer's gradients are 1,088 B, a transformer block's 8.6 kB: several buckets
TWO = [Case("mlp", 1, 2, "gpipe", "none", "sgd", D=2), Case("transformer", 1, 3, "1f1b", "always", "momentum", D=2),
       Case("mlp", 1, 4, "1f1b", "none", "adam", D=2, zero=1)]
FOUR = [Case("transformer", 2, 2, "gpipe", "always", "momentum", D=2),
        Case("mlp", 2, 4, "interleaved_1f1b", "none", "adam", v=2, D=2, zero=1),
        # split backward: the weight passes' accumulations count the buckets in (no autograd hook fires)
        Case("transformer", 2, 4, "zb_h1", "none", "momentum", D=2),
        Case("mlp", 2, 4, "interleaved_zb", "none", "adam", v=2, D=2, zero=1)]
GRADIENT_PASSES = (Kind.BACKWARD, Kind.BACKWARD_WEIGHT)


def _overlapped(sc):
    return sc.with_updates({"training.overlap_grad_reduce": True, "training.bucket_bytes": BUCKET_BYTES})


def _run(world: int, cases: list[Case]) -> list[tuple[Case, dict]]:
    """Two steps of each case; checks each chunk's buckets started before its last backward pass
    ended (per rank, on the step's own clock), in the simulator's number of buckets."""
    plans = [check_runnable(_overlapped(scenario(case))) for case in cases]
    outs = launch([job_for(p, steps=2, warmup=0, return_params=True, dropout=0.0) for p in plans],
                  list(range(world)), OPTIONS)
    results = []
    for case, plan, out in zip(cases, plans, outs):
        assert len(step_timelines(plan, out)) == 2, case
        for rank in out["ranks"]:
            for rec in rank["records"]:
                assert rec.bucket_starts, case
                for c, starts in rec.bucket_starts.items():
                    ch = plan.chunks[c]
                    own = plan.layers[ch.first_layer:ch.last_layer + 1]
                    layer_bytes = [layer.params * 4 for layer in reversed(own)]
                    assert len(starts) == len(buckets(layer_bytes, BUCKET_BYTES)), (case, c)
                    last_backward = max(e for k, ci, e in zip(rec.kind, rec.chunk, rec.ends)
                                        if ci == c and k in GRADIENT_PASSES)
                    assert starts[0] < last_backward, (case, c, starts, last_backward)
        params: dict = {}
        for rank in out["ranks"]:
            for key, (param, grad) in rank["params"].items():
                if key in params:  # the other replica's copy: identical
                    torch.testing.assert_close(grad, params[key][1], rtol=0, atol=0)
                params[key] = (param, grad)
        results.append((case, params))
    return results


def test_overlapped_reduction_equals_plain_training_one_stage() -> None:
    assert_equal_to_reference(_run(2, TWO), steps=2)


@pytest.mark.slow
def test_overlapped_reduction_equals_plain_training_two_stages() -> None:
    assert_equal_to_reference(_run(4, FOUR), steps=2)


@pytest.mark.slow
@pytest.mark.parametrize("zero", [0, 1])
def test_peak_memory_against_the_prediction(zero: int) -> None:
    """The step's measured peak (the tensor tracker) against gpipe-sim's, within 3%."""
    from gpipe_exec.measure.steps import measured_result
    from gpipe_sim.api import simulate
    from test_exec_sharding import _memory_case

    sc = _memory_case(zero).with_updates({"training.overlap_grad_reduce": True, "training.bucket_bytes": 400_000})
    plan = check_runnable(sc)
    out, = launch([job_for(plan, steps=1, warmup=1)], [0, 1], OPTIONS)
    measured = measured_result(plan, out).result.stages[0].peak_memory_bytes
    predicted = simulate(sc).stages[0].peak_memory_bytes
    assert abs(predicted / measured - 1) <= 0.03, (predicted, measured)
