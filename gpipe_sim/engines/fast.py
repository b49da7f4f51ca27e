"""The fast evaluator: the exact step of a contention-free plan, in time linear in its actions.

Each rank's program is a chain, T[i] = max(T[i-1], ready[i]) + d[i], where `ready` is a message's
arrival for a recv. With C the inclusive prefix sum of d this is T = C + max(0, running max of
(ready - (C - d))), so only receives and sends need visiting one by one: a rank advances over its
transfers until it reaches a receive whose message is not yet sent, and a send wakes the rank
waiting for it (a topological pass over the dependency graph, each transfer visited once). A
link used by one rank is the same recurrence over its sends. One vectorised sweep (ranks up,
then down) is tried first: it finishes fill-drain schedules, whose dependencies run one way per
phase, with no per-transfer Python at all. Without contention only: a device running two ranks or
a link carrying two ranks' sends needs the SimPy engine (`evaluate_fast` refuses such plans).
"""

from __future__ import annotations

import numpy as np

from gpipe_sim.errors import SimulationError
from gpipe_sim.plan.compile import Plan
from gpipe_sim.schedule import Kind

SWEEPS = 1  # vectorised up-and-down passes tried before the per-transfer pass (GPipe settles in one)


def contention_free(plan: Plan) -> bool:
    """True when no device runs two ranks and no link carries two ranks' sends."""
    prog = plan.program
    return not prog.shared_device.any() and bool(prog.dedicated.all())


def _chain(durations: np.ndarray, ready: np.ndarray) -> np.ndarray:
    """End times of a chain starting at 0: T[i] = max(T[i-1], ready[i]) + durations[i]."""
    cumulative = np.cumsum(durations)
    slack = ready - (cumulative - durations)
    np.maximum.accumulate(slack, out=slack)
    np.maximum(slack, 0.0, out=slack)
    return cumulative + slack


class _Rank:
    """One rank's program slices, prepared once."""

    def __init__(self, plan: Plan, r: int) -> None:
        prog = plan.program
        lo, hi = int(prog.offsets[r]), int(prog.offsets[r + 1])
        self.lo, self.hi = lo, hi
        kind = prog.kind[lo:hi]
        self.duration = prog.duration[lo:hi]
        self.recv_at = np.flatnonzero(kind == Kind.RECV)
        self.recv_msg = prog.message[lo:hi][self.recv_at]
        self.send_at = np.flatnonzero(kind == Kind.SEND)
        self.send_msg = prog.message[lo:hi][self.send_at]
        self.send_link = prog.link[lo:hi][self.send_at]
        self.send_ser = prog.serialization[lo:hi][self.send_at]
        self.send_lat = prog.latency[lo:hi][self.send_at]
        self.reduce_at = np.flatnonzero(kind == Kind.ALLREDUCE)
        self.reduce_group = prog.collective[lo:hi][self.reduce_at]


