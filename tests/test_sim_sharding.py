"""Sharded data parallelism (`training.zero` 2 and 3, `training.shard_within_node`): the bytes a rank
keeps and the per-layer all-gathers and reduce-scatters, against the formulas written out here."""

from __future__ import annotations

import pytest

from gpipe_sim.api import simulate
from gpipe_sim.errors import ScenarioError
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.plan.sharding import fsdp_pass_seconds
from gpipe_sim.scenario.scenario import parse_scenario

LAYERS, PARAMS = 8, 25_000_000  # 100 MB of fp32 weights a layer
FORWARD_S, BACKWARD_S = 1e-3, 2e-3  # a layer's passes on one sample
ACTIVATION = 4e6  # bytes a layer saves per sample
BANDWIDTH, LATENCY = 50e9, 5e-6  # the v100 preset's link
ADAM_FP32 = 4 + 4 + 8  # weight, gradient, two fp32 moments


def _scenario(zero: int, K: int = 1, D: int = 2, hsdp: bool = False, hardware: dict | None = None, M: int = 2,
              **training):
    return parse_scenario({
        "model": {"preset": "uniform", "layers": LAYERS, "params_per_layer": PARAMS,
                  "activation_bytes_per_sample": ACTIVATION,
                  "forward_s_per_sample": FORWARD_S, "backward_s_per_sample": BACKWARD_S},
        "hardware": hardware or {"preset": "v100"},
        "pipeline": {"stages": K, "data_parallel": D, "micro_batches": M, "batch_size": M * D, "schedule": "1f1b",
                     "remat": "none"},
        "training": {"dtype": "fp32", "optimizer": "adam", "zero": zero, "shard_within_node": hsdp} | training})


def _half(nbytes: float, members: int = 2, bandwidth: float = BANDWIDTH, latency: float = LATENCY) -> float:
    """A reduce-scatter or all-gather of `nbytes` in all on a ring of `members`."""
    return (members - 1) / members * nbytes / bandwidth + (members - 1) * latency


def _static(zero: int, K: int) -> float:
    r = simulate(_scenario(zero, K))
    stage = r.stages[0]
    return stage.param_bytes + stage.state_bytes


