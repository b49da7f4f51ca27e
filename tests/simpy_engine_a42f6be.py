"""The SimPy engine as it stood at a42f6be (every SimPy event taken, none processed in line), kept
verbatim as the reference `tests/test_simpy_inline.py` holds the engine to, result for result, bit for bit."""

from __future__ import annotations

from typing import Callable, Generator

import numpy as np
import simpy
from simpy.events import URGENT

from gpipe_sim.errors import SimulationError
from fcfs_a42f6be import Fcfs
from gpipe_sim.engines.chain import ALLREDUCE, RECV, SEND  # plain ints: the per-action loop compares them
from gpipe_sim.plan.compile import Plan
from gpipe_sim.plan.costed_program import Program

_Proc = Generator[simpy.Event, object, None]


class _Run:
    """State of one simulation: clocks, mailboxes, resources and the recorded timeline."""

    def __init__(self, plan: Plan) -> None:
        prog = plan.program
        self.env = simpy.Environment()
        self.prog = prog
        n = len(prog.kind)
        self.start = [0.0] * n
        self.end = [0.0] * n
        self.arrival: list[float | None] = [None] * prog.num_messages
        self.waiting: dict[int, simpy.Event] = {}
        self.link_free = [0.0] * len(prog.dedicated)
        self.owned = _owned_links(prog)
        self.pending = [0] * len(prog.dedicated)  # per owned link: rings and queued sends holding or awaiting it
        self.link_res = [
            None if dedicated else Fcfs(self.env) for dedicated in prog.dedicated
        ]
        self.device_res: dict[int, Fcfs] = {}
        for k, device in enumerate(plan.device_map[:plan.num_ranks]):
            if prog.shared_device[k] and device not in self.device_res:
                self.device_res[device] = Fcfs(self.env)
        self.device_map = plan.device_map
        self.host_on_device = plan.scenario.hardware.host.on_device
        self.position = [int(o) for o in prog.offsets[:-1]]
        self.done = [False] * plan.num_ranks
        # data-parallel reductions: members started so far, the latest start, their actions
        groups = len(prog.group_seconds)
        self.group_started = [0] * groups
        self.group_ready = [0.0] * groups
        self.group_actions: list[list[int]] = [[] for _ in range(groups)]
        self.wait_base = prog.num_messages - groups * prog.group_size

    def post(self, message: int, at: float) -> None:
        self.arrival[message] = at
        event = self.waiting.pop(message, None)
        if event is not None:
            event.succeed()

    def rank(self, k: int) -> _Proc:
        env, prog = self.env, self.prog
        lo, hi = int(prog.offsets[k]), int(prog.offsets[k + 1])
        kinds = prog.kind[lo:hi].tolist()
        durs = prog.duration[lo:hi].tolist()
        msgs = prog.message[lo:hi].tolist()
        links = prog.link[lo:hi].tolist()
        sers = prog.serialization[lo:hi].tolist()
        lats = prog.latency[lo:hi].tolist()
        start, end, arrival, link_free = self.start, self.end, self.arrival, self.link_free
        dedicated = prog.dedicated.tolist()
        owned, pending = self.owned, self.pending
        device = self.device_res.get(self.device_map[k]) if prog.shared_device[k] else None
        host_device = device if self.host_on_device else None
        t = 0.0
        for j in range(hi - lo):
            i = lo + j
            self.position[k] = i
            code = kinds[j]
            if code == RECV:
                a = arrival[msgs[j]]
                if a is None:
                    event = env.event()
                    self.waiting[msgs[j]] = event
                    yield event
                    a = arrival[msgs[j]]
                start[i] = t
                if a > t:  # type: ignore[operator]
                    t = a  # type: ignore[assignment]
                # host time to complete the receive
                if host_device is not None and durs[j] > 0:
                    t = yield from self._hold(host_device, t, durs[j])
                else:
                    t += durs[j]
                end[i] = t
            elif code == SEND:
                # host time to issue the send; the transfer leaves after it
                if host_device is not None and durs[j] > 0:
                    t = yield from self._hold(host_device, t, durs[j])
                else:
                    t += durs[j]
                link = links[j]
                if link < 0:
                    start[i] = end[i] = t
                    self.post(msgs[j], t)
                elif dedicated[link] or (owned[link] and not pending[link]):
                    s = link_free[link]
                    if t > s:
                        s = t
                    free = s + sers[j]
                    link_free[link] = free
                    start[i] = s
                    end[i] = free + lats[j]
                    self.post(msgs[j], end[i])
                else:
                    if t > env.now:
                        yield env.timeout(t - env.now)
                    if owned[link]:
                        pending[link] += 1
                    self._transfer(link, i, msgs[j], sers[j], lats[j])
            elif code == ALLREDUCE:  # asynchronous: the rank goes on; the update waits for it
                self._join(int(prog.collective[i]), i, t)
            elif device is None:
                start[i] = t
                t += durs[j]
                end[i] = t
            else:
                if t > env.now:
                    yield env.timeout(t - env.now)
                yield device.request()
                start[i] = env.now
                yield env.timeout(durs[j])
                device.release()
                t = end[i] = env.now
        self.done[k] = True

    def _hold(self, device: Fcfs, t: float, duration: float) -> Generator[simpy.Event, object, float]:
        """Take the shared device at local time `t` (first come first served) for `duration`;
        return the time it is released."""
        env = self.env
        if t > env.now:
            yield env.timeout(t - env.now)
        yield device.request()
        yield env.timeout(duration)
        device.release()
        return env.now

    def _join(self, group: int, i: int, t: float) -> None:
        """A member starts a reduction at local time `t`; the last of the D runs it."""
        prog = self.prog
        self.group_actions[group].append(i)
        self.group_started[group] += 1
        if t > self.group_ready[group]:
            self.group_ready[group] = t
        if self.group_started[group] < prog.group_size:
            return
        links = [int(x) for x in prog.group_links[group]]
        if all(prog.dedicated[x] for x in links):
            self._reduced(group, self.group_ready[group], self.group_ready[group] + prog.group_seconds[group])
        else:
            links = sorted(set(links))
            for x in links:
                if self.owned[x]:
                    self.pending[x] += 1
            self.env.process(self._contended_reduction(group, links))

    def _contended_reduction(self, group: int, links: list[int]) -> _Proc:
        """A ring over links that pipeline transfers also use: it takes them all (in id order, so
        two rings cannot hold each other up), first come first served, for its duration."""
        env = self.env
        if self.group_ready[group] > env.now:
            yield env.timeout(self.group_ready[group] - env.now)
        held = []
        for x in links:
            resource = self.link_res[x]
            if resource is not None:
                yield from self._until_free(x)
                held.append(resource)
                yield resource.request()
        begin = env.now
        yield env.timeout(self.prog.group_seconds[group])
        for resource in held:
            resource.release()
        for x in links:
            self._released(x)
        self._reduced(group, begin, env.now)

    def _until_free(self, link: int) -> _Proc:
        """On a rank's own link, wait for the time its sends taken as dedicated leave it free."""
        if self.owned[link] and self.link_free[link] > self.env.now:
            yield self.env.timeout(self.link_free[link] - self.env.now)

    def _released(self, link: int) -> None:
        """A ring or queued send leaves a rank's own link now."""
        if self.owned[link]:
            self.link_free[link] = max(self.link_free[link], self.env.now)
            self.pending[link] -= 1

    def _reduced(self, group: int, begin: float, done: float) -> None:
        for i in self.group_actions[group]:
            self.start[i], self.end[i] = begin, done
        for d in range(self.prog.group_size):
            self.post(self.wait_base + group * self.prog.group_size + d, done)

    def _transfer(self, link: int, i: int, message: int, ser: float, lat: float) -> None:
        """Send action `i` over a shared link from now: wait for it (on a rank's own link, for the
        time its dedicated sends leave it free too), hold it for `ser` (first come first served),
        then arrive after `lat`. A chain of SimPy callbacks, not a process: the same events, at
        the same times and in the same order, as a process doing this would schedule (its start
        an urgent event, as SimPy starts a process), less the end of the process, which nothing awaits."""
        env, resource = self.env, self.link_res[link]
        assert resource is not None
        owned = self.owned[link]

        def arrive(_: object = None) -> None:
            self.end[i] = env.now
            self.post(message, env.now)

        def sent(_: object) -> None:
            resource.release()
            if owned:
                self._released(link)
            if lat:
                env.timeout(lat).callbacks.append(arrive)
            else:
                arrive()

        def granted(_: object) -> None:
            self.start[i] = env.now
            env.timeout(ser).callbacks.append(sent)

        def ask(_: object = None) -> None:
            resource.request().callbacks.append(granted)

        def begin(_: object) -> None:
            if owned and self.link_free[link] > env.now:
                env.timeout(self.link_free[link] - env.now).callbacks.append(ask)
            else:
                ask()

        _urgent(env, begin)


