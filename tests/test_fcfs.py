"""The SimPy engine's first-come-first-served resources (`Fcfs`) against `simpy.Resource(capacity=1)`:
the same grants, at the same times, in the same order among every other event of a simulation,
taken by request or, where that is its next event, at once (`Fcfs.take_now`)."""

from __future__ import annotations

import random
from typing import Generator

import pytest
import simpy

from gpipe_sim.engines.fcfs import Fcfs
from gpipe_sim.engines.next_event import sleep


def _log(make: str, seed: int) -> tuple[list[tuple[float, str]], int]:
    """Everything that happens, in SimPy's processing order, and the number of events processed:
    2 to 12 processes each taking one of two resources (or both) at integer times (so many requests,
    releases and wake-ups coincide). `make`: "simpy" (`simpy.Resource`), "fcfs" (`Fcfs.request`),
    "inline" (`Fcfs.take_now` and `next_event.sleep`, events processed in line where they are next)."""
    rng = random.Random(seed)
    env = simpy.Environment()
    log: list[tuple[float, str]] = []
    steps = [0]
    resources = [simpy.Resource(env, capacity=1) for _ in range(2)] if make == "simpy" else Fcfs(env, 2)

    def take(r: int) -> Generator[simpy.Event, object, object]:
        if make == "simpy":
            request = resources[r].request()  # type: ignore[index]
            yield request
            return request
        if make == "fcfs" or not resources.take_now(r):  # type: ignore[union-attr]
            yield resources.request(r)  # type: ignore[union-attr]
        return None

    def give(r: int, request: object) -> None:
        if make == "simpy":
            resources[r].release(request)  # type: ignore[index]
        else:
            resources.release(r)  # type: ignore[union-attr]

    def wait(delay: float) -> Generator[simpy.Event, object, None]:
        if make == "inline":
            yield from sleep(env, delay)
        else:
            yield env.timeout(delay)

    def worker(name: int, plan: list[tuple[int, int, list[int]]]):
        for delay, hold, which in plan:
            yield from wait(delay)
            log.append((env.now, f"{name} asks {which}"))
            held = []
            for r in which:
                request = yield from take(r)
                held.append((r, request))
                log.append((env.now, f"{name} holds {r}"))
            yield from wait(hold)
            for r, request in held:
                give(r, request)
            log.append((env.now, f"{name} leaves"))

    for name in range(rng.randint(2, 12)):
        plan = [(rng.randint(0, 2), rng.randint(0, 2), rng.choice([[0], [1], [0], [0, 1]])) for _ in range(8)]
        env.process(worker(name, plan))
    while env.peek() < float("inf"):
        env.step()
        steps[0] += 1
    return log, steps[0]


@pytest.mark.parametrize("seed", range(40))
def test_fcfs_is_simpys_resource_event_for_event(seed: int) -> None:
    assert _log("fcfs", seed)[0] == _log("simpy", seed)[0]
    assert _log("inline", seed)[0] == _log("simpy", seed)[0]


def test_events_processed_in_line_are_left_out():
    requested = sum(_log("fcfs", seed)[1] for seed in range(40))
    in_line = sum(_log("inline", seed)[1] for seed in range(40))
    assert in_line < 0.9 * requested
