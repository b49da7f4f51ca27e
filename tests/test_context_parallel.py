"""Context parallelism (issue 34): the sequence split over C devices, the key/value ring overlapped
with the attention steps, the gradients reduced over D x C, checked against the formulas."""

from __future__ import annotations

import pytest

from gpipe_sim.api import simulate
from gpipe_sim.errors import ScenarioError
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.plan.context_parallel import cp_link, exposed_ring_seconds, ring_work
from gpipe_sim.plan.layer_table import scenario_layers
from gpipe_sim.plan.replicas import ring_allreduce_seconds
from gpipe_sim.schedule import Kind
from gpipe_sim.model.block_shape import BlockShape
from gpipe_sim.scenario.scenario import parse_scenario

D_MODEL, S, HEADS, KV = 1024, 2048, 16, 4
LINK_BW, LINK_LAT = 100e9, 2e-6
PEAK, EFF = 100e12, 0.5


def _scenario(cp: int, tp: int = 1, preset: str | None = None, remat: str = "none", **pipeline):
    """A Llama-like transformer on a roofline accelerator (no kernel tables: FLOPs at PEAK x EFF)."""
    hardware = ({"preset": preset, "devices_per_node": 8} if preset else
                {"preset": "ideal", "accelerator": {"peak_flops": {"bf16": PEAK, "fp32": PEAK}, "efficiency": EFF,
                                                    "memory_bandwidth": "inf", "kernel_overhead_s": 0.0},
                 "link": {"bandwidth": LINK_BW, "latency_s": LINK_LAT}})
    return parse_scenario({
        "model": {"preset": "transformer", "layers": 4, "d_model": D_MODEL, "d_ff": 4 * D_MODEL, "heads": HEADS,
                  "kv_heads": KV, "seq_len": S, "vocab": 32000, "attention": "flash", "position": "rope",
                  "mlp": "swiglu", "norm": "rmsnorm", "bias": False, "dropout": 0.0},
        "hardware": hardware,
        "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 4, "schedule": "1f1b", "remat": remat,
                     "tensor_parallel": tp, "context_parallel": cp, **pipeline},
        "training": {"optimizer": "adam", "dtype": "bf16"},
    })


@pytest.mark.parametrize("cp, tp", [(2, 1), (4, 1), (2, 2)])
def test_a_block_on_one_of_c_devices_does_a_c_th_of_its_work_and_keeps_a_c_th(cp, tp):
    """Load-balanced causal chunks: every device has s/C tokens and 1/C of the attention, so each
    block's FLOPs (GEMMs 2(s/C) x weights, attention C steps of 4(s/C)^2 q) are the whole
    sequence's over C; flash attention keeps bytes per token, so activations are 1/C; parameters
    are every device's."""
    whole, split = scenario_layers(_scenario(1, tp)), scenario_layers(_scenario(cp, tp))
    b = BlockShape.of(_scenario(1, tp).model, tp)
    for one, part in zip(whole[1:-1], split[1:-1]):
        assert part.forward_flops_per_sample == pytest.approx(b.matmul_flops / cp, rel=1e-12)
        assert part.forward_flops_per_sample == pytest.approx(one.forward_flops_per_sample / cp, rel=1e-12)
        assert part.backward_flops_per_sample == pytest.approx(one.backward_flops_per_sample / cp, rel=1e-12)
        assert part.backward_input_flops_per_sample == pytest.approx(
            one.backward_input_flops_per_sample / cp, rel=1e-12)
        assert part.activation_bytes_per_sample == pytest.approx(one.activation_bytes_per_sample / cp, rel=1e-12)
        assert part.output_bytes_per_sample == one.output_bytes_per_sample / cp
    assert [layer.params for layer in split] == [layer.params for layer in whole]


def test_full_recompute_redoes_the_ring_attention_in_the_backward():
    one, part = scenario_layers(_scenario(1, remat="full"))[1], scenario_layers(_scenario(2, remat="full"))[1]
    assert part.backward_flops_per_sample == pytest.approx(one.backward_flops_per_sample / 2, rel=1e-12)


