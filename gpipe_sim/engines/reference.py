"""The textbook SimPy model of a plan: one Resource per device and per link, one process per
transfer, every action a SimPy event. Slow and obviously right: the reference the engines are tested against."""

from __future__ import annotations

from typing import Generator

import numpy as np
import simpy

from gpipe_sim.plan.compile import Plan
from gpipe_sim.schedule import Kind


def straightforward_simpy(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """The textbook SimPy model of the same plan, as a baseline: one Resource per device and per
    link, one process per transfer, every action a SimPy event."""
    prog = plan.program
    env = simpy.Environment()
    devices = {d: simpy.Resource(env, capacity=1) for d in set(plan.device_map)}
    links = [simpy.Resource(env, capacity=1) for _ in range(len(prog.dedicated))]
    delivered = [env.event() for _ in range(prog.num_messages)]
    start = np.zeros(len(prog.kind))
    end = np.zeros(len(prog.kind))

    def transfer(i: int) -> Generator[simpy.Event, object, None]:
        if prog.link[i] >= 0:
            with links[prog.link[i]].request() as request:
                yield request
                start[i] = env.now
                yield env.timeout(prog.serialization[i])
            yield env.timeout(prog.latency[i])
        else:
            start[i] = env.now
        end[i] = env.now
        delivered[prog.message[i]].succeed()

    on_device = plan.scenario.hardware.host.on_device
    size = prog.group_size
    started = [env.event() for _ in range(len(prog.group_seconds) * size)]  # member d of group g started
    wait_base = prog.num_messages - len(prog.group_seconds) * size

    def reduction(group: int, members: list[int]) -> Generator[simpy.Event, object, None]:
        """A data-parallel ring: once all D members started it, it holds every link it uses."""
        yield simpy.AllOf(env, started[group * size:(group + 1) * size])
        held = []
        for x in sorted(set(int(x) for x in prog.group_links[group])):
            request = links[x].request()
            held.append((links[x], request))
            yield request
        begin = env.now
        yield env.timeout(prog.group_seconds[group])
        for resource, request in held:
            resource.release(request)
        for i in members:
            start[i], end[i] = begin, env.now
        for d in range(size):
            delivered[wait_base + group * size + d].succeed()

    for group in range(len(prog.group_seconds)):
        env.process(reduction(group, [int(i) for i in np.flatnonzero(prog.collective == group)]))
    replica_of = np.asarray(prog.rank) // max(1, len(plan.ranks))

    def host(device: simpy.Resource, duration: float) -> Generator[simpy.Event, object, None]:
        if not on_device or duration <= 0:
            yield env.timeout(duration)
            return
        with device.request() as request:
            yield request
            yield env.timeout(duration)

    def rank(k: int) -> Generator[simpy.Event, object, None]:
        device = devices[plan.device_map[k]]
        for i in range(int(prog.offsets[k]), int(prog.offsets[k + 1])):
            kind = prog.kind[i]
            if kind == Kind.SEND:
                yield from host(device, prog.duration[i])  # host time to issue it
                env.process(transfer(i))
            elif kind == Kind.ALLREDUCE:
                group = int(prog.collective[i])
                started[group * size + int(replica_of[i])].succeed()
            elif kind == Kind.RECV:
                start[i] = env.now
                yield delivered[prog.message[i]]
                yield from host(device, prog.duration[i])  # host time to complete it
                end[i] = env.now
            else:
                with device.request() as request:
                    yield request
                    start[i] = env.now
                    yield env.timeout(prog.duration[i])
                    end[i] = env.now

    for k in range(plan.num_ranks):
        env.process(rank(k))
    env.run()
    return start, end
