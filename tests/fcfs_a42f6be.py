"""`gpipe_sim.engines.fcfs.Fcfs` as it stood at a42f6be, for the frozen engine beside it (`simpy_engine_a42f6be`)."""

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