def test_ring_exposes_only_what_the_transfer_takes_past_each_step():
    assert exposed_ring_seconds(4, 1.0, 0.5) == 0.0
    assert exposed_ring_seconds(4, 1.0, 1.5) == pytest.approx(3 * 0.5)
    assert exposed_ring_seconds(1, 1.0, 9.0) == 0.0


@pytest.mark.parametrize("bandwidth", [1e9, 1e12])
def test_ring_work_is_c_minus_1_exposed_steps_of_k_v_forward_and_k_v_dk_dv_backward(bandwidth):
    """A step computes (s/C) queries against (s/C) keys: 4 (s/C)^2 q FLOPs forward, twice that
    backward; it sends K and V of s/C tokens (2 (s/C) kv x 2 B), backward twice that."""
    cp, b = 4, 2
    scenario = _scenario(cp).with_updates({"hardware.link.bandwidth": bandwidth})
    s, q, kv = S // cp, D_MODEL, KV * D_MODEL // HEADS
    step = 4.0 * s * s * q * b / (PEAK * EFF)
    sent = 2.0 * s * kv * 2 * b
    work = ring_work(scenario, 0, [b])
    forward = (cp - 1) * max(0.0, sent / bandwidth + LINK_LAT - step)
    # ... and the last step's dK, dV (as many bytes as K, V) after the last block, exposed
    backward = (cp - 1) * max(0.0, 2 * sent / bandwidth + LINK_LAT - 2 * step) + sent / bandwidth + LINK_LAT
    assert work[1][0].exposed_forward_s == pytest.approx(forward, rel=1e-12)
    assert work[1][0].exposed_backward_s == pytest.approx(backward, rel=1e-12)
    assert work[0][0].exposed_forward_s == work[-1][0].exposed_backward_s == 0.0
    assert (forward > 0) == (bandwidth < 1e10)


def test_a_slow_ring_adds_its_exposed_seconds_to_each_block_pass():
    cp, b = 2, 2
    fast = compile_plan(_scenario(cp))
    slow_scenario = _scenario(cp).with_updates({"hardware.link.bandwidth": 1e8})
    slow = compile_plan(slow_scenario)
    work = ring_work(slow_scenario, 0, [b])
    # the fast ring still exposes the last dK, dV transfer of each backward (nothing after it to hide it)
    fast_work = ring_work(_scenario(cp), 0, [b])
    assert fast_work[1][0].exposed_forward_s == 0.0 and fast_work[1][0].exposed_backward_s > 0.0
    chunk = fast.chunks[0]  # embedding and two blocks
    blocks = chunk.last_layer - chunk.first_layer
    assert slow.chunks[0].forward_s[0] - chunk.forward_s[0] == pytest.approx(
        blocks * work[1][0].exposed_forward_s, rel=1e-9)
    assert slow.chunks[0].backward_s[0] - chunk.backward_s[0] == pytest.approx(
        blocks * (work[1][0].exposed_backward_s - fast_work[1][0].exposed_backward_s), rel=1e-9)


def test_gradients_are_reduced_over_d_times_c_even_with_one_replica():
    """Megatron-LM reduces over the data-parallel group with context parallelism: C = 2, D = 1
    reduces each chunk's gradients over 2 devices (ring all-reduce on the link), D = 2 over 4."""
    for D, members in ((1, 2), (2, 4)):
        plan = compile_plan(_scenario(2, data_parallel=D))
        prog = plan.program
        assert (prog.kind == Kind.ALLREDUCE).sum() == len(plan.chunks) * D
        expected = [ring_allreduce_seconds(ch.params * 2, members, LINK_BW, LINK_LAT) for ch in plan.chunks]
        assert list(prog.group_seconds) == pytest.approx(expected, rel=1e-12)


