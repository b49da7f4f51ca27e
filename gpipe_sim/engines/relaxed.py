"""The contention-relaxed step: a lower bound of a contended plan's simulated step, by the fast evaluator.

Relax a plan by giving each rank its own copy of every link it sends over, by letting no device
be shared and by letting no all-reduce ring wait for its links. The relaxed program is
contention-free, so the fast evaluator times it exactly, and every action ends no later than in
the SimPy engine's run of the plan itself: both engines compute start = max(the rank's previous
end, a received message's arrival, a ring's latest member start, the sender's previous send over
the same link) with the same durations, and the SimPy engine only adds waits on top (first come
first served on shared links and devices, where a rank's own sends keep their program order).
By induction over the actions in time order, each relaxed end is at most the simulated one, so
the relaxed step is a lower bound of the simulated step (the planner prunes with it).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpipe_sim.engines.fast import contention_free, evaluate_fast
from gpipe_sim.engines.relaxed_replicas import replica_zero_stands_for_all
from gpipe_sim.engines.transfer_pass import Collectives, events, run_events
from gpipe_sim.plan.compile import Plan
from gpipe_sim.plan.costed_program import Program


def relaxed_links(prog: Program, num_ranks: int) -> np.ndarray:
    """`prog.link` with each (link, sending rank) its own link, numbered from 0 (-1 kept)."""
    link = prog.link.copy()
    sends = np.flatnonzero(link >= 0)
    own = link[sends].astype(np.int64) * num_ranks + prog.rank[sends]
    link[sends] = np.unique(own, return_inverse=True)[1]
    return link


def relaxed_plan(plan: Plan) -> Plan:
    """`plan` with the contention relaxed (module docstring): each (link, sending rank) its own
    link, no device shared, no ring holding a link. A contention-free plan is returned as it is."""
    if contention_free(plan):
        return plan
    prog = plan.program
    link = relaxed_links(prog, plan.num_ranks)
    users = int(link.max()) + 1 if len(link) else 0
    relaxed = replace(prog, link=link, dedicated=np.ones(users, dtype=bool),
                      shared_device=np.zeros_like(prog.shared_device),
                      group_links=[np.zeros(0, dtype=np.int64) for _ in prog.group_links])
    out = replace(plan)
    out.__dict__["program"] = relaxed  # the cached program, as `Plan.program` caches it
    return out


def relaxed_step(plan: Plan) -> float:
    """Seconds the simulated step of `plan` is at least (its exact step where contention-free):
    the latest end of `evaluate_fast(relaxed_plan(plan))`, to the bit.

    With all-reduces (which `evaluate_fast` times by the per-transfer pass) only that pass runs,
    over replica 0 alone where it stands for every replica (`relaxed_replicas`), and only the
    step's end is read (`_latest_end`)."""
    prog = plan.program
    if not (prog.collective >= 0).any():
        _, end = evaluate_fast(relaxed_plan(plan))  # the vectorised sweeps' path
        return float(end.max()) if len(end) else 0.0
    link = prog.link if contention_free(plan) else relaxed_links(prog, plan.num_ranks)
    alike = replica_zero_stands_for_all(prog, link, len(plan.ranks))
    return _latest_end(plan, link, len(plan.ranks) if alike else plan.num_ranks, alike)


def _latest_end(plan: Plan, link: np.ndarray, ranks: int, replica_zero_only: bool) -> float:
    """The latest end of any action of ranks 0 .. `ranks`-1 of `plan`'s program run with `link`
    (no link shared by two ranks) by the per-transfer pass: the latest of each rank's last chain
    time C + s and each message's arrival (a send's end, or an all-reduce's: its group's start
    plus its seconds). A rank's chain time never decreases along its program, so every other
    action ends by its rank's last; C and C + s are the full timeline's operations, so the bits
    are its bits."""
    prog = plan.program
    offsets = prog.offsets[: ranks + 1]
    n = int(offsets[-1])
    if n == 0:
        return 0.0
    cumulative = np.empty(n)
    lo_hi = list(zip(offsets[:-1].tolist(), offsets[1:].tolist()))
    for lo, hi in lo_hi:
        np.cumsum(prog.duration[lo:hi], out=cumulative[lo:hi])
    ev = events(prog.kind, prog.duration, cumulative, link, prog.message, prog.collective,
                prog.serialization, prog.latency, offsets)
    arrival, slack, _ = run_events(plan, ev, prog.num_messages, int(link.max()) + 1,
                                   Collectives.of(prog, replica_zero_only))
    step = max(arrival, default=0.0)
    for (lo, hi), s in zip(lo_hi, slack):
        if hi > lo:
            step = max(step, float(cumulative[hi - 1]) + s)
    return step
