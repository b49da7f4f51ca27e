"""The fast evaluator's per-transfer pass: every rank's transfers visited once, in dependency order."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from gpipe_sim.engines.chain import ALLREDUCE, RECV, SEND, RankSlices
from gpipe_sim.errors import SimulationError
from gpipe_sim.plan.compile import Plan
from gpipe_sim.plan.costed_program import Program

# An event's code: a send's link (>= 0), or one of these
NO_LINK, RECEIVE, REDUCE = -1, -2, -3  # a send on no link (same device), a receive, an all-reduce start
UNKNOWN = float("-inf")  # the arrival of a message not yet sent


class Events(NamedTuple):
    """Every rank's receives, sends and all-reduce starts in program order, rank after rank, as
    parallel lists (the hot loop reads lists); rank r's events are bounds[r] .. bounds[r+1]-1."""

    rows: np.ndarray  # each event's row in the plan's program
    bounds: list[int]
    codes: list[int]  # a send's link, NO_LINK, RECEIVE or REDUCE
    messages: list[int]  # the message received or sent; for REDUCE, the collective group
    times: list[float]  # a send or all-reduce start: C[i], the rank's time after action i before any
    #                     wait; a receive: C[i] - d[i], that time before it
    sers: list[float]  # a send's serialization seconds (0 for the other events)
    lats: list[float]  # a send's latency seconds (0 for the other events)


def _events(plan: Plan, ranks: list[RankSlices]) -> Events:
    """The events of every rank, with C the prefix sum of each rank's own durations."""
    prog = plan.program
    cumulative = np.empty(len(prog.kind))
    for rk in ranks:
        cumulative[rk.lo : rk.hi] = rk.cumulative
    return events(prog.kind, prog.duration, cumulative, prog.link, prog.message, prog.collective,
                  prog.serialization, prog.latency, prog.offsets)


def events(kind: np.ndarray, duration: np.ndarray, cumulative: np.ndarray, link: np.ndarray, message: np.ndarray,
           collective: np.ndarray, serialization: np.ndarray, latency: np.ndarray, offsets: np.ndarray) -> Events:
    """The `Events` of the ranks whose actions are rows offsets[0] .. offsets[-1] - 1 of these
    program columns (`cumulative`: C, each rank's own prefix sum of `duration`); the columns may
    run on past offsets[-1], their rows there are not read."""
    n = int(offsets[-1])
    kind = kind[:n]
    receive, send, reduce = kind == RECV, kind == SEND, kind == ALLREDUCE
    rows = np.flatnonzero(receive | send | reduce)
    receive, reduce = receive[rows], reduce[rows]
    at = cumulative[rows]
    codes = np.where(receive, RECEIVE, np.where(reduce, REDUCE, link[rows]))
    return Events(
        rows, np.searchsorted(rows, offsets).tolist(), codes.tolist(),
        np.where(reduce, collective[rows], message[rows]).tolist(),
        np.where(receive, at - duration[rows], at).tolist(),
        serialization[rows].tolist(), latency[rows].tolist(),
    )


class Collectives:
    """The data-parallel all-reduces: group g runs once `members` members have started it, from
    the latest start, for `seconds[g]`; its end is the arrival of messages first(g) .. first(g) +
    members - 1, first(g) = wait_base + g * stride (the program's: members = stride = its
    `group_size`; replica 0 alone standing for alike replicas: members 1, stride D)."""

    def __init__(self, seconds: np.ndarray, members: int, wait_base: int, stride: int) -> None:
        self.size, self.wait_base, self.stride = members, wait_base, stride
        self.seconds: list[float] = seconds.tolist()
        self.started = [0] * len(self.seconds)
        self.start: list[float] = [0.0] * len(self.seconds)  # the latest member's start so far

    @classmethod
    def of(cls, prog: Program, replica_zero_only: bool = False) -> "Collectives":
        """Every group of `prog`, each run by all its members, or, `replica_zero_only`, by replica
        0's member alone (where it stands for every replica), which posts replica 0's wait."""
        size = prog.group_size
        wait_base = prog.num_messages - len(prog.group_seconds) * size
        return cls(prog.group_seconds, 1 if replica_zero_only else size, wait_base, size)

    def member_starts(self, group: int, posted: float) -> range:
        """Record one member's start at `posted`; the ids of the messages its end posts once this
        was the last member (an empty range before)."""
        self.started[group] += 1
        if posted > self.start[group]:
            self.start[group] = posted
        if self.started[group] < self.size:
            return range(0)
        first = self.wait_base + group * self.stride
        return range(first, first + self.size)


