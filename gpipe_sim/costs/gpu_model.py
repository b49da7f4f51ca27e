"""The time of a layer's kernels on a GPU, priced with its kernel tables (`hardware.gpu_tables`)."""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass
from typing import Sequence

from gpipe_sim.hardware.gpu_tables import GpuTables, peak_for
from gpipe_sim.costs.fp8 import FP8, GEMM_TABLE
from gpipe_sim.model.kernels import Flash, Gemm, Kernel, LayerKernels, MemOp, Softmax

# Kernels a torch.optim step launches per parameter tensor (for_loop) or per list (foreach, fused).
STEP_KERNELS: dict[str, int] = {"for_loop": 10, "foreach": 10, "fused": 1}


@dataclass(frozen=True)
class StreamWork:
    """Work a layer's passes put on the GPU's stream besides its own kernels, per micro-batch: the
    tensor-parallel collectives' seconds and launches, forward and backward (the backward's reduce
    input gradients, so they belong to a split backward's input pass)."""

    forward_s: float = 0.0
    backward_s: float = 0.0
    forward_launches: int = 0
    backward_launches: int = 0
    # What a context-parallel ring's key/value transfers (gpipe_sim.plan.context_parallel) and a
    # mixture of experts' all-to-alls (gpipe_sim.plan.experts) add past the compute they overlap:
    # exposed already, so no kernel hides it.
    exposed_forward_s: float = 0.0
    exposed_backward_s: float = 0.0

    def __add__(self, other: "StreamWork") -> "StreamWork":
        """Both works on the stream: every figure summed."""
        return StreamWork(*(a + b for a, b in zip(astuple(self), astuple(other))))


NO_STREAM_WORK = StreamWork()


def gemm_seconds(g: Gemm, samples: int, dtype: str, p: int, peak_flops: dict[str, float], bandwidth: float,
                 t: GpuTables) -> float:
    """One (batched) GEMM: waves of tiles over the SMs, small-k and unaligned penalties, never
    faster than its operands' traffic or the kernel floor."""
    batch, m, n, k = g.shape(samples)
    table = GEMM_TABLE if dtype == FP8 else dtype  # an FP8 GEMM: the bf16 table at the FP8 rate
    rate = peak_for(peak_flops, dtype) * t.gemm_efficiency.get(table, max(t.gemm_efficiency.values()))  # type: ignore[call-overload]
    per_sm = rate / t.sms
    best = math.inf
    for rows, cols, share in t.gemm_tiles:
        tiles = batch * math.ceil(m / rows) * math.ceil(n / cols)
        waves = math.ceil(tiles / t.sms)
        best = min(best, waves * 2.0 * rows * cols * k / (per_sm * share))
    best *= (k + t.small_k) / k
    if m % 8 or n % 8 or k % 8:
        best /= t.unaligned_efficiency
    traffic = batch * (m * k + k * n + m * n) * p
    return max(t.kernel_floor_s, best, memory_seconds(traffic, bandwidth, t))


def memory_seconds(nbytes: float, bandwidth: float, t: GpuTables) -> float:
    """A memory-bound kernel moving `nbytes`: fixed latency, then the achieved bandwidth."""
    return max(t.kernel_floor_s, t.bandwidth_latency_s + nbytes / (bandwidth * t.bandwidth_efficiency))


def flash_seconds(f: Flash, samples: int, dtype: str, peak_flops: dict[str, float], t: GpuTables) -> float:
    """Fused attention: tiles of 128 queries of one (sample, head) in waves over the SMs, at
    `flash_efficiency` of the 16-bit peak (fp32 inputs: the fp32 rate); the backward
    `flash_backward_ratio` times the forward; a context-parallel ring's `steps` one after another."""
    rate = peak_for(peak_flops, dtype if dtype == "fp32" else "bf16") * t.flash_efficiency
    # one tile per 128 queries of a (sample, head), in waves over the SMs
    samples = max(1, samples)
    tiles = f.heads * samples * math.ceil(f.seq / 128)
    waves = math.ceil(tiles / t.sms)
    per_tile = f.flops(samples) / tiles
    forward = max(t.kernel_floor_s, waves * per_tile / (rate / t.sms))
    return f.steps * (forward * t.flash_backward_ratio if f.backward else forward)


