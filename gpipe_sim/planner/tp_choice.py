"""Why the planner's pick has its T: the pick's tensor-parallel figures beside the best of every
other T searched, or what kept that T out (memory, or a step-time bound)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

from gpipe_sim.spec.units import format_bytes, format_seconds

if TYPE_CHECKING:
    from gpipe_sim.planner.search import PlanEntry, PlanSearch


def searched_tp(search: PlanSearch) -> list[int]:
    """The T values of the configurations the search enumerated (or refused)."""
    return sorted({c.tensor_parallel for c in search.candidates} | {r[6] for r in search.rejected if len(r) > 6})


def _figures(e: PlanEntry, pick: PlanEntry | None) -> str:
    """Step (against the pick), peak and the tensor-parallel collectives of the rank with the most
    (`PlanEntry.max_stage_tp_comm_s`)."""
    versus = ""
    if pick is not None and e is not pick and pick.step_time_s > 0:
        change = e.step_time_s / pick.step_time_s - 1.0
        versus = f" ({change:+.1%} on the pick)" if abs(change) >= 0.0005 else " (as fast as the pick)"
    comm = f", TP collectives {format_seconds(e.max_stage_tp_comm_s)} a step" if e.get("T") > 1 else ""
    return f"step {format_seconds(e.step_time_s)}{versus}, peak {format_bytes(e.peak_memory_bytes)}{comm}"


def _kept_out(search: PlanSearch, T: int, pick: PlanEntry | None) -> str:
    """Why no configuration of this T fits or was simulated: the least memory one needs, or the
    step-time bound that every simulated-free one is at least."""
    memory, bound, preferred = [], [], 0
    for i, (code, figure, _) in search.pruned.items():
        if search.candidates[i].tensor_parallel == T:
            preferred += code == "preferred"
            (memory if code == "memory" else bound if code == "bound" else []).append(figure)
    memory += [e.peak_memory_bytes for e in search.simulated_entries if e.get("T") == T and not e.fits]
    bound = [b for b in bound if math.isfinite(b)]
    cap = format_bytes(search.limit_bytes)
    if preferred:
        return (f"not simulated: {preferred:,} configurations may be within the tie of the fastest, but "
                "simpler tied ones (a smaller T first) rank before them")
    if bound:
        least = min(bound)
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
    values = searched_tp(search)
    if len(values) < 2:
        return ""
    pick = search.pick
    best: dict[int, PlanEntry] = {}
    for e in search.ranked:  # fastest first
        best.setdefault(e.get("T"), e)
    parts = []
    if pick is not None:
        parts.append(f"tensor parallelism: picked T={pick.get('T')} ({_figures(pick, None)})")
    else:
        parts.append("tensor parallelism: nothing fits with any T")
    for T in values:
        if pick is not None and T == pick.get("T"):
            continue
        e = best.get(T)
        if e is None:
            parts.append(f"T={T}: {_kept_out(search, T, pick)}")
            continue
        tied = (" (within the tie: the smaller T is preferred)"
                if pick is not None and e.tied and T > pick.get("T") else "")
        parts.append(f"T={T}: best {describe(e)}: {_figures(e, pick)}{tied}")
    return "; ".join(parts)
