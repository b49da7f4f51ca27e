"""First-come-first-served resources of capacity one for the SimPy engine, event for event SimPy's own.

`simpy.Resource(env, capacity=1)` grants requests in the order made and schedules, per request,
the grant (a normal-priority event, now or when it comes to the head of the queue) and, per
release, a Release event whose processing grants the next waiter. `Fcfs` schedules the same events
at the same times and priorities in the same order, so a simulation is the same to the bit
(`tests/test_fcfs.py`), without SimPy's per-request objects and queue scans. The one event it
leaves out is a release's where nobody waits: processing it would grant nothing; `take_now` leaves
out a grant that would be SimPy's next event (`gpipe_sim.engines.next_event`). One `Fcfs` holds
`n` such resources, numbered 0 .. n-1 (a plan's links, or its devices), as lists: making one costs
two lists, however many it holds.
"""

from __future__ import annotations

from collections import deque
from functools import partial

import simpy

from gpipe_sim.engines.next_event import clear_until


class Fcfs:
    """`n` resources, each one holder at a time, granted in request order (see the module docstring)."""

    __slots__ = ("env", "busy", "queues")

    def __init__(self, env: simpy.Environment, n: int) -> None:
        self.env = env
        self.busy = [False] * n
        self.queues: dict[int, deque[simpy.Event]] = {}  # resource -> its waiters, made at its first request

    def request(self, x: int) -> simpy.Event:
        """An event that succeeds when resource `x` is the caller's (now, where nobody holds it)."""
        event = simpy.Event(self.env)
        queue = self.queues.get(x)
        if queue is None:
            queue = self.queues[x] = deque()
        queue.append(event)
        if not self.busy[x]:  # the first waiter goes first, as SimPy grants its queue in order
            self._grant(x)
        return event

    def take_now(self, x: int) -> bool:
        """Take resource `x` now without an event where `request` would grant it before anything
        else happens: nobody holds or awaits it and no other event is due now, so its grant would
        be the next event processed (call it as `gpipe_sim.engines.next_event` says). False:
        nothing changed, `request` it."""
        if self.busy[x] or self.queues.get(x) or not clear_until(self.env, self.env.now):
            return False
        self.busy[x] = True
        return True

    def release(self, x: int) -> None:
        """The holder leaves resource `x` now; the first waiter, if any, gets it when SimPy's
        Release event would grant it (a normal-priority event scheduled now)."""
        self.busy[x] = False
        if self.queues.get(x):
            done = simpy.Event(self.env)
            done.callbacks.append(partial(self._granted_on_release, x))
            done.succeed()

    def _granted_on_release(self, x: int, _: simpy.Event) -> None:
        if not self.busy[x] and self.queues[x]:
            self._grant(x)

    def _grant(self, x: int) -> None:
        self.busy[x] = True
        self.queues[x].popleft().succeed()
