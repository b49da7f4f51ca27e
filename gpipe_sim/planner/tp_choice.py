"""Why the planner's pick has its T, C and E: the pick's figures beside the best of every other
value searched, or what kept that value out (memory, or a step-time bound)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from gpipe_sim.schema.units import format_bytes, format_seconds

if TYPE_CHECKING:
    from gpipe_sim.planner.search import PlanEntry, PlanSearch


def searched_tp(search: PlanSearch) -> list[int]:
    """The T values of the configurations the search enumerated (or refused)."""
    return sorted(search.candidates.values("T") | {r[6] for r in search.rejected if len(r) > 6})


def searched_cp(search: PlanSearch) -> list[int]:
    """The C values of the configurations the search enumerated."""
    return sorted(search.candidates.values("C"))


def searched_ep(search: PlanSearch) -> list[int]:
    """The E values of the configurations the search enumerated."""
    return sorted(search.candidates.values("E"))


def _figures(e: PlanEntry, pick: PlanEntry | None) -> str:
    """Step (against the pick), peak and the tensor-parallel collectives of the rank with the most
    (`PlanEntry.max_stage_tp_comm_s`)."""
    versus = ""
    if pick is not None and e is not pick and pick.step_time_s > 0:
        change = e.step_time_s / pick.step_time_s - 1.0
        versus = f" ({change:+.1%} on the pick)" if abs(change) >= 0.0005 else " (as fast as the pick)"
    comm = f", TP collectives {format_seconds(e.max_stage_tp_comm_s)} a step" if e.get("T") > 1 else ""
    return f"step {format_seconds(e.step_time_s)}{versus}, peak {format_bytes(e.peak_memory_bytes)}{comm}"


def _pruned_by_value(search: PlanSearch, axis: str) -> dict[int, tuple[list[float], np.ndarray, int]]:
    """Per value of `axis`, its pruned configurations' (memory figures, finite step-time bounds,
    how many were "preferred"), in one pass over the pruned."""
    pruned = search.pruned
    values = search.candidates.column(axis)
    out: dict[int, tuple[list[float], np.ndarray, int]] = {}
    held = np.flatnonzero(pruned.code >= 0)
    ids = {name: code for code, name in enumerate(pruned.names)}
    memory, bound, preferred = (ids.get(name, -1) for name in ("memory", "bound", "preferred"))
    held_values = values[held]
    for value in np.unique(held_values).tolist():
        mine = held[held_values == value]
        figures, codes = pruned.figure[mine], pruned.code[mine]
        bounds = figures[codes == bound]
        out[value] = (figures[codes == memory].tolist(), bounds[np.isfinite(bounds)],
                      int((codes == preferred).sum()))
    return out


def _kept_out(search: PlanSearch, T: int, pick: PlanEntry | None, axis: str,
              pruned: dict[int, tuple[list[float], np.ndarray, int]]) -> str:
    """Why no configuration with this value of `axis` (T or C) fits or was simulated: the least
    memory one needs, or the step-time bound that every simulated-free one is at least
    (`pruned`: `_pruned_by_value`)."""
    memory, bound, preferred = pruned.get(T, ([], np.zeros(0), 0))
    memory = list(memory)
    memory += [e.peak_memory_bytes for e in search.simulated_entries if e.get(axis) == T and not e.fits]
    cap = format_bytes(search.limit_bytes)
    if preferred:
        return (f"not simulated: {preferred:,} configurations may be within the tie of the fastest, but "
                "simpler tied ones rank before them (the tie's order: smaller T, C, E, fewer stages, ...)")
    if len(bound):
        least = float(bound.min())
        versus = f" ({least / pick.step_time_s - 1.0:+.1%} on the pick)" if pick and pick.step_time_s > 0 else ""
        text = f"not simulated: every configuration that may fit takes at least {format_seconds(least)} by the step-time bound{versus}"
        return text + (f"; {len(memory):,} others need more than {cap} per device" if memory else "")
    if memory:
        return (f"no configuration fits: the layers' weights and activations need at least "
                f"{format_bytes(min(memory))} per device > {cap}")
    return "no configuration of it compiles or the space refused every one (see --csv)"


def tp_text(search: PlanSearch, describe: Callable[[PlanEntry], str]) -> str:
    """One line on the pick's T when more than one T was searched (else ""): "tensor parallelism:
    picked T=2 (step, peak, TP collectives a step); T=1: no configuration fits: ...; T=4: best
    (configuration), step (+x% on the pick), ..."; `describe` writes a configuration in words."""
    return _axis_choice(search, describe, "T", "tensor parallelism", searched_tp(search))


def cp_text(search: PlanSearch, describe: Callable[[PlanEntry], str]) -> str:
    """The same line for the pick's C (context parallelism) when more than one C was searched."""
    return _axis_choice(search, describe, "C", "context parallelism", searched_cp(search))


def ep_text(search: PlanSearch, describe: Callable[[PlanEntry], str]) -> str:
    """The same line for the pick's E (expert parallelism) when more than one E was searched."""
    return _axis_choice(search, describe, "E", "expert parallelism", searched_ep(search))


def _axis_choice(search: PlanSearch, describe: Callable[[PlanEntry], str], axis: str, name: str,
                 values: list[int]) -> str:
    """The pick's value of `axis` (T or C) beside the best configuration of each other value
    searched, or what kept it out (`_kept_out`); "" when one value was searched."""
    if len(values) < 2:
        return ""
    pick = search.pick
    best: dict[int, PlanEntry] = {}
    for e in search.ranked:  # fastest first
        best.setdefault(e.get(axis), e)
    parts = [f"{name}: picked {axis}={pick.get(axis)} ({_figures(pick, None)})" if pick is not None
             else f"{name}: nothing fits with any {axis}"]
    pruned: dict[int, tuple[list[float], np.ndarray, int]] | None = None
    for value in values:
        if pick is not None and value == pick.get(axis):
            continue
        e = best.get(value)
        if e is None:
            pruned = _pruned_by_value(search, axis) if pruned is None else pruned
            parts.append(f"{axis}={value}: {_kept_out(search, value, pick, axis, pruned)}")
            continue
        tied = (f" (within the tie: the smaller {axis} is preferred)"
                if pick is not None and e.tied and value > pick.get(axis) else "")
        parts.append(f"{axis}={value}: best {describe(e)}: {_figures(e, pick)}{tied}")
    return "; ".join(parts)
