"""gpipe_sim: a discrete-event model of GPipe-style pipeline-parallel training (no torch needed)."""

from gpipe_sim.errors import GpipeError, ScenarioError, ScheduleError, SimulationError
from gpipe_sim.plan.compile import Plan, compile_plan
from gpipe_sim.results.result import Result, StageResult, Timeline, analytic_bubble, summarize
from gpipe_sim.spec.scenario import Scenario, load_scenario, parse_scenario
from gpipe_sim.schedule import ACTION_KINDS, SCHEDULES, Action, Schedule, build_schedule, register
from gpipe_sim.api import simulate

__all__ = [
    "ACTION_KINDS", "Action", "GpipeError", "Plan", "Result", "SCHEDULES", "Scenario",
    "ScenarioError", "Schedule", "ScheduleError", "SimulationError", "StageResult", "Timeline",
    "analytic_bubble", "build_schedule", "compile_plan", "load_scenario", "parse_scenario",
    "register", "simulate", "summarize",
]
