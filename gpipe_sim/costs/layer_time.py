"""The cost model: how long a layer takes for a micro-batch on an accelerator."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from gpipe_sim.costs import gpu_model_arrays as arrays
from gpipe_sim.costs.gpu_model import NO_STREAM_WORK, StreamWork, layer_pass_seconds, step_seconds
from gpipe_sim.hardware.hardware import Accelerator
from gpipe_sim.model.kernels import LayerKernels
from gpipe_sim.model.model import LayerSpec


# The share of a backward pass that computes the input gradient (zero-bubble's I pass) when a layer
# says nothing else; the rest is the weight gradients (W). A matmul's two gradients each cost as
# much as its forward.
BACKWARD_INPUT_SHARE = 0.5


def layer_seconds(
    layer: LayerSpec, micro_batch: int, accelerator: Accelerator, dtype: str, dtype_bytes: int,
    stream: StreamWork | None = None,
) -> tuple[float, float]:
    """(forward, backward) seconds of `layer` for a micro-batch of `micro_batch` samples.

    Measured `timings` are interpolated piecewise-linearly in the micro-batch size (extrapolated
    from the nearest segment, never below zero); seconds per sample scale linearly; FLOPs use a
    roofline (compute at peak x efficiency, or memory traffic at the memory bandwidth, whichever is
    slower) plus a fixed overhead per kernel, so small micro-batches are less efficient. On an
    accelerator with kernel tables (`gpu`), a preset layer's kernels are priced one by one
    (gpipe_sim.costs.gpu_model), once per (layer kernels, micro-batch size).

    `stream`: the tensor-parallel collectives of the layer's passes. Kernel tables run them on the
    GPU's stream inside the pass (the host issues on while they run, so a host-bound pass hides
    them); the other costs add them to the pass.
    """
    work = stream or NO_STREAM_WORK
    if kernel_priced(layer, accelerator):
        return layer_pass_seconds(layer.ops, micro_batch, dtype, dtype_bytes, accelerator.peak_flops,  # type: ignore[arg-type]
                                  accelerator.memory_bandwidth, accelerator.gpu, work)
    forward, backward = _own_seconds(layer, micro_batch, accelerator, dtype, dtype_bytes)
    return forward + work.forward_s + work.exposed_forward_s, backward + work.backward_s + work.exposed_backward_s


def kernel_priced(layer: LayerSpec, accelerator: Accelerator) -> bool:
    """Whether `layer_seconds` prices the layer's kernels on the accelerator's kernel tables (a
    preset layer without measured seconds, on an accelerator with tables)."""
    return accelerator.gpu is not None and isinstance(layer.ops, LayerKernels) and not layer.timings \
        and layer.forward_s_per_sample is None


def layer_pass_times(layer: LayerSpec, micro_batch: int, accelerator: Accelerator, dtype: str,
                     dtype_bytes: int, stream: StreamWork | None = None) -> tuple[float, float, float, float]:
    """(forward, backward, backward input, backward weight) seconds of `layer` on a micro-batch,
    its tensor-parallel collectives (`stream`) inside: what they add to the backward goes to the
    input pass (they reduce input gradients); the rest splits as `split_backward_seconds` says."""
    forward, backward = layer_seconds(layer, micro_batch, accelerator, dtype, dtype_bytes, stream)
    if stream is None or stream == NO_STREAM_WORK:
        return pass_times(layer, micro_batch, forward, backward)
    return pass_times(layer, micro_batch, forward, backward,
                      layer_seconds(layer, micro_batch, accelerator, dtype, dtype_bytes)[1])


def layer_pass_times_over(layer: LayerSpec, sizes: Sequence[int], accelerator: Accelerator, dtype: str,
                          dtype_bytes: int, streams: Sequence[StreamWork | None] | None = None
                          ) -> list[tuple[float, float, float, float]]:
    """`layer_pass_times` at each of `sizes` (with `streams[j]` at `sizes[j]`), equal to it: a
    layer its kernel tables price is priced at every size in one array pass
    (`gpu_model_arrays.layer_pass_seconds`), any other one size at a time."""
    works = list(streams or [None] * len(sizes))
    if not kernel_priced(layer, accelerator):
        return [layer_pass_times(layer, b, accelerator, dtype, dtype_bytes, w) for b, w in zip(sizes, works)]
    priced = lambda given: [x.tolist() for x in arrays.layer_pass_seconds(  # noqa: E731
        layer.ops, np.asarray(sizes, dtype=np.int64), dtype, dtype_bytes, accelerator.peak_flops,  # type: ignore[arg-type]
        accelerator.memory_bandwidth, accelerator.gpu, given)]  # type: ignore[arg-type]
    forward, backward = priced(works)
    bare = [w is None or w == NO_STREAM_WORK for w in works]
    own = backward if all(bare) else priced(None)[1]
    return [pass_times(layer, b, f, bk, None if plain else o)
            for b, f, bk, o, plain in zip(sizes, forward, backward, own, bare)]


def pass_times(layer: LayerSpec, micro_batch: int, forward: float, backward: float,
               own_backward: float | None = None) -> tuple[float, float, float, float]:
    """`layer_pass_times` from the layer's (forward, backward) seconds with its stream work and,
    where it has any, its backward's `own_backward` seconds without."""
    if own_backward is None:
        return (forward, backward, *split_backward_seconds(layer, micro_batch, backward))
    given, weight = split_backward_seconds(layer, micro_batch, own_backward)
    return forward, backward, given + (backward - own_backward), weight


