"""Context parallelism in the executor: C x K processes on gloo, gradients and loss equal to plain training."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

torch = pytest.importorskip("torch")

from gpipe_exec.context_parallel import block_views, load_balanced_positions  # noqa: E402
from gpipe_exec.ring_attention import backward_block, forward_block  # noqa: E402
from gpipe_exec.execute import check_model, check_runnable  # noqa: E402
from gpipe_exec.launch.spawn import LaunchOptions, launch  # noqa: E402
from gpipe_exec.measure.steps import measured_result, step_timelines  # noqa: E402
from gpipe_exec.reference import reference_step  # noqa: E402
from gpipe_exec.runtime.job import job_for  # noqa: E402
from gpipe_exec.zoo import build_model, loss_sum, make_batch  # noqa: E402
from gpipe_sim.api import simulate_plan  # noqa: E402
from gpipe_sim.errors import ScenarioError  # noqa: E402
from gpipe_sim.plan.compile import compile_plan  # noqa: E402
from gpipe_sim.schedule import Kind  # noqa: E402
from gpipe_sim.schedule.global_program import process_program  # noqa: E402
from gpipe_sim.scenario.scenario import Scenario, parse_scenario  # noqa: E402

# 8 tokens cut into 2C = 4 chunks of 2; grouped-query attention (4 heads, 2 key/value heads)
MODEL = dict(preset="transformer", layers=4, d_model=16, d_ff=32, heads=4, kv_heads=2, seq_len=8, vocab=23,
             vocab_multiple=8, attention="flash")
MOE = dict(experts=4, top_k=2, expert_d_ff=24, shared_experts=1, moe_every=2, first_dense_layers=1)
OPTIONS = LaunchOptions(comm_timeout_s=60, run_timeout_s=900)


class Case(NamedTuple):
    C: int
    K: int
    M: int
    schedule: str
    remat: str = "none"
    D: int = 1
    position: str = "learned"
    optimizer: str = "sgd"
    zero: int = 0
    T: int = 1
    overlap: bool = False  # training.overlap_grad_reduce
    sp: bool = False  # pipeline.sequence_parallel
    E: int = 1  # pipeline.expert_parallel (of a mixture of experts where moe)
    moe: bool = False
    v: int = 1  # pipeline.chunks

    @property
    def world(self) -> int:
        return self.C * self.K * self.D * self.T


def scenario(case: Case) -> Scenario:
    return parse_scenario({
        "model": {**MODEL, "position": case.position, **(MOE if case.moe else {})}, "hardware": {"preset": "cpu"},
        "pipeline": {"stages": case.K, "chunks": case.v, "micro_batches": case.M, "batch_size": 4,
                     "schedule": case.schedule, "remat": case.remat, "data_parallel": case.D,
                     "context_parallel": case.C, "tensor_parallel": case.T, "sequence_parallel": case.sp, "expert_parallel": case.E},
        "training": {"optimizer": case.optimizer, "zero": case.zero, "overlap_grad_reduce": case.overlap}})


def test_device_c_holds_chunks_c_and_2c_minus_1_minus_c() -> None:
    assert load_balanced_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert load_balanced_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    held = torch.cat([load_balanced_positions(24, 3, c) for c in range(3)])
    assert sorted(held.tolist()) == list(range(24))  # every token once


def context_mask(seq_len: int, size: int, rank: int) -> torch.Tensor:
    """Member `rank`'s visibility from the tokens' global positions (the reference): its tokens x
    every member's, in member order; True where the query's position is not before the key's."""
    positions = load_balanced_positions(seq_len, size, rank)
    keys = torch.cat([load_balanced_positions(seq_len, size, r) for r in range(size)])
    return keys[None, :] <= positions[:, None]


