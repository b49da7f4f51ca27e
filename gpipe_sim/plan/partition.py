"""Partitioning (facade): layers into chunks by a `pipeline.partition` method; the batch into micro-batches."""

from __future__ import annotations

from typing import Sequence

from gpipe_sim.errors import ScenarioError
from gpipe_sim.plan.balance import balance_by_count, balance_by_weight, check_stages, micro_batch_sizes
from gpipe_sim.plan.held import INPUT_ONLY, KEPT, RECOMPUTED, HeldActivations, MemoryTable, held_activations
from gpipe_sim.plan.memory_partition import balance_by_memory, fastest_fitting

__all__ = [
    "INPUT_ONLY", "KEPT", "RECOMPUTED", "HeldActivations", "MemoryTable", "balance_by_count", "balance_by_memory",
    "balance_by_weight", "check_stages", "fastest_fitting", "held_activations", "micro_batch_sizes",
    "resolve_partition",
]


def resolve_partition(
    partition: str | Sequence[int],
    chunks: int,
    time_weights: Sequence[float],
    memory: MemoryTable | None = None,
) -> list[int]:
    """Layer counts per chunk (`chunks` of them, each >= 1, summing to len(`time_weights`)) for a
    `pipeline.partition` value: "uniform" (by count), "time" (by `time_weights`), "memory" or "fit"
    (these two need `memory`, a table of `chunks` chunks), or the counts themselves, checked.
    Raises a one-line ScenarioError for an unknown method or counts that do not fit."""
    if isinstance(partition, str):
        if partition == "uniform":
            return balance_by_count(len(time_weights), chunks)
        if partition == "time":
            return balance_by_weight(time_weights, chunks)
        if partition in ("memory", "fit"):
            if memory is None:
                raise ScenarioError(f"pipeline.partition: {partition} needs the schedule's memory table")
            if len(memory.held.placement) != chunks:
                raise ScenarioError(f"pipeline.partition: the memory table has {len(memory.held.placement)} "
                                    f"chunks, not {chunks}")
            return (balance_by_memory if partition == "memory" else fastest_fitting)(time_weights, memory)
        raise ScenarioError(f"pipeline.partition: unknown method {partition!r}")
    counts = list(partition)
    if len(counts) != chunks or sum(counts) != len(time_weights) or min(counts) < 1:
        raise ScenarioError(
            f"pipeline.partition: {counts} must give {chunks} chunks of >= 1 layer "
            f"summing to {len(time_weights)}"
        )
    return counts
