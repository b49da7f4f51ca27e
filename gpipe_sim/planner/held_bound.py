"""The planner's memory bound with the activations the schedule holds at once (`held_activations`), below the simulated peak."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence
from weakref import WeakKeyDictionary

import numpy as np

from gpipe_sim.model.recompute import per_layer
from gpipe_sim.plan.partition import micro_batch_sizes
from gpipe_sim.planner.bounds import CostTable, chunk_placement
from gpipe_sim.planner.held_levels import HeldSamples, event_table, held_levels
from gpipe_sim.planner.chunk_arrays import partition_edges
from gpipe_sim.planner.segments import SLACK, min_max_partition, segment_cost
from gpipe_sim.planner.space import Candidate


def held_samples(cand: Candidate, batch: int) -> HeldSamples:
    """Samples whose whole activations the candidate's schedule holds at once, counted by
    `held_activations` in program order as the memory accountant counts bytes: per chunk, the
    most it holds at some moment; per rank of more than one chunk, rows of what its chunks hold at
    once covering every undominated moment (none where too many to list, and for a rank of one
    chunk, whose moments are that chunk's). A sample counts when kept, or when held as an input and
    re-computed at the same time (input + re-computed bytes >= the saved bytes)."""
    # the per-layer modes keep every forward, as "none" does (`saves_activations`): the same programs
    remat = "none" if per_layer(cand.remat) else cand.remat
    return _held_samples(cand.schedule, cand.stages, cand.micro_batches, cand.chunks, remat,
                         batch // cand.data_parallel)


@lru_cache(maxsize=16384)
def _held_samples(name: str, K: int, M: int, v: int, remat: str, share: int) -> HeldSamples:
    """`held_samples` of one schedule and per-replica batch (`held_levels` of its events, read
    once per schedule)."""
    return held_levels(event_table(name, K, M, v, remat), np.asarray(micro_batch_sizes(share, M), dtype=float))


def held_memory_bound(costs: CostTable, cand: Candidate, counts: Sequence[int] | None = None) -> float:
    """`memory_lower_bound` with the activations counted for the samples the schedule holds at
    once (`held_samples`) instead of one micro-batch: static(rank) + the most its chunks hold at
    one moment (or, where the moments are too many to list, the most one chunk holds); exactly
    minimised over the partitions (per chunk) when the counts are not given."""
    costs = costs.of(cand)
    held = held_samples(cand, costs.base.pipeline.batch_size)
    if counts is not None:
        part = _partition_bytes(costs, cand, counts)
        rank_act = np.zeros(cand.stages)
        np.maximum.at(rank_act, held.placement, part.chunk_act[:-1] * held.per_chunk)
        if len(held.rows):
            weights = part.chunk_act[held.owned]  # (K, width); past a rank's chunks (-1), 0 bytes
            most = np.maximum.reduceat(moment_bytes(held.rows, weights[held.row_rank]), held.row_starts)
            rank_act[held.listed] = np.maximum(rank_act[held.listed], most)
        return float((part.rank_static + rank_act).max()) * SLACK
    s_cum = costs.static_cum(cand.data_parallel * cand.context_parallel, cand.zero)
    seg_s, seg_a = segment_cost(s_cum), segment_cost(costs.act_cum)
    return min_max_partition([seg_s + hc * seg_a for hc in held.per_chunk], [True] * len(held.per_chunk)) * SLACK


def moment_bytes(rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Per row, sum_j rows[:, j] x weights[:, j], summed in column order (one order for every
    caller: a matrix product's may differ in the last bit)."""
    total = rows[:, 0] * weights[:, 0]
    for j in range(1, rows.shape[1]):
        total += rows[:, j] * weights[:, j]
    return total


_ABOVE = 1.0 + 1e-9  # the ceiling's margin over the bound's rounding


def held_memory_ceiling(costs: CostTable, cand: Candidate, counts: Sequence[int]) -> float:
    """At least `held_memory_bound(costs, cand, counts)`, without building the schedule: a chunk
    holds at most every sample of the replica's batch at once (each micro-batch's samples are held
    once, kept or as input, from its forward to its last backward), so each rank's bound is at most
    its static bytes plus the batch's activations of each of its chunks. Where this is within the
    capacity, the held bound is too (and need not be computed)."""
    costs = costs.of(cand)
    part = _partition_bytes(costs, cand, counts)
    share = costs.base.pipeline.batch_size // cand.data_parallel
    return float((part.rank_static + share * part.rank_act).max()) * _ABOVE


@dataclass(frozen=True)
class _PartitionBytes:
    """A partition's bytes on a table: per chunk its activation bytes per sample (then a 0 for
    "no chunk"), per rank its static bytes and its chunks' activation bytes per sample."""

    chunk_act: np.ndarray
    rank_static: np.ndarray
    rank_act: np.ndarray


# per cost table (weakly: a table's entries go with it), per (D x C, ZeRO, schedule, K, v, counts)
_PARTITIONS: "WeakKeyDictionary[CostTable, dict[tuple, _PartitionBytes]]" = WeakKeyDictionary()


def _partition_bytes(costs: CostTable, cand: Candidate, counts: Sequence[int]) -> _PartitionBytes:
    """The `_PartitionBytes` of the candidate's partition `counts` on table `costs` (one the
    candidate's T, C, E and per-layer remat give), made once: the ceiling and the bound of every
    M and remat mode share them."""
    DC = cand.data_parallel * cand.context_parallel
    key = (DC, cand.zero, cand.schedule, cand.stages, cand.chunks, tuple(counts))
    table = _PARTITIONS.setdefault(costs, {})
    got = table.get(key)
    if got is None:
        edges = partition_edges(key[-1])
        s_cum, a_cum = costs.static_cum(DC, cand.zero), costs.act_cum
        chunk_act = a_cum[edges[1:]] - a_cum[edges[:-1]]
        placement = chunk_placement(cand)
        got = table[key] = _PartitionBytes(
            np.append(chunk_act, 0.0),
            np.bincount(placement, weights=s_cum[edges[1:]] - s_cum[edges[:-1]], minlength=cand.stages),
            np.bincount(placement, weights=chunk_act, minlength=cand.stages))
    return got