def kernel_seconds(kernel: Kernel, samples: int, dtype: str, p: int, peak_flops: dict[str, float],
                   bandwidth: float, t: GpuTables) -> float:
    """GPU time of one kernel on a micro-batch of `samples`."""
    if isinstance(kernel, Gemm):
        return gemm_seconds(kernel, samples, dtype, p, peak_flops, bandwidth, t)
    if isinstance(kernel, Flash):
        return flash_seconds(kernel, samples, dtype, peak_flops, t)
    if isinstance(kernel, Softmax):
        return math.fsum(memory_seconds(b, bandwidth, t) for b in kernel.kernel_bytes(samples))
    assert isinstance(kernel, MemOp)
    return memory_seconds(kernel.bytes_per_sample * samples + kernel.bytes_fixed, bandwidth, t)


def pass_seconds(kernels: Sequence[Kernel], samples: int, dtype: str, p: int, peak_flops: dict[str, float],
                 bandwidth: float, t: GpuTables, host_factor: float = 1.0, stream_s: float = 0.0,
                 stream_launches: int = 0, beside: tuple[str, ...] = ()) -> float:
    """A pass over `kernels`: max(the GPU's time, the host's time to issue them). `stream_s`: seconds
    of collectives the pass puts on the GPU (tensor parallelism's: NCCL kernels, which the host
    issues without waiting for), issued with `stream_launches` more launches, and run beside the
    kernels named in `beside` (what those take hides as much of them)."""
    times = [kernel_seconds(k, samples, dtype, p, peak_flops, bandwidth, t) for k in kernels]
    hidden = math.fsum(x for k, x in zip(kernels, times) if getattr(k, "name", None) in beside) if beside else 0.0
    gpu = math.fsum(times) + max(0.0, stream_s - hidden)
    return max(gpu, host_seconds(kernels, samples, t, host_factor, stream_launches))


def host_seconds(kernels: Sequence[Kernel], samples: int, t: GpuTables, host_factor: float = 1.0,
                 stream_launches: int = 0) -> float:
    """The host's time to issue a pass over `kernels` (and `stream_launches` collectives) on a
    micro-batch of `samples`: one `host_issue_s` per launch, `host_factor` times that in backward."""
    launches = sum(k.launches(samples) if isinstance(k, Softmax) else 1 for k in kernels) + stream_launches
    return launches * t.host_issue_s * host_factor


def layer_pass_seconds(recipe: LayerKernels, samples: int, dtype: str, p: int, peak_flops: dict[str, float],
                       bandwidth: float, t: GpuTables, stream: StreamWork | None = None) -> tuple[float, float]:
    """(forward, backward) seconds of a layer's kernels and the `stream` work its passes add
    (`pass_seconds`), costed once per (layer kernels, micro-batch size, dtype, stream work) on
    these tables."""
    work = stream or NO_STREAM_WORK
    key = (recipe, samples, dtype, p, bandwidth, peak_for(peak_flops, dtype), work)
    hit = t._cache.get(key)
    if hit is None:
        hit = (pass_seconds(recipe.forward, samples, dtype, p, peak_flops, bandwidth, t,
                            stream_s=work.forward_s, stream_launches=work.forward_launches) + work.exposed_forward_s,
               pass_seconds(recipe.backward, samples, dtype, p, peak_flops, bandwidth, t, t.host_backward_factor,
                            work.backward_s, work.backward_launches, recipe.beside_collectives)
               + work.exposed_backward_s)
        t._cache[key] = hit
    return hit


def step_seconds(params: int, tensors: int, state_bytes_per_param: float, mode: str, bandwidth: float,
                 t: GpuTables) -> float:
    """An optimizer step over `params` parameters in `tensors` tensors: its traffic at the achieved
    bandwidth (`step_traffic` by implementation), and its kernels' issue (one list per step for
    foreach and fused, every tensor for for_loop)."""
    if not params:
        return 0.0
    traffic = params * state_bytes_per_param * t.step_traffic.get(mode, 1.0)  # type: ignore[call-overload]
    launches = STEP_KERNELS.get(mode, 1) * (max(1, tensors) if mode == "for_loop" else 1)
    gpu = traffic / (bandwidth * t.bandwidth_efficiency) + launches * t.kernel_floor_s
    return max(gpu, launches * t.host_issue_s)
