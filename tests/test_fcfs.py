"""The SimPy engine's first-come-first-served resource (`Fcfs`) against `simpy.Resource(capacity=1)`:
the same grants, at the same times, in the same order among every other event of a simulation."""

from __future__ import annotations

import random

import pytest
import simpy

from gpipe_sim.engines.fcfs import Fcfs


def _log(make: str, seed: int) -> list[tuple[float, str]]:
    """Everything that happens, in SimPy's processing order: 12 processes each taking one of two
    resources (or both) at integer times (so many requests, releases and wake-ups coincide)."""
    rng = random.Random(seed)
    env = simpy.Environment()
    log: list[tuple[float, str]] = []
    if make == "simpy":
        resources = [simpy.Resource(env, capacity=1) for _ in range(2)]
    else:
        resources = [Fcfs(env) for _ in range(2)]

    def take(resource: object) -> simpy.Event:
        return resource.request()  # type: ignore[attr-defined]

    def give(resource: object, request: simpy.Event) -> None:
        if make == "simpy":
            resource.release(request)  # type: ignore[attr-defined]
        else:
            resource.release()  # type: ignore[attr-defined]

    def worker(name: int, plan: list[tuple[int, int, list[int]]]):
        for wait, hold, which in plan:
            yield env.timeout(wait)
            log.append((env.now, f"{name} asks {which}"))
            held = []
            for r in which:
                request = take(resources[r])
                yield request
                held.append((resources[r], request))
                log.append((env.now, f"{name} holds {r}"))
            yield env.timeout(hold)
            for resource, request in held:
                give(resource, request)
            log.append((env.now, f"{name} leaves"))

    for name in range(12):
        plan = [(rng.randint(0, 2), rng.randint(0, 2), rng.choice([[0], [1], [0], [0, 1]])) for _ in range(8)]
        env.process(worker(name, plan))
    env.run()
    return log


@pytest.mark.parametrize("seed", range(40))
def test_fcfs_is_simpys_resource_event_for_event(seed: int) -> None:
    assert _log("fcfs", seed) == _log("simpy", seed)
