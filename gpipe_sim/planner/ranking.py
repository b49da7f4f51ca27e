"""The planner's search state: the entries recorded, the plans decided, the threshold a bound must beat."""

from __future__ import annotations

import heapq
import math
from typing import Any

from gpipe_sim.planner.entries import PlanEntry, _copy_entry
from gpipe_sim.planner.pruned import Pruned
from gpipe_sim.planner.space import Candidate
from gpipe_sim.planner.plan_keys import PlanKeys


class Ranking:
    """The search's state: every entry recorded, the simulated ones by their plan (`PlanKeys.key`),
    a lower bound of the step of each plan compiled (`floors`), the step
    times of the `top` best fitting signatures (whose worst is the threshold a bound must beat)
    and the fastest."""

    def __init__(self, top: int, space: int) -> None:
        self.top = top
        self.entries: list[PlanEntry] = []
        self.seen: dict[Any, PlanEntry] = {}
        self.plans = PlanKeys()
        self.floors: dict[Any, float] = {}
        self.pruned = Pruned(space)  # index -> (reason, figure, threshold)
        self._best_steps: list[float] = []  # max-heap (negated) of the top fitting step times, one per signature
        self._signatures: set[tuple[Any, ...]] = set()
        self.fastest = math.inf
        self.fixed: float | None = None  # while ties are resolved: the tie's limit
        self.close: set[int] = set()  # candidates pruned by a close bound: their pass orders', program's or timed step

    def threshold(self) -> float:
        """The `top`-th best fitting step time found (inf until `top` signatures fit); while
        ties are resolved, the fastest's step time plus the tie."""
        if self.fixed is not None:
            return self.fixed
        return -self._best_steps[0] if len(self._best_steps) >= self.top else math.inf

    def record(self, entry: PlanEntry) -> None:
        """Keep the entry; a fitting one of a new signature may lower the threshold."""
        self.entries.append(entry)
        if entry.fits:
            self.fastest = min(self.fastest, entry.step_time_s)
        if entry.fits and entry.signature not in self._signatures:
            self._signatures.add(entry.signature)
            if len(self._best_steps) < self.top:
                heapq.heappush(self._best_steps, -entry.step_time_s)
            elif entry.step_time_s < -self._best_steps[0]:
                heapq.heapreplace(self._best_steps, -entry.step_time_s)

    def floor_prunes(self, index: int, key: Any, floor: float) -> bool:
        """Note `floor` (at most the step of the plan under `key`, where not None) and prune the
        candidate where it is above the threshold (noted "bound" in `pruned`, a close bound)."""
        if key is not None:
            self.floors[key] = max(floor, self.floors.get(key, -math.inf))
        limit = self.threshold()
        if floor > limit:
            self.pruned[index] = ("bound", floor, limit)
            self.close.add(index)
            return True
        return False

    def repeats(self, key: Any, index: int) -> bool:
        """Prune the candidate by the floor noted for its plan, where one was and is above the threshold."""
        return key in self.floors and self.floor_prunes(index, key, self.floors[key])

    def reuse(self, key: Any, index: int, cand: Candidate) -> bool:
        """Record the figures of the entry simulated under `key` for this candidate; False if none."""
        if key is None or key not in self.seen:
            return False
        self.record(_copy_entry(self.seen[key], index, cand))
        return True