@pytest.mark.parametrize("C", [2, 3, 4])
def test_each_ring_step_is_a_dense_block_but_the_devices_own(C: int) -> None:
    """With the load balance, device c sees an earlier device's block whole with all its queries
    but only its first chunk of keys, a later device's whole with its second chunk of queries only,
    and its own causally (Transformer Engine's three cases): what the views say is exactly what
    the tokens' global positions allow."""
    tokens = 4  # each device's, two chunks of 2
    for c in range(C):
        views = block_views(C, c, tokens)
        for s, visible in enumerate(context_mask(tokens * C, C, c).chunk(C, dim=1)):
            view = views[s]
            said = torch.zeros(tokens, tokens, dtype=torch.bool)
            said[view.rows, view.cols] = True
            if view.causal:
                said &= torch.ones(tokens, tokens, dtype=torch.bool).tril()
            assert torch.equal(said, visible), (C, c, s)
            assert view.causal == (s == c)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("fused", [True, False])
def test_a_ring_block_is_attention_with_its_log_sum_exp(fused: bool, causal: bool) -> None:
    """One block, fused (torch's CPU flash kernel) and unfused (what other devices run): its output
    and gradients those of autograd through softmax attention (grouped heads; the own block's
    causal, with the mask as a -inf bias, or a block seen whole), its log-sum-exp the scores'."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 6, 8, generator=g, dtype=torch.float64).float() for h in (4, 2, 2))
    bias = torch.zeros(6, 6).masked_fill_(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    out, lse = forward_block(q, k, v, causal, fused=fused)
    bias = bias if causal else torch.zeros(6, 6)
    qa, ka, va = (t.clone().requires_grad_() for t in (q, k, v))
    scores = qa @ ka.repeat_interleave(2, 1).transpose(-2, -1) / 8**0.5 + bias
    expected = scores.softmax(-1) @ va.repeat_interleave(2, 1)
    grad = torch.randn(expected.shape, generator=g)
    expected.backward(grad)
    torch.testing.assert_close(out, expected.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse, scores.logsumexp(-1).detach(), rtol=1e-5, atol=1e-6)
    for got, want in zip(backward_block(grad, q, k, v, out, lse, causal, fused=fused), (qa, ka, va)):
        torch.testing.assert_close(got, want.grad, rtol=1e-5, atol=1e-5)


def _ring_against_whole_attention(rank: int, device: Any, clock: Any, payload: Any) -> None:
    """One member of a C-device ring: its output and q, k, v gradients those of causal attention
    over the whole sequence (torch's scaled_dot_product_attention, grouped heads) at its tokens."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from gpipe_exec.context_parallel import SequenceShard, attend

    size, s = dist.get_world_size(), 16
    g = torch.Generator().manual_seed(0)  # the same whole tensors on every member
    q, k, v = (torch.randn(2, h, s, 8, generator=g).requires_grad_() for h in (4, 2, 2))
    grad = torch.randn(2, 4, s, 8, generator=g)
    F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(grad)
    shard = SequenceShard.of(s, size, rank, dist.group.WORLD, torch.device("cpu"))
    mine = shard.positions
    ql, kl, vl = (t.detach()[:, :, mine].clone().requires_grad_() for t in (q, k, v))
    out = attend(shard, ql, kl, vl)
    out.backward(grad[:, :, mine])
    with torch.no_grad():
        whole = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, whole[:, :, mine], rtol=1e-5, atol=1e-5)
    for got, want in ((ql, q), (kl, k), (vl, v)):
        torch.testing.assert_close(got.grad, want.grad[:, :, mine], rtol=1e-5, atol=1e-5)


def test_a_ring_of_four_is_causal_attention_over_the_whole_sequence() -> None:
    """C = 4 (the launches below run C = 2): every key/value block and its dK, dV go all the way
    round (the gradients travel while the next block computes) and come back to their owner."""
    launch(None, [0, 1, 2, 3], OPTIONS, task=_ring_against_whole_attention)


