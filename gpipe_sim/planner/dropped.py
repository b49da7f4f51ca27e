"""What the planner leaves out of `--tensor-parallel`, `--context-parallel` and `--expert-parallel`, and why."""

from __future__ import annotations

from typing import Callable, Sequence

from gpipe_sim.model.context_parallel import context_parallel_problem
from gpipe_sim.model.tensor_parallel import tensor_parallel_problem
from gpipe_sim.planner.space import (PlanOptions, context_parallel_values, device_layouts, expert_parallel_values,
                                     tensor_parallel_values)
from gpipe_sim.scenario.scenario import Scenario


def _note(flag: str, given: Sequence[int] | None, kept: set[int], why: Callable[[int], str]) -> list[str]:
    """One line naming `flag`'s values not in `kept` with their reasons, values of one reason
    together; none where all are kept."""
    reasons: dict[str, list[int]] = {}
    for value in sorted(set(given or ()) - kept):
        reasons.setdefault(why(value), []).append(value)
    if not reasons:
        return []
    return [f"{flag}: left out " + "; ".join(f"{', '.join(map(str, values))} ({reason})"
                                              for reason, values in reasons.items())]


def dropped_notes(base: Scenario, options: PlanOptions) -> list[str]:
    """One line per option whose given values the planner cannot use (none given, or all used):
    the values and why, as the space's own rules say (`tensor_parallel_values`,
    `context_parallel_values`, `expert_parallel_values`): over the devices, a model the value does
    not split (the simulator's one-line reason), ranks that do not tile the nodes, or no device
    layout it fits."""
    per_node = base.hardware.devices_per_node
    nodes = f"ranks of that many devices do not tile nodes of {per_node}"
    N = options.devices
    T_values = tensor_parallel_values(base, options)

    def why_t(t: int) -> str:
        if t > N:
            return f"more than the {N:,} devices"
        return tensor_parallel_problem(base.model, t) or nodes

    def why_c(c: int) -> str:
        if all(c > N // t for t in T_values):
            return f"more than the {N:,} devices over T"
        return context_parallel_problem(base.model, c) or (nodes if T_values else "no T is left")

    layouts = device_layouts(base, options)
    C_kept = {c for t in T_values for c in context_parallel_values(base, options, t)}
    E_kept = {e for _, _, D, _ in layouts for e in expert_parallel_values(base, options, D)}
    experts = getattr(base.model, "experts", 0)

    def why_e(e: int) -> str:
        if not experts:
            return "the model has no experts"
        if experts % e:
            return f"does not divide its {experts:,} experts"
        return "divides no data-parallel size D of the layouts (E is carved from D)"

    return (_note("--tensor-parallel", options.tensor_parallel, set(T_values), why_t)
            + _note("--context-parallel", options.context_parallel, C_kept, why_c)
            + _note("--expert-parallel", options.expert_parallel, E_kept if layouts else set(), why_e))


__all__ = ["dropped_notes"]