def _own_seconds(layer: LayerSpec, micro_batch: int, accelerator: Accelerator, dtype: str,
                 dtype_bytes: int) -> tuple[float, float]:
    """(forward, backward) of the layer alone where no kernel tables price it: its timings,
    seconds per sample, or the roofline."""
    if layer.timings:
        return _interpolate(layer, micro_batch)
    if layer.forward_s_per_sample is not None:
        assert layer.backward_s_per_sample is not None
        return layer.forward_s_per_sample * micro_batch, layer.backward_s_per_sample * micro_batch
    assert layer.forward_flops_per_sample is not None and layer.backward_flops_per_sample is not None
    rate = accelerator.peak_flops_for(dtype) * accelerator.efficiency
    param_bytes = layer.params * dtype_bytes
    # what its forward writes, whether kept for backward or re-made there (per-layer recomputation)
    written = layer.output_bytes_per_sample + layer.activation_bytes_per_sample + layer.recompute_bytes_per_sample
    traffic = param_bytes + written * micro_batch
    overhead = layer.kernels * accelerator.kernel_overhead_s
    forward = overhead + max(
        layer.forward_flops_per_sample * micro_batch / rate, traffic / accelerator.memory_bandwidth
    )
    backward = 2 * overhead + max(
        layer.backward_flops_per_sample * micro_batch / rate,
        (traffic + param_bytes) / accelerator.memory_bandwidth,
    )
    return forward, backward


def _interpolate(layer: LayerSpec, micro_batch: int) -> tuple[float, float]:
    """(forward, backward) seconds of the layer's `timings` at `micro_batch` (`measured_seconds`)."""
    points = sorted(layer.timings, key=lambda t: t.micro_batch)
    sizes = [t.micro_batch for t in points]
    return (measured_seconds(sizes, [t.forward_s for t in points], micro_batch),
            measured_seconds(sizes, [t.backward_s for t in points], micro_batch))


def measured_seconds(sizes: Sequence[int], seconds: Sequence[float], micro_batch: int) -> float:
    """The seconds a quantity measured at the micro-batch `sizes` (ascending, distinct) takes at
    `micro_batch`: the one rule for every column of a layer's `timings`. Exact at a measured size,
    linear between two; outside them, the nearest segment's line, not under proportional scaling
    from the smallest measurement below it and never below zero; one measurement scales
    proportionally."""
    if len(sizes) == 1:
        return float(seconds[0] * micro_batch / sizes[0])
    if micro_batch <= sizes[0]:
        i = 0
    elif micro_batch >= sizes[-1]:
        i = len(sizes) - 2
    else:
        i = int(np.searchsorted(sizes, micro_batch)) - 1
    slope = (seconds[i + 1] - seconds[i]) / (sizes[i + 1] - sizes[i])
    value = seconds[i] + slope * (micro_batch - sizes[i])
    if micro_batch < sizes[0]:  # below the smallest measurement, not under proportional scaling from it
        value = max(value, seconds[0] * micro_batch / sizes[0])
    return max(0.0, float(value))


