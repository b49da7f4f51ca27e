"""The network per node (issue 26): NICs shared by a node's devices, used by the pipeline's sends
and the all-reduce rings between nodes; the per-device reading stays the default."""

from __future__ import annotations

import pytest

from gpipe_sim import ScenarioError, parse_scenario, simulate
from gpipe_sim.plan.compile import compile_plan

GB = 1e9


def _scenario(network, *, K, D, placement=None, params=1, output=1.0e9):
    """A model that does nearly nothing but move bytes: 2 nodes of 8 devices, NVLink free."""
    hardware = {"preset": "ideal", "devices_per_node": 8, "network": network,
                **({"placement": placement} if placement else {})}
    return parse_scenario({
        "model": {"preset": "uniform", "layers": 8, "forward_s_per_sample": 1e-9, "backward_s_per_sample": 2e-9,
                  "params_per_layer": params, "activation_bytes_per_sample": 1.0, "output_bytes_per_sample": output},
        "hardware": hardware,
        "pipeline": {"stages": K, "data_parallel": D, "micro_batches": 1, "batch_size": D, "schedule": "1f1b"},
        "training": {"dtype": "bf16"},
    })


ONE_NIC = {"bandwidth": "1 GB/s", "per": "node", "nics": 1}
EIGHT_NICS = {"bandwidth": "1 GB/s", "per": "node", "nics": 8}
PER_DEVICE = {"bandwidth": "1 GB/s"}


def test_one_nic_per_node_makes_pipeline_sends_between_nodes_8x_slower():
    """K=2, D=8: stage 0's replicas on node 0, stage 1's on node 1; the eight sends of each
    direction cross together: through one NIC they take turns, through eight they do not."""
    steps = {name: simulate(_scenario(net, K=2, D=8)).step_time_s
             for name, net in (("one", ONE_NIC), ("eight", EIGHT_NICS), ("device", PER_DEVICE))}
    assert steps["eight"] == pytest.approx(2.0, rel=1e-3)  # 1 GB forward, 1 GB back at 1 GB/s
    # one NIC: node 0's eight 1 GB sends take 8 s in turn (8x the 1 s of a NIC each), then the last
    # replica's backward send 1 s through node 1's NIC (the others' overlapped the forward sends)
    assert steps["one"] == pytest.approx(8.0 + 1.0, rel=1e-3)
    assert steps["device"] == pytest.approx(steps["eight"], rel=1e-9)  # the default reading: a port each
    keys = compile_plan(_scenario(ONE_NIC, K=2, D=8)).program.link
    per_device = compile_plan(_scenario(PER_DEVICE, K=2, D=8)).program.link
    assert len(set(keys[keys >= 0])) < len(set(per_device[per_device >= 0]))


def test_one_nic_per_node_makes_rings_between_nodes_8x_slower():
    """K=8, D=2 placed so that every stage's two replicas sit on different nodes: eight rings
    cross at once. One NIC: they take turns; eight NICs: each ring runs on all eight (8x the
    bandwidth) and they take turns, as fast in all as one port per device."""
    placement = [list(range(8)), list(range(8, 16))]
    exposed = {name: simulate(_scenario(net, K=8, D=2, placement=placement, params=GB, output=1.0))
               .exposed_allreduce_s for name, net in (("one", ONE_NIC), ("eight", EIGHT_NICS), ("device", PER_DEVICE))}
    assert exposed["eight"] > 0
    assert exposed["one"] / exposed["eight"] == pytest.approx(8.0, rel=0.05)
    assert exposed["device"] == pytest.approx(exposed["eight"], rel=0.05)


@pytest.mark.parametrize("network, match", [
    ({"bandwidth": "1 GB/s", "nics": 2}, "per: node"),
    ({"bandwidth": "1 GB/s", "per": "node", "nics": 9}, "nics"),
    ({"bandwidth": "1 GB/s", "per": "rack"}, "per"),
])
def test_network_mistakes_are_named(network, match):
    with pytest.raises(ScenarioError, match=match):
        _scenario(network, K=2, D=8)


@pytest.mark.parametrize("network, share", [(ONE_NIC, 0.5), ({**ONE_NIC, "nics": 2}, 1.0), (PER_DEVICE, 1.0)])
def test_tensor_parallel_rings_share_the_nodes_nics(network, share):
    """T = 2, D = 2 over 2 nodes of 2 devices: each replica's 2 devices all-reduce their own
    shard's gradients at once, so 2 rings leave each node: through one NIC per node each gets half
    of it, through two NICs or a port per device a whole one."""
    from gpipe_sim.plan.replicas import ring_allreduce_seconds

    scenario = parse_scenario({
        "model": {"preset": "transformer", "layers": 2, "d_model": 64, "d_ff": 256, "heads": 4, "seq_len": 16,
                  "vocab": 128},
        "hardware": {"preset": "a100-80gb", "devices_per_node": 2, "network": network},
        "pipeline": {"stages": 1, "data_parallel": 2, "tensor_parallel": 2, "micro_batches": 1, "batch_size": 2},
        "training": {"dtype": "bf16"},
    })
    plan = compile_plan(scenario)
    assert scenario.mesh.rank_devices == (0, 2)  # the two replicas on the two nodes
    chunk = plan.chunks[0]
    expected = ring_allreduce_seconds(chunk.params * 2, 2, 1 * GB * share, scenario.hardware.network.latency_s)
    assert plan.program.group_seconds[0] == pytest.approx(expected)
