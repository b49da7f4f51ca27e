"""A chunk's pass times: its layers' kernels with the collectives, rings and all-to-alls on its passes."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from gpipe_sim.plan.context_parallel import combined, ring_work
from gpipe_sim.plan.experts import all_to_all_work
from gpipe_sim.plan.tensor_parallel import collective_work
from gpipe_sim.costs.layer_rows import accelerator_token, host_rows, pass_rows
from gpipe_sim.costs.twins import pricing_key
from gpipe_sim.kept import Kept
from gpipe_sim.costs.gpu_model import StreamWork
from gpipe_sim.model.model import LayerSpec
from gpipe_sim.scenario.scenario import Scenario


# Chunks with no collective inside their passes (T = C = E = 1), by all that prices them then: their
# layers' content, the sizes, the accelerator's content and the dtype (a search compiles each many times).
_ALONE: Kept[np.ndarray] = Kept(1 << 14)


def chunk_times(scenario: Scenario, own: Sequence[LayerSpec], first: int, device: int,
                sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray | None]:
    """`chunk_pass_times`; at T = C = E = 1 kept by what it reads there (read-only)."""
    p, training = scenario.pipeline, scenario.training
    if p.tensor_parallel == 1 and p.context_parallel == 1 and p.expert_parallel == 1:
        accel = scenario.hardware.accelerator
        key = (tuple(map(pricing_key, own)), tuple(sizes), accelerator_token(accel), training.dtype,
               training.dtype_bytes)
        return _ALONE.get(key, lambda: _read_only(chunk_pass_times(scenario, own, first, device, sizes)[0])), None
    return chunk_pass_times(scenario, own, first, device, sizes)


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def chunk_pass_times(scenario: Scenario, own: Sequence[LayerSpec], first: int, device: int,
                     sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray | None]:
    """A chunk's [size, (forward, backward, backward input, backward weight)] seconds for each of
    `sizes` samples, its layers' tensor-parallel collectives (on the TP link of its rank's
    `device`), context-parallel rings (gpipe_sim.plan.context_parallel) and experts' all-to-alls
    (gpipe_sim.plan.experts) inside its passes, and
    the [size, (forward, backward)] seconds the tensor-parallel collectives add to the passes (None
    at T = 1). A pass takes at least what issuing its layers' kernels takes
    the host (profiles that measured it)."""
    accel, dtype, dtype_bytes = scenario.hardware.accelerator, scenario.training.dtype, scenario.training.dtype_bytes
    span = slice(first, first + len(own))
    extra = combined(ring_work(scenario, device, sizes, span), all_to_all_work(scenario, device, sizes, span, own))
    tp = collective_work(scenario, device, sizes, span)
    mine = combined(tp, extra)
    host = np.array([[math.fsum(h[i] for h in hosts) for i in range(2)]
                     for hosts in (host_rows(own, b) for b in sizes)]).reshape(len(sizes), 2)

    def summed(work: list[list[StreamWork]] | None) -> np.ndarray:
        """[size, 4] of the chunk's passes with `work`'s collectives inside, at least the host's
        issue: its layers' `layer_pass_times` (`pass_rows`: once per twin), each pass's fsum."""
        out = np.array([[math.fsum(t[k] for t in per_layer) for k in range(4)] for per_layer in (
            pass_rows(own, b, accel, dtype, dtype_bytes, None if work is None else [w[j] for w in work])
            for j, b in enumerate(sizes))], dtype=float).reshape(len(sizes), 4)
        out[:, :2] = np.maximum(out[:, :2], host)
        return out

    times = summed(mine)
    if tp is None:
        return times, None
    return times, np.maximum(times[:, :2] - summed(extra)[:, :2], 0.0)


__all__ = ["chunk_pass_times", "chunk_times"]
