"""A GPU's kernel-level cost tables and the time of a layer's kernels on it."""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass
from typing import Any, Literal, Sequence

from pydantic import Field, PrivateAttr

from gpipe_sim.spec.fields import Fraction, Seconds, _Strict
from gpipe_sim.spec.fp8 import FP8, GEMM_TABLE
from gpipe_sim.spec.kernels import Flash, Gemm, Kernel, LayerKernels, MemOp, Softmax

Dtype = Literal["fp32", "bf16", "fp16"]
OptimizerStep = Literal["for_loop", "foreach", "fused"]

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


class GpuTables(_Strict):
    """What a GPU's kernels achieve, by feature (each preset figure names its source).

    GEMMs: the output is cut in tiles (`gemm_tiles`: rows, columns, the tile's share of the
    GEMM peak), the tiles run in waves over the `sms` multiprocessors (a partial wave costs a
    whole one), the cheapest tiling wins; a GEMM with inner size k runs at k / (k + small_k) of
    that, one with a size not a multiple of 8 at `unaligned_efficiency`. Memory-bound kernels move
    their bytes at `bandwidth_efficiency` x memory_bandwidth after a fixed `bandwidth_latency_s`.
    Every kernel takes at least `kernel_floor_s` on the GPU; the host needs `host_issue_s` to
    issue a forward kernel (`host_backward_factor` times that in backward, autograd's engine), and
    a pass takes max(GPU time, host time): the host queues kernels ahead of the GPU, so whichever
    is slower sets the pace.
    """

    sms: int = Field(132, ge=1, le=100_000)
    gemm_efficiency: dict[Dtype, Fraction]  # share of accelerator.peak_flops for full tiles, large k
    gemm_tiles: tuple[tuple[int, int, Fraction], ...] = ((128, 256, 1.0), (128, 128, 0.9), (64, 128, 0.5))
    small_k: float = Field(256.0, ge=0)
    unaligned_efficiency: Fraction = 0.2
    bandwidth_efficiency: Fraction = 0.85
    bandwidth_latency_s: Seconds = 2.0e-6
    kernel_floor_s: Seconds = 3.0e-6
    host_issue_s: Seconds = 6.0e-6
    host_backward_factor: float = Field(2.0, ge=0)
    flash_efficiency: Fraction = 0.5  # flash attention forward, share of the 16-bit peak
    flash_backward_ratio: float = Field(2.5, ge=0)  # its backward / its forward
    # Bytes an optimizer step moves, as a multiple of one read of the weights, gradients and
    # states and one write of the weights and states, by torch.optim's implementation.
    # The share of a link's bandwidth the tensor-parallel ring collectives (NCCL's) achieve between
    # the devices of a node (gpipe_sim.plan.tensor_parallel); the data-parallel rings take the link's.
    collective_efficiency: Fraction = 1.0
    step_traffic: dict[OptimizerStep, float] = Field(
        default_factory=lambda: {"for_loop": 2.5, "foreach": 2.5, "fused": 1.0})

    _cache: dict = PrivateAttr(default_factory=dict)  # (layer kernels, samples, ...) -> seconds

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> "GpuTables":
        """A copy with its own (empty) cache of priced layers."""
        copied = super().model_copy(update=update, deep=deep)
        copied._cache = {}
        return copied


def peak_for(peak_flops: dict[str, float], dtype: str) -> float:
    """The peak FLOP/s for `dtype` in `peak_flops`: its entry, else the highest given
    (`Accelerator.peak_flops_for`: the cost model's rate and the MFU's denominator)."""
    return peak_flops.get(dtype) or max(peak_flops.values())


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
