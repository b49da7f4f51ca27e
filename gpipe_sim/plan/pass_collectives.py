"""The data-parallel collectives inside a chunk's passes: ZeRO-3's without pipelining, ZeRO-2's in every backward.

ZeRO-3 without pipelining gathers each layer in each pass and reduce-scatters its gradients in each
backward (gpipe_sim.plan.sharding: `fsdp_chunk_seconds`, `in_flight_bytes`).

Under `training.zero: 2` only a replica's shard of the gradients is kept, so no micro-batch's
gradients can accumulate unreduced: every backward pass of a chunk reduce-scatters the gradients it
made, as DeepSpeed's stage 2 does (`DeepSpeedZeroOptimizer.reduce_independent_p_g_buckets_and_remove_grads`
reduces each full `reduce_bucket_size` bucket, `independent_gradient_partition_epilogue` the last
one at the end of every backward, the engine's `allreduce_gradients` calling it "during non
gradient accumulation boundaries as well") and FSDP2 does with its post-backward reduce-scatter.
Both wait for the last one before the backward returns (DeepSpeed's `overlap_comm` synchronizes
there; FSDP2's root post-backward callback waits for the reduce-scatter on the last backward,
which gpipe-exec marks every ZeRO-2 backward), so a pass lasts until its last bucket is reduced:

    with `overlap_grad_reduce` (DeepSpeed's `overlap_comm`; FSDP2 always overlaps, one unit a
        bucket: `bucket_bytes` at most a layer's gradients):  the buckets of `bucket_bytes`
        reduce-scattered as the pass finishes them, one after another on the ring
        (`gpipe_sim.plan.buckets.overlapped_seconds`: t_b = max(ready_b, t_{b-1}) + rs(bytes_b));
        the pass ends at max(its compute, t_last): only the last bucket's tail is exposed;
    without (DeepSpeed's default for stage 2, `overlap_comm` False):  the pass, then the reduce-scatter
        of its gradients on the same stream: compute + rs(dense) + rs_E(experts),

rs(n) = (N-1)/N x n / bandwidth + (N-1) x latency over the chunk's N = D x C gradient members
(half a ring all-reduce: `Ring.half`), rs_E over the D x C / E devices that hold the same experts.
The updated parameters are all-gathered once a step, after the optimizer step
(`all_gather_dp_groups` in DeepSpeed's `step`): that is the chunk's `allreduce` group
(gpipe_sim.plan.replicas), half a ring.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from gpipe_sim.costs.layer_rows import pass_rows
from gpipe_sim.model.model import LayerSpec
from gpipe_sim.plan.buckets import backward_shares, bucket_bytes, overlapped_seconds
from gpipe_sim.plan.replicas import gradient_rings
from gpipe_sim.plan.sharding import fsdp_chunk_seconds, gathers_per_pass, in_flight_bytes, reduces_every_backward
from gpipe_sim.scenario.scenario import Scenario

# the columns of a chunk's [size, (forward, backward, backward input, backward weight)] seconds
# whose pass makes the weights' gradients: a full backward and a split backward's weight pass
GRADIENT_PASSES = ((1, False), (3, True))


def reduced_backward_seconds(scenario: Scenario, layers: Sequence[LayerSpec], rank: int, params: int,
                             experts: int, sizes: Sequence[int], seconds: np.ndarray) -> np.ndarray:
    """A chunk's [size, (forward, backward, backward input, backward weight)] `seconds` on `sizes`
    samples, with each backward and weight pass lasting until its gradients are reduce-scattered
    (module docstring): `layers` the chunk's, on pipeline rank `rank`, holding `params` parameters
    of which `experts` are routed experts'. A copy; the forward and input passes are unchanged."""
    out = np.array(seconds, dtype=float)
    whole, alike = gradient_rings(scenario, rank, scenario.mesh.node_size)
    element = scenario.training.dtype_bytes
    overlap = scenario.training.overlap_grad_reduce
    grads = [float(layer.params * element) for layer in reversed(layers)]
    after = whole.half((params - experts) * element) + (alike.half(experts * element) if experts else 0.0)
    for i, samples in enumerate(sizes):
        for column, weight_pass in GRADIENT_PASSES:
            pass_s = float(out[i, column])
            if pass_s <= 0:
                continue
            if not overlap:
                out[i, column] = pass_s + after
                continue
            shares = backward_shares(scenario, layers, samples, pass_s, weight_pass)
            out[i, column] = overlapped_seconds(grads, shares, bucket_bytes(scenario), whole.half)
    return out


def sharded_passes(scenario: Scenario, layers: Sequence[LayerSpec], rank: int, params: int, experts: int,
                   sizes: Sequence[int], seconds: np.ndarray) -> tuple[np.ndarray, tuple[float, float]]:
    """(a chunk's [size, pass] `seconds` on `sizes` samples with the collectives its passes run,
    the (forward, backward) bytes of gathered units they hold at their peak): ZeRO-3 without
    pipelining's per-layer gathers and reduce-scatters (`fsdp_chunk_seconds`, `in_flight_bytes`),
    ZeRO-2's reduce-scatter in every backward (`reduced_backward_seconds`), else `seconds` as they
    are. `layers` the chunk's, on pipeline rank `rank`, holding `params` parameters, `experts` of
    them routed experts'."""
    training = scenario.training
    if gathers_per_pass(scenario):
        accel, dtype, element = scenario.hardware.accelerator, training.dtype, training.dtype_bytes
        shares = np.array([[row[:2] for row in pass_rows(layers, b, accel, dtype, element)] for b in sizes],
                          dtype=float)
        out = np.array(seconds, dtype=float)
        out[:, :2] = fsdp_chunk_seconds(scenario, layers, shares, out[:, :2])
        return out, in_flight_bytes(layers, element)
    if reduces_every_backward(scenario):
        return reduced_backward_seconds(scenario, layers, rank, params, experts, sizes, seconds), (0.0, 0.0)
    return seconds, (0.0, 0.0)


__all__ = ["GRADIENT_PASSES", "reduced_backward_seconds", "sharded_passes"]
