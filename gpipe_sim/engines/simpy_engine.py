"""The SimPy engine: one process per rank running its program; links and shared devices contend.

Each rank process keeps a local clock and advances it without yielding to SimPy while nothing
can change its outcome (its own compute, a message that has already arrived, a send over a link
that only it uses). It synchronises with SimPy's clock only to wait for a message not yet sent or
to take a resource that other ranks share (`gpipe_sim.engines.fcfs.Fcfs`: first come first served,
event for event as `simpy.Resource` grants it), which keeps contention exact while most actions
cost no SimPy event at all. A send over a shared link is a chain of callbacks, not a process.
Where the event a process or callback would wait for is the next one SimPy would process (a grant
of a free resource, a timeout, with nothing else due first), it goes on at once
(`gpipe_sim.engines.next_event`): the same simulation, bit for bit, one event fewer. A ring taking
the NICs of a node's every replica takes them so in one go where nothing else happens meanwhile.

A link is the rank's own (`_owned_links`) where its only other users are all-reduce rings whose one
member is that rank (a program holding replica 0 alone for alike replicas): its sends take it as
over a dedicated link while no ring or queued send holds or awaits it (`pending`), and the rings
and queued sends wait for the time it is free (`link_free`) before taking its resource, which
keeps first come first served on it.
"""

from __future__ import annotations

from typing import Callable, Generator

import numpy as np
import simpy
from simpy.events import URGENT

from gpipe_sim.errors import SimulationError
from gpipe_sim.engines.fcfs import Fcfs
from gpipe_sim.engines.next_event import after, sleep
from gpipe_sim.engines.chain import ALLREDUCE, RECV, SEND  # plain ints: the per-action loop compares them
from gpipe_sim.plan.compile import Plan
from gpipe_sim.plan.costed_program import Program

_Proc = Generator[simpy.Event, object, None]


