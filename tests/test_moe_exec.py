"""The executor's mixture-of-experts MLP: expert parallelism over 2 gloo processes gives the
gradients of one process holding every expert; its parameters are the simulator's."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpipe_exec.execute import check_runnable
from gpipe_exec.launch.spawn import LaunchOptions, launch
from gpipe_exec.moe import ExpertGroup, MoeMlp
from gpipe_exec.reference import reference_step
from gpipe_exec.runtime.job import job_for
from gpipe_exec.zoo import Block, build_layers_range
from gpipe_sim.model.experts import moe_parameters
from gpipe_sim.model.layers import build_layers
from gpipe_sim.model.model import TransformerModel
from gpipe_sim.scenario.scenario import parse_scenario

SEED = 11
# 4 blocks: dense, MoE, dense, MoE (first_dense_layers 1, moe_every 2)
MOE_MODEL = dict(preset="transformer", layers=4, d_model=16, d_ff=32, heads=2, seq_len=6, vocab=23, experts=4,
                 top_k=2, expert_d_ff=24, shared_experts=1, moe_every=2, first_dense_layers=1)


def _model(**kw: object) -> TransformerModel:
    base = dict(preset="transformer", layers=2, d_model=16, heads=2, d_ff=32, seq_len=8, vocab=64,
                experts=4, top_k=2, expert_d_ff=24, shared_experts=1)
    return TransformerModel(**{**base, **kw})


def _plain(model: TransformerModel, x: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """Gradients of one process holding every expert on the batch, run as the two replicas' halves
    (mean squared error; a capacity counts each half's tokens, as each replica routes its own)."""
    torch.manual_seed(SEED)
    moe = MoeMlp(model, seed=SEED)
    sum(F_loss(moe(xs), ts, x.shape[0]) for xs, ts in zip(x.chunk(2), target.chunk(2))).backward()
    return {n: p.grad.clone() for n, p in moe.named_parameters()}


def F_loss(y: torch.Tensor, target: torch.Tensor, batch: int) -> torch.Tensor:
    return ((y - target) ** 2).sum() / batch


def _worker(rank: int, port: int, kw: dict, queue: object) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model, (x, target) = _model(**kw), _batch(_model(**kw))
    torch.manual_seed(SEED)
    moe = MoeMlp(model, seed=SEED, group=ExpertGroup(2, rank, dist.group.WORLD))
    half = x.shape[0] // 2  # D = E = 2: each replica its half of the batch
    mine = slice(rank * half, (rank + 1) * half)
    F_loss(moe(x[mine]), target[mine], x.shape[0]).backward()
    grads = {}
    for name, p in moe.named_parameters():
        if not name.startswith("local_experts."):  # replicated: reduced over D; experts over D / E = 1
            dist.all_reduce(p.grad)
        grads[name] = p.grad.numpy().copy()  # by value: the queue outlives the process
    queue.put((rank, grads))  # type: ignore[attr-defined]
    dist.destroy_process_group()


def _batch(model: TransformerModel) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return (torch.randn(4, model.seq_len, model.d_model, generator=g),
            torch.randn(4, model.seq_len, model.d_model, generator=g))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("kw", [{}, {"capacity_factor": 1.0, "top_k": 1, "shared_experts": 0, "mlp": "swiglu"}])
def test_expert_parallel_gradients_equal_one_process(kw: dict) -> None:
    model = _model(**kw)
    plain = _plain(model, *_batch(model))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _port()
    procs = [ctx.Process(target=_worker, args=(r, port, kw, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    local = model.experts // 2
    for rank, grads in results.items():
        for name, grad in grads.items():
            if name.startswith("local_experts."):
                _, e, rest = name.split(".", 2)
                name = f"local_experts.{rank * local + int(e)}.{rest}"
            torch.testing.assert_close(torch.from_numpy(grad), plain[name], rtol=1e-5, atol=1e-6)


def test_parameters_equal_the_simulators() -> None:
    model = _model(bias=True)
    moe = MoeMlp(model, seed=SEED)
    routed = sum(p.numel() for n, p in moe.named_parameters() if n.startswith("local_experts."))
    total, active = moe_parameters(model)
    blocks = sum(model.is_moe(i) for i in range(model.layers))
    assert routed * blocks == total
    assert routed * model.top_k // model.experts * blocks == active


@pytest.mark.slow
@pytest.mark.parametrize("K,schedule,E,mlp", [(1, "gpipe", 2, "gelu"), (2, "1f1b", 2, "swiglu"),
                                              (2, "1f1b", 1, "gelu")])
def test_executor_runs_experts_as_plain_training(K: int, schedule: str, E: int, mlp: str) -> None:
    """D = 2 replicas with E experts-parallel ranks carved from them, K pipeline stages: parameters
    and gradients after a step equal plain single-process training of the same MoE model."""
    sc = parse_scenario({
        "model": {**MOE_MODEL, "mlp": mlp}, "hardware": {"preset": "cpu"},
        "pipeline": {"stages": K, "micro_batches": 2, "batch_size": 8, "schedule": schedule,
                     "data_parallel": 2, "expert_parallel": E},
        "training": {"optimizer": "sgd"},
    })
    plan = check_runnable(sc)
    job = job_for(plan, warmup=0, return_params=True, steps=1, dropout=0.0)
    out, = launch([job], list(range(2 * K)), LaunchOptions(comm_timeout_s=60, run_timeout_s=300))
    got: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for rank in out["ranks"]:
        for key, (param, grad) in rank["params"].items():
            if key in got:  # another replica's copy: the same parameters and reduced gradients
                torch.testing.assert_close(grad, got[key][1], rtol=0, atol=0, msg=key)
            got[key] = (param, grad)
    ref = reference_step(sc)
    assert got.keys() == ref.keys()
    assert any(".moe.local_experts.3." in k for k in ref)
    for name, (param, grad) in ref.items():
        torch.testing.assert_close(got[name][1], grad, rtol=1e-5, atol=1e-6, msg=f"grad {name}")
        torch.testing.assert_close(got[name][0], param, rtol=1e-5, atol=1e-6, msg=f"param {name}")


@pytest.mark.parametrize("E", [1, 2])
@pytest.mark.parametrize("mlp,bias", [("gelu", True), ("swiglu", False)])
def test_each_layer_holds_the_simulators_parameters(E: int, mlp: str, bias: bool) -> None:
    """Every layer one expert-parallel device builds holds the parameters the simulator's layer
    table gives it (its experts / E routed experts), dense and MoE blocks alike."""
    model = TransformerModel(**{**MOE_MODEL, "mlp": mlp, "bias": bias})
    group = ExpertGroup(E, E - 1, None)
    built = build_layers_range(model, 0, model.layers + 1, experts=group)
    table = build_layers(model, expert_parallel=E)
    assert [sum(p.numel() for p in layer.parameters()) for layer in built] == [row.params for row in table]
    assert [isinstance(layer, Block) and layer.moe is not None for layer in built] == \
        [False] + [model.is_moe(i) for i in range(model.layers)] + [False]


@pytest.mark.slow
def test_executor_memory_is_the_simulators_within_3_percent() -> None:
    """D = E = 2, one stage: each device's measured parameters, gradients and momentum are the
    simulator's exactly (its experts / E routed experts), its measured peak within 3% of the
    simulated one (balanced routing there, this batch's routing here)."""
    from gpipe_exec.execute import execute
    from gpipe_sim.api import simulate

    sc = parse_scenario({
        "model": MOE_MODEL, "hardware": {"preset": "cpu"},
        "pipeline": {"stages": 1, "micro_batches": 2, "batch_size": 8, "schedule": "1f1b", "data_parallel": 2,
                     "expert_parallel": 2},
        "training": {"optimizer": "momentum"},
    })
    predicted = simulate(sc).stages[0]
    measured = execute(sc, steps=1, warmup=1).result
    b = measured.stages[0].memory_breakdown
    assert b["parameters"] == b["gradients"] == b["optimizer_states"] == predicted.memory_breakdown["parameters"]
    assert len(measured.device_peak_memory_bytes) == 2
    for peak in measured.device_peak_memory_bytes.values():
        assert peak == pytest.approx(predicted.peak_memory_bytes, rel=0.03)


@pytest.mark.slow
def test_experts_split_over_tensor_parallel_ranks_equal_plain_training() -> None:
    """T = 2 under sequence parallelism (Megatron-LM's default expert tensor parallelism of T):
    each device routes its half of the tokens and runs its half of every expert's width on the
    rows of both, with E = 2 over two replicas, with E = 1, and over two stages; two steps, in one
    launch of 4 processes (tests/test_exec_context_parallel.py's cases, gradients and parameters
    against plain single-process training)."""
    from test_exec_context_parallel import Case, assert_equal_to_reference, run_cases

    cases = [Case(1, 1, 2, "1f1b", D=2, T=2, sp=True, E=2, moe=True),
             Case(1, 1, 2, "gpipe", D=2, T=2, sp=True, moe=True, position="rope"),
             Case(1, 2, 2, "1f1b", T=2, sp=True, moe=True)]
    assert_equal_to_reference(run_cases(4, cases, steps=2), steps=2)


def test_experts_at_t2_need_sequence_parallelism_in_one_line() -> None:
    """Megatron-LM's rule, the scenario's: the simulator and gpipe-exec refuse MoE at T > 1 without
    sequence parallelism alike (one line naming the field), and run it with."""
    from gpipe_exec.execute import check_model
    from gpipe_sim.errors import ScenarioError

    data = {"model": MOE_MODEL, "hardware": {"preset": "cpu"},
            "pipeline": {"stages": 1, "micro_batches": 2, "batch_size": 4, "tensor_parallel": 2}}
    with pytest.raises(ScenarioError, match=r"^pipeline.sequence_parallel: a mixture of experts at tensor_parallel 2 "
                                            r"needs sequence parallelism"):
        parse_scenario(data)
    check_model(parse_scenario({**data, "pipeline": {**data["pipeline"], "sequence_parallel": True}}))