def test_processes_are_numbered_as_the_simulator_numbers_devices() -> None:
    """Program rank g runs its context rank c on process 2g + c (C = 2; gpipe_sim.mesh.Mesh), each
    sending to the same context rank of its peer."""
    plan = compile_plan(scenario(Case(C=2, K=2, M=2, schedule="1f1b")))
    assert plan.mesh.process_devices() == (0, 1, 2, 3)
    for process in range(4):
        g, c, _ = plan.mesh.coordinates(process)
        peers = {a.peer for a in process_program(plan.global_program, process, 2).actions
                 if a.kind in (Kind.SEND, Kind.RECV) and a.peer >= 0}
        assert peers == {(1 - g) * 2 + c}
    # one replica still reduces its gradients: over the C devices holding the same layers
    assert any(a.kind == Kind.ALLREDUCE for a in plan.global_program.rank(0).actions)


def test_zero2_runs_with_one_stage_and_is_refused_with_two_in_one_line() -> None:
    base = scenario(Case(C=2, K=1, M=2, schedule="1f1b")).with_updates({"training.zero": 2})
    check_model(base)  # FSDP2 over the C devices of one replica
    with pytest.raises(ScenarioError, match=r"^training.zero: gpipe-exec runs ZeRO-2 \(FSDP2 fully_shard\) with "
                                            r"pipelining at context_parallel 1 "):
        check_model(base.with_updates({"pipeline.stages": 2}))


def run_cases(world: int, cases: list[Case], steps: int = 1) -> list[tuple[Case, dict[str, Any], float]]:
    """One launch of `world` processes running every case: each case's parameters and gradients
    (from each rank's c = 0 process) and its first step's loss."""
    plans, jobs = [], []
    for case in cases:
        assert case.world == world, case
        plans.append(check_runnable(scenario(case)))
        jobs.append(job_for(plans[-1], steps=steps, warmup=0, dropout=0.0, return_params=True, tag=str(case)))
    results = []
    for case, plan, out in zip(cases, plans, launch(jobs, list(range(world)), OPTIONS)):
        assert len(step_timelines(plan, out)) == steps, case
        params: dict[str, Any] = {}
        for rank in out["ranks"]:
            params.update(rank["params"])
        results.append((case, params, measured_result(plan, out).loss))
    return results


def plain_loss(sc: Scenario) -> float:
    """The first step's loss of plain single-process training (before any update)."""
    model = build_model(sc.model, seed=0, dropout=0.0, tensor_parallel=sc.pipeline.tensor_parallel)  # as padded
    x, y = make_batch(sc.model, sc.pipeline.batch_size, seed=0)
    with torch.no_grad():
        return float(loss_sum(model(x), y, sc.pipeline.batch_size))


def assert_equal_to_reference(results: list[tuple[Case, dict[str, Any], float]], steps: int = 1) -> None:
    for case, got, loss in results:
        plain = scenario(case._replace(C=1, K=1, v=1, schedule="gpipe", remat="none", D=1, zero=0, overlap=False,
                                       E=1))
        ref = reference_step(plain, steps=steps)
        assert got.keys() == ref.keys(), case
        for name, (param, grad) in ref.items():
            torch.testing.assert_close(got[name][1], grad, rtol=1e-5, atol=1e-5, msg=f"grad {name}: {case}")
            torch.testing.assert_close(got[name][0], param, rtol=1e-5, atol=1e-5, msg=f"param {name}: {case}")
        if steps == 1:
            assert loss == pytest.approx(plain_loss(plain), rel=1e-5), case


def test_c2_k1_and_k2_equal_plain_training() -> None:
    """C = 2 with two pipeline stages (1f1b, learned positions) and with one stage and two
    replicas (gpipe, rotary positions), in one launch of 4 processes."""
    assert_equal_to_reference(run_cases(4, [Case(2, 2, 2, "1f1b"), Case(2, 1, 2, "gpipe", D=2, position="rope")]))


@pytest.mark.slow
def test_c2_with_tensor_parallelism_equals_plain_training() -> None:
    """C = 2 x T = 2: each device's ring carries its T-th of the key/value heads; the gradients
    summed over the C devices of each tensor rank; with sequence parallelism each device's s/C
    tokens split again T ways between the layers."""
    assert_equal_to_reference(run_cases(4, [Case(2, 1, 2, "1f1b", T=2), Case(2, 1, 2, "gpipe", "full", T=2,
                                                                           position="rope"),
                                            Case(2, 1, 2, "1f1b", T=2, sp=True),
                                            Case(2, 1, 2, "gpipe", "always", T=2, sp=True, position="rope")]))


