"""Mixture of experts and expert parallelism (issue 34): parameters (total and active) of the presets
against their published counts and an independent count, a MoE block's figures, the all-to-alls,
DualPipeV's overlap and the expert gradients' smaller reduction group."""

from __future__ import annotations

import pytest

from gpipe_sim.api import model_figures, simulate
from gpipe_sim.errors import ScenarioError
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.plan.experts import all_to_all_seconds, all_to_all_work
from gpipe_sim.plan.layer_table import scenario_layers
from gpipe_sim.plan.replicas import ring_allreduce_seconds
from gpipe_sim.costs.layer_time import layer_seconds
from gpipe_sim.model.model_flops import active_parameters
from gpipe_sim.scenario.scenario import parse_scenario

LINK_BW, LINK_LAT, NET_BW, NET_LAT = 100e9, 2e-6, 25e9, 10e-6
MOE = {"preset": "transformer", "layers": 4, "d_model": 512, "d_ff": 1536, "heads": 8, "kv_heads": 2, "seq_len": 1024,
       "vocab": 1024, "attention": "flash", "mlp": "swiglu", "norm": "rmsnorm", "position": "rope", "bias": False,
       "dropout": 0.0, "experts": 8, "top_k": 2, "expert_d_ff": 768, "shared_experts": 1, "first_dense_layers": 1}


def _scenario(ep: int = 1, D: int = 4, schedule: str = "1f1b", chunks: int = 1, **model):
    return parse_scenario({
        "model": {**MOE, **model},
        "hardware": {"preset": "h100-sxm", "devices_per_node": 4,
                     "link": {"bandwidth": LINK_BW, "latency_s": LINK_LAT},
                     "network": {"bandwidth": NET_BW, "latency_s": NET_LAT}},
        "pipeline": {"stages": 2, "chunks": chunks, "micro_batches": 4, "batch_size": 4 * D, "schedule": schedule,
                     "data_parallel": D, "expert_parallel": ep},
        "training": {"dtype": "bf16", "optimizer": "adam"},
    })


def _preset(name: str):
    return parse_scenario({"model": {"preset": name}, "hardware": {"preset": "h100-sxm"},
                           "pipeline": {"stages": 4, "micro_batches": 4, "batch_size": 4}, "training": {"dtype": "bf16"}})


def _counted(L, d, heads, kv, vocab, dense_layers, d_ff, experts, top_k, f_e, shared):
    """An independent count from the published configuration: per block the attention (q, k, v,
    o without biases), two RMSNorm weights, and a SwiGLU MLP (3 d f) or a MoE (router d x experts,
    each expert 3 d f_e, the shared ones too); embedding and untied head, the final norm."""
    head_dim = d // heads
    attention = d * heads * head_dim * 2 + 2 * d * kv * head_dim + 2 * d
    expert = 3 * d * f_e
    moe = L - dense_layers
    total = L * attention + dense_layers * 3 * d * d_ff + moe * (d * experts + (experts + shared) * expert)
    total += 2 * vocab * d + d
    active = total - moe * (experts - top_k) * expert
    return total, active


@pytest.mark.parametrize("name, config, published, tolerance", [
    ("mixtral-8x7b", (32, 4096, 32, 8, 32000, 0, 14336, 8, 2, 14336, 0), (46.7e9, 12.9e9), (0.005, 0.005)),
    # MLA approximated as multi-head attention: about 1.1B more active parameters (see the preset)
    ("deepseek-v3-like", (61, 7168, 128, 128, 129280, 3, 18432, 256, 8, 2048, 1), (671e9, 37e9), (0.005, 0.05)),
])
def test_preset_parameters_total_and_active(name, config, published, tolerance):
    scenario = _preset(name)
    total = model_figures(scenario).parameters
    assert (total, active_parameters(scenario.model, total)) == _counted(*config)
    assert total == pytest.approx(published[0], rel=tolerance[0])
    assert active_parameters(scenario.model, total) == pytest.approx(published[1], rel=tolerance[1])


def test_llama3_70b_128k_is_llama3_70b_at_131072_tokens():
    long, short = _preset("llama3-70b-128k").model, _preset("llama3-70b").model
    assert long.seq_len == 131072 and long.model_copy(update={"seq_len": 8192}) == short


