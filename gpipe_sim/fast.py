"""The fast evaluator: the step's longest path over the action graph, vectorised with NumPy.

Each stage's action list is a chain, T[i] = max(T[i-1], ready[i]) + d[i], where `ready` is a
message's arrival for a recv. With C the inclusive prefix sum of d, this is
T = C + max(0, running max of (ready - (C - d))), one `np.maximum.accumulate` per stage; a link
used by one sender is the same recurrence over its sends. Stages are swept up and down, each
sweep using the arrivals the previous ones produced, until nothing changes: arrivals only grow
from a lower bound, so the fixed point is the longest path. Valid only without contention
(no link or device shared by two stages); `evaluate_fast` refuses such plans.
"""

from __future__ import annotations

import numpy as np

from gpipe_sim.errors import SimulationError
from gpipe_sim.plan import RECV, SEND, Plan


def contention_free(plan: Plan) -> bool:
    """True when no device runs two stages and no link carries two stages' sends."""
    prog = plan.program
    return not prog.shared_device.any() and bool(prog.dedicated.all())


def _chain(durations: np.ndarray, ready: np.ndarray) -> np.ndarray:
    """End times of a chain starting at 0: T[i] = max(T[i-1], ready[i]) + durations[i]."""
    cumulative = np.cumsum(durations)
    slack = ready - (cumulative - durations)
    np.maximum.accumulate(slack, out=slack)
    np.maximum(slack, 0.0, out=slack)
    return cumulative + slack


class _StageArrays:
    """Per-stage slices of the program, prepared once."""

    def __init__(self, plan: Plan, k: int) -> None:
        prog = plan.program
        lo, hi = int(prog.offsets[k]), int(prog.offsets[k + 1])
        self.lo = lo
        kind = prog.kind[lo:hi]
        self.duration = prog.duration[lo:hi]
        self.recv_at = np.flatnonzero(kind == RECV)
        self.recv_msg = prog.message[lo:hi][self.recv_at]
        self.ready = np.full(hi - lo, -np.inf)
        send_at = np.flatnonzero(kind == SEND)
        links = prog.link[lo:hi][send_at]
        # Group the sends by link; a send on the same device arrives when issued.
        self.groups = []
        for link in np.unique(links):
            idx = send_at[links == link]
            self.groups.append(
                (
                    int(link),
                    idx,
                    prog.message[lo:hi][idx],
                    prog.serialization[lo:hi][idx],
                    prog.latency[lo:hi][idx],
                )
            )


def evaluate_fast(plan: Plan, max_sweeps: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Return (start, end) seconds of every action in program order, like `run_simpy`."""
    if not contention_free(plan):
        raise SimulationError("the fast evaluator needs a contention-free plan; use the SimPy engine")
    prog = plan.program
    K = len(plan.stages)
    stages = [_StageArrays(plan, k) for k in range(K)]
    receiver = prog.stage[prog.kind == RECV][np.argsort(prog.message[prog.kind == RECV])]
    arrival = np.zeros(prog.num_messages)
    start = np.zeros(len(prog.kind))
    end = np.zeros(len(prog.kind))
    dirty = np.ones(K, dtype=bool)  # a stage whose incoming arrivals changed since it was computed
    order = list(range(K)) + list(reversed(range(K)))
    limit = max_sweeps if max_sweeps is not None else 4 * K + 16
    for _ in range(limit):
        if not dirty.any():
            return start, end
        for k in order:
            if not dirty[k]:
                continue
            dirty[k] = False
            st = stages[k]
            ready = st.ready
            ready[st.recv_at] = arrival[st.recv_msg]
            T = _chain(st.duration, ready)
            hi = st.lo + len(T)
            end[st.lo : hi] = T
            start[st.lo] = 0.0
            start[st.lo + 1 : hi] = T[:-1]
            for link, idx, msgs, ser, lat in st.groups:
                posted = T[idx]
                if link < 0:
                    start[st.lo + idx] = posted
                    arrive = posted
                else:
                    free = _chain(ser, posted)
                    start[st.lo + idx] = free - ser
                    arrive = free + lat
                end[st.lo + idx] = arrive
                moved = arrival[msgs] != arrive
                if moved.any():
                    arrival[msgs] = arrive
                    dirty[receiver[msgs[moved]]] = True
    if not dirty.any():
        return start, end
    raise SimulationError(f"fast evaluator did not converge in {limit} sweeps (does the schedule deadlock?)")