@pytest.mark.slow
def test_c2_with_experts_equals_plain_training() -> None:
    """A mixture of experts at C = 2 and D = 2: each device routes its own tokens; with E = 2 the
    experts are spread over the replicas at the same context rank and their gradients summed over
    the C devices holding the same experts, with E = 1 over all D x C."""
    assert_equal_to_reference(run_cases(4, [Case(2, 1, 2, "1f1b", D=2, E=2, moe=True),
                                            Case(2, 1, 2, "gpipe", D=2, moe=True, position="rope")]))


@pytest.mark.slow
def test_c2_with_split_backward_and_interleaved_schedules_equals_plain_training() -> None:
    """Zero-bubble schedules (the input's gradient first, the weights' later: the ring runs in the
    first) and interleaved chunks."""
    cases = [Case(2, 2, 4, "zb_h1"), Case(2, 2, 4, "zbv", v=2, position="rope"),
             Case(2, 2, 4, "interleaved_1f1b", "always", v=2)]
    assert_equal_to_reference(run_cases(4, cases))


@pytest.mark.slow
def test_c2_under_recomputation_equals_plain_training() -> None:
    """Whole-chunk (`always`) and per-block (`full`, `selective`) re-computation: the backward's
    forward gathers the keys and values again."""
    cases = [Case(2, 2, 4, "gpipe", "always", position="rope"), Case(2, 2, 2, "1f1b", "selective"),
             Case(2, 1, 2, "1f1b", "full", D=2, position="rope")]
    assert_equal_to_reference(run_cases(4, cases))


@pytest.mark.slow
def test_c2_with_zero_and_overlapped_reduction_equals_plain_training() -> None:
    """Over two momentum steps: ZeRO-1's optimizer states split over the C devices of one replica
    and over the D x C of two; the gradients reduced in buckets during the last backward pass
    (overlap_grad_reduce) over the D x C devices; ZeRO-2 (FSDP2) over the D x C devices."""
    cases = [Case(2, 2, 2, "1f1b", optimizer="momentum", zero=1),
             Case(2, 1, 2, "gpipe", D=2, optimizer="momentum", zero=1, position="rope"),
             Case(2, 2, 2, "1f1b", optimizer="momentum", overlap=True),
             Case(2, 1, 2, "1f1b", D=2, optimizer="momentum", overlap=True),
             Case(2, 1, 2, "1f1b", D=2, optimizer="momentum", zero=2)]
    assert_equal_to_reference(run_cases(4, cases, steps=2), steps=2)


@pytest.mark.slow
def test_each_devices_memory_agrees_with_the_simulator() -> None:
    """C = 2, K = 2 (1f1b, momentum): each device's saved-tensor accounting is the simulator's
    (s/C tokens a device, its own K and V kept for the backward, the mask static) and its measured
    peak (real tensor bytes) within the 10% validate's check holds for split ranks."""
    case = Case(2, 2, 2, "1f1b", optimizer="momentum")
    plan = compile_plan(scenario(case).with_updates({"hardware.host.step_buffers": True}))
    out, = launch([job_for(plan, steps=1, warmup=1)], list(range(4)), OPTIONS)
    predicted, measured = simulate_plan(plan).stages, measured_result(plan, out).result.stages
    whole = simulate_plan(compile_plan(scenario(case._replace(C=1)))).stages
    for p, m, w in zip(predicted, measured, whole):
        assert p.peak_activation_bytes == pytest.approx(w.peak_activation_bytes / 2, rel=0.02)  # s/C tokens
        assert m.peak_activation_bytes == pytest.approx(p.peak_activation_bytes, rel=0.01), p.index
        assert m.peak_memory_bytes == pytest.approx(p.peak_memory_bytes, rel=0.10), p.index
