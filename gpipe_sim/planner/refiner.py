"""The planner's finer bounds of a candidate, each computed once per what it depends on: memory, step time and the pass orders'."""

from __future__ import annotations

import math
from typing import Any

from gpipe_sim.planner.bounds import (
    CostTable, chunk_placement, memory_lower_bound, quick_counts, step_lower_bound, step_zero,
)
from gpipe_sim.planner.order_bound import OrderBounds
from gpipe_sim.planner.space import Candidate
from gpipe_sim.planner.work_rows import WorkCache


class Refiner:
    """The finer bounds of a candidate (with the layer counts of its partition where known
    without compiling), each computed once per distinct set of what it depends on: the memory
    bound first, the step-time bound only where the memory bound fits. ZeRO 1 and 2 share a
    step-time bound (`step_lower_bound` tells ZeRO 0, which does not shard the update, and 3,
    whose collectives it counts, from the others only)."""

    def __init__(self, costs: CostTable, works: WorkCache) -> None:
        self.costs = costs
        self.works = works
        # counts by what they depend on, each distinct counts with a number (cheaper to hash in a key)
        self.counts: dict[Any, tuple[list[int] | None, int]] = {}
        self.count_ids: dict[tuple[int, ...] | None, int] = {None: -1}
        self.placements: dict[tuple[str, int, int], int] = {}  # by (schedule, K, v), its placement's number
        self.placement_ids: dict[tuple[int, ...], int] = {}
        self.memory: dict[Any, float] = {}
        self.cache: dict[Any, float] = {}
        self.order = OrderBounds(costs)  # the pass orders' bound, asked before compiling

    def __call__(self, cand: Candidate) -> tuple[float, float, list[int] | None]:
        """(memory bound, step-time bound, counts or None); the step-time bound is nan where the
        memory bound exceeds the capacity (the candidate is pruned by memory: not computed)."""
        costs = self.costs
        D, K, v, M, schedule, remat, partition, zero, T, C, E, _ = cand
        rows = self.works.of(cand)
        largest = rows.largest_of[M - 1]
        ckey = (T, C, E, remat, partition, K * v, largest)
        got = self.counts.get(ckey)
        if got is None:
            counts = quick_counts(costs, cand, largest)
            key = None if counts is None else tuple(counts)
            got = self.counts[ckey] = (counts, self.count_ids.setdefault(key, len(self.count_ids)))
        counts, counts_id = got
        placement = self.placements.get((schedule, K, v))
        if placement is None:
            placement = self.placements[(schedule, K, v)] = self.placement_ids.setdefault(
                chunk_placement(cand), len(self.placement_ids))
        mkey = (T, C, E, remat, D, largest if counts is not None else M, zero, K, v, placement, counts_id)
        memory = self.memory.get(mkey)
        if memory is None:
            memory = self.memory[mkey] = memory_lower_bound(costs, cand, counts)
        if memory > costs.capacity:
            return memory, math.nan, counts
        bkey = (T, C, E, D, remat, M, step_zero(zero), K, v, placement, counts_id)
        step = self.cache.get(bkey)
        if step is None:
            step = self.cache[bkey] = step_lower_bound(costs, cand, counts, rows.work(M))
        return memory, step, counts
