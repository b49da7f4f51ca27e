"""The cost model: measured timings interpolate, small micro-batches are less efficient."""

from __future__ import annotations

import pytest

from gpipe_sim import parse_scenario, simulate
from gpipe_sim.costs.layer_time import layer_seconds, measured_host_seconds, measured_seconds
from gpipe_sim.hardware.hardware import Accelerator
from gpipe_sim.model.model import LayerSpec

CPU = Accelerator(peak_flops={"fp32": 1e11}, efficiency=0.5, kernel_overhead_s=1e-4)


def _measured(points):
    return LayerSpec(name="l", timings=[{"micro_batch": b, "forward_s": f, "backward_s": 2 * f}
                                        for b, f in points])


def test_timings_are_exact_at_measured_sizes_and_linear_between():
    layer = _measured([(1, 1.0e-3), (4, 2.5e-3), (16, 8.5e-3)])
    assert layer_seconds(layer, 4, CPU, "fp32", 4) == pytest.approx((2.5e-3, 5.0e-3))
    assert layer_seconds(layer, 10, CPU, "fp32", 4)[0] == pytest.approx(2.5e-3 + 6 * 0.5e-3)
    # Beyond the largest measurement: the last segment's slope.
    assert layer_seconds(layer, 32, CPU, "fp32", 4)[0] == pytest.approx(8.5e-3 + 16 * 0.5e-3)


def test_measured_small_micro_batches_cost_more_per_sample():
    layer = _measured([(1, 1.0e-3), (8, 2.0e-3), (64, 10.0e-3)])
    per_sample = [layer_seconds(layer, b, CPU, "fp32", 4)[0] / b for b in (1, 2, 8, 32, 64)]
    assert per_sample == sorted(per_sample, reverse=True)


def test_flops_layers_pay_a_kernel_overhead_per_micro_batch():
    layer = LayerSpec(name="l", forward_flops_per_sample=1e6, backward_flops_per_sample=2e6, kernels=3)
    f1, b1 = layer_seconds(layer, 1, CPU, "fp32", 4)
    assert f1 == pytest.approx(3e-4 + 1e6 / 5e10)
    assert b1 == pytest.approx(6e-4 + 2e6 / 5e10)


def test_too_many_micro_batches_lower_throughput_when_kernels_have_overhead():
    layers = [{"name": f"l{i}", "forward_flops_per_sample": 2e6, "backward_flops_per_sample": 4e6,
               "kernels": 4, "output_bytes_per_sample": 1e3, "activation_bytes_per_sample": 1e4}
              for i in range(8)]

    def throughput(m):
        return simulate(parse_scenario({
            "model": {"preset": "table", "layers": layers},
            "hardware": {"preset": "cpu", "accelerator": {"memory_bandwidth": "inf"}},
            "pipeline": {"stages": 4, "micro_batches": m, "batch_size": 64, "remat": "none"},
        })).throughput_samples_per_s

    best = max((throughput(m), m) for m in (1, 2, 4, 8, 16, 32, 64))
    assert 1 < best[1] < 64, "the optimum lies between no micro-batching and one sample each"
    assert throughput(64) < best[0]


def test_host_issue_times_follow_the_device_times_rule_outside_the_measured_sizes():
    """One interpolation rule for every timings column: host seconds measured equal to the device
    seconds give the device seconds at every size, inside, below and beyond the measurements."""
    for points in ([(2, 1.0e-3)], [(2, 1.0e-3), (8, 2.0e-3)], [(1, 1.0e-3), (4, 2.5e-3), (16, 8.5e-3)]):
        layer = LayerSpec(name="l", timings=[
            {"micro_batch": b, "forward_s": f, "backward_s": 2 * f, "forward_host_s": f, "backward_host_s": 2 * f}
            for b, f in points])
        for b in (1, 2, 3, 8, 16, 40):
            assert measured_host_seconds(layer, b) == layer_seconds(layer, b, CPU, "fp32", 4)
    one = LayerSpec(name="l", timings=[{"micro_batch": 2, "forward_s": 1.0, "backward_s": 2.0,
                                         "forward_host_s": 0.5, "backward_host_s": 0.25}])
    assert measured_host_seconds(one, 8) == (2.0, 1.0)  # one measurement scales proportionally
    assert measured_host_seconds(_measured([(2, 1.0)]), 8) == (0.0, 0.0)  # none measured


def test_below_the_smallest_measurement_time_is_not_under_proportional_scaling():
    # the first segment's line gives 1.0 - 1 * 1.0 = 0 at one sample; half of 2 samples' 1.0 is more
    assert measured_seconds([2, 4], [1.0, 3.0], 1) == 0.5
    assert measured_seconds([2, 4], [1.0, 3.0], 6) == 5.0  # beyond: the last segment's line
    assert measured_seconds([2, 4], [1.0, 0.1], 40) == 0.0  # never below zero


def test_ring_collectives_take_nccls_ring_formula():
    """An all-reduce of B bytes among n devices: 2(n-1)/n x B / bandwidth + 2(n-1) x latency; a
    reduce-scatter or all-gather (share 0.5) half; bytes per sample times the samples; 0 alone."""
    from gpipe_sim.costs.collectives import collective_seconds

    B, n, bw, lat = 3e6, 4, 2e9, 1e-5
    assert collective_seconds(((1.0, B),), 2, n, bw, lat) == pytest.approx(2 * 3 / 4 * 2 * B / bw + 6 * lat)
    assert collective_seconds(((0.5, B), (1.0, B)), 1, n, bw, lat) == pytest.approx(1.5 * (1.5 * B / bw + 6 * lat))
    assert collective_seconds(((1.0, B),), 1, 1, bw, lat) == 0.0
