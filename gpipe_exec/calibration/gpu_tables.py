"""Measure a GPU's kernel tables (gpipe-exec calibrate --gpu-tables) and write a hardware YAML gpipe-sim takes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import yaml

from gpipe_sim.costs.gpu_fit import fit_tables

# A grid small enough to run in well under 3 minutes on one GPU: sizes from the H100 reference set.
GEMM_SIZES = (256, 1024, 2048, 4096, 8192)
GEMM_ODD_N = 50257
MEMBOUND_ELEMENTS = (1 << 20, 1 << 24, 1 << 26)
OPTIMIZER_PARAMS = (100_000_000,)
SDPA_SHAPES = ((16, 2048, 64), (64, 2048, 64), (16, 4096, 128))  # (batch x heads, seq, head_dim)


def _timer(torch: Any, fn: Callable[[], Any], repeats: int = 10) -> float:
    """Median seconds of `fn` on the current CUDA stream (CUDA events, after two warm-up calls)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def device_row(torch: Any) -> dict[str, Any]:
    """The device line: name, SMs, the capacity it reports."""
    props = torch.cuda.get_device_properties(0)
    return {"kind": "device", "name": props.name, "sms": props.multi_processor_count,
            "mem_bytes": props.total_memory, "torch": torch.__version__}


def gemm_rows(torch: Any) -> list[dict[str, Any]]:
    """bf16 and fp32 `a @ b` over the size grid, and the vocabulary-like odd n."""
    rows = []
    for dtype, tdt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        shapes = [(m, n, k) for m in GEMM_SIZES for n in GEMM_SIZES for k in GEMM_SIZES if m * n * k <= 1 << 36]
        shapes += [(m, GEMM_ODD_N, 1024) for m in (1024, 4096)]
        for m, n, k in shapes:
            a = torch.randn(m, k, device="cuda", dtype=tdt)
            b = torch.randn(k, n, device="cuda", dtype=tdt)
            s = _timer(torch, lambda: a @ b, repeats=5)
            rows.append({"kind": "gemm", "dtype": dtype, "m": m, "n": n, "k": k, "flops": 2 * m * n * k, "s": s})
    return rows


def membound_rows(torch: Any) -> list[dict[str, Any]]:
    """Forward add, copy and gelu over the element grid, and the launch rate of tiny kernels."""
    F = torch.nn.functional
    rows = []
    for elements in MEMBOUND_ELEMENTS:
        x = torch.randn(elements, device="cuda", dtype=torch.bfloat16)
        y = torch.randn_like(x)
        for op, fn in (("add", lambda: x + y), ("copy", lambda: x.clone()), ("gelu", lambda: F.gelu(x))):
            rows.append({"kind": "membound", "op": op, "dir": "fwd", "dtype": "bf16", "elements": elements,
                         "bytes_per_el": 2, "s": _timer(torch, fn)})
    tiny = torch.zeros(16, device="cuda")

    def launches() -> None:
        for _ in range(1000):
            tiny.add_(1.0)
    per = _timer(torch, launches, repeats=3) / 1000
    rows.append({"kind": "launch", "what": "1000 tiny add_ launched back to back", "per_kernel_s": per})
    return rows


def sdpa_rows(torch: Any) -> list[dict[str, Any]]:
    """Flash attention forward and forward + backward, causal and not."""
    F = torch.nn.functional
    rows = []
    for bh, seq, hd in SDPA_SHAPES:
        for causal in (False, True):
            q, k, v = (torch.randn(1, bh, seq, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            fwd = _timer(torch, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
            both = _timer(torch, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward())
            rows.append({"kind": "sdpa", "dtype": "bf16", "head_dim": hd, "seq": seq, "batch_heads": bh,
                         "causal": causal, "fwd_s": fwd, "fwd_bwd_s": both})
    return rows


def optimizer_rows(torch: Any) -> list[dict[str, Any]]:
    """AdamW steps, foreach and fused, on fp32 parameters."""
    rows = []
    for params in OPTIMIZER_PARAMS:
        p = torch.nn.Parameter(torch.zeros(params, device="cuda"))
        p.grad = torch.zeros_like(p)
        for mode in ("foreach", "fused"):
            opt = torch.optim.AdamW([p], **{mode: True})
            rows.append({"kind": "optimizer", "opt": "adamw", "mode": mode, "params": params,
                         "s": _timer(torch, opt.step, repeats=5)})
    return rows


def measure_rows() -> list[dict[str, Any]]:
    """Every microbenchmark on CUDA device 0 (about a minute on an H100)."""
    import torch

    if not torch.cuda.is_available():
        from gpipe_sim.errors import GpipeError
        raise GpipeError("--gpu-tables: no CUDA device (the kernel tables are measured on a GPU)")
    from gpipe_exec.launch.devices import configure_cuda_math

    configure_cuda_math()  # TF32 off, as the executor and the profiler run fp32
    return [device_row(torch), *gemm_rows(torch), *membound_rows(torch), *sdpa_rows(torch), *optimizer_rows(torch)]


def hardware_yaml(rows: list[dict[str, Any]], peak_flops: dict[str, float], memory_bandwidth: float,
                  reserve: float = 0.06) -> dict[str, Any]:
    """A hardware section (accelerator with fitted `gpu` tables) from measured rows; the memory is
    the capacity the device reports less `reserve` (CUDA context, workspaces, fragmentation)."""
    device = next((r for r in rows if r.get("kind") == "device"), {})
    tables = fit_tables(rows, peak_flops, memory_bandwidth)
    gpu = tables.model_dump(mode="json")
    gpu["gemm_tiles"] = [list(t) for t in gpu["gemm_tiles"]]
    accel: dict[str, Any] = {"name": device.get("name", "GPU"), "peak_flops": dict(peak_flops),
                             "memory_bandwidth": memory_bandwidth, "gpu": gpu}
    if device.get("mem_bytes"):
        accel["memory_bytes"] = int(device["mem_bytes"])
        accel["usable_memory_fraction"] = round(1.0 - reserve, 4)
    return {"accelerator": accel}


def calibrate_gpu_tables(out: Path | str, preset: str, rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Measure (unless `rows` are given), fit and write `out`: `hardware:` with `preset` (its peak
    rates and bandwidth, the datasheet's) and the fitted accelerator fields."""
    from gpipe_sim.hardware.hardware import Hardware

    base = Hardware.model_validate({"preset": preset}).accelerator
    bandwidth = base.memory_bandwidth
    started = time.monotonic()
    measured = rows if rows is not None else measure_rows()
    hardware = {"preset": preset, **hardware_yaml(measured, dict(base.peak_flops), bandwidth)}
    seconds = time.monotonic() - started
    header = (f"# gpipe-exec calibrate --gpu-tables: kernel tables measured on this GPU "
              f"({len(measured)} rows, {seconds:.0f} s) and fitted by gpipe_sim.costs.gpu_fit\n")
    Path(out).write_text(header + yaml.safe_dump({"hardware": hardware}, sort_keys=False))
    return hardware
