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


def one_line(text: str, limit: int = 500) -> str:
    """`text` with line breaks and other control characters escaped, cut to `limit` characters:
    every message a command prints is one line, whatever the user's keys and values hold."""
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none): what a
    one-line error quotes of a cause raised by a library."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