class _Run:
    """State of one simulation: clocks, mailboxes, resources and the recorded timeline."""

    def __init__(self, plan: Plan) -> None:
        prog = plan.program
        self.env = env = simpy.Environment()
        self.prog = prog
        n = len(prog.kind)
        self.start = [0.0] * n
        self.end = [0.0] * n
        self.arrival: list[float | None] = [None] * prog.num_messages
        self.waiting: dict[int, simpy.Event] = {}
        self.dedicated: list[bool] = prog.dedicated.tolist()
        self.link_free = [0.0] * len(self.dedicated)
        self.owned = _owned_links(prog)
        self.pending = [0] * len(self.dedicated)  # per owned link: rings and queued sends holding or awaiting it
        self.links = Fcfs(env, len(self.dedicated))  # the shared links' (a dedicated one's is never asked for)
        self.device_map: list[int] = [int(d) for d in plan.device_map]
        self.devices = Fcfs(env, max(self.device_map, default=-1) + 1)  # the shared devices' (likewise)
        self.host_on_device = plan.scenario.hardware.host.on_device
        self.offsets: list[int] = prog.offsets.tolist()
        self.position = self.offsets[:-1]
        self.done = [False] * plan.num_ranks
        # data-parallel reductions: members started so far, the latest start, their actions
        groups = len(prog.group_seconds)
        self.group_seconds: list[float] = prog.group_seconds.tolist()
        self.group_size = prog.group_size
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
        """Rank `k`'s program on its local clock `t` (module docstring); it yields only to wait for
        a message or to take a shared device or link."""
        env, prog = self.env, self.prog
        lo, hi = self.offsets[k], self.offsets[k + 1]
        kinds = prog.kind[lo:hi].tolist()
        durs = prog.duration[lo:hi].tolist()
        msgs = prog.message[lo:hi].tolist()
        links = prog.link[lo:hi].tolist()
        sers = prog.serialization[lo:hi].tolist()
        lats = prog.latency[lo:hi].tolist()
        groups = prog.collective[lo:hi].tolist()
        start, end, arrival, link_free = self.start, self.end, self.arrival, self.link_free
        dedicated, owned, pending, position = self.dedicated, self.owned, self.pending, self.position
        device = self.device_map[k] if prog.shared_device[k] else -1  # in self.devices; -1: its own
        host_device = device if self.host_on_device else -1
        waiting = self.waiting
        t = 0.0
        for i, code, dur, msg in zip(range(lo, hi), kinds, durs, msgs):
            if code == RECV:
                a = arrival[msg]
                if a is None:
                    position[k] = i
                    event = waiting[msg] = env.event()
                    yield event
                    a = arrival[msg]
                start[i] = t
                if a > t:  # type: ignore[operator]
                    t = a  # type: ignore[assignment]
                # host time to complete the receive
                if host_device >= 0 and dur > 0:
                    position[k] = i
                    t = yield from self._hold(host_device, t, dur)
                else:
                    t += dur
                end[i] = t
            elif code == SEND:
                # host time to issue the send; the transfer leaves after it
                if host_device >= 0 and dur > 0:
                    position[k] = i
                    t = yield from self._hold(host_device, t, dur)
                else:
                    t += dur
                link = links[i - lo]
                if link < 0:
                    start[i] = end[i] = arrival[msg] = t  # `post`, written out: the loop's commonest call
                    if msg in waiting:
                        waiting.pop(msg).succeed()
                elif dedicated[link] or (owned[link] and not pending[link]):
                    s = link_free[link]
                    if t > s:
                        s = t
                    free = link_free[link] = s + sers[i - lo]
                    start[i] = s
                    end[i] = arrival[msg] = free + lats[i - lo]
                    if msg in waiting:
                        waiting.pop(msg).succeed()
                else:
                    if t > env.now:
                        position[k] = i
                        yield from sleep(env, t - env.now)
                    if owned[link]:
                        pending[link] += 1
                    self._transfer(link, i, msg, sers[i - lo], lats[i - lo])
            elif code == ALLREDUCE:  # asynchronous: the rank goes on; the update waits for it
                self._join(groups[i - lo], i, t)
            elif device < 0:
                start[i] = t
                t += dur
                end[i] = t
            else:
                position[k] = i
                t = yield from self._hold(device, t, dur, i)
        self.done[k] = True

    def _hold(self, device: int, t: float, duration: float, action: int = -1) -> Generator[simpy.Event, object, float]:
        """Take shared `device` at local time `t` (first come first served) for `duration`;
        return the time it is released. `action`: the action whose start and end this is, if any."""
        env, devices = self.env, self.devices
        if t > env.now:
            yield from sleep(env, t - env.now)
        if not devices.take_now(device):
            yield devices.request(device)
        if action >= 0:
            self.start[action] = env.now
        yield from sleep(env, duration)
        devices.release(device)
        if action >= 0:
            self.end[action] = env.now
        return env.now

    def _join(self, group: int, i: int, t: float) -> None:
        """A member starts a reduction at local time `t`; the last of the D runs it."""
        self.group_actions[group].append(i)
        self.group_started[group] += 1
        if t > self.group_ready[group]:
            self.group_ready[group] = t
        if self.group_started[group] < self.group_size:
            return
        links = sorted(set(self.prog.group_links[group].tolist()))
        dedicated, owned = self.dedicated, self.owned
        if all(dedicated[x] for x in links):
            self._reduced(group, self.group_ready[group], self.group_ready[group] + self.group_seconds[group])
        else:
            mine = [x for x in links if owned[x]]
            for x in mine:
                self.pending[x] += 1
            shared = [x for x in links if not dedicated[x]]
            self.env.process(self._contended_reduction(group, shared, mine))

    def _contended_reduction(self, group: int, shared: list[int], mine: list[int]) -> _Proc:
        """A ring over links that pipeline transfers also use: it takes its shared ones (`shared`)
        in id order, so two rings cannot hold each other up, first come first served, for its
        duration. `mine`: those of them that are a rank's own."""
        env, links, owned, link_free = self.env, self.links, self.owned, self.link_free
        if self.group_ready[group] > env.now:
            yield from sleep(env, self.group_ready[group] - env.now)
        for x in shared:
            if owned[x] and link_free[x] > env.now:  # wait for the rank's sends taken as dedicated
                yield from sleep(env, link_free[x] - env.now)
            if not links.take_now(x):
                yield links.request(x)
        begin = env.now
        yield from sleep(env, self.group_seconds[group])
        for x in shared:
            links.release(x)
        self._released(mine)
        self._reduced(group, begin, env.now)

    def _released(self, own_links: list[int]) -> None:
        """A ring or queued send leaves these links of a rank's own now."""
        now, link_free, pending = self.env.now, self.link_free, self.pending
        for x in own_links:
            if link_free[x] < now:
                link_free[x] = now
            pending[x] -= 1

    def _reduced(self, group: int, begin: float, done: float) -> None:
        for i in self.group_actions[group]:
            self.start[i], self.end[i] = begin, done
        base = self.wait_base + group * self.group_size
        for d in range(self.group_size):
            self.post(base + d, done)

    def _transfer(self, link: int, i: int, message: int, ser: float, lat: float) -> None:
        """Send action `i` over a shared link from now: wait for it (on a rank's own link, for the
        time its dedicated sends leave it free too), hold it for `ser` (first come first served),
        then arrive after `lat`. A chain of SimPy callbacks, not a process: the same events, at
        the same times and in the same order, as a process doing this would schedule (its start
        an urgent event, as SimPy starts a process), less the end of the process, which nothing
        awaits, and less those processed in line (`gpipe_sim.engines.next_event`)."""
        env, links = self.env, self.links
        owned = self.owned[link]

        def arrive(_: object = None) -> None:
            self.end[i] = env.now
            self.post(message, env.now)

        def sent(_: object) -> None:
            links.release(link)
            if owned:
                self._released([link])
            if lat:
                after(env, lat, arrive)
            else:
                arrive()

        def granted(_: object) -> None:
            self.start[i] = env.now
            after(env, ser, sent)

        def ask(_: object) -> None:
            if links.take_now(link):
                granted(None)
            else:
                links.request(link).callbacks.append(granted)

        def begin(_: object) -> None:
            if owned and self.link_free[link] > env.now:
                after(env, self.link_free[link] - env.now, ask)
            else:
                ask(None)

        _urgent(env, begin)


