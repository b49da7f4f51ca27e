"""Why the planner's pick has its recompute mode and ZeRO stage: the same configuration under each other value searched."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpipe_sim.schema.units import format_bytes, format_seconds

if TYPE_CHECKING:
    from gpipe_sim.planner.search import Candidate, PlanEntry, PlanSearch

# the axes explained, as the reports name them
AXIS_NAMES = {"remat": "recompute (remat)", "zero": "ZeRO stage"}


def _other(e: PlanEntry, pick: PlanEntry, limit: float) -> str:
    """A simulated configuration against the pick: it does not fit, or its step on the pick's."""
    if not e.fits:
        return f"peak {format_bytes(e.peak_memory_bytes)} > {format_bytes(limit)}: does not fit"
    change = e.step_time_s / pick.step_time_s - 1.0 if pick.step_time_s > 0 else 0.0
    tie = ", within the tie: the simpler is preferred" if e.tied and change >= 0 and e is not pick else ""
    return f"step {format_seconds(e.step_time_s)} ({change:+.1%} on the pick{tie}), peak {format_bytes(e.peak_memory_bytes)}"


def _pruned(code: str, figure: float, limit: float) -> str:
    """A configuration the search did not simulate, in words."""
    if code == "memory":
        return f"needs at least {format_bytes(figure)} > {format_bytes(limit)}: does not fit"
    if code == "bound":
        return f"takes at least {format_seconds(figure)} by the step-time bound: slower than the pick"
    return "not simulated: within the tie, but a simpler configuration ranks first"


def axis_text(search: PlanSearch, axis: str) -> str:
    """One line on the pick's value of `axis` ("remat" or "zero") where the search tried others in
    the pick's configuration (else ""): "ZeRO stage: picked 2 (step, peak); 0: peak ... > ...: does
    not fit; 3: step ... (+x% on the pick)", each other value the same configuration otherwise."""
    pick = search.pick
    if pick is None:
        return ""
    mine = pick.candidate
    indices: dict[Candidate, list[int]] = {}  # each other configuration's indices in the space
    block = search.candidates.block_of(pick.index)  # remat and ZeRO vary within a block only
    for i, c in enumerate(block.candidates(), block.start):
        if c != mine and mine.differs_only_in(axis, c):
            indices.setdefault(c, []).append(i)
    others = list(indices)
    if not others:
        return ""
    entries = {e.candidate: e for e in (*search.simulated_entries, *search.ranked)}
    pruned = {}  # the pruned reason of its last index pruned
    for c, where in indices.items():
        for i in where:
            if i in search.pruned:
                pruned[c] = search.pruned[i][:2]
    parts = [f"{AXIS_NAMES[axis]}: picked {getattr(mine, axis)} (step {format_seconds(pick.step_time_s)}, "
             f"peak {format_bytes(pick.peak_memory_bytes)})"]
    for c in others:
        e = entries.get(c)
        if e is not None:
            parts.append(f"{getattr(c, axis)}: {_other(e, pick, search.limit_bytes)}")
        elif c in pruned:
            parts.append(f"{getattr(c, axis)}: {_pruned(*pruned[c], search.limit_bytes)}")
        else:
            parts.append(f"{getattr(c, axis)}: not compiled (refused or infeasible; see --csv)")
    return "; ".join(parts)


__all__ = ["AXIS_NAMES", "axis_text"]
