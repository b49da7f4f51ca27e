"""Tensor-parallel groups wider than a node (issue 33): T = 16 over two nodes of 8, its ring's
collectives priced over the NICs the group crosses, alike in the simulator and the planner's bound."""

from __future__ import annotations

import pytest

from gpipe_sim.api import simulate
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.plan.tensor_parallel import collective_work, tp_ring
from gpipe_sim.planner.bounds import CostTable
from gpipe_sim.planner.search import PlanOptions, search_configurations, tensor_parallel_values
from gpipe_sim.scenario.scenario import parse_scenario

D_MODEL, S, HEADS = 1024, 512, 16
LINK_BW, LINK_LAT = 100e9, 2e-6
NIC_BW, NET_LAT = 200e9 / 8, 10e-6  # 200 Gb/s NICs


def _scenario(tp: int, nics: int = 2, per: str = "node", **pipeline):
    network = {"bandwidth": "200 Gb/s", "latency_s": NET_LAT, "per": per, **({"nics": nics} if per == "node" else {})}
    return parse_scenario({
        "model": {"preset": "transformer", "layers": 4, "d_model": D_MODEL, "d_ff": 4 * D_MODEL, "heads": HEADS,
                  "seq_len": S, "vocab": 32000},
        "hardware": {"preset": "a100-80gb", "devices_per_node": 8, "network": network,
                     "link": {"bandwidth": LINK_BW, "latency_s": LINK_LAT},
                     "accelerator": {"gpu": {"collective_efficiency": 1.0}}},
        "pipeline": {"stages": 1, "micro_batches": 2, "batch_size": 4, "schedule": "1f1b", "tensor_parallel": tp,
                     **pipeline},
        "training": {"optimizer": "adam", "dtype": "bf16"},
    })


def _all_reduce(nbytes: float, T: int, bandwidth: float, intra: int, inter: int) -> float:
    """NCCL's ring all-reduce: 2(T-1)/T x bytes at the ring's bandwidth, `intra` steps at the
    link's latency and `inter` at the network's (src/graph/tuning.cc)."""
    return 2 * (T - 1) / T * nbytes / bandwidth + intra * LINK_LAT + inter * NET_LAT


@pytest.mark.parametrize("nics, bandwidth", [(2, 2 * NIC_BW), (8, LINK_BW)])
def test_t16_over_two_nodes_of_8_all_reduces_over_the_nics_it_crosses(nics, bandwidth):
    """T=16 on devices 0-15 (nodes 0 and 1): of an all-reduce's 2 x 15 steps, 2 x (2 - 1) = 2
    cross the network and 28 stay in a node; the ring runs at the least of the link (100 GB/s)
    and the NICs a node's 8 devices send through (2 x 25 GB/s, or 8 x 25 GB/s)."""
    T, b = 16, 2
    scenario = _scenario(T, nics)
    assert tp_ring(scenario.hardware, T, 0) == pytest.approx((bandwidth, (14 * LINK_LAT + NET_LAT) / 15))
    ring = _all_reduce(b * S * D_MODEL * 2, T, bandwidth, intra=28, inter=2)
    work = [w[0] for w in collective_work(scenario, 0, [b])]  # embedding, 4 blocks, head
    assert [w.forward_s for w in work[1:-1]] == pytest.approx([2 * ring] * 4, rel=1e-12)
    assert [w.backward_s for w in work[1:-1]] == pytest.approx([2 * ring] * 4, rel=1e-12)
    assert work[0].forward_s == pytest.approx(ring, rel=1e-12)


def test_t8_in_a_node_is_priced_on_the_link_as_before():
    T, b = 8, 2
    scenario = _scenario(T)
    assert tp_ring(scenario.hardware, T, 8) == (LINK_BW, LINK_LAT)
    ring = _all_reduce(b * S * D_MODEL * 2, T, LINK_BW, intra=14, inter=0)
    assert collective_work(scenario, 8, [b])[1][0].forward_s == pytest.approx(2 * ring, rel=1e-12)


def test_a_port_per_device_gives_the_group_a_node_s_ports():
    """`per: device`: each of a node's 8 devices sends through its own 25 GB/s port."""
    assert tp_ring(_scenario(16, per="device").hardware, 16, 0)[0] == min(LINK_BW, 8 * NIC_BW)


def test_t16_simulates_and_its_passes_carry_the_network_collectives():
    """T=16, K=2 on 32 devices: each rank fills two nodes; a wider ring over slower NICs makes
    the step slower than T=16 with NICs as fast as the link."""
    slow, fast = _scenario(16, nics=1, stages=2), _scenario(16, nics=8, stages=2)
    plan = compile_plan(slow)
    assert [int(d) for d in plan.device_map] == [0, 16]
    assert simulate(slow).num_devices == 32
    assert simulate(slow).step_time_s > simulate(fast).step_time_s
    assert simulate(slow).stages[0].tp_comm_s > simulate(fast).stages[0].tp_comm_s > 0


def test_the_planners_bound_prices_the_same_ring():
    """The planner's per-layer collectives (its step-time bound) are the simulator's, T=16 over
    two nodes included; --tensor-parallel 16 is searched on 16 devices and its pick simulates."""
    scenario = _scenario(16, nics=2)
    table = CostTable(scenario, 16, "none")
    for got, want in zip(table.stream_work(2), (w[0] for w in collective_work(scenario, 0, [2]))):
        assert got == want
    options = PlanOptions(devices=16, tensor_parallel=(16,), schedules=("1f1b",), remat=("none",),
                          partitions=("uniform",), max_chunks=1)
    assert tensor_parallel_values(scenario, options) == [16]
    assert tensor_parallel_values(scenario, PlanOptions(devices=16)) == [1, 2, 4, 8]
    search = search_configurations(scenario, options)
    assert search.best is not None and search.best.get("T") == 16 and search.best.max_stage_tp_comm_s > 0
