"""The simple partition methods: micro-batch sizes, and layers into stages by count or by time weights."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from gpipe_sim.errors import ScenarioError
from gpipe_sim.kept import Kept
from gpipe_sim.plan.distinct import distinct_sorted


def micro_batch_sizes(batch_size: int, micro_batches: int) -> list[int]:
    """Split `batch_size` samples into `micro_batches` parts differing by at most one sample
    (the first `batch_size % micro_batches` parts get the extra one, as `torch.tensor_split` does)."""
    if not 1 <= micro_batches <= batch_size:
        raise ScenarioError(
            f"pipeline.micro_batches: {micro_batches} must be between 1 and the batch size {batch_size}"
        )
    base, extra = divmod(batch_size, micro_batches)
    return [base + (1 if i < extra else 0) for i in range(micro_batches)]


def balance_by_count(layers: int, stages: int) -> list[int]:
    """Layer counts per stage as equal as possible (the first stages take the remainder)."""
    check_stages(layers, stages)
    base, extra = divmod(layers, stages)
    return [base + (1 if k < extra else 0) for k in range(stages)]


_CANDIDATE_LAYERS = 256  # up to this many layers, search the contiguous sums themselves


_BALANCED: Kept[tuple[int, ...]] = Kept(4096)  # the last splits, by weights and stages


def balance_by_weight(weights: Sequence[float], stages: int) -> list[int]:
    """`split_by_weight`, a new list, kept by the weights and stages (a search compiles the same
    model into as many stages thousands of times)."""
    return list(_BALANCED.get((tuple(map(float, weights)), stages),
                              lambda: tuple(split_by_weight(weights, stages))))


def split_by_weight(weights: Sequence[float], stages: int) -> list[int]:
    """Layer counts per stage that minimise the largest stage weight, exactly.

    The optimal bottleneck is the sum of some contiguous run of layers: for up to 256 layers the
    sorted run sums are searched by bisection with a greedy feasibility test; beyond, the
    bottleneck is bisected as a float until the bracket closes to adjacent values. Every stage
    gets at least one layer.
    """
    w = np.asarray(weights, dtype=float)
    check_stages(len(w), stages)
    if np.any(w < 0) or not np.all(np.isfinite(w)):
        raise ScenarioError("pipeline.partition: layer weights must be finite and non-negative")
    prefix = np.concatenate(([0.0], np.cumsum(w)))
    slack = 8 * np.finfo(float).eps * max(float(prefix[-1]), 1e-300)  # prefix-sum rounding
    if len(w) <= _CANDIDATE_LAYERS:
        first, last = np.triu_indices(len(prefix), k=1)
        sums = distinct_sorted(prefix[last] - prefix[first])
        sums = sums[sums >= w.max() - slack]
        lo, hi = 0, len(sums) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if _parts_needed(prefix, sums[mid] + slack) <= stages:
                hi = mid
            else:
                lo = mid + 1
        return _split_at_cap(prefix, float(sums[lo]) + slack, stages)
    lo, hi = float(w.max()), float(prefix[-1]) + slack
    while True:
        mid = lo + (hi - lo) / 2
        if mid <= lo or mid >= hi:
            break
        if _parts_needed(prefix, mid) <= stages:
            hi = mid
        else:
            lo = mid
    cap = hi if _parts_needed(prefix, lo) > stages else lo
    return _split_at_cap(prefix, cap, stages)


def _parts_needed(prefix: np.ndarray, cap: float) -> int:
    """Contiguous parts the greedy split of the layers (prefix sums `prefix`) needs with no part above
    `cap`; more than the layers when one layer alone exceeds it."""
    n, i, parts = len(prefix) - 1, 0, 0
    while i < n:
        j = int(np.searchsorted(prefix, prefix[i] + cap, side="right")) - 1
        if j <= i:
            return n + 1  # one layer alone exceeds the cap
        i, parts = j, parts + 1
    return parts


def _split_at_cap(prefix: np.ndarray, cap: float, stages: int) -> list[int]:
    """Layer counts of the greedy split at `cap` (at least one layer a part), the longest parts
    halved until there are `stages` of them (`cap` is feasible: at most `stages` parts needed)."""
    n, i, counts = len(prefix) - 1, 0, []
    while i < n:
        j = max(i + 1, int(np.searchsorted(prefix, prefix[i] + cap, side="right")) - 1)
        counts.append(j - i)
        i = j
    # Fewer parts than stages: split the longest parts (splitting never raises the bottleneck).
    while len(counts) < stages:
        longest = max(range(len(counts)), key=lambda c: counts[c])
        half = counts[longest] // 2
        counts[longest : longest + 1] = [counts[longest] - half, half]
    return counts


def check_stages(layers: int, stages: int) -> None:
    """Raise a one-line ScenarioError unless 1 <= `stages` <= `layers` (every stage gets a layer)."""
    if stages < 1:
        raise ScenarioError(f"pipeline.stages: must be >= 1, got {stages}")
    if stages > layers:
        plural = "s" if layers != 1 else ""
        raise ScenarioError(
            f"pipeline.stages: {stages} stages but the model has only {layers} layer{plural}"
        )