@pytest.mark.parametrize("zero, K, per_param", [
    (0, 1, ADAM_FP32), (1, 1, 4 + 4 + 8 / 2),
    (2, 1, 4 + (4 + 4 + 8) / 2),  # the fp32 weight shard the replica steps, its gradient and states
    (3, 1, (4 + 4 + 8) / 2),  # FSDP2: the fp32 sharded parameter, its gradient and states
    (3, 2, 4 + (4 + 8) / 2),  # under pipelining the gathered stage stays all step (its gradients: below)
])
def test_static_bytes_per_parameter(zero: int, K: int, per_param: float) -> None:
    assert _static(zero, K) == pytest.approx(LAYERS // K * PARAMS * per_param, rel=1e-12)


def test_bf16_zero3_keeps_no_bf16_weight_beside_the_fp32_master_shard() -> None:
    stage = simulate(_scenario(3, dtype="bf16")).stages[0]
    assert stage.param_bytes == 0.0
    assert stage.state_bytes == pytest.approx(LAYERS * PARAMS * (2 + 4 + 8) / 2, rel=1e-12)


def test_bf16_zero2_steps_its_fp32_master_shard() -> None:
    """In mixed precision ZeRO-2's stepped shard is the fp32 master copy: the bf16 weight whole, then
    the gradient, master and moments sharded."""
    stage = simulate(_scenario(2, dtype="bf16")).stages[0]
    assert stage.param_bytes == pytest.approx(LAYERS * PARAMS * 2, rel=1e-12)
    assert stage.state_bytes == pytest.approx(LAYERS * PARAMS * (2 + 4 + 8) / 2, rel=1e-12)


def test_zero3_passes_gather_and_reduce_scatter_each_layer() -> None:
    """Without pipelining each micro-batch's forward gathers its layers one ahead and its backward
    gathers them again and reduce-scatters their gradients; nothing is left for after the backward."""
    gather = _half(PARAMS * 4)
    forward = fsdp_pass_seconds([gather] * LAYERS, [FORWARD_S] * LAYERS)
    backward = fsdp_pass_seconds([gather] * LAYERS, [BACKWARD_S] * LAYERS, [gather] * LAYERS)
    # written out: a gather (1.005 ms) outlasts a layer's forward (1 ms), so the gathers set the pace
    assert gather > FORWARD_S and forward == pytest.approx(LAYERS * gather + FORWARD_S, rel=1e-12)
    # backward: per layer a gather and a reduce-scatter (2 x 1.005 ms) against 2 ms of compute
    assert backward > LAYERS * BACKWARD_S + gather
    zero3 = simulate(_scenario(3))
    assert zero3.stages[0].exposed_allreduce_s == 0.0
    update = compile_plan(_scenario(0)).ranks[0].update_s / 2  # the shard's update
    assert compile_plan(_scenario(3)).ranks[0].update_s == pytest.approx(update, rel=1e-12)
    assert zero3.step_time_s == pytest.approx(2 * (forward + backward) + update, rel=1e-9)
    assert simulate(_scenario(3), engine="fast").step_time_s == pytest.approx(zero3.step_time_s, rel=1e-12)


def test_fsdp_pass_one_unit_ahead() -> None:
    """Gathers slower than compute: the next gather is issued as a unit's compute starts, so each
    unit waits for its own gather; reductions queue behind the gathers issued before them."""
    assert fsdp_pass_seconds([3.0, 3.0, 3.0], [1.0, 1.0, 1.0]) == 3 + 1 + 2 + 1 + 2 + 1
    # queue: g0 0-3, c0 3-4, g1 3-6, r0 6-7, c1 6-7, g2 7-10, r1 10-11, c2 10-11, r2 11-12
    assert fsdp_pass_seconds([3.0] * 3, [1.0] * 3, [1.0] * 3) == 12.0


def test_zero3_memory_holds_two_gathered_layers_and_a_gradient() -> None:
    zero3 = simulate(_scenario(3)).stages[0]
    static = LAYERS * PARAMS * ADAM_FP32 / 2
    activations = zero3.peak_memory_bytes - static - 3 * PARAMS * 4  # two layers' weights, one's gradient
    assert 0 < activations <= simulate(_scenario(0)).stages[0].peak_memory_bytes - LAYERS * PARAMS * ADAM_FP32


def test_zero3_under_pipelining_reduces_layer_by_layer_and_gathers_in_the_first_forward() -> None:
    """K = 2 (torchtitan with pipelining): each layer reduce-scattered as the last backward finishes
    it, then the step's first forward delayed by gathering its layers one after another."""
    per_stage = LAYERS // 2
    t = 0.0
    for layer in range(per_stage):
        t = max((layer + 1) * BACKWARD_S, t) + _half(PARAMS * 4)
    gathered = computed = 0.0
    for _ in range(per_stage):
        gathered += _half(PARAMS * 4)
        computed = max(computed, gathered) + FORWARD_S
    expected = t - per_stage * BACKWARD_S + computed - per_stage * FORWARD_S
    assert simulate(_scenario(3, K=2)).stages[0].exposed_allreduce_s == pytest.approx(expected, rel=1e-9)


def test_zero3_under_pipelining_accumulates_gradients_from_the_first_backward() -> None:
    """K = 2: a stage's unsharded gradients (4 B a parameter) are held from the end of its first
    backward pass to the end of its last, then its reduced shard (half of them) to the step's end;
    the first backward holds, while layer j runs, the gradients of the layers after j."""
    import numpy as np

    from gpipe_sim.plan.accumulated_gradients import first_backward_transients, gradient_deltas
    from gpipe_sim.schedule import Kind

    plan = compile_plan(_scenario(3, K=2))
    prog, per_stage = plan.program, LAYERS // 2
    at_start, at_end = gradient_deltas(plan)
    transient = first_backward_transients(plan, np.zeros(len(prog.kind)))
    for g in range(plan.num_ranks):
        held, backwards = 0.0, 0
        lo, hi = int(prog.offsets[g]), int(prog.offsets[g + 1])
        count = int(np.sum(prog.kind[lo:hi] == Kind.BACKWARD))
        for i in range(lo, hi):
            held += at_start[i]
            if prog.kind[i] == Kind.BACKWARD:
                backwards += 1
                # while its first layer runs: the later layers' gradients, less the activations
                # (one sample's) they have freed; the uniform layers have no temporaries of their own
                first = (per_stage - 1) * (PARAMS * 4 - ACTIVATION)
                assert transient[i] == (pytest.approx(first) if backwards == 1 else 0.0)
            held += at_end[i]
            expected = 0.0 if backwards == 0 else PARAMS * 4 * per_stage / (2 if backwards == count else 1)
            assert held == pytest.approx(expected), (g, i)
    assert plan.ranks[0].state_bytes == pytest.approx(per_stage * PARAMS * (4 + 8) / 2)  # nothing of it static


def test_zero2_backward_holds_the_previous_layers_reduce_scatter_copy() -> None:
    """FSDP2 keeps a unit's gradient copy (its reduce-scatter's input) until the next unit's
    reduce-scatter: while a layer's backward runs the copy of the layer after it is live. Two layers
    that save nothing: the first's backward holds its own gradient and the second's copy."""
    import numpy as np

    from gpipe_sim.model.model import LayerSpec
    from gpipe_sim.plan.compile import chunk_transient_bytes

    layers = [LayerSpec(name=f"layer{i}", params=PARAMS, transient_bytes=4.0 * PARAMS,
                        forward_s_per_sample=FORWARD_S, backward_s_per_sample=BACKWARD_S) for i in range(2)]
    plain = chunk_transient_bytes(layers, np.array([1.0]))[0]
    copied = chunk_transient_bytes(layers, np.array([1.0]), copied=4.0)[0]
    assert (plain, copied) == (4.0 * PARAMS, 8.0 * PARAMS)


@pytest.mark.parametrize("overlap", [False, True])
def test_zero2_reduce_scatters_every_micro_batch(overlap: bool) -> None:
    """K = 1, M = 4 one-sample micro-batches, D = 2 over one link: each backward pass lasts until its
    gradients are reduce-scattered, and the updated parameters are all-gathered once, after the last.
    Without overlap (DeepSpeed's default) the whole chunk's after each pass; with it (Megatron's
    default bucket, 40M fp32 parameters: one closes every two layers, 200 MB) a bucket (2.005 ms)
    is reduced within the next two layers' backward (4 ms), so each pass exposes the last one's."""
    M = 4
    forward, backward = LAYERS * FORWARD_S, LAYERS * BACKWARD_S
    whole = _half(LAYERS * PARAMS * 4)  # 8.005 ms: a reduce-scatter or an all-gather of the chunk
    exposed = _half(2 * PARAMS * 4) if overlap else whole
    update = compile_plan(_scenario(0)).ranks[0].update_s / 2  # the shard's update
    step = M * (forward + backward + exposed) + whole + update
    zero2 = simulate(_scenario(2, M=M, overlap_grad_reduce=overlap))
    assert zero2.step_time_s == pytest.approx(step, rel=1e-9)
    assert simulate(_scenario(2, M=M, overlap_grad_reduce=overlap), engine="fast").step_time_s == pytest.approx(
        zero2.step_time_s, rel=1e-12)
    assert zero2.stages[0].exposed_allreduce_s == pytest.approx(whole, rel=1e-9)  # the all-gather
    if not overlap:  # ZeRO-1 reduce-scatters once, after the last pass: M - 1 reduce-scatters fewer
        zero1 = simulate(_scenario(1, M=M))
        assert zero2.step_time_s - zero1.step_time_s == pytest.approx((M - 1) * whole, rel=1e-9)


def test_hybrid_sharding_shards_within_a_node_and_all_reduces_across() -> None:
    """D = 4 over two nodes of two devices: shards of S = 2, their gradients all-reduced across the
    two nodes on the network after each reduce-scatter within the node."""
    network = {"bandwidth": "5 GB/s", "latency_s": 5e-6}
    hardware = {"preset": "v100", "devices_per_node": 2, "network": network}
    hsdp = simulate(_scenario(3, D=4, hsdp=True, hardware=hardware))
    stage = hsdp.stages[0]
    assert stage.param_bytes + stage.state_bytes == pytest.approx(LAYERS * PARAMS * ADAM_FP32 / 2, rel=1e-12)
    gather = _half(PARAMS * 4)
    across = 2 * _half(PARAMS * 4 / 2, bandwidth=5e9)
    backward = fsdp_pass_seconds([gather] * LAYERS, [BACKWARD_S] * LAYERS, [gather + across] * LAYERS)
    forward = fsdp_pass_seconds([gather] * LAYERS, [FORWARD_S] * LAYERS)
    update = compile_plan(_scenario(0, D=4, hardware=hardware)).ranks[0].update_s / 2
    assert hsdp.step_time_s == pytest.approx(2 * (forward + backward) + update, rel=1e-9)
    fsdp = simulate(_scenario(3, D=4, hardware=hardware))
    stage = fsdp.stages[0]
    assert stage.param_bytes + stage.state_bytes == pytest.approx(LAYERS * PARAMS * ADAM_FP32 / 4, rel=1e-12)


@pytest.mark.parametrize("training, field", [
    ({"zero": 1, "shard_within_node": True}, "training.shard_within_node"),
    ({"zero": 3, "overlap_grad_reduce": True}, "training.overlap_grad_reduce"),
    ({"zero": 2, "overlap_grad_reduce": True, "overlap_param_gather": True}, "training.overlap_param_gather"),
    ({"zero": 4}, "training.zero"),
])
def test_refused_with_one_line(training: dict, field: str) -> None:
    with pytest.raises(ScenarioError) as info:
        _scenario(**training)
    assert str(info.value).startswith(field) and "\n" not in str(info.value)


@pytest.mark.parametrize("zero", [2, 3])
def test_executor_refuses_what_it_does_not_run(zero: int) -> None:
    """gpipe-exec runs ZeRO 2 and 3 (FSDP2) pipelined with whole backward passes (1F1B here); a
    schedule splitting them (zero-bubble) is refused with one line naming the field."""
    from gpipe_exec.execute import check_model

    scenario = parse_scenario({"model": {"preset": "transformer", "layers": 2, "d_model": 64, "d_ff": 128,
                                         "heads": 2, "seq_len": 16, "vocab": 100},
                               "hardware": {"preset": "v100"},
                               "pipeline": {"stages": 2, "data_parallel": 2, "micro_batches": 2, "batch_size": 4,
                                            "schedule": "1f1b"},
                               "training": {"zero": zero}})
    check_model(scenario)
    with pytest.raises(ScenarioError) as info:
        check_model(scenario.with_updates({"pipeline.schedule": "zb_h1"}))
    assert str(info.value).startswith("training.zero:") and "\n" not in str(info.value)


def test_the_planner_keeps_a_hybrid_sharded_base_at_zero3() -> None:
    """A base sharding within nodes: every configuration ZeRO-3 (shard_within_node needs it), D = 1
    included (nothing to shard there), none refused."""
    from gpipe_sim.planner.search import PlanOptions, search_configurations

    hardware = {"preset": "v100", "devices_per_node": 2, "network": {"bandwidth": "5 GB/s", "latency_s": 5e-6}}
    base = _scenario(3, D=2, hsdp=True, hardware=hardware)
    search = search_configurations(base, PlanOptions(devices=4, schedules=("1f1b",), remat=("none",), max_chunks=1))
    assert search.candidates and all(c.zero == 3 for c in search.candidates)
    assert {c.data_parallel for c in search.candidates} >= {1, 2, 4} and search.infeasible == 0
