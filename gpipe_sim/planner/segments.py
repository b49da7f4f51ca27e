"""Costs of contiguous layer ranges and their exact min-max partition: what the planner's bounds minimise over."""

from __future__ import annotations

from typing import Sequence

import numpy as np

SLACK = 1.0 - 1e-9  # bounds are sums in another order than the simulator's: keep them strictly below


def cumulative(values: np.ndarray) -> np.ndarray:
    """Running sums of `values` from 0: element i is the sum of the first i."""
    return np.concatenate(([0.0], np.cumsum(values)))


def cumulative_rows(values: np.ndarray) -> np.ndarray:
    """`cumulative` of each row of a 2-D array at once (row r: `cumulative(values[r])`, the same
    sums in the same order: a running sum adds one element at a time)."""
    return np.concatenate((np.zeros((len(values), 1)), np.cumsum(values, axis=1)), axis=1)


def min_max_partition(cost: np.ndarray | Sequence[np.ndarray], priced: Sequence[bool]) -> float:
    """min over partitions of L layers into len(priced) contiguous non-empty chunks of the largest
    cost[s, e] of a priced chunk (layers s .. e-1; `cost` may also be one matrix per chunk): an
    exact dynamic programme, O(C L^2)."""
    matrices = [cost] * len(priced) if isinstance(cost, np.ndarray) else list(cost)
    L = matrices[0].shape[0] - 1
    s_idx, e_idx = np.indices(matrices[0].shape)
    valid = s_idx < e_idx
    free_cost = np.where(valid, -np.inf, np.inf)
    best = np.full(L + 1, np.inf)
    best[0] = -np.inf
    for flag, matrix in zip(priced, matrices):
        step = np.where(valid, matrix, np.inf) if flag else free_cost
        best = np.maximum(best[:, None], step).min(axis=0)
    return float(best[L])


def segment_cost(cum: np.ndarray, extra: np.ndarray | None = None) -> np.ndarray:
    """cost[s, e] = cum[e] - cum[s] (+ extra[s]): a chunk of layers s .. e-1."""
    cost = cum[None, :] - cum[:, None]
    return cost + extra[:, None] if extra is not None else cost
