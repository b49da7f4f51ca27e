"""ZeRO with a mixture of experts in gpipe-exec. ZeRO-1 as Megatron-LM's distributed optimizer
shards it: the dense parameters' buckets over the D x C data-parallel group, the routed experts'
over the D x C / E processes holding the same experts (the expert-data-parallel group); ZeRO-2/3 as
torchtitan shards it with FSDP2: each routed expert a unit over that group, the rest over D x C.
Gradients and parameters equal plain training's (gloo, fp32, two steps)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_exec_context_parallel import Case, assert_equal_to_reference, run_cases  # noqa: E402

# momentum, not Adam: the key bias's gradient is zero but for rounding, which Adam's update would
# turn into a step of the learning rate's size whose sign the rounding decides
CASES = [Case(1, 1, 1, "gpipe", D=4, E=2, zero=1, moe=True, optimizer="momentum"),  # experts over 2 of 4
         Case(1, 2, 2, "1f1b", D=2, E=2, zero=1, moe=True, optimizer="momentum"),  # experts on one process
         Case(1, 1, 2, "1f1b", D=2, T=2, sp=True, E=2, zero=1, moe=True, optimizer="momentum"),
         Case(2, 1, 2, "gpipe", D=2, E=2, zero=1, moe=True, optimizer="momentum"),  # over D x C / E = 2
         Case(1, 1, 1, "gpipe", D=4, zero=1, moe=True, optimizer="momentum")]  # E = 1: every bucket over D


FSDP = [Case(1, 1, 1, "gpipe", D=4, E=2, zero=3, moe=True, optimizer="momentum"),  # experts over 2 of 4
        Case(1, 2, 2, "1f1b", D=2, E=2, zero=3, moe=True, optimizer="momentum"),  # experts whole, pipelined
        Case(1, 1, 1, "1f1b", D=4, E=2, zero=2, moe=True, optimizer="momentum"),
        Case(2, 1, 2, "gpipe", D=2, E=2, zero=2, moe=True, optimizer="momentum"),  # over D x C / E = 2
        Case(1, 1, 1, "gpipe", D=4, zero=2, moe=True, optimizer="momentum")]  # E = 1: every unit over D


def test_fsdp_with_experts_equals_plain_training() -> None:
    """FSDP2 with the routed experts as their own units over expert-data-parallel groups of 2 (D = 4,
    E = 2 under ZeRO-2 and 3; D = C = E = 2), left whole and unreduced where that group is one
    process (D = E = 2 over K = 2), and at E = 1, in one launch of 4 processes."""
    assert_equal_to_reference(run_cases(4, FSDP, steps=2), steps=2)


def test_fsdp_with_experts_at_t2_runs_where_each_expert_is_on_one_process() -> None:
    """T = 2 under sequence parallelism: the experts left whole where D = E (ZeRO-3), every unit
    over D at E = 1 (ZeRO-2); expert-data-parallel groups of more than one are refused in one line."""
    from gpipe_exec.execute import check_model
    from gpipe_sim.errors import ScenarioError
    from test_exec_context_parallel import scenario

    cases = [Case(1, 1, 2, "1f1b", D=2, T=2, sp=True, E=2, zero=3, moe=True, optimizer="momentum"),
             Case(1, 1, 2, "1f1b", D=2, T=2, sp=True, zero=2, moe=True, optimizer="momentum")]
    assert_equal_to_reference(run_cases(4, cases, steps=2), steps=2)
    refused = scenario(Case(1, 1, 1, "gpipe", D=4, T=2, sp=True, E=2, zero=2, moe=True))
    with pytest.raises(ScenarioError, match=r"^model.experts: gpipe-exec runs a mixture of experts with training.zero"):
        check_model(refused)


def test_distributed_optimizer_with_experts_equals_plain_training() -> None:
    """Expert-data-parallel groups of 2 (D = 4, E = 2; D = C = E = 2) and of one process (D = E = 2
    over two stages), with T = 2 under sequence parallelism, and E = 1, in one launch of 4 processes."""
    assert_equal_to_reference(run_cases(4, CASES, steps=2), steps=2)


@pytest.mark.slow
@pytest.mark.parametrize("replicas, experts", [
    # each expert on one process, the dense parameters over two (-0.1% seen)
    (2, 2),
    # every bucket over the four replicas: the peak is the update's (the bucket's all-gather beside
    # the shard's gradient) or the reduction's (each bucket's padded copy and received part); -0.1%
    # seen, -11.2% when the bucket was concatenated then padded, holding the gradients twice
    (4, 1),
])
def test_zero1_memory_with_experts_agrees_with_the_simulator(replicas: int, experts: int) -> None:
    """D replicas, E experts' groups, momentum, fp32, `host.step_buffers`: each device's master
    parts and momentum are the simulator's master shard exactly (dense / D x E + every local
    expert), its peak within 3% of the simulated one."""
    from test_sim_zero_experts import _scenario

    from gpipe_exec.execute import execute
    from gpipe_sim.api import simulate

    sc = _scenario(replicas, experts)
    predicted = simulate(sc).stages[0]
    measured = execute(sc, steps=1, warmup=1).result
    assert measured.stages[0].memory_breakdown["optimizer_states"] == 2 * predicted.memory_breakdown["zero_master_shard"]
    for peak in measured.device_peak_memory_bytes.values():
        assert peak == pytest.approx(predicted.peak_memory_bytes, rel=0.03)
