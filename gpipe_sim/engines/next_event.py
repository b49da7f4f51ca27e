"""SimPy's next event processed in line: where an event just scheduled would be the next one SimPy
processes, doing its work at once is the same simulation, one event fewer.

SimPy processes events by (time, priority, scheduling order), so an event scheduled now for time
`at` comes before every event already due later than `at` and after every event already due at or
before it. Where none is due at or before `at` (`clear_until`), it is the next event processed,
and processing it at once (the clock set to `at`, then its callback) changes nothing another event
could see, provided nothing else runs in the current step before it would have been processed:
call these only from a process (its continuation is the only code left in the step) or from the
only callback of the event being processed. Every event those go on to schedule is then in the
queue, and every later check sees it.
"""

from __future__ import annotations

from typing import Callable, Generator

import simpy


def clear_until(env: simpy.Environment, at: float) -> bool:
    """Whether no event is due at or before `at`: one scheduled now for `at` would be the next processed."""
    queue = env._queue  # SimPy's heap of (time, priority, id, event); `env.peek()` is its head's time
    return not queue or queue[0][0] > at


def sleep(env: simpy.Environment, delay: float) -> Generator[simpy.Event, object, None]:
    """`yield env.timeout(delay)`, with the clock moved to its time at once where that timeout would
    be the next event processed (`clear_until`; module docstring: from a process only)."""
    at = env.now + delay  # the time SimPy would schedule it for
    if clear_until(env, at):
        env._now = at  # as SimPy's step sets it on taking that timeout
    else:
        yield env.timeout(delay)


def after(env: simpy.Environment, delay: float, callback: Callable[[object], None]) -> None:
    """Call `callback` `delay` seconds from now, as a timeout's callback, or at once with the clock
    moved to that time where the timeout would be the next event processed (module docstring: from
    the only callback of the event being processed)."""
    at = env.now + delay
    if clear_until(env, at):
        env._now = at
        callback(None)
    else:
        env.timeout(delay).callbacks.append(callback)
