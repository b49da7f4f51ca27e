"""FP8 training (`training.dtype: fp8`): FP8 GEMMs, bf16 elsewhere, as Transformer Engine and torchao's float8 train.

What changes against bf16 mixed precision (weights, gradients and activations in bf16, fp32 master
weights and optimizer states, all kept as they are):

- GEMMs run at the accelerator's FP8 rate (`peak_flops.fp8`, the spec sheet's dense figure) with
  the bf16 GEMM table's efficiencies: a GEMM's bf16 time scaled by the spec sheet's bf16 / FP8 rate
  ratio. Derived, not measured. Attention's core (flash or not) and the memory-bound kernels stay
  bf16, as Transformer Engine runs them by default.
- Each weight of a GEMM also has FP8 copies while a step runs: Transformer Engine's Float8Tensor
  keeps a row-wise and, on Hopper, a column-wise (transposed) copy for the backward's GEMMs,
  `FP8_WEIGHT_BYTES` a parameter (counted for every parameter: an upper bound; the amax history and
  scales, a few floats a tensor, are left out).
- The GEMMs' inputs saved for the backward are kept in FP8 (Transformer Engine saves the quantized
  input of Linear, LayerNormLinear and LayerNormMLP): a block's two norm outputs, the attention's
  output (the projection's input) and the MLP's down-projection input keep 1 byte an element
  instead of 2 (`fp8_saved_bytes_per_token`).
"""

from __future__ import annotations

from typing import Any

from gpipe_sim.errors import ScenarioError
from gpipe_sim.model.block_shape import BlockShape
from gpipe_sim.model.model import LayerSpec, TransformerModel

FP8 = "fp8"
FP8_WEIGHT_BYTES = 2  # Float8Tensor: row-wise and column-wise FP8 data, 1 byte each
GEMM_TABLE = "bf16"  # the GEMM table an FP8 GEMM's efficiency is read from


# what a simulation of FP8 training says of its GEMM times (gpipe-sim simulate, on stderr)
DERIVED_NOTE = ("training.dtype fp8: GEMM times are derived (the bf16 GEMM table at the spec sheet's FP8 rate), "
                "not measured")


def check_fp8(scenario: Any) -> None:
    """ScenarioError (one line) for FP8 training on an accelerator without an FP8 rate."""
    accel = scenario.hardware.accelerator
    if scenario.training.dtype == FP8 and FP8 not in accel.peak_flops:
        raise ScenarioError(f"training.dtype: fp8 needs FP8 tensor cores; {accel.name} has no fp8 rate in "
                            "hardware.accelerator.peak_flops (H100 and H200 have: 1,979 TFLOP/s dense)")


def fp8_saved_bytes_per_token(model: TransformerModel, tp: int, sequence_parallel: bool) -> float:
    """Bytes a block saves less per token (one device's share) when its GEMM inputs are kept in
    FP8 rather than bf16: one byte for each element of the two norm outputs (whole, or split over
    T with sequence parallelism), the attention's output and the down-projection's input (split).
    A mixture of experts' block: the attention's side only (the first norm's output and the
    attention's output; its routed MLP's inputs are left in bf16, an upper bound)."""
    b = BlockShape.of(model, tp)
    share = tp if sequence_parallel and tp > 1 else 1
    if getattr(model, "experts", 0):
        return b.d / share + b.q
    return 2 * b.d / share + b.q + b.f_share


def fp8_layers(layers: list[LayerSpec], model: Any, tp: int, sequence_parallel: bool) -> list[LayerSpec]:
    """The layer table with each transformer block's saved GEMM inputs in FP8 (module docstring)."""
    if not isinstance(model, TransformerModel):
        return layers
    less = model.seq_len * fp8_saved_bytes_per_token(model, tp, sequence_parallel)
    return [layer.model_copy(update={"activation_bytes_per_sample": layer.activation_bytes_per_sample - less})
            if layer.name.startswith("block") else layer for layer in layers]


__all__ = ["DERIVED_NOTE", "FP8", "FP8_WEIGHT_BYTES", "GEMM_TABLE", "check_fp8", "fp8_layers", "fp8_saved_bytes_per_token"]