def _owned_links(prog: Program) -> list[bool]:
    """Per link: whether it is one rank's own (module docstring): shared, every send over it from
    one rank, and every ring holding it a ring whose one member is that rank."""
    n = len(prog.dedicated)
    sends = np.flatnonzero((prog.kind == SEND) & (prog.link >= 0))
    lowest, highest = np.full(n, np.iinfo(np.int64).max), np.full(n, -1)
    np.minimum.at(lowest, prog.link[sends], prog.rank[sends].astype(np.int64))
    np.maximum.at(highest, prog.link[sends], prog.rank[sends].astype(np.int64))
    owner = np.where(highest < 0, -1, np.where(lowest == highest, highest, -2))  # -1: no sends, -2: several ranks
    starts = np.flatnonzero(prog.kind == ALLREDUCE)
    for group, links in enumerate(prog.group_links):
        members = set(prog.rank[starts[prog.collective[starts] == group]].tolist())
        member = members.pop() if prog.group_size == 1 and len(members) == 1 else -2
        for x in set(links.tolist()):
            owner[x] = member if owner[x] in (-1, member) else -2
    return ((owner >= 0) & ~prog.dedicated).tolist()


def _urgent(env: simpy.Environment, callback: Callable[[simpy.Event], None]) -> None:
    """Call `callback` now, as SimPy starts a process: an urgent event, before the normal ones
    already due now."""
    event = simpy.Event(env)
    event._ok, event._value = True, None  # triggered, as SimPy's own Initialize event is
    event.callbacks.append(callback)
    env.schedule(event, URGENT)


def run_simpy(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Simulate one step; return (start, end) seconds of every action in program order."""
    run = _Run(plan)
    for k in range(plan.num_ranks):
        run.env.process(run.rank(k))
    run.env.run()
    if not all(run.done):
        k = run.done.index(False)
        raise SimulationError(f"schedule deadlocks: rank {k} waits forever at {plan.action(run.position[k])}")
    return np.asarray(run.start), np.asarray(run.end)