def test_the_mesh_counts_t_times_c_devices_per_rank_in_megatrons_order():
    """tp-cp-dp-pp: a rank of one replica takes T x C consecutive devices."""
    scenario = _scenario(2, 2, data_parallel=2)
    assert scenario.mesh.rank_devices == (0, 8, 4, 12)
    assert compile_plan(scenario).num_devices == 2 * 2 * 2 * 2
    assert simulate(scenario).num_devices == 16


def test_the_ring_crosses_the_network_when_t_times_c_fills_more_than_a_node():
    inside = _scenario(4, 2, preset="dgx-h100")
    across = _scenario(4, 4, preset="dgx-h100")
    hw = inside.hardware
    assert cp_link(inside.hardware, 2, 4, 0)[0] == pytest.approx(hw.link.bandwidth * hw.accelerator.gpu.collective_efficiency)
    assert cp_link(across.hardware, 4, 4, 0)[1] == hw.network.latency_s


@pytest.mark.parametrize("updates, field", [
    ({"model.attention": "standard"}, "model.attention:"),
    ({"model.seq_len": 2050}, "model.seq_len:"),
    ({"hardware.preset": "dgx-h100", "model.seq_len": 3072, "pipeline.tensor_parallel": 2,
      "pipeline.context_parallel": 3}, "pipeline.context_parallel:"),
])
def test_what_context_parallelism_cannot_split_is_one_line_naming_the_field(updates, field):
    with pytest.raises(ScenarioError) as exc:
        _scenario(2).with_updates(updates)
    assert str(exc.value).startswith(field) and "\n" not in str(exc.value)


def test_c_1_is_todays_plan():
    base = _scenario(1)
    assert compile_plan(base).chunks[0].forward_s.tolist() == compile_plan(
        parse_scenario({k: v for k, v in base.to_dict().items()})).chunks[0].forward_s.tolist()
    assert not (compile_plan(base).program.kind == Kind.ALLREDUCE).any()


def test_megatron_arguments_carry_the_context_parallel_size_and_its_devices():
    from gpipe_sim.frameworks.megatron import write_megatron

    text = write_megatron(_scenario(2, 2)).text
    assert "--context-parallel-size 2" in text and "--nproc-per-node 8" in text  # T x C x K = 2 x 2 x 2


@pytest.mark.parametrize("D, zero", [(1, 1), (2, 1), (2, 2)])
def test_zero_shards_over_d_times_c_as_megatrons_distributed_optimizer(D, zero):
    """Megatron-LM's distributed optimizer shards over the data-parallel group with context
    parallelism: C = 2 halves each device's optimizer states (and gradients under ZeRO-2) as D = 2 does."""
    from gpipe_sim.plan.sharding import bytes_per_param

    scenario = _scenario(2, data_parallel=D).with_updates({"training.zero": zero})
    plan = compile_plan(scenario)
    weight, other = bytes_per_param(scenario.training, 2 * D, 2 * D, 2, zero)
    for chunk in plan.chunks:
        assert chunk.param_bytes == chunk.params * weight and chunk.state_bytes == pytest.approx(chunk.params * other)


def test_the_bubble_counts_each_timed_rank_for_its_t_times_c_devices():
    """K = 1, one replica on C devices: the bubble is the one rank's idle share of the step (its
    wait for the gradients' C-member all-reduce), not half the devices idle."""
    for cp in (1, 2):
        result = simulate(_scenario(cp).with_updates({"pipeline.stages": 1, "pipeline.micro_batches": 1}))
        assert result.num_devices == cp
        assert result.bubble_fraction == pytest.approx(1 - result.stages[0].busy_s / result.step_time_s)
        assert result.bubble_fraction < 0.1


def test_torchtitan_degrees_written_read_back():
    from gpipe_sim.frameworks.torchtitan import write_torchtitan
    from gpipe_sim.frameworks.torchtitan_read import read_torchtitan

    scenario = _scenario(2, 2)
    read = read_torchtitan(write_torchtitan(scenario).text, scenario)
    assert read.scenario.pipeline.context_parallel == 2
    assert not any("context_parallel_degree" in note for note in read.notes)
