"""A GPU's kernel tables: what its GEMMs, memory-bound kernels, attention and host achieve, by feature."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PrivateAttr

from gpipe_sim.schema.fields import Fraction, Seconds, _Strict

Dtype = Literal["fp32", "bf16", "fp16"]
OptimizerStep = Literal["for_loop", "foreach", "fused"]


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
