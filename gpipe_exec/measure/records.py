"""What each rank records of a step as it runs: per action its kind, chunk, micro-batch, message and times."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

@dataclass
class StepRecord:
    """One rank's record of one step, per action as it ran: kind (a Kind code), chunk, micro-batch,
    message key (-1: not a transfer), start and end; activation bytes held after it; peaks."""

    kind: list[int] = field(default_factory=list)
    chunk: list[int] = field(default_factory=list)
    micro_batch: list[int] = field(default_factory=list)
    message: list[int] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    step_start: float = 0.0
    held: list[float] = field(default_factory=list)  # activation bytes held after each action (rank)
    peak_activation_bytes: float = 0.0  # the rank's, over all its chunks
    chunk_peak_activation_bytes: dict[int, float] = field(default_factory=dict)  # each chunk on its own
    cuda_peak_bytes: float | None = None
    # The memory step only (`step(memory=True)`): the rank's real tensor bytes (measure.memory),
    # their peak over the step, the total per category at that peak, and per action the peak
    # while it ran and the bytes live after it.
    memory_peak_bytes: float | None = None
    memory_breakdown: dict[str, float] = field(default_factory=dict)
    memory_action_peaks: list[float] = field(default_factory=list)
    memory_levels: list[float] = field(default_factory=list)
    # overlap_grad_reduce: per chunk, when each of its gradient buckets' all-reduces was started
    bucket_starts: dict[int, list[float]] = field(default_factory=dict)
    loss: float = 0.0  # the sum of the micro-batches' losses (on the rank holding the last chunk)

    def __len__(self) -> int:
        return len(self.kind)


def record_columns(records: list[StepRecord]) -> dict[str, np.ndarray]:
    """The records of one step, rank after rank, as timeline columns (times not shifted)."""
    return {
        "rank": np.concatenate([np.full(len(r), k, dtype=np.int32) for k, r in enumerate(records)]),
        "chunk": np.concatenate([np.asarray(r.chunk, dtype=np.int32) for r in records]),
        "kind": np.concatenate([np.asarray(r.kind, dtype=np.int8) for r in records]),
        "micro_batch": np.concatenate([np.asarray(r.micro_batch, dtype=np.int32) for r in records]),
        "message": np.concatenate([np.asarray(r.message, dtype=np.int64) for r in records]),
        "start_s": np.concatenate([np.asarray(r.starts, dtype=float) for r in records]),
        "end_s": np.concatenate([np.asarray(r.ends, dtype=float) for r in records]),
    }