def measured_host_seconds(layer: LayerSpec, micro_batch: int) -> tuple[float, float]:
    """(forward, backward) seconds the host takes to issue the layer's passes on a micro-batch, from
    its timings' `forward_host_s`/`backward_host_s` (`measured_seconds`, as the device seconds
    they floor); (0, 0) where unmeasured."""
    points = sorted((t for t in layer.timings if t.forward_host_s is not None and t.backward_host_s is not None),
                    key=lambda t: t.micro_batch)
    if not points:
        return 0.0, 0.0
    sizes = [t.micro_batch for t in points]
    return (measured_seconds(sizes, [t.forward_host_s for t in points], micro_batch),  # type: ignore[misc]
            measured_seconds(sizes, [t.backward_host_s for t in points], micro_batch))  # type: ignore[misc]


def update_seconds(
    layers: list[LayerSpec], accelerator: Accelerator, dtype_bytes: int, bytes_per_param: int, step: str,
) -> float:
    """Optimizer step for these layers: measured `update_s` where given, else memory-bound traffic
    (read weight, gradient and states; write weight and states) at the memory bandwidth; on an
    accelerator with kernel tables, that traffic as the `step` implementation moves it
    (`Scenario.optimizer_step`, as the executor steps) at the achieved bandwidth."""
    total = 0.0
    gpu = accelerator.gpu
    for layer in layers:
        if layer.update_s is not None:
            total += layer.update_s
        elif layer.params and gpu is not None and isinstance(layer.ops, LayerKernels):
            traffic = bytes_per_param + (bytes_per_param - dtype_bytes)
            total += step_seconds(layer.params, layer.ops.tensors, traffic, step,
                                  accelerator.memory_bandwidth, gpu)
        elif layer.params:
            traffic = layer.params * (bytes_per_param + (bytes_per_param - dtype_bytes))
            total += accelerator.kernel_overhead_s + traffic / accelerator.memory_bandwidth
    return total if math.isfinite(total) else 0.0


def split_backward_seconds(layer: LayerSpec, micro_batch: int, backward_s: float) -> tuple[float, float]:
    """(input-gradient, weight-gradient) seconds of `layer`'s backward split in two passes, for a
    micro-batch whose full backward takes `backward_s`: measured `timings` of both passes
    (interpolated as the full backward is), seconds per sample, or the full backward divided by
    `backward_input_flops_per_sample / backward_flops_per_sample` (else BACKWARD_INPUT_SHARE).
    Measured split passes may add up to more than the full backward, as they do on real hardware."""
    if layer.timings and all(t.backward_input_s is not None and t.backward_weight_s is not None
                             for t in layer.timings):
        split = layer.model_copy(update={"timings": tuple(
            t.model_copy(update={"forward_s": t.backward_input_s, "backward_s": t.backward_weight_s})
            for t in layer.timings)})
        return _interpolate(split, micro_batch)
    if layer.backward_input_s_per_sample is not None or layer.backward_weight_s_per_sample is not None:
        i = layer.backward_input_s_per_sample
        w = layer.backward_weight_s_per_sample
        per = backward_s / micro_batch if micro_batch else 0.0
        i = per - w if i is None and w is not None else i
        w = per - i if w is None and i is not None else w
        return max(0.0, i) * micro_batch, max(0.0, w) * micro_batch  # type: ignore[operator]
    share = BACKWARD_INPUT_SHARE
    if layer.backward_input_flops_per_sample is not None and layer.backward_flops_per_sample:
        share = min(1.0, layer.backward_input_flops_per_sample / layer.backward_flops_per_sample)
    return share * backward_s, (1 - share) * backward_s
