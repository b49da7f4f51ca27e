"""The chain recurrence of one rank's program and the per-rank column slices the fast evaluator reads."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from gpipe_sim.plan.compile import Plan
from gpipe_sim.schedule import Kind

RECV, SEND, ALLREDUCE = int(Kind.RECV), int(Kind.SEND), int(Kind.ALLREDUCE)  # plain codes: NumPy compares them fastest


def chain(durations: np.ndarray, ready: np.ndarray, cumulative: np.ndarray | None = None) -> np.ndarray:
    """End times of a chain starting at 0: T[i] = max(T[i-1], ready[i]) + durations[i].

    Computed as C + max(0, running max of (ready - (C - durations))) with C the inclusive prefix
    sum of `durations` (`cumulative`, where already known: np.cumsum(durations)); `ready` is -inf
    where an action waits for nothing. Returns a new array."""
    if cumulative is None:
        cumulative = np.cumsum(durations)
    slack = ready - (cumulative - durations)
    np.maximum.accumulate(slack, out=slack)
    np.maximum(slack, 0.0, out=slack)
    return cumulative + slack


class RankSlices(NamedTuple):
    """One rank's program columns: its actions are `plan.program` rows lo .. hi-1. Positions
    (`*_at`) are within the rank's program, in program order; `send_link` is -1 for a send that
    uses no link (same device); `cumulative` is np.cumsum(duration), C. The arrays may be views of
    the plan's: read them, never write."""

    lo: int
    hi: int
    duration: np.ndarray
    cumulative: np.ndarray
    recv_at: np.ndarray
    recv_msg: np.ndarray
    send_at: np.ndarray
    send_msg: np.ndarray
    send_link: np.ndarray
    send_ser: np.ndarray
    send_lat: np.ndarray
    reduce_at: np.ndarray
    reduce_group: np.ndarray


def rank_slices(plan: Plan) -> list[RankSlices]:
    """Every rank's `RankSlices`, in rank order (found for the whole program at once, then cut)."""
    prog = plan.program
    offsets = prog.offsets

    def rows(code: int) -> tuple[np.ndarray, list[int]]:
        at = np.flatnonzero(prog.kind == code)
        return at, np.searchsorted(at, offsets).tolist()

    recv, rb = rows(RECV)
    send, sb = rows(SEND)
    reduce, db = rows(ALLREDUCE)
    recv_msg, send_msg = prog.message[recv], prog.message[send]
    send_link, send_ser, send_lat = prog.link[send], prog.serialization[send], prog.latency[send]
    reduce_group = prog.collective[reduce]
    out = []
    for r, (lo, hi) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
        s = slice(sb[r], sb[r + 1])
        out.append(RankSlices(
            lo, hi, prog.duration[lo:hi], np.cumsum(prog.duration[lo:hi]),
            recv[rb[r] : rb[r + 1]] - lo, recv_msg[rb[r] : rb[r + 1]],
            send[s] - lo, send_msg[s], send_link[s], send_ser[s], send_lat[s],
            reduce[db[r] : db[r + 1]] - lo, reduce_group[db[r] : db[r + 1]],
        ))
    return out
