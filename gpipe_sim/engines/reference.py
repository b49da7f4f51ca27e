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
    link, one process per transfer, every action a SimPy event. Returns (start, end) of every
    action in program order."""
    return _Textbook(plan).run()


class _Textbook:
    """One run of the textbook model: the SimPy environment, its resources and events, and the
    start and end of every action as they become known."""

    def __init__(self, plan: Plan) -> None:
        prog = plan.program
        self.plan, self.prog = plan, prog
        self.env = env = simpy.Environment()
        self.devices = {d: simpy.Resource(env, capacity=1) for d in set(plan.device_map)}
        self.links = [simpy.Resource(env, capacity=1) for _ in range(len(prog.dedicated))]
        self.delivered = [env.event() for _ in range(prog.num_messages)]
        self.start = np.zeros(len(prog.kind))
        self.end = np.zeros(len(prog.kind))
        self.on_device = plan.scenario.hardware.host.on_device
        self.size = prog.group_size
        # member d of group g started its all-reduce; the all-reduce's end posts messages wait_base + g*D + d
        self.started = [env.event() for _ in range(len(prog.group_seconds) * self.size)]
        self.wait_base = prog.num_messages - len(prog.group_seconds) * self.size
        self.replica_of = np.asarray(prog.rank) // max(1, len(plan.ranks))  # each action's replica

    def run(self) -> tuple[np.ndarray, np.ndarray]:
        """A process per all-reduce group, then one per rank; run them all to the end."""
        prog = self.prog
        for group in range(len(prog.group_seconds)):
            self.env.process(self.reduction(group, [int(i) for i in np.flatnonzero(prog.collective == group)]))
        for k in range(self.plan.num_ranks):
            self.env.process(self.rank(k))
        self.env.run()
        return self.start, self.end

    def transfer(self, i: int) -> Generator[simpy.Event, object, None]:
        """Send i: hold its link while it serializes, then its latency; then deliver its message."""
        prog, env = self.prog, self.env
        if prog.link[i] >= 0:
            with self.links[prog.link[i]].request() as request:
                yield request
                self.start[i] = env.now
                yield env.timeout(prog.serialization[i])
            yield env.timeout(prog.latency[i])
        else:
            self.start[i] = env.now
        self.end[i] = env.now
        self.delivered[prog.message[i]].succeed()

    def reduction(self, group: int, members: list[int]) -> Generator[simpy.Event, object, None]:
        """A data-parallel ring: once all D members started it, it holds every link it uses."""
        prog, env, size = self.prog, self.env, self.size
        yield simpy.AllOf(env, self.started[group * size:(group + 1) * size])
        held = []
        for x in sorted(set(int(x) for x in prog.group_links[group])):
            request = self.links[x].request()
            held.append((self.links[x], request))
            yield request
        begin = env.now
        yield env.timeout(prog.group_seconds[group])
        for resource, request in held:
            resource.release(request)
        for i in members:
            self.start[i], self.end[i] = begin, env.now
        for d in range(size):
            self.delivered[self.wait_base + group * size + d].succeed()

    def host(self, device: simpy.Resource, duration: float) -> Generator[simpy.Event, object, None]:
        """Host time of a transfer: on the device (held) when the hardware says so, else beside it."""
        if not self.on_device or duration <= 0:
            yield self.env.timeout(duration)
            return
        with device.request() as request:
            yield request
            yield self.env.timeout(duration)

    def rank(self, k: int) -> Generator[simpy.Event, object, None]:
        """Rank k's program, action by action."""
        prog, env, start, end = self.prog, self.env, self.start, self.end
        device = self.devices[self.plan.device_map[k]]
        for i in range(int(prog.offsets[k]), int(prog.offsets[k + 1])):
            kind = prog.kind[i]
            if kind == Kind.SEND:
                yield from self.host(device, prog.duration[i])  # host time to issue it
                env.process(self.transfer(i))
            elif kind == Kind.ALLREDUCE:
                group = int(prog.collective[i])
                self.started[group * self.size + int(self.replica_of[i])].succeed()
            elif kind == Kind.RECV:
                start[i] = env.now
                yield self.delivered[prog.message[i]]
                yield from self.host(device, prog.duration[i])  # host time to complete it
                end[i] = env.now
            else:
                with device.request() as request:
                    yield request
                    start[i] = env.now
                    yield env.timeout(prog.duration[i])
                    end[i] = env.now
