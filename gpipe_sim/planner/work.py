"""A candidate's compute for one replica, layer by layer (`Work`): what every step-time bound reads."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from gpipe_sim.planner.segments import cumulative


@dataclass(frozen=True)
class Work:
    """A candidate's per-layer figures for one replica: `work`, compute seconds over all
    micro-batches (re-computation, the cheaper of full or split backward, the update); `trail`,
    the part of it that may run after a chunk's last input-gradient pass (the update and every
    weight-gradient pass); and one (the smallest) micro-batch's forward and backward seconds."""

    work: np.ndarray
    trail: np.ndarray
    forward: np.ndarray
    backward: np.ndarray
    largest: int  # samples in the largest micro-batch
    smallest: int  # samples in the smallest micro-batch

    @cached_property
    def total(self) -> float:
        """Compute seconds of a replica over every layer."""
        return float(self.work.sum())

    @cached_property
    def chain(self) -> float:
        """One micro-batch's forward and backward through every layer."""
        return float(self.forward.sum() + self.backward.sum())

    @cached_property
    def cums(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Running sums (from 0) of `work`, `forward`, `backward` and `trail` over the layers."""
        return cumulative(self.work), cumulative(self.forward), cumulative(self.backward), cumulative(self.trail)

    @classmethod
    def with_sums(cls, work: np.ndarray, trail: np.ndarray, forward: np.ndarray, backward: np.ndarray,
                  largest: int, smallest: int, *, total: float, chain: float,
                  cums: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> "Work":
        """A `Work` given its sums (`total`, `chain`, `cums`), made for many at once elsewhere
        (`work_rows.WorkRows`): the caller's to make equal to those it would compute."""
        got = cls(work, trail, forward, backward, largest, smallest)
        # functools.cached_property keeps each figure in the instance's __dict__ under its name
        vars(got).update(total=total, chain=chain, cums=cums)
        return got
