"""A frozen copy of the fast evaluator's per-transfer path as it was at a42f6be: the reference the
faster relaxed step and fast evaluator are checked against, bit for bit (not used by the package)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpipe_sim.plan.compile import Plan
from gpipe_sim.schedule import Kind

RECV, SEND, ALLREDUCE = int(Kind.RECV), int(Kind.SEND), int(Kind.ALLREDUCE)
NO_LINK, RECEIVE, REDUCE = -1, -2, -3
UNKNOWN = float("-inf")


def reference_relaxed_step(plan: Plan) -> float:
    """The relaxed step as it was: each (link, sending rank) its own link, the step's latest end."""
    prog = plan.program
    link = prog.link.copy()
    sends = np.flatnonzero(link >= 0)
    link[sends] = np.unique(link[sends].astype(np.int64) * plan.num_ranks + prog.rank[sends], return_inverse=True)[1]
    relaxed = replace(prog, link=link, dedicated=np.ones(len(prog.link), dtype=bool))
    out = replace(plan)
    out.__dict__["program"] = relaxed
    _, end = reference_timeline(out)
    return float(end.max()) if len(end) else 0.0


def reference_timeline(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of every action of a contention-free plan by the per-transfer pass."""
    prog = plan.program
    n = len(prog.kind)
    offsets = prog.offsets.tolist()
    cumulative = np.empty(n)
    for lo, hi in zip(offsets[:-1], offsets[1:]):
        cumulative[lo:hi] = np.cumsum(prog.duration[lo:hi])
    kind = prog.kind
    receive, send, reduce = kind == RECV, kind == SEND, kind == ALLREDUCE
    rows = np.flatnonzero(receive | send | reduce)
    before = (cumulative - prog.duration)[rows]
    codes = np.where(receive[rows], RECEIVE, np.where(reduce[rows], REDUCE, prog.link[rows])).tolist()
    messages = np.where(reduce[rows], prog.collective[rows], prog.message[rows]).tolist()
    times = np.where(receive[rows], before, cumulative[rows]).tolist()
    sers, lats = prog.serialization[rows].tolist(), prog.latency[rows].tolist()
    bounds = np.searchsorted(rows, prog.offsets).tolist()
    size, seconds = prog.group_size, prog.group_seconds.tolist()
    started, group_start = [0] * len(seconds), [0.0] * len(seconds)
    wait_base = prog.num_messages - len(seconds) * size
    arrival, waiter = [UNKNOWN] * prog.num_messages, [-1] * prog.num_messages
    link_free, begin = [0.0] * len(prog.dedicated), [0.0] * len(codes)
    pointer, slack = bounds[:-1], [0.0] * (len(bounds) - 1)
    work = list(range(len(bounds) - 1))
    while work:
        r = work.pop()
        e, s, end_e = pointer[r], slack[r], bounds[r + 1]
        while e < end_e:
            code, woken = codes[e], []
            if code == RECEIVE:
                a = arrival[messages[e]]
                if a == UNKNOWN:
                    waiter[messages[e]] = r
                    break
                gap = a - times[e]
                if gap > s:
                    s = gap
            elif code >= 0:
                posted, free = times[e] + s, link_free[code]
                start = free if free > posted else posted
                begin[e] = start
                link_free[code] = free = start + sers[e]
                arrival[messages[e]] = free + lats[e]
                woken = [messages[e]]
            elif code == NO_LINK:
                begin[e] = arrival[messages[e]] = times[e] + s
                woken = [messages[e]]
            else:
                group, posted = messages[e], times[e] + s
                begin[e] = posted
                started[group] += 1
                if posted > group_start[group]:
                    group_start[group] = posted
                if started[group] == size:
                    woken = list(range(wait_base + group * size, wait_base + group * size + size))
                    for wait in woken:
                        arrival[wait] = group_start[group] + seconds[group]
            work.extend(waiter[m] for m in woken if waiter[m] >= 0)
            e += 1
        pointer[r], slack[r] = e, s
    assert all(e == bounds[r + 1] for r, e in enumerate(pointer)), "deadlock"
    arrival_a = np.asarray(arrival)
    chains = np.empty(n)
    for r, (lo, hi) in enumerate(zip(offsets[:-1], offsets[1:])):
        ready = np.full(hi - lo, -np.inf)
        recv = np.flatnonzero(receive[lo:hi])
        ready[recv] = arrival_a[prog.message[lo + recv]]
        gap = ready - (cumulative[lo:hi] - prog.duration[lo:hi])
        np.maximum.accumulate(gap, out=gap)
        chains[lo:hi] = cumulative[lo:hi] + np.maximum(gap, 0.0)
    start = np.empty(n)
    start[1:] = chains[:-1]
    start[prog.offsets[:-1]] = 0.0
    end = chains
    link_start = np.zeros(n)
    codes_a = np.asarray(codes)
    sent = codes_a >= NO_LINK
    link_start[rows[sent]] = np.asarray(begin)[sent]
    reduced = codes_a == REDUCE
    link_start[rows[reduced]] = np.asarray(group_start)[np.asarray(messages)[reduced]]
    sends, reduces = np.flatnonzero(send), np.flatnonzero(reduce)
    start[sends], end[sends] = link_start[sends], arrival_a[prog.message[sends]]
    start[reduces] = link_start[reduces]
    end[reduces] = link_start[reduces] + prog.group_seconds[prog.collective[reduces]]
    return start, end
