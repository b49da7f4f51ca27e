"""Schedules as data: one ordered program per pipeline rank, from a registered generator and one lowering."""

from gpipe_sim.schedule.actions import ACTION_KINDS, COMPUTE_KINDS, PASS_KINDS, Action, Kind, Pass, Tensor
from gpipe_sim.schedule.global_program import GlobalProgram, RankProgram, global_program
from gpipe_sim.schedule.lower import build_schedule, lower, saves_activations
from gpipe_sim.schedule.program import ProgramColumns, RematMode, Schedule
from gpipe_sim.schedule.registry import SCHEDULES, ScheduleFamily, register, schedule_family

from gpipe_sim.schedule import generators  # registers the built-in families

__all__ = [
    "generators",
    "ACTION_KINDS", "COMPUTE_KINDS", "PASS_KINDS", "Action", "GlobalProgram", "Kind", "Pass", "ProgramColumns",
    "RankProgram", "global_program", "RematMode", "SCHEDULES",
    "Schedule", "ScheduleFamily", "Tensor", "build_schedule", "lower", "register", "saves_activations",
    "schedule_family",
]
