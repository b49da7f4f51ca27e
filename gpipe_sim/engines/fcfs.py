"""A first-come-first-served resource of capacity one for the SimPy engine, event for event SimPy's own.

`simpy.Resource(env, capacity=1)` grants requests in the order made and schedules, per request,
the grant (a normal-priority event, now or when it comes to the head of the queue) and, per
release, a Release event whose processing grants the next waiter. `Fcfs` schedules the same events
at the same times and priorities in the same order, so a simulation is the same to the bit
(`tests/test_sim_engine.py`), without SimPy's per-request objects and queue scans. The one event it
leaves out is a release's where nobody waits: processing it would grant nothing.
"""

from __future__ import annotations

from collections import deque

import simpy


class Fcfs:
    """One holder at a time, granted in request order (see the module docstring)."""

    __slots__ = ("env", "busy", "queue")

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.busy = False
        self.queue: deque[simpy.Event] = deque()

    def request(self) -> simpy.Event:
        """An event that succeeds when the resource is the caller's (now, where nobody holds it)."""
        event = simpy.Event(self.env)
        self.queue.append(event)
        if not self.busy:  # the first waiter goes first, as SimPy grants its queue in order
            self._grant()
        return event

    def release(self) -> None:
        """The holder leaves it now; the first waiter, if any, gets it when SimPy's Release event
        would grant it (a normal-priority event scheduled now)."""
        self.busy = False
        if self.queue:
            done = simpy.Event(self.env)
            done.callbacks.append(self._granted_on_release)
            done.succeed()

    def _granted_on_release(self, _: simpy.Event) -> None:
        if not self.busy and self.queue:
            self._grant()

    def _grant(self) -> None:
        self.busy = True
        self.queue.popleft().succeed()
