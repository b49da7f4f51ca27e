"""Executor errors: one-line messages that name the failing rank or the cause."""

from __future__ import annotations

from gpipe_sim.errors import GpipeError


class ExecutionError(GpipeError, RuntimeError):
    """A pipeline run failed: a rank raised, was killed, or the run timed out."""

    exit_status = 1


class PeerError(ExecutionError):
    """A transfer failed because the peer rank stopped (a consequence, not the cause)."""
