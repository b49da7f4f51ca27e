"""Cluster presets (issue 33): a node as its vendor sells it, its accelerator taken from an
accelerator preset (`base`), its NICs written as sold (gigabits per second)."""

from __future__ import annotations

import numpy as np
import pytest

from gpipe_sim import simulate
from gpipe_sim.cli import main
from gpipe_sim.errors import ScenarioError
from gpipe_sim.hardware.hardware import Hardware
from gpipe_sim.hardware.presets import _over, _resolved, hardware_presets
from gpipe_sim.scenario.scenario import parse_scenario
from gpipe_sim.summary import _nodes

GBIT = 1e9 / 8  # bytes/s in one Gb/s

# preset: (base, devices a node, NICs a node, Gb/s a NIC, GPU-to-GPU link in bytes/s a direction)
CLUSTERS = {
    "dgx-a100": ("a100-80gb", 8, 8, 200, 150e9),  # DGX A100: 8 x 200 Gb/s HDR; the a100 preset's achieved link
    "dgx-h100": ("h100-sxm", 8, 8, 400, 450e9),   # DGX H100: 8 x 400 Gb/s NDR; NVLink 4 a direction
    "hgx-h200": ("h200", 8, 8, 400, 450e9),
    "gb200-nvl72": ("h100-sxm", 72, 72, 400, 900e9),  # NVLink 5: 1.8 TB/s a GPU, both directions
}
NCCL_NET_RING_LATENCY_S = 9.6e-6  # NCCL src/graph/tuning.cc, hwLat[NET][Ring][Simple]


def _hardware(preset: str) -> Hardware:
    return Hardware.model_validate({"preset": preset})


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_cluster_presets_are_the_vendors_nodes(name):
    base, per_node, nics, gbits, link = CLUSTERS[name]
    hw = _hardware(name)
    assert hw.devices_per_node == per_node
    assert (hw.network.per, hw.network.nics) == ("node", nics)
    assert hw.network.bandwidth == gbits * GBIT
    assert hw.network.latency_s == NCCL_NET_RING_LATENCY_S
    assert hw.link.bandwidth == link
    # one NIC a GPU: each device sends between nodes through its own NIC
    assert list(hw.network_ports(np.arange(per_node), per_node)) == list(range(per_node))
    assert base in hardware_presets()[name]["source"]


@pytest.mark.parametrize("name", ["dgx-a100", "dgx-h100", "hgx-h200"])
def test_a_node_of_known_gpus_takes_its_accelerator_and_host_from_the_accelerator_preset(name):
    base = CLUSTERS[name][0]
    assert _hardware(name).accelerator == _hardware(base).accelerator
    assert _hardware(name).host == _hardware(base).host


def test_gb200_is_blackwell_figures_over_h100_kernel_tables_marked_derived():
    b200, h100 = _hardware("gb200-nvl72").accelerator, _hardware("h100-sxm").accelerator
    rack = 72
    assert b200.peak_flops == {"fp32": 5760e12 / rack, "bf16": 360e15 / 2 / rack, "fp16": 360e15 / 2 / rack,
                               "fp8": 720e15 / 2 / rack}
    assert b200.memory_bytes == pytest.approx(13.4e12 / rack, rel=1e-3)
    assert b200.memory_bandwidth == 576e12 / rack
    assert b200.gpu.sms == 148
    assert b200.gpu.model_dump(exclude={"sms"}) == h100.gpu.model_dump(exclude={"sms"})
    assert (b200.efficiency, b200.kernel_overhead_s, b200.usable_memory_fraction) == \
        (h100.efficiency, h100.kernel_overhead_s, h100.usable_memory_fraction)
    data = hardware_presets()["gb200-nvl72"]
    assert "DERIVED, NOT MEASURED" in data["source"] and "derived" in data["description"]


def test_a_scenario_overrides_a_cluster_preset_field_by_field():
    hw = Hardware.model_validate({"preset": "dgx-h100", "network": {"nics": 4}, "accelerator": {"memory_bytes": "40 GB"}})
    assert (hw.network.nics, hw.network.bandwidth, hw.network.per, hw.devices_per_node) == (4, 400 * GBIT, "node", 8)
    assert hw.accelerator.memory_bytes == 40e9 and hw.accelerator.peak_flops["bf16"] == 989e12
    assert Hardware.model_validate({"preset": "dgx-h100", "network": None}).network is None


def test_nodes_smaller_than_the_preset_s_nics_are_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text("hardware: {preset: dgx-h100, devices_per_node: 4}\n")
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "network.nics: 8 NICs for nodes of 4 devices" in err and len(err.splitlines()) == 1
    with pytest.raises(ScenarioError):
        parse_scenario({"hardware": {"preset": "gb200-nvl72", "devices_per_node": 8}})


def test_base_presets_merge_mappings_field_by_field_and_refuse_loops():
    raw = {"a": {"accelerator": {"name": "A", "gpu": {"sms": 1, "small_k": 2}}, "link": {"bandwidth": 1}},
           "b": {"base": "a", "accelerator": {"gpu": {"sms": 3}}, "devices_per_node": 8},
           "c": {"base": "c"}, "d": {"base": "nowhere"}}
    assert _resolved("b", raw, ()) == {"accelerator": {"name": "A", "gpu": {"sms": 3, "small_k": 2}},
                                       "link": {"bandwidth": 1}, "devices_per_node": 8}
    assert raw["a"]["accelerator"]["gpu"]["sms"] == 1  # the base is not changed
    for name in ("c", "d"):
        with pytest.raises(ValueError, match=f"hardware preset '{name}': base"):
            _resolved(name, raw, ())
    assert _over({"x": {"y": 1}}, {"x": 2}) == {"x": 2}


def test_presets_lists_the_cluster_presets_nodes(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for name in CLUSTERS:
        assert name in out
    assert [_nodes(_hardware(name)) for name in ("dgx-a100", "dgx-h100", "gb200-nvl72", "h100-sxm")] == \
        ["8/node, 8x200 Gb/s", "8/node, 8x400 Gb/s", "72/node, 72x400 Gb/s", "-"]


@pytest.mark.parametrize("name", ["dgx-a100", "dgx-h100"])
def test_two_nodes_pipeline_sends_cross_at_a_nic_each(name):
    """K=2, D=8 on two nodes (stage 0's replicas on node 0, stage 1's on node 1): the eight 1 GB
    sends of each direction cross together, each through its own NIC, so the step is the same
    step over a free network plus a forward and a backward send at the NIC's rate and latency."""
    def step(network):
        return simulate(parse_scenario({
            "model": {"preset": "uniform", "layers": 2, "forward_s_per_sample": 1e-9, "backward_s_per_sample": 2e-9,
                      "params_per_layer": 1, "activation_bytes_per_sample": 1.0, "output_bytes_per_sample": 1.0e9},
            "hardware": {"preset": name, **network},
            "pipeline": {"stages": 2, "data_parallel": 8, "micro_batches": 1, "batch_size": 8, "schedule": "1f1b"},
            "training": {"dtype": "bf16"},
        })).step_time_s

    nic = CLUSTERS[name][3] * GBIT
    free = step({"network": {"bandwidth": "inf", "latency_s": 0}})
    assert step({}) - free == pytest.approx(2 * (1e9 / nic + NCCL_NET_RING_LATENCY_S), rel=1e-9)
