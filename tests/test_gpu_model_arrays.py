"""The kernel model over an array of micro-batch sizes equals the scalar one bit for bit: every
kernel, pass and layer of every preset model on every GPU's kernel tables, with and without stream
work, and the planner's cost table priced all sizes at once equals it priced one size at a time."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gpipe_sim.costs import gpu_model, gpu_model_arrays as arrays
from gpipe_sim.costs.gpu_model import StreamWork
from gpipe_sim.costs.layer_time import layer_pass_times, layer_pass_times_over
from gpipe_sim.costs.twins import twins
from gpipe_sim.hardware.presets import hardware_presets
from gpipe_sim.model.kernels import LayerKernels, Softmax
from gpipe_sim.model.model import MODEL_PRESETS, TransformerModel
from gpipe_sim.plan.layer_table import layer_table
from gpipe_sim.planner.bounds import CostTable
from gpipe_sim.scenario.scenario import parse_scenario

GPUS = sorted(name for name, preset in hardware_presets().items() if "gpu" in (preset.get("accelerator") or {}))
MODELS = [name for name in MODEL_PRESETS if name != "table"]  # a table has no kernels
SIZES = [1, 2, 3, 4, 5, 6, 7, 9, 12, 16, 31, 64, 255, 1024]
# (T, remat, C): whole layers, split ones with the fallback softmax at odd sizes (16 heads / 8),
# re-computed ones, and a context-parallel ring's attention
SPLITS = [(1, "none", 1), (8, "full", 1), (2, "selective", 2)]


def _scenario(model: str, gpu: str, dtype: str):
    return parse_scenario({"model": {"preset": model}, "hardware": {"preset": gpu},
                           "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": 8},
                           "training": {"dtype": dtype}})


def _streams(rng: random.Random) -> list[StreamWork | None]:
    """Stream work at each size: none, or collectives and exposed seconds of either size."""
    return [None if rng.random() < 0.3 else StreamWork(rng.choice([0.0, rng.uniform(0, 2e-3)]),
                                                       rng.uniform(0, 5e-3), rng.randrange(4), rng.randrange(4),
                                                       rng.choice([0.0, rng.uniform(0, 1e-3)]),
                                                       rng.choice([0.0, rng.uniform(0, 1e-3)]))
            for _ in SIZES]


def _kernel_layers(scenario, tp: int, remat: str, cp: int):
    layers = layer_table(scenario, tp, remat, cp if isinstance(scenario.model, TransformerModel) else 1)
    return [layers[i] for i in sorted(set(twins(layers))) if isinstance(layers[i].ops, LayerKernels)]


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("dtype", ["bf16", "fp32", "fp8"])
def test_every_preset_layer_priced_over_sizes_equals_the_scalar_model(gpu, dtype):
    rng = random.Random(f"{gpu}/{dtype}")
    samples = np.array(SIZES, dtype=np.int64)
    unfused = 0
    for model in MODELS:
        scenario = _scenario(model, gpu, dtype)
        accel, p = scenario.hardware.accelerator, scenario.training.dtype_bytes
        args = (dtype, p, accel.peak_flops, accel.memory_bandwidth)
        for split in SPLITS:
            for layer in _kernel_layers(scenario, *split):
                ops = layer.ops
                for kernel in {*ops.forward, *ops.backward}:
                    got = arrays.kernel_seconds(kernel, samples, *args, accel.gpu).tolist()
                    assert got == [gpu_model.kernel_seconds(kernel, b, *args, accel.gpu) for b in SIZES], kernel
                    if isinstance(kernel, Softmax):
                        unfused += sum(not kernel.fused(b) for b in SIZES)
                streams = _streams(rng)
                fresh = accel.gpu.model_copy()  # the scalar prices afresh, not from a cache
                want = [gpu_model.layer_pass_seconds(ops, b, *args, fresh, w) for b, w in zip(SIZES, streams)]
                forward, backward = arrays.layer_pass_seconds(ops, samples, *args, accel.gpu, streams)
                assert list(zip(forward.tolist(), backward.tolist())) == want, (model, layer.name, split)
                host = arrays.host_seconds(ops.backward, samples, accel.gpu, 2.0, 3).tolist()
                assert host == [gpu_model.host_seconds(ops.backward, b, accel.gpu, 2.0, 3) for b in SIZES]
    assert unfused  # the fallback softmax's fsum was compared too


@pytest.mark.parametrize("gpu, model", [("h100-sxm", "transformer"), ("v100", "transformer"), ("a100-80gb", "mlp")])
def test_layer_pass_times_over_sizes_equals_one_size_at_a_time(gpu, model):
    """Kernel tables priced in one array pass, the roofline (no tables) one size at a time."""
    scenario = _scenario(model, gpu, "bf16")
    accel, rng = scenario.hardware.accelerator, random.Random(gpu)
    for layer in layer_table(scenario, 2, "full"):
        streams = _streams(rng)
        got = layer_pass_times_over(layer, SIZES, accel, "bf16", 2, streams)
        assert got == [layer_pass_times(layer, b, accel, "bf16", 2, w) for b, w in zip(SIZES, streams)]
        assert layer_pass_times_over(layer, SIZES, accel, "bf16", 2) == [
            layer_pass_times(layer, b, accel, "bf16", 2) for b in SIZES]


@pytest.mark.parametrize("tensor_parallel, context_parallel", [(1, 1), (2, 1), (2, 2)])
def test_cost_table_priced_at_once_equals_one_size_at_a_time(tensor_parallel, context_parallel):
    base = parse_scenario({
        "model": {"preset": "llama3-8b", "layers": 4, "seq_len": 1024},
        "hardware": {"preset": "dgx-h100"},
        "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": 64}, "training": {"dtype": "bf16"}})
    at_once = CostTable(base, tensor_parallel, context_parallel=context_parallel)
    one_by_one = CostTable(base, tensor_parallel, context_parallel=context_parallel)
    sizes = [1, 2, 3, 5, 8, 13, 21, 32, 64]
    at_once.price(sizes)
    for b in sizes:
        assert at_once.times(b).tolist() == one_by_one.times(b).tolist()
        assert at_once.times(b).flags.c_contiguous
    if tensor_parallel == context_parallel == 1:  # the kernels alone are the times
        assert all(at_once.compute_times(b) is at_once.times(b) for b in sizes)
