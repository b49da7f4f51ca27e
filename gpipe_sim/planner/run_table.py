"""The planner's training-run columns: each configuration's days, device-hours, goodput and cost."""

from __future__ import annotations

from typing import Any

from gpipe_sim.planner.entries import PlanEntry
from gpipe_sim.results.result import ModelFigures
from gpipe_sim.results.run_cost import RunCost, money, scenario_run_cost
from gpipe_sim.scenario.scenario import Scenario


def entry_run(base: Scenario, e: PlanEntry, figures: ModelFigures) -> RunCost | None:
    """The run's figures at this configuration's step time and devices (None: the scenario asks
    for none: no `training.tokens`, `training.goodput` or `hardware.price_per_device_hour`)."""
    return scenario_run_cost(base, e.step_time_s, e.devices, figures.tokens_per_step)


def table_run_columns(base: Scenario) -> tuple[str, ...]:
    """The table's run columns for what the scenario gives: days and device-hours with a token
    budget, goodput with its model, the run's cost (or, without tokens, the cost per hour) with a price."""
    t, price = base.training, base.hardware.price_per_device_hour
    cols = ("days", "device-hours") if t.tokens is not None else ()
    if t.goodput is not None:
        cols += ("goodput",)
    if price is not None:
        cols += ("cost",) if t.tokens is not None else ("cost/h",)
    return cols


def run_cells(base: Scenario, e: PlanEntry, figures: ModelFigures) -> list[str]:
    """An entry's cells under `table_run_columns` ("-" where the run never finishes: goodput 0)."""
    rc = entry_run(base, e, figures)
    if rc is None:
        return []
    cells: dict[str, Any] = {
        "days": rc.days, "device-hours": rc.device_hours, "cost": rc.cost, "cost/h": rc.cost_per_hour,
        "goodput": None if rc.goodput is None else rc.goodput.goodput,
    }
    shown = {"days": "{:,.1f}", "device-hours": "{:,.0f}", "goodput": "{:.1%}"}
    return ["-" if cells[c] is None else (money(cells[c]) if c.startswith("cost") else shown[c].format(cells[c]))
            for c in table_run_columns(base)]


def run_dict(base: Scenario, e: PlanEntry, figures: ModelFigures) -> dict[str, Any]:
    """{"training_run": the run's figures} for an entry's JSON and CSV ({} where the scenario asks for none)."""
    rc = entry_run(base, e, figures)
    return {} if rc is None else {"training_run": rc.to_dict()}
