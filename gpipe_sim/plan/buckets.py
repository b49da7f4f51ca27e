"""Bucketed gradient reduction overlapping the backward (Megatron-LM's --overlap-grad-reduce, DDP's buckets).

With `training.overlap_grad_reduce`, a chunk's gradients are reduced in buckets while its last
backward pass still runs, as Megatron-LM's DistributedDataParallel does: parameters are assigned to
buckets in the order the backward makes their gradients (the chunk's layers from its last to its
first), a bucket closing once it holds `bucket_bytes` of gradients (whole layers here: a layer's
parameters are never split); a bucket's reduction starts when the backward has finished its layers
and the reductions run one after another on the ring. The reduction of the chunk ends at

    t_0 = 0;  t_b = max(ready_b, t_{b-1}) + reduce(bytes_b)

seconds after the pass starts (ready_b: the end of the bucket's last layer's backward, the pass's
seconds shared over its layers as their own backward times are). Under ZeRO-1 (Megatron's
distributed optimizer) each bucket is reduce-scattered (half a ring all-reduce) and the updated
parameters are all-gathered after the optimizer step (the other half), the whole chunk's at once,
or with `overlap_param_gather` bucket by bucket in forward order while the next step's first
forward runs, a bucket's layers waiting for its gather: g_b = g_{b-1} + gather(bytes_b),
c_b = max(c_{b-1}, g_b) + forward_b; what that forward is delayed, c_last - sum(forward_b), is
charged here, after the reduction (one step's worth in a steady run).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from gpipe_sim.schedule import Kind
from gpipe_sim.costs.layer_rows import pass_rows
from gpipe_sim.model.model import LayerSpec
from gpipe_sim.scenario.scenario import Scenario

# Megatron-LM's default bucket (DistributedDataParallelConfig.bucket_size None): max(40M, 1M x D)
# parameters, "larger DP sizes need larger buckets to ensure collectives do not become latency-bound"
MEGATRON_BUCKET_PARAMS = 40_000_000
MEGATRON_BUCKET_PARAMS_PER_REPLICA = 1_000_000


def bucket_bytes(scenario: Scenario) -> float:
    """Bytes of gradients a bucket holds: `training.bucket_bytes`, else Megatron-LM's default."""
    training, D = scenario.training, scenario.pipeline.data_parallel
    if training.bucket_bytes is not None:
        return training.bucket_bytes
    return max(MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_REPLICA * D) * training.dtype_bytes


def reduction_size(scenario: Scenario) -> float:
    """Bytes of gradients a reduction bucket holds: `bucket_bytes` with `overlap_grad_reduce`, else
    a chunk's whole (Megatron-LM's one bucket without overlap). The simulator's and gpipe-exec's rule."""
    return bucket_bytes(scenario) if scenario.training.overlap_grad_reduce else float("inf")


def buckets(grad_bytes: Sequence[float], size: float) -> list[tuple[int, float]]:
    """(index of its last layer, its bytes) per bucket, the layers `grad_bytes` given in the order
    their gradients are made: a bucket closes once it holds at least `size` bytes, and the last
    takes what is left."""
    out: list[tuple[int, float]] = []
    held = 0.0
    for i, nbytes in enumerate(grad_bytes):
        held += nbytes
        if held >= size:
            out.append((i, held))
            held = 0.0
    if held > 0 or not out:
        out.append((len(grad_bytes) - 1, held))
    return out


def overlapped_seconds(grad_bytes: Sequence[float], layer_seconds: Sequence[float], size: float,
                       reduce: Callable[[float], float], tail: float = 0.0) -> float:
    """Seconds from the start of a chunk's last backward pass to the end of its bucketed reduction
    (module docstring): `grad_bytes` and `layer_seconds` per layer in backward order, buckets of
    `size` bytes, `reduce(bytes)` the seconds of one bucket's collective, `tail` what follows the
    last (ZeRO-1's all-gather)."""
    ready, t, done = 0.0, 0.0, 0
    for last, nbytes in buckets(grad_bytes, size):
        while done <= last:
            ready += layer_seconds[done]
            done += 1
        t = max(ready, t) + reduce(nbytes)
    return t + tail