@pytest.mark.parametrize("ep", [1, 2, 4])
def test_a_moe_block_holds_its_local_experts_and_runs_the_active_ones(ep):
    """A MoE block: the dense block's attention and norms, the router (d x 8), the shared expert,
    8 / E routed experts; forward FLOPs 2 s x (router + shared MLP) + 2 (s top_k) x expert MLP on
    top of the attention's; block 0 (first_dense_layers 1) is dense."""
    layers = scenario_layers(_scenario(ep))
    dense = scenario_layers(_scenario(1, experts=0))
    s, d, f_e, f = 1024, 512, 768, 1536
    expert = 3 * d * f_e
    assert layers[1] == dense[1]  # the dense first block
    block, plain = layers[2], dense[2]
    assert block.expert_params == (8 // ep) * expert
    assert block.params == plain.params - 3 * d * f + d * 8 + expert + (8 // ep) * expert
    assert block.forward_flops_per_sample == pytest.approx(
        plain.forward_flops_per_sample - 2 * s * 3 * d * f + 2 * s * d * 8 + 2 * s * expert + 2 * (2 * s) * expert)


def test_all_to_all_is_the_slower_of_the_in_node_and_network_peers():
    """E = 8 over two nodes of 4: each device's bytes split 8 ways; 3 peers in its node over the
    link, 4 across over the network."""
    hw = _scenario(8, D=8).hardware
    nbytes = 8e6
    assert all_to_all_seconds(hw, range(8), nbytes) == pytest.approx(
        max(3 * nbytes / 8 / LINK_BW, 4 * nbytes / 8 / NET_BW) + NET_LAT)
    assert all_to_all_seconds(hw, range(4), nbytes) == pytest.approx(3 * nbytes / 4 / LINK_BW + LINK_LAT)
    assert all_to_all_seconds(hw, [0], nbytes) == 0.0


def test_each_moe_block_pays_two_all_to_alls_a_pass_and_dense_layers_none():
    scenario = _scenario(2)
    b = 1
    one = all_to_all_seconds(scenario.hardware, [0, 1], 1024 * 2 * 512 * 2 * b)  # rows x d x 2 B
    work = all_to_all_work(scenario, 0, [b])
    assert [w[0].exposed_forward_s for w in work] == pytest.approx([0, 0, 2 * one, 2 * one, 2 * one, 0])
    assert work[3][0].exposed_backward_s == pytest.approx(2 * one)
    assert all_to_all_work(_scenario(1), 0, [b]) is None


def test_under_sequence_parallelism_each_tensor_rank_dispatches_its_tokens_and_the_rows_are_gathered():
    """T = 2 under sequence parallelism (Megatron-LM's expert tensor parallelism of T): each
    tensor rank's all-to-alls carry its 1/T of the tokens' rows, and the MoE block gathers the
    routed rows of the s tokens over T and sums the experts' partial outputs back (two halves each
    way), its attention and shared experts as the dense block's; dense blocks unchanged."""
    from gpipe_sim.model.tensor_parallel import HALF, transformer_collectives

    sc = _scenario(2).with_updates({"pipeline.tensor_parallel": 2, "pipeline.sequence_parallel": True})
    one = all_to_all_seconds(sc.hardware, sc.mesh.expert_members(0), 512 * 2 * 512 * 2)  # 1,024 / 2 tokens x 2
    assert all_to_all_work(sc, 0, [1])[2][0].exposed_forward_s == pytest.approx(2 * one)
    m = sc.model
    act, rows = 1024 * 512 * 2.0, 1024 * 2 * 512 * 2.0
    moe = transformer_collectives(m, 2, True, 2)[2]
    assert moe.forward == ((HALF, act),) * 4 + ((HALF, rows),) * 2
    assert moe.backward == ((HALF, act),) * 6 + ((HALF, rows),) * 2
    assert transformer_collectives(m, 2, True, 2)[1] == transformer_collectives(
        m.model_copy(update={"experts": 0}), 2, True, 2)[1]  # block 0 is dense
    routed_only = transformer_collectives(m.model_copy(update={"shared_experts": 0}), 2, True, 2)[2]
    assert routed_only.forward == ((HALF, act),) * 2 + ((HALF, rows),) * 2 and len(routed_only.backward) == 5


def test_dualpipev_hides_the_all_to_alls_behind_the_paired_pass():
    """A forward's all-to-alls run beside the other micro-batch's backward: only what exceeds
    that backward's compute is charged (and a backward's beyond the forward's)."""
    slow = _scenario(2, schedule="dualpipev", chunks=2).with_updates({"hardware.link.bandwidth": 1e8})
    layers = scenario_layers(slow)
    work = all_to_all_work(slow, 0, [1], own=layers)
    fwd, bwd = layer_seconds(layers[2], 1, slow.hardware.accelerator, "bf16", 2)
    one = all_to_all_seconds(slow.hardware, [0, 1], 1024 * 2 * 512 * 2)
    assert work[2][0].exposed_forward_s == pytest.approx(max(0.0, 2 * one - bwd))
    assert work[2][0].exposed_backward_s == pytest.approx(max(0.0, 2 * one - fwd))
    plain = all_to_all_work(slow.with_updates({"pipeline.schedule": "interleaved_1f1b"}), 0, [1], own=layers)
    assert plain[2][0].exposed_forward_s == pytest.approx(2 * one)


def test_expert_gradients_are_reduced_over_d_over_e_and_the_rest_over_d():
    ep, D = 2, 4
    plan = compile_plan(_scenario(ep, D))
    for ch, seconds in zip(plan.chunks, plan.program.group_seconds):
        experts = sum(layer.expert_params for layer in plan.layers[ch.first_layer:ch.last_layer + 1])
        assert experts > 0
        expected = (ring_allreduce_seconds((ch.params - experts) * 2, D, LINK_BW, LINK_LAT)
                    + ring_allreduce_seconds(experts * 2, D // ep, LINK_BW, LINK_LAT))
        assert seconds == pytest.approx(expected, rel=1e-12)


def test_expert_parallelism_spreads_the_weights_and_keeps_the_model_figures():
    one, two = simulate(_scenario(1)), simulate(_scenario(2))
    assert two.parameters == one.parameters and two.mfu is not None
    assert max(s.param_bytes for s in two.stages) < max(s.param_bytes for s in one.stages)


@pytest.mark.parametrize("updates, start", [
    ({"pipeline.expert_parallel": 3, "model.experts": 9}, "pipeline.expert_parallel:"),  # 3 does not divide D=4
    ({"pipeline.expert_parallel": 4, "model.experts": 6}, "model.experts:"),
    ({"pipeline.expert_parallel": 2, "model.experts": 0}, "pipeline.expert_parallel:"),
    ({"model.top_k": 9}, "model.top_k:"),
])
def test_what_experts_cannot_split_is_one_line_naming_the_field(updates, start):
    with pytest.raises(ScenarioError) as exc:
        _scenario(1).with_updates(updates)
    assert str(exc.value).startswith(start) and "\n" not in str(exc.value)


def test_the_executor_runs_experts_with_zero_and_refuses_overlap_at_e2_in_one_line():
    pytest.importorskip("torch")
    from gpipe_exec.execute import check_model

    for zero in (0, 1, 2):
        check_model(_scenario(1).with_updates({"training.zero": zero}))
        check_model(_scenario(2).with_updates({"training.zero": zero}))
    with pytest.raises(ScenarioError, match=r"^model\.experts: gpipe-exec runs a mixture of experts at") as exc:
        check_model(_scenario(2).with_updates({"training.overlap_grad_reduce": True}))
    assert "\n" not in str(exc.value)


def test_megatron_arguments_carry_the_experts_and_their_parallelism():
    from gpipe_sim.frameworks.megatron import write_megatron

    text = write_megatron(_scenario(2)).text
    for flag in ("--num-experts 8", "--moe-router-topk 2", "--moe-ffn-hidden-size 768",
                 "--moe-shared-expert-intermediate-size 768", "--moe-layer-freq '[0,1,1,1]'",
                 "--expert-model-parallel-size 2"):
        assert flag in text


@pytest.mark.parametrize("zero", [1, 3])
def test_zero_shards_the_experts_over_the_d_over_e_replicas_that_hold_them(zero):
    """Each routed expert lives on D / E replicas: ZeRO shards its states over those, not over D
    (Megatron-LM's expert-data-parallel group)."""
    from gpipe_sim.plan.sharding import bytes_per_param

    scenario = _scenario(2, D=4).with_updates({"training.zero": zero, "pipeline.stages": 1, "pipeline.schedule": "1f1b"})
    plan = compile_plan(scenario)
    t = scenario.training
    dense_w, dense_s = bytes_per_param(t, 4, 4, 1)
    expert_w, expert_s = bytes_per_param(t, 2, 2, 1)
    chunk = plan.chunks[0]
    experts = sum(layer.expert_params for layer in plan.layers)
    assert chunk.state_bytes == pytest.approx((chunk.params - experts) * dense_s + experts * expert_s)
    assert chunk.param_bytes == pytest.approx((chunk.params - experts) * dense_w + experts * expert_w)


@pytest.mark.parametrize("cp", [1, 2])
def test_megatron_arguments_written_read_back_are_the_same_scenario(cp):
    """write_megatron then read_megatron on the same hardware: the experts, E and C come back."""
    from gpipe_sim.frameworks.megatron import write_megatron
    from gpipe_sim.frameworks.megatron_read import read_megatron

    scenario = _scenario(2).with_updates({"pipeline.context_parallel": cp, "hardware.devices_per_node": 16,
                                          "model.capacity_factor": 1.5})
    read = read_megatron(write_megatron(scenario).text, scenario).scenario
    assert read.model == scenario.model
    p, q = read.pipeline, scenario.pipeline
    assert (p.context_parallel, p.expert_parallel, p.data_parallel) == (q.context_parallel, q.expert_parallel,
                                                                        q.data_parallel)
