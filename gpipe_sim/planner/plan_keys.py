"""The key the search keeps a plan's figures under: equal for candidates that compile to the same plan, schedules told apart by their programs."""

from __future__ import annotations

import hashlib
from dataclasses import fields
from typing import Any, Sequence

from gpipe_sim.errors import GpipeError
from gpipe_sim.plan.experts import OVERLAPPING
from gpipe_sim.planner.space import Candidate
from gpipe_sim.schedule import build_schedule
from gpipe_sim.schedule.program import ProgramColumns

_SCHEDULE = Candidate._fields.index("schedule")  # its place among `Candidate.axes()`
_PARTITION = Candidate._fields.index("partition")  # the partition method only picks the counts, which the key holds


class PlanKeys:
    """Numbers the programs of the candidates' schedules by their content: two registered
    schedules that lower to the same programs and placement (GPipe and looped BFS at v = 1,
    ZB-H1 and interleaved ZB at v = 1, any two at K = 1) get one number, unless the schedule's
    name enters the costs otherwise (`OVERLAPPING`: the expert all-to-alls it hides). A
    candidate's `key` is then equal to another's exactly when the two compile to the same plan."""

    def __init__(self) -> None:
        self._by_content: dict[tuple[Any, ...], int] = {}
        self._by_arguments: dict[tuple[Any, ...], int] = {}

    def programs(self, cand: Candidate) -> int:
        """The number of `cand`'s schedule's programs: equal for equal programs, placement and
        `OVERLAPPING` membership; a number of its own (negative) where they cannot be built (the
        candidate does not compile: `compile_plan` says why)."""
        arguments = (cand.schedule, cand.stages, cand.micro_batches, cand.remat, cand.chunks)
        got = self._by_arguments.get(arguments)
        if got is None:
            try:
                schedule = build_schedule(cand.stages, cand.micro_batches, cand.schedule, cand.remat, cand.chunks)
            except GpipeError:
                got = -1 - len(self._by_arguments)
            else:
                digest = hashlib.blake2b(digest_size=16)
                for column in fields(ProgramColumns):
                    digest.update(getattr(schedule.columns, column.name).tobytes())
                content = (schedule.placement, cand.schedule in OVERLAPPING, digest.digest())
                got = self._by_content.setdefault(content, len(self._by_content))
            self._by_arguments[arguments] = got
        return got

    def key(self, cand: Candidate, counts: Sequence[int]) -> tuple[Any, ...]:
        """Equal for two candidates that compile to the same plan: every axis but the partition
        method (its `counts` instead) and the schedule (its programs' number instead)."""
        axes = [repr(value) for value in cand.axes()]
        axes[_SCHEDULE] = self.programs(cand)
        del axes[_PARTITION]
        return (*axes, cand.cleared, tuple(counts))
