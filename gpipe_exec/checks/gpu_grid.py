"""The selfcheck's cases (a GPU grid and a CPU grid) and what is predicted of each without a profile:
the hardware preset alone, or the kernel tables `calibrate --gpu-tables` measured."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from gpipe_sim.scenario.scenario import Scenario, parse_scenario

GPU_BOUND_D_MODEL, GPU_BOUND_TOKENS = 2048, 4096  # issue 35's GPU-bound class: d_model and tokens per micro-batch


def transformer(layers: int, d_model: int, seq: int, attention: str = "flash", vocab: int = 8192) -> dict[str, Any]:
    """A zoo transformer's model section: d_ff = 4 d_model, 64-wide heads."""
    return {"preset": "transformer", "layers": layers, "d_model": d_model, "d_ff": 4 * d_model,
            "heads": max(1, d_model // 64), "seq_len": seq, "vocab": vocab, "attention": attention}


def case(model: dict[str, Any], K: int, M: int, batch: int, *, schedule: str = "1f1b", remat: str = "none",
         dtype: str = "bf16", chunks: int = 1, hardware: str = "h100-sxm") -> dict[str, Any]:
    """A scenario with every stage on device 0 and Adam."""
    return {"model": model, "hardware": {"preset": hardware, "stage_to_device": [0] * K},
            "pipeline": {"stages": K, "chunks": chunks, "micro_batches": M, "batch_size": batch,
                         "schedule": schedule, "remat": remat},
            "training": {"optimizer": "adam", "dtype": dtype}}


def gpu_cases() -> list[tuple[str, dict[str, Any]]]:
    """The GPU grid, every stage on GPU 0 (K = 2 and 4 share it): d_model 256-4096, bf16 and fp32
    (TF32 off), flash and standard attention, remat none and always, K = 1, 2, 4, GPipe, 1F1B,
    interleaved and ZB-H1, a host-bound case with one-sample micro-batches, GPU-bound cases
    (d_model >= 2048 and >= 4,096 tokens per micro-batch), an mlp and a convnet. About ten minutes
    on one H100 with the plain loop beside each case; ordered so that a run cut short has covered
    every schedule and the GPU-bound class first."""
    t = transformer
    return [
        ("transformer d2048 bf16 flash K=1", case(t(4, 2048, 2048), 1, 4, 8)),
        ("transformer d4096 bf16 flash K=1", case(t(3, 4096, 4096), 1, 2, 2)),
        ("transformer d2048 bf16 1f1b K=2 on GPU 0", case(t(4, 2048, 2048), 2, 4, 8)),
        ("transformer d1024 bf16 gpipe remat K=4 on GPU 0", case(t(8, 1024, 512), 4, 8, 16, schedule="gpipe",
                                                                remat="always")),
        ("transformer d768 bf16 zb_h1 K=2 on GPU 0", case(t(8, 768, 512), 2, 8, 16, schedule="zb_h1")),
        ("transformer d768 bf16 interleaved v=2 K=2", case(t(8, 768, 512), 2, 4, 8, schedule="interleaved_1f1b",
                                                           chunks=2)),
        ("transformer d256 bf16 1 sample (host-bound) K=1", case(t(4, 256, 128), 1, 8, 8)),
        ("transformer d2048 fp32 standard K=1", case(t(4, 2048, 1024, "standard"), 1, 2, 8, dtype="fp32")),
        ("transformer d2048 bf16 standard remat K=1", case(t(4, 2048, 2048, "standard"), 1, 4, 8, remat="always")),
        ("transformer d1024 bf16 flash K=1", case(t(8, 1024, 1024), 1, 4, 16)),
        ("transformer d512 bf16 flash K=1", case(t(8, 512, 1024), 1, 4, 16)),
        ("transformer d768 fp32 standard remat K=1", case(t(6, 768, 512, "standard"), 1, 4, 8,
                                                          remat="always", dtype="fp32")),
        ("transformer d1024 bf16 1f1b K=2 on GPU 0", case(t(8, 1024, 512), 2, 8, 16)),
        ("mlp w4096 bf16 K=1", case({"preset": "mlp", "layers": 8, "width": 4096, "input_dim": 1024,
                                     "num_classes": 1000}, 1, 4, 256)),
        ("convnet c64 fp32 K=1", case({"preset": "convnet", "layers": 6, "channels": 64, "image_size": 64,
                                       "num_classes": 100}, 1, 4, 64, dtype="fp32")),
    ]


def cpu_cases() -> list[tuple[str, dict[str, Any]]]:
    """The CPU grid: small models that run in seconds, K=1 and K=2 on this machine's cores."""
    tiny = transformer(4, 64, 32, "standard", vocab=256)
    return [
        ("transformer d64 K=1", case(tiny, 1, 4, 8, hardware="cpu", dtype="fp32")),
        ("transformer d64 1f1b K=2", {**case(tiny, 2, 4, 8, hardware="cpu", dtype="fp32"),
                                      "hardware": {"preset": "cpu", "stage_to_device": [0, 1]}}),
        ("mlp w256 K=1", case({"preset": "mlp", "layers": 4, "width": 256, "input_dim": 64, "num_classes": 10},
                              1, 4, 32, hardware="cpu", dtype="fp32")),
    ]


def gpu_bound(scenario: Scenario) -> bool:
    """A transformer with d_model >= 2048 and >= 4,096 tokens in every micro-batch: its kernels, not
    the host's issue of them, set the step's pace."""
    model = scenario.model
    if getattr(model, "preset", None) != "transformer":
        return False
    p = scenario.pipeline
    smallest = (p.batch_size // p.data_parallel) // p.micro_batches
    return model.d_model >= GPU_BOUND_D_MODEL and smallest * model.seq_len >= GPU_BOUND_TOKENS


def with_tables(scenario: Scenario, tables: Path | str) -> Scenario:
    """The scenario on the hardware `calibrate --gpu-tables` wrote (its `hardware:` section), the
    stages placed as before."""
    hardware = dict(yaml.safe_load(Path(tables).read_text())["hardware"])
    data = scenario.to_dict()
    hardware["stage_to_device"] = data["hardware"].get("stage_to_device")
    data["hardware"] = {k: v for k, v in hardware.items() if v is not None}
    return parse_scenario(data)


def model_host_seconds(scenario: Scenario) -> float:
    """The host issue time the GPU model assigns one step's passes (every layer's forward and
    backward launches at `host_issue_s` each, `host_backward_factor` in backward, every
    micro-batch), without the optimizer step; NaN where the accelerator has no kernel tables."""
    from gpipe_sim.plan.balance import micro_batch_sizes
    from gpipe_sim.costs.gpu_model import host_seconds
    from gpipe_sim.model.kernels import LayerKernels
    from gpipe_sim.model.layers import build_layers

    tables = scenario.hardware.accelerator.gpu
    if tables is None:
        return math.nan
    p = scenario.pipeline
    sizes = micro_batch_sizes(p.batch_size // p.data_parallel, p.micro_batches)
    total = 0.0
    dtype_bytes = scenario.training.dtype_bytes
    mask = scenario.hardware.accelerator.dropout_mask_bytes(dtype_bytes)
    for layer in build_layers(scenario.model, dtype_bytes, mask):
        if not isinstance(layer.ops, LayerKernels):
            return math.nan
        for n in sizes:
            total += host_seconds(layer.ops.forward, n, tables)
            total += host_seconds(layer.ops.backward, n, tables, tables.host_backward_factor)
    return total


def profiled_host_seconds(table: dict[str, Any] | None, scenario: Scenario) -> float:
    """The host issue time the profiler measured for one step's passes: every layer's forward and
    backward host seconds at each micro-batch's size (NaN where the table lacks them)."""
    from gpipe_sim.plan.balance import micro_batch_sizes

    if not table:
        return math.nan
    p = scenario.pipeline
    total = 0.0
    for n in micro_batch_sizes(p.batch_size // p.data_parallel, p.micro_batches):
        for row in table.get("layers", []):
            timing = next((t for t in row.get("timings", []) if t.get("micro_batch") == n), None)
            if timing is None or "forward_host_s" not in timing:
                return math.nan
            total += timing["forward_host_s"] + timing["backward_host_s"]
    return total