def gathered_forward_delay(grad_bytes: Sequence[float], layer_seconds: Sequence[float], size: float,
                           gather: Callable[[float], float]) -> float:
    """Seconds a chunk's first forward is delayed by its parameters' bucketed all-gather (module
    docstring): `grad_bytes` and `layer_seconds` per layer in forward order, the buckets those of
    the backward (`buckets` in backward order), gathered one after another from the forward's start."""
    counts, previous = [], -1
    for last, _ in buckets(list(reversed(grad_bytes)), size):
        counts.append(last - previous)
        previous = last
    gathered, computed, i = 0.0, 0.0, 0
    for n in reversed(counts):  # forward order
        gathered += gather(sum(grad_bytes[i:i + n]))
        computed = max(computed, gathered) + sum(layer_seconds[i:i + n])
        i += n
    return computed - sum(layer_seconds)


def backward_shares(scenario: Scenario, layers: Sequence[LayerSpec], samples: int, seconds: float,
                    weight_pass: bool) -> list[float]:
    """Per layer in backward order (the last first), its part of a backward pass of `seconds` on
    `samples` samples: the pass shared as the layers' own backward (or weight-pass) times are
    (evenly where they are all 0)."""
    return _backward_shares(_pass_times(scenario, layers, samples), seconds, weight_pass)


def _pass_times(scenario: Scenario, layers: Sequence[LayerSpec], samples: int) -> list[tuple[float, ...]]:
    """Each layer's own (forward, backward, input pass, weight pass) seconds on `samples` samples
    (`layer_pass_times`, remembered by content: `pass_rows`)."""
    accel, training = scenario.hardware.accelerator, scenario.training
    return pass_rows(layers, samples, accel, training.dtype, training.dtype_bytes)


def _backward_shares(times: Sequence[tuple[float, ...]], seconds: float, weight_pass: bool) -> list[float]:
    """`backward_shares` from the layers' `_pass_times`."""
    own = [t[3 if weight_pass else 1] for t in reversed(times)]
    total = sum(own)
    if total <= 0:
        return [seconds / len(own)] * len(own)
    return [seconds * t / total for t in own]


def overlaps_step_reduction(scenario: Scenario) -> bool:
    """Whether each chunk's step reduction starts with its last backward pass and overlaps it
    (`overlap_grad_reduce`, or ZeRO-3, which always overlaps), not after it: never under ZeRO-2,
    whose every backward pass reduces its own gradients (gpipe_sim.plan.pass_collectives)."""
    zero = scenario.training.zero
    return (scenario.training.overlap_grad_reduce or zero == 3) and zero != 2


def overlap_profiles(plan: Any, kind: np.ndarray, chunk: np.ndarray, micro_batch: np.ndarray,
                     duration: np.ndarray) -> list[tuple[list[float], list[float], list[float]]] | None:
    """Per chunk of the compiled `plan` (its program's `kind`, `chunk` and `micro_batch` columns
    and each action's `duration`): its layers' gradient bytes and their seconds of its last
    backward pass (the pass right after its first `allreduce`, which `overlap_grad_reduce` puts
    before it), in backward order, and their seconds of its first micro-batch's forward, in forward
    order; None without `overlap_grad_reduce` (or ZeRO-3, which always overlaps), under ZeRO-2 (whose
    backward passes reduce: gpipe_sim.plan.pass_collectives) or where no gradient is reduced (D x C = 1)."""
    scenario = plan.scenario
    if not overlaps_step_reduction(scenario) or plan.mesh.gradient_group == 1:
        return None
    element = scenario.training.dtype_bytes
    starts = np.flatnonzero(kind == Kind.ALLREDUCE)
    sizes, first_size = plan.micro_batch_sizes, plan.micro_batch_sizes[0]
    out = []
    for ch in plan.chunks:
        at = int(starts[chunk[starts] == ch.index][0]) + 1  # the pass the allreduce starts with
        own = plan.layers[ch.first_layer:ch.last_layer + 1]
        samples = sizes[int(micro_batch[at])]
        times = _pass_times(scenario, own, samples)  # the layers' own seconds, shared by both passes
        seconds = _backward_shares(times, float(duration[at]), int(kind[at]) == Kind.BACKWARD_WEIGHT)
        own_forward = [t[0] for t in (times if samples == first_size else _pass_times(scenario, own, first_size))]
        total, first = sum(own_forward), float(ch.forward_s[0])
        forward = [first * t / total for t in own_forward] if total > 0 else [first / len(own)] * len(own)
        out.append(([float(layer.params * element) for layer in reversed(own)], seconds, forward))
    return out


__all__ = ["MEGATRON_BUCKET_PARAMS", "MEGATRON_BUCKET_PARAMS_PER_REPLICA", "backward_shares", "bucket_bytes",
           "buckets", "gathered_forward_delay", "overlap_profiles", "overlapped_seconds",
           "overlaps_step_reduction"]
