"""`gpu_model`'s kernel model over an array of micro-batch sizes at once, equal bit for bit to the scalar one.

Every figure is the scalar function's, operation for operation: IEEE +, -, *, / and the integer
products (exact below 2**53, as every size here is) give the same doubles elementwise in NumPy;
`math.ceil` of a quotient is `np.ceil` of the same double; the order of each expression is the
scalar's; and where the scalar sums with `math.fsum` (a pass over its kernels, the fallback
softmax's kernels) the sum is `math.fsum` per size. `tests/test_gpu_model_arrays.py` checks every
preset model's layers on every GPU's kernel tables against the scalar functions.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from gpipe_sim.costs.fp8 import FP8, GEMM_TABLE
from gpipe_sim.costs.gpu_model import NO_STREAM_WORK, StreamWork
from gpipe_sim.hardware.gpu_tables import GpuTables, peak_for
from gpipe_sim.model.kernels import Flash, Gemm, Kernel, LayerKernels, MemOp, Softmax


def memory_seconds(nbytes: np.ndarray, bandwidth: float, t: GpuTables) -> np.ndarray:
    """`gpu_model.memory_seconds` of each of `nbytes`."""
    return np.maximum(t.kernel_floor_s, t.bandwidth_latency_s + nbytes / (bandwidth * t.bandwidth_efficiency))


def gemm_seconds(g: Gemm, samples: np.ndarray, dtype: str, p: int, peak_flops: dict[str, float],
                 bandwidth: float, t: GpuTables) -> np.ndarray:
    """`gpu_model.gemm_seconds` at each of `samples`."""
    batch, m, n, k = g.shape_of(np.maximum(samples, 1))
    table = GEMM_TABLE if dtype == FP8 else dtype
    rate = peak_for(peak_flops, dtype) * t.gemm_efficiency.get(table, max(t.gemm_efficiency.values()))  # type: ignore[call-overload]
    per_sm = rate / t.sms
    best = np.full(len(samples), math.inf)
    for rows, cols, share in t.gemm_tiles:
        tiles = batch * np.ceil(m / rows) * np.ceil(n / cols)
        waves = np.ceil(tiles / t.sms)
        best = np.minimum(best, waves * 2.0 * rows * cols * k / (per_sm * share))
    best = best * ((k + t.small_k) / k)
    unaligned = (np.asarray(m) % 8 != 0) | (np.asarray(n) % 8 != 0) | (np.asarray(k) % 8 != 0)
    best = np.where(unaligned, best / t.unaligned_efficiency, best)
    traffic = batch * (m * k + k * n + m * n) * p
    return np.maximum(np.maximum(t.kernel_floor_s, best), memory_seconds(traffic, bandwidth, t))


def flash_seconds(f: Flash, samples: np.ndarray, dtype: str, peak_flops: dict[str, float],
                  t: GpuTables) -> np.ndarray:
    """`gpu_model.flash_seconds` at each of `samples`."""
    rate = peak_for(peak_flops, dtype if dtype == "fp32" else "bf16") * t.flash_efficiency
    s = np.maximum(samples, 1)
    tiles = f.heads * s * math.ceil(f.seq / 128)
    waves = np.ceil(tiles / t.sms)
    per_tile = f.flops(s) / tiles
    forward = np.maximum(t.kernel_floor_s, waves * per_tile / (rate / t.sms))
    return f.steps * (forward * t.flash_backward_ratio if f.backward else forward)


def softmax_seconds(kernel: Softmax, samples: np.ndarray, bandwidth: float, t: GpuTables) -> np.ndarray:
    """`gpu_model.kernel_seconds` of a `Softmax` at each of `samples`: the fused kernel's, or the
    fsum of the fallback's kernels (per size, as the scalar sums them)."""
    s = np.maximum(samples, 1)
    elements = kernel.score_elements(s).astype(float)
    fused = kernel.fused_of(s)
    out = memory_seconds(elements * kernel.fused_bytes, bandwidth, t)
    if not fused.all():
        parts = [memory_seconds(elements * b, bandwidth, t).tolist() for b in kernel.unfused_bytes]
        out = np.where(fused, out, [math.fsum(column) for column in zip(*parts)])
    return out


