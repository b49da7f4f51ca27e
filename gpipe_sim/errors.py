"""Exceptions with one-line, user-facing messages."""

from __future__ import annotations


class GpipeError(Exception):
    """Base class: the message is one line that names the field or the cause.

    `exit_status` is what a command exits with when this error ends it (2: bad input).
    """

    exit_status = 2


class ScenarioError(GpipeError, ValueError):
    """A scenario (or a file it names) is malformed or describes an impossible pipeline."""


class ScheduleError(GpipeError, ValueError):
    """A schedule's action lists are inconsistent (unmatched transfer, deadlock, ...)."""


class SimulationError(GpipeError, RuntimeError):
    """The simulation could not complete (for example, a schedule that deadlocks)."""
