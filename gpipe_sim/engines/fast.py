"""The fast evaluator: the exact step of a contention-free plan, in time linear in its actions.

Each rank's program is a chain, T[i] = max(T[i-1], ready[i]) + d[i], where `ready` is a message's
arrival for a recv (`gpipe_sim.engines.chain`), so only receives and sends need the messages'
times. Vectorised sweeps over the ranks (`gpipe_sim.engines.sweeps`) are tried first: one pass
(ranks up, then down) finishes fill-drain schedules, whose dependencies run one way per phase, and
a few more finish 1F1B and interleaved ones; where they do not settle within a budget, or the plan
has data-parallel all-reduces, a per-transfer pass (`gpipe_sim.engines.transfer_pass`) visits each
transfer once in dependency order. A link used by one rank is the same recurrence over its sends.
Without contention only: a device running two ranks or a link carrying two ranks' sends needs the
SimPy engine (`evaluate_fast` refuses such plans).
"""

from __future__ import annotations

import numpy as np

from gpipe_sim.engines.chain import chain, rank_slices
from gpipe_sim.engines.sweeps import Sweeps
from gpipe_sim.engines.transfer_pass import transfer_pass
from gpipe_sim.errors import SimulationError
from gpipe_sim.plan.compile import Plan


def contention_free(plan: Plan) -> bool:
    """True when no device runs two ranks and no link carries two ranks' sends."""
    prog = plan.program
    return not prog.shared_device.any() and bool(prog.dedicated.all())


def evaluate_fast(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Return (start, end) seconds of every action in program order, exactly as `run_simpy` would;
    SimulationError naming the rank and action where the programs deadlock."""
    if not contention_free(plan):
        raise SimulationError("the fast evaluator needs a contention-free plan; use the SimPy engine")
    prog = plan.program
    ranks = rank_slices(plan)
    arrival = np.full(prog.num_messages, -np.inf)
    link_start = np.zeros(len(prog.kind))
    reductions = (prog.collective >= 0).any()  # joins of D ranks: only the per-transfer pass has them
    if reductions or not Sweeps(ranks, arrival, link_start).settle():
        transfer_pass(plan, ranks, arrival, link_start)
    start = np.zeros(len(prog.kind))
    end = np.zeros(len(prog.kind))
    for rk in ranks:
        ready = np.full(rk.hi - rk.lo, -np.inf)
        ready[rk.recv_at] = arrival[rk.recv_msg]
        T = chain(rk.duration, ready, rk.cumulative)
        end[rk.lo : rk.hi] = T
        start[rk.lo + 1 : rk.hi] = T[:-1]
        sends = rk.lo + rk.send_at
        start[sends] = link_start[sends]
        end[sends] = arrival[rk.send_msg]
        reduces = rk.lo + rk.reduce_at
        start[reduces] = link_start[reduces]
        end[reduces] = link_start[reduces] + prog.group_seconds[rk.reduce_group]
    return start, end