def transfer_pass(plan: Plan, ranks: list[RankSlices], arrival: np.ndarray, link_start: np.ndarray) -> None:
    """Fill `arrival` (per message; entries of messages never sent are left -inf) and `link_start`
    (per send and all-reduce start, by program row) with exact times, visiting each transfer once:
    each rank advances over its receives and sends until a receive's message is not yet sent, and
    waits for the send to wake it. SimulationError naming the rank and action where the programs
    deadlock."""
    ev = _events(plan, ranks)
    collectives = Collectives.of(plan.program)
    arrivals, _, begins = run_events(plan, ev, plan.program.num_messages, len(plan.program.dedicated), collectives)
    codes = np.asarray(ev.codes)
    sends = codes >= NO_LINK
    link_start[ev.rows[sends]] = np.asarray(begins)[sends]
    reduces = codes == REDUCE
    if reduces.any():  # every member's all-reduce runs from its group's start
        link_start[ev.rows[reduces]] = np.asarray(collectives.start)[np.asarray(ev.messages)[reduces]]
    arrival[:] = arrivals


def run_events(plan: Plan, ev: Events, num_messages: int, num_links: int,
               collectives: Collectives) -> tuple[list[float], list[float], list[float]]:
    """`_advance` over `ev` (its arrivals, each rank's final wait s, each event's begin);
    SimulationError naming the rank and action (of `plan`) where the programs deadlock."""
    arrivals, pointer, slack, begins = _advance(ev, num_messages, num_links, collectives)
    for r, e in enumerate(pointer):
        if e < ev.bounds[r + 1]:
            raise SimulationError(f"schedule deadlocks: rank {r} waits forever at {plan.action(int(ev.rows[e]))}")
    return arrivals, slack, begins


def _advance(ev: Events, num_messages: int, num_links: int,
             collectives: Collectives) -> tuple[list[float], list[int], list[float], list[float]]:
    """Run every rank as far as its messages allow (the hot loop: plain Python over lists).

    Returns (the arrival of each message, UNKNOWN where never sent; the event each rank stopped
    at, bounds[r+1] where it finished; each rank's s where it stopped; each event's begin: a
    send's link start, an all-reduce member's own start). A rank's time after action i is C[i] + s, with s the largest wait so far
    (max(0, arrival - (C - d)) over its receives)."""
    codes, messages, times, sers, lats, bounds = ev.codes, ev.messages, ev.times, ev.sers, ev.lats, ev.bounds
    arrival = [UNKNOWN] * num_messages
    waiter = [-1] * num_messages  # the rank blocked on each message, -1 for none
    link_free = [0.0] * num_links
    pointer = bounds[:-1]
    slack = [0.0] * (len(bounds) - 1)
    begin = [0.0] * len(codes)
    work = list(range(len(bounds) - 1))
    while work:
        r = work.pop()
        e, s, n = pointer[r], slack[r], bounds[r + 1]
        while e < n:
            code = codes[e]
            if code == RECEIVE:
                a = arrival[messages[e]]
                if a == UNKNOWN:
                    waiter[messages[e]] = r
                    break
                gap = a - times[e]
                if gap > s:
                    s = gap
            elif code >= 0:  # a send over link `code`
                posted = times[e] + s
                free = link_free[code]
                start = free if free > posted else posted
                begin[e] = start
                link_free[code] = free = start + sers[e]
                message = messages[e]
                arrival[message] = free + lats[e]
                woken = waiter[message]
                if woken >= 0:
                    work.append(woken)
            elif code == NO_LINK:
                message = messages[e]
                begin[e] = arrival[message] = times[e] + s
                woken = waiter[message]
                if woken >= 0:
                    work.append(woken)
            else:  # this member starts its group's all-reduce; the last member runs it
                group, posted = messages[e], times[e] + s
                begin[e] = posted
                for wait in collectives.member_starts(group, posted):
                    arrival[wait] = collectives.start[group] + collectives.seconds[group]
                    woken = waiter[wait]
                    if woken >= 0:
                        work.append(woken)
            e += 1
        pointer[r], slack[r] = e, s
    return arrival, pointer, slack, begin
