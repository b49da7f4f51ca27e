"""Fit a GPU's kernel tables (GpuTables) to microbenchmark rows, one figure per hardware feature."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Any, Iterable

from gpipe_sim.costs.gpu_model import flash_seconds, gemm_seconds, memory_seconds
from gpipe_sim.hardware.gpu_tables import GpuTables
from gpipe_sim.model.kernels import Flash, Gemm

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}
# Bytes read plus written per element by the forward kernels the membound rows time.
_MEMBOUND_BYTES = {"add": 3, "copy": 2, "gelu": 2, "softmax": 2, "layernorm": 2}
# A row timed alone (CUDA events around one call) includes the host's dispatch of the call, about
# 15-25 us on the reference H100 (its smallest kernels): rows faster than this time the launch,
# not the kernel, and are left out of the kernel fits.
KERNEL_TIMED_S = 50e-6


def read_rows(paths: Iterable[Path | str]) -> list[dict[str, Any]]:
    """Every JSON line of these files (a microbenchmark's rows, its device line included)."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
    return rows


def relative_errors(pairs: Iterable[tuple[float, float]]) -> list[float]:
    """|predicted / measured - 1| for (predicted, measured) pairs."""
    return [abs(p / m - 1.0) for p, m in pairs if m > 0]


def _median_log_error(pairs: list[tuple[float, float]]) -> float:
    return statistics.median(abs(math.log(p / m)) for p, m in pairs) if pairs else math.inf


def gemm_pairs(rows: list[dict[str, Any]], dtype: str, peak: dict[str, float], bandwidth: float,
               t: GpuTables) -> list[tuple[float, float]]:
    """(predicted, measured) seconds of the `dtype` GEMM rows on tables `t` (tf32 priced as fp32
    at the `tf32` peak when `peak` has one)."""
    out = []
    rate = dict(peak)
    if dtype == "tf32":
        rate = {"fp32": peak.get("tf32", peak["fp32"])}
    for r in rows:
        if r.get("kind") == "gemm" and r["dtype"] == dtype and r["s"] >= KERNEL_TIMED_S:
            g = Gemm("g", r["m"], r["n"], r["k"])
            d = "fp32" if dtype == "tf32" else dtype
            out.append((gemm_seconds(g, 1, d, DTYPE_BYTES[dtype], rate, bandwidth, t), r["s"]))
    return out


def fit_gemm(rows: list[dict[str, Any]], peak: dict[str, float], bandwidth: float, base: GpuTables) -> GpuTables:
    """The GEMM features by grid search on the median |log error|: the shape features (tile
    shares, small_k, unaligned) on the 16-bit rows, then each dtype's efficiency alone."""
    half = "bf16" if any(r.get("dtype") == "bf16" for r in rows if r.get("kind") == "gemm") else "fp16"
    best, best_err = base, math.inf
    for eff, small_k, mid, small, unaligned in itertools.product(
            (0.66, 0.7, 0.74, 0.78, 0.82), (0.0, 128.0, 256.0, 512.0), (0.8, 0.9, 1.0), (0.4, 0.5, 0.6, 0.7),
            (0.15, 0.18, 0.2, 0.22, 0.25)):
        tiles = ((128, 256, 1.0), (128, 128, mid), (64, 128, small))
        t = base.model_copy(update={"gemm_efficiency": {**base.gemm_efficiency, half: eff}, "small_k": small_k,
                                    "gemm_tiles": tiles, "unaligned_efficiency": unaligned})
        err = _median_log_error(gemm_pairs(rows, half, peak, bandwidth, t))
        if err < best_err:
            best, best_err = t, err
    efficiency = dict(best.gemm_efficiency)
    for dtype in ("fp32", "fp16", "bf16"):
        if dtype == half or not any(r.get("dtype") == dtype for r in rows if r.get("kind") == "gemm"):
            continue
        grid = [x / 100 for x in range(30, 101, 2)]
        efficiency[dtype] = min(grid, key=lambda e: _median_log_error(gemm_pairs(
            rows, dtype, peak, bandwidth, best.model_copy(update={"gemm_efficiency": {**efficiency, dtype: e}}))))
    efficiency.setdefault("fp16", efficiency[half])
    efficiency.setdefault("bf16", efficiency[half])
    return best.model_copy(update={"gemm_efficiency": efficiency})


def membound_pairs(rows: list[dict[str, Any]], bandwidth: float, t: GpuTables) -> list[tuple[float, float]]:
    """(predicted, measured) seconds of the forward elementwise rows (add, copy, gelu, softmax,
    layernorm) of 16M elements and more, where the kernel, not its launch, is timed."""
    out = []
    for r in rows:
        if r.get("kind") == "membound" and r.get("dir") == "fwd" and r.get("op") in _MEMBOUND_BYTES \
                and r["elements"] >= 1 << 24:
            nbytes = r["elements"] * r["bytes_per_el"] * _MEMBOUND_BYTES[r["op"]]
            out.append((memory_seconds(nbytes, bandwidth, t), r["s"]))
    return out


def fit_bandwidth(rows: list[dict[str, Any]], bandwidth: float, base: GpuTables) -> GpuTables:
    """Achieved share of the memory bandwidth and the fixed latency of a memory-bound kernel."""
    grid = itertools.product([x / 100 for x in range(50, 101)], [x * 1e-6 for x in range(0, 6)])
    eff, lat = min(grid, key=lambda g: _median_log_error(membound_pairs(
        rows, bandwidth, base.model_copy(update={"bandwidth_efficiency": g[0], "bandwidth_latency_s": g[1]}))))
    return base.model_copy(update={"bandwidth_efficiency": eff, "bandwidth_latency_s": lat})


def flash_pairs(rows: list[dict[str, Any]], peak: dict[str, float], t: GpuTables,
                backward: bool = False) -> list[tuple[float, float]]:
    """(predicted, measured) seconds of the 16-bit flash rows: forward, or forward + backward."""
    out = []
    for r in rows:
        if r.get("kind") == "sdpa" and r["dtype"] in ("bf16", "fp16") and r["fwd_s"] >= KERNEL_TIMED_S:
            f = Flash(r["batch_heads"], r["seq"], r["head_dim"], r["causal"])
            fwd = flash_seconds(f, 1, r["dtype"], peak, t)
            pred = fwd * (1 + t.flash_backward_ratio) if backward else fwd
            out.append((pred, r["fwd_bwd_s"] if backward else r["fwd_s"]))
    return out


def fit_flash(rows: list[dict[str, Any]], peak: dict[str, float], base: GpuTables) -> GpuTables:
    """Flash attention's share of the 16-bit peak (forward rows), then its backward / forward."""
    grid = [x / 100 for x in range(10, 91)]
    eff = min(grid, key=lambda e: _median_log_error(flash_pairs(rows, peak, base.model_copy(
        update={"flash_efficiency": e}))))
    t = base.model_copy(update={"flash_efficiency": eff})
    ratio = min([x / 10 for x in range(10, 61)], key=lambda q: _median_log_error(flash_pairs(
        rows, peak, t.model_copy(update={"flash_backward_ratio": q}), backward=True)))
    return t.model_copy(update={"flash_backward_ratio": ratio})


def fit_step(rows: list[dict[str, Any]], bandwidth: float, base: GpuTables) -> GpuTables:
    """Each optimizer implementation's traffic (multiple of the minimal fp32 Adam traffic: read
    weight, gradient, two states; write weight, two states = 28 bytes a parameter) from the
    AdamW rows of 100M parameters and more."""
    traffic = dict(base.step_traffic)
    achieved = bandwidth * base.bandwidth_efficiency
    for mode in ("foreach", "fused"):
        ratios = [r["s"] * achieved / (28.0 * r["params"]) for r in rows
                  if r.get("kind") == "optimizer" and r.get("opt") == "adamw" and r.get("mode") == mode
                  and r["params"] >= 100_000_000]
        if ratios:
            traffic[mode] = round(statistics.median(ratios), 2)
    traffic["for_loop"] = traffic.get("foreach", traffic.get("for_loop", 1.0))
    return base.model_copy(update={"step_traffic": traffic})


def fit_host(rows: list[dict[str, Any]], base: GpuTables) -> GpuTables:
    """Host time to issue a kernel: the launch row's back-to-back rate (per_kernel_s)."""
    launch = [r["per_kernel_s"] for r in rows if r.get("kind") == "launch"]
    return base.model_copy(update={"host_issue_s": launch[0]}) if launch else base


def fit_tables(rows: list[dict[str, Any]], peak: dict[str, float], bandwidth: float,
               base: GpuTables | None = None) -> GpuTables:
    """All the tables from one device's microbenchmark rows (kinds gemm, membound, sdpa, optimizer,
    launch; any missing kind keeps `base`'s figures)."""
    device = next((r for r in rows if r.get("kind") == "device"), {})
    t = base or GpuTables(gemm_efficiency={"bf16": 0.7, "fp16": 0.7, "fp32": 0.8})
    if device.get("sms"):
        t = t.model_copy(update={"sms": int(device["sms"])})
    t = fit_host(rows, t)
    if any(r.get("kind") == "membound" for r in rows):
        t = fit_bandwidth(rows, bandwidth, t)
    if any(r.get("kind") == "gemm" for r in rows):
        t = fit_gemm(rows, peak, bandwidth, t)
    if any(r.get("kind") == "sdpa" for r in rows):
        t = fit_flash(rows, peak, t)
    if any(r.get("kind") == "optimizer" for r in rows):
        t = fit_step(rows, bandwidth, t)
    return t
