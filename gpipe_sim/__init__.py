"""gpipe_sim: a discrete-event model of GPipe-style pipeline-parallel training (no torch needed)."""

from __future__ import annotations

from importlib import import_module
from typing import Any

# Each public name and the module it lives in, imported on first use (PEP 562): a command that
# only prints its help never loads NumPy, pydantic or SimPy.
_EXPORTS = {
    "GpipeError": "gpipe_sim.errors", "ScenarioError": "gpipe_sim.errors",
    "ScheduleError": "gpipe_sim.errors", "SimulationError": "gpipe_sim.errors",
    "Plan": "gpipe_sim.plan.compile", "compile_plan": "gpipe_sim.plan.compile",
    "Result": "gpipe_sim.results.result", "StageResult": "gpipe_sim.results.result",
    "Timeline": "gpipe_sim.results.result", "summarize": "gpipe_sim.results.result",
    "fill_drain_bubble": "gpipe_sim.schedule.registry",
    "Scenario": "gpipe_sim.scenario.scenario", "load_scenario": "gpipe_sim.scenario.scenario",
    "parse_scenario": "gpipe_sim.scenario.scenario",
    "ACTION_KINDS": "gpipe_sim.schedule", "SCHEDULES": "gpipe_sim.schedule", "Action": "gpipe_sim.schedule",
    "Schedule": "gpipe_sim.schedule", "build_schedule": "gpipe_sim.schedule", "register": "gpipe_sim.schedule",
    "simulate": "gpipe_sim.api",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'gpipe_sim' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