def evaluate_fast(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Return (start, end) seconds of every action in program order, exactly as `run_simpy` would;
    SimulationError naming the rank and action where the programs deadlock."""
    if not contention_free(plan):
        raise SimulationError("the fast evaluator needs a contention-free plan; use the SimPy engine")
    prog = plan.program
    ranks = [_Rank(plan, r) for r in range(plan.num_ranks)]
    arrival = np.full(prog.num_messages, -np.inf)
    link_start = np.zeros(len(prog.kind))
    reductions = (prog.collective >= 0).any()  # joins of D ranks: only the per-transfer pass has them
    if reductions or not _sweeps(ranks, arrival, link_start):
        _topological(plan, ranks, arrival, link_start)
    start = np.zeros(len(prog.kind))
    end = np.zeros(len(prog.kind))
    for rk in ranks:
        ready = np.full(rk.hi - rk.lo, -np.inf)
        ready[rk.recv_at] = arrival[rk.recv_msg]
        T = _chain(rk.duration, ready)
        end[rk.lo : rk.hi] = T
        start[rk.lo + 1 : rk.hi] = T[:-1]
        sends = rk.lo + rk.send_at
        start[sends] = link_start[sends]
        end[sends] = arrival[rk.send_msg]
        reduces = rk.lo + rk.reduce_at
        start[reduces] = link_start[reduces]
        end[reduces] = link_start[reduces] + prog.group_seconds[rk.reduce_group]
    return start, end


def _post(rk: _Rank, T: np.ndarray, link_start: np.ndarray) -> np.ndarray:
    """Arrival of each of the rank's sends given its chain times `T` (link by link, in order)."""
    posted = T[rk.send_at]
    arrive = posted.copy()
    for link in np.unique(rk.send_link):
        sel = rk.send_link == link
        if link < 0:
            link_start[rk.lo + rk.send_at[sel]] = posted[sel]
            continue
        ser = rk.send_ser[sel]
        free = _chain(ser, posted[sel])
        link_start[rk.lo + rk.send_at[sel]] = free - ser
        arrive[sel] = free + rk.send_lat[sel]
    return arrive


def _sweeps(ranks: list[_Rank], arrival: np.ndarray, link_start: np.ndarray) -> bool:
    """Up to SWEEPS vectorised passes (ranks up, then down), each rank computed from the arrivals
    known so far (a lower bound: they start at 0 and only grow); True when a whole pass changed
    nothing, which is the fixed point, the longest path. Beside the times, each action's depth
    (actions on the longest chain of dependencies before it) is iterated the same way: it cannot
    settle around a cycle, so a deadlock is never taken for a fixed point of zero-length actions."""
    arrival.fill(0.0)
    depth = np.zeros(len(arrival))
    receiver = np.zeros(len(arrival), dtype=np.int64)
    for r, rk in enumerate(ranks):
        receiver[rk.recv_msg] = r
    dirty = np.ones(len(ranks), dtype=bool)
    order = list(range(len(ranks))) + list(reversed(range(len(ranks))))
    for _ in range(SWEEPS):
        for r in order:
            if not dirty[r]:
                continue
            dirty[r] = False
            rk = ranks[r]
            ready = np.full(rk.hi - rk.lo, -np.inf)
            ready[rk.recv_at] = arrival[rk.recv_msg]
            arrive = _post(rk, _chain(rk.duration, ready), link_start)
            ready[rk.recv_at] = depth[rk.recv_msg]
            deep = _chain(np.ones(rk.hi - rk.lo), ready)[rk.send_at]
            moved = (arrival[rk.send_msg] != arrive) | (depth[rk.send_msg] != deep)
            if moved.any():
                arrival[rk.send_msg] = arrive
                depth[rk.send_msg] = deep
                dirty[receiver[rk.send_msg[moved]]] = True
        if not dirty.any():
            return True
    return False


def _topological(plan: Plan, ranks: list[_Rank], arrival: np.ndarray, link_start: np.ndarray) -> None:
    """Every rank's transfers in dependency order: each rank advances over its receives and
    sends until a receive's message is not yet sent, and waits for the send to wake it."""
    prog = plan.program
    known = [False] * prog.num_messages
    arrival_list = [0.0] * prog.num_messages
    link_free = [0.0] * len(prog.dedicated)
    state = []
    for rk in ranks:
        # the rank's transfers and reductions in program order, as parallel lists; the event's
        # type: 0 receive, 1 send, 2 start of a reduction (its "message" is the group)
        at = np.concatenate([rk.recv_at, rk.send_at, rk.reduce_at])
        order = np.argsort(at, kind="stable")
        n_recv, n_send, n_reduce = len(rk.recv_at), len(rk.send_at), len(rk.reduce_at)
        is_send = np.concatenate([np.zeros(n_recv, int), np.ones(n_send, int), np.full(n_reduce, 2)])[order]
        cumulative = np.cumsum(rk.duration)
        pos = at[order]
        state.append((
            pos.tolist(), is_send.tolist(),
            np.concatenate([rk.recv_msg, rk.send_msg, rk.reduce_group])[order].tolist(),
            np.concatenate([np.full(n_recv, -1), rk.send_link, np.full(n_reduce, -1)])[order].tolist(),
            np.concatenate([np.zeros(n_recv), rk.send_ser, np.zeros(n_reduce)])[order].tolist(),
            np.concatenate([np.zeros(n_recv), rk.send_lat, np.zeros(n_reduce)])[order].tolist(),
            cumulative[pos].tolist(),  # C[i]: the rank's time after action i, before any wait
            (cumulative - rk.duration)[pos].tolist(),  # C[i] - d[i]
        ))
    pointer = [0] * len(ranks)
    slack = [0.0] * len(ranks)
    begins: list[list[float]] = [[0.0] * len(st[0]) for st in state]
    waiting: dict[int, int] = {}
    work = list(range(len(ranks)))
    size, group_seconds = prog.group_size, prog.group_seconds.tolist()
    started, ready = [0] * len(group_seconds), [0.0] * len(group_seconds)
    wait_base = prog.num_messages - len(group_seconds) * size
    while work:
        r = work.pop()
        positions, sends, messages, links, sers, lats, c_incl, c_excl = state[r]
        begin = begins[r]
        e, s, n = pointer[r], slack[r], len(positions)
        while e < n:
            message = messages[e]
            if sends[e] == 2:  # this member starts the group's reduction; the last one runs it
                group, posted = message, c_incl[e] + s
                begin[e] = posted
                started[group] += 1
                if posted > ready[group]:
                    ready[group] = posted
                if started[group] == size:
                    done = ready[group] + group_seconds[group]
                    for d in range(size):
                        wait = wait_base + group * size + d
                        arrival_list[wait] = done
                        known[wait] = True
                        woken = waiting.pop(wait, None)
                        if woken is not None:
                            work.append(woken)
            elif sends[e]:
                posted = c_incl[e] + s
                link = links[e]
                if link < 0:
                    begin[e] = arrive = posted
                else:
                    free = link_free[link]
                    start = free if free > posted else posted
                    begin[e] = start
                    link_free[link] = start + sers[e]
                    arrive = start + sers[e] + lats[e]
                arrival_list[message] = arrive
                known[message] = True
                woken = waiting.pop(message, None)
                if woken is not None:
                    work.append(woken)
            else:
                if not known[message]:
                    waiting[message] = r
                    break
                gap = arrival_list[message] - c_excl[e]
                if gap > s:
                    s = gap
            e += 1
        pointer[r], slack[r] = e, s
    for r, st in enumerate(state):
        if pointer[r] < len(st[0]):
            action = plan.action(ranks[r].lo + st[0][pointer[r]])
            raise SimulationError(f"schedule deadlocks: rank {r} waits forever at {action}")
    group_start = np.asarray(ready)
    for r, st in enumerate(state):
        types, positions = np.asarray(st[1]), np.asarray(st[0], dtype=np.int64)
        sends = types == 1
        link_start[ranks[r].lo + positions[sends]] = np.asarray(begins[r])[sends]
        if (types == 2).any():  # every member's reduction runs from the group's start
            link_start[ranks[r].lo + positions[types == 2]] = group_start[np.asarray(st[2])[types == 2]]
    arrival[:] = arrival_list
