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
from gpipe_sim.plan.compile import Plan


def relaxed_plan(plan: Plan) -> Plan:
    """`plan` with the contention relaxed (module docstring): each (link, sending rank) its own
    link, no device shared, no ring holding a link. A contention-free plan is returned as it is."""
    if contention_free(plan):
        return plan
    prog = plan.program
    link = prog.link.copy()
    sends = np.flatnonzero(link >= 0)
    own = link[sends].astype(np.int64) * plan.num_ranks + prog.rank[sends]
    users, link[sends] = np.unique(own, return_inverse=True)
    relaxed = replace(prog, link=link, dedicated=np.ones(len(users), dtype=bool),
                      shared_device=np.zeros_like(prog.shared_device),
                      group_links=[np.zeros(0, dtype=np.int64) for _ in prog.group_links])
    out = replace(plan)
    out.__dict__["program"] = relaxed  # the cached program, as `Plan.program` caches it
    return out


def relaxed_step(plan: Plan) -> float:
    """Seconds the simulated step of `plan` is at least (its exact step where contention-free)."""
    _, end = evaluate_fast(relaxed_plan(plan))
    return float(end.max()) if len(end) else 0.0