def kernel_seconds(kernel: Kernel, samples: np.ndarray, dtype: str, p: int, peak_flops: dict[str, float],
                   bandwidth: float, t: GpuTables) -> np.ndarray:
    """`gpu_model.kernel_seconds` at each of `samples`."""
    if isinstance(kernel, Gemm):
        return gemm_seconds(kernel, samples, dtype, p, peak_flops, bandwidth, t)
    if isinstance(kernel, Flash):
        return flash_seconds(kernel, samples, dtype, peak_flops, t)
    if isinstance(kernel, Softmax):
        return softmax_seconds(kernel, samples, bandwidth, t)
    assert isinstance(kernel, MemOp)
    return memory_seconds(kernel.bytes_per_sample * samples + kernel.bytes_fixed, bandwidth, t)


def pass_seconds(kernels: Sequence[Kernel], samples: np.ndarray, dtype: str, p: int,
                 peak_flops: dict[str, float], bandwidth: float, t: GpuTables, host_factor: float = 1.0,
                 stream_s: np.ndarray | float = 0.0, stream_launches: np.ndarray | int = 0,
                 beside: tuple[str, ...] = ()) -> np.ndarray:
    """`gpu_model.pass_seconds` at each of `samples` (`stream_s`, `stream_launches`: per size or
    one for all): the kernels' times summed per size by `math.fsum`, as the scalar sums them."""
    columns = list(zip(*(kernel_seconds(k, samples, dtype, p, peak_flops, bandwidth, t).tolist()
                         for k in kernels))) or [()] * len(samples)
    hidden: np.ndarray | float = 0.0
    if beside:
        near = [getattr(k, "name", None) in beside for k in kernels]
        hidden = np.array([math.fsum(x for x, h in zip(column, near) if h) for column in columns], dtype=float)
    gpu = np.array([math.fsum(column) for column in columns], dtype=float) + np.maximum(0.0, stream_s - hidden)
    return np.maximum(gpu, host_seconds(kernels, samples, t, host_factor, stream_launches))


def host_seconds(kernels: Sequence[Kernel], samples: np.ndarray, t: GpuTables, host_factor: float = 1.0,
                 stream_launches: np.ndarray | int = 0) -> np.ndarray:
    """`gpu_model.host_seconds` at each of `samples`."""
    s = np.maximum(samples, 1)
    launches = np.zeros(len(samples), dtype=np.int64)
    for k in kernels:
        launches = launches + (np.where(k.fused_of(s), 1, len(k.unfused_bytes)) if isinstance(k, Softmax) else 1)
    return (launches + stream_launches) * t.host_issue_s * host_factor


def layer_pass_seconds(recipe: LayerKernels, samples: np.ndarray, dtype: str, p: int,
                       peak_flops: dict[str, float], bandwidth: float, t: GpuTables,
                       streams: Sequence[StreamWork | None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`gpu_model.layer_pass_seconds` at each of `samples`: (forward, backward) arrays, with
    `streams[j]` the stream work at `samples[j]` (none where None)."""
    works = [w or NO_STREAM_WORK for w in (streams or [None] * len(samples))]
    column = lambda field: np.array([getattr(w, field) for w in works])  # noqa: E731
    forward = pass_seconds(recipe.forward, samples, dtype, p, peak_flops, bandwidth, t,
                           stream_s=column("forward_s"), stream_launches=column("forward_launches"))
    backward = pass_seconds(recipe.backward, samples, dtype, p, peak_flops, bandwidth, t, t.host_backward_factor,
                            column("backward_s"), column("backward_launches"), recipe.beside_collectives)
    return forward + column("exposed_forward_s"), backward + column("exposed_backward_s")


__all__ = ["flash_seconds", "gemm_seconds", "host_seconds", "kernel_seconds", "layer_pass_seconds",
           "memory_seconds", "pass_seconds", "softmax_seconds"]