def _owned_links(prog: Program) -> list[bool]:
    """Per link: whether it is one rank's own (module docstring): shared, every send over it from
    one rank, and every ring holding it a ring whose one member is that rank."""
    sends = np.flatnonzero((prog.kind == SEND) & (prog.link >= 0))
    starts = np.flatnonzero(prog.kind == ALLREDUCE)
    groups = len(prog.group_links)
    # each ring's one member (-1 where it has several members or none: it owns nothing)
    lowest, highest = _extremes(prog.collective[starts], prog.rank[starts], groups)
    member = np.where((prog.group_size == 1) & (lowest == highest), highest, -1)
    sizes = [len(links) for links in prog.group_links]
    ring_links = np.concatenate(prog.group_links) if groups else np.zeros(0, dtype=np.int64)
    # every user of each link: the rank of each send over it, the member of each ring holding it
    user_link = np.concatenate([prog.link[sends], ring_links])
    user = np.concatenate([prog.rank[sends].astype(np.int64), np.repeat(member, sizes)])
    lowest, highest = _extremes(user_link, user, len(prog.dedicated))
    return ((lowest == highest) & (highest >= 0) & ~prog.dedicated).tolist()


def _extremes(keys: np.ndarray, values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per key in range(n): the lowest and highest of its `values` (lowest > highest where it has none)."""
    lowest, highest = np.full(n, np.iinfo(np.int64).max), np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(lowest, keys, values.astype(np.int64))
    np.maximum.at(highest, keys, values.astype(np.int64))
    return lowest, highest


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

