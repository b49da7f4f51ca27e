"""The fast evaluator: the exact step of a contention-free plan, in time linear in its actions.

Each rank's program is a chain, T[i] = max(T[i-1], ready[i]) + d[i], where `ready` is a message's
arrival for a recv (`gpipe_sim.engines.chain`), so only receives and sends need the messages'
times. Vectorised sweeps over the ranks (`gpipe_sim.engines.fast_sweeps`) are tried first: one pass
(ranks up, then down) finishes fill-drain schedules, whose dependencies run one way per phase, and
a few more finish 1F1B and interleaved ones; where they do not settle within a budget, or the plan
has data-parallel all-reduces, a per-transfer pass (`gpipe_sim.engines.transfer_pass`) visits each
transfer once in dependency order. A link used by one rank is the same recurrence over its sends.
Without contention only: a device running two ranks or a link carrying two ranks' sends needs the
SimPy engine (`evaluate_fast` refuses such plans).
"""

from __future__ import annotations

import numpy as np

from gpipe_sim.engines.chain import ALLREDUCE, RECV, SEND, RankSlices, chain, rank_slices
from gpipe_sim.engines.fast_sweeps import Sweeps
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
    sweeps = None if (prog.collective >= 0).any() else Sweeps(ranks, arrival, link_start)  # all-reduces join
    #                                                       D ranks: only the per-transfer pass has them
    if sweeps is not None and sweeps.settle():
        chains = _chains_from_waits(plan, ranks, sweeps.waits())
    else:
        transfer_pass(plan, ranks, arrival, link_start)
        chains = _chains_from_arrivals(plan, ranks, arrival)
    return _timeline(plan, chains, arrival, link_start)


def _chains_from_waits(plan: Plan, ranks: list[RankSlices], waits: np.ndarray) -> np.ndarray:
    """T of every action (the chain recurrence) from the sweeps' waits: C plus the wait after the
    last receive at or before the action (rank r's waits start at its receives before it plus r)."""
    prog = plan.program
    cumulative = np.concatenate([rk.cumulative for rk in ranks])
    return cumulative + waits[np.cumsum(prog.kind == RECV) + prog.rank]


def _chains_from_arrivals(plan: Plan, ranks: list[RankSlices], arrival: np.ndarray) -> np.ndarray:
    """T of every action (the chain recurrence), rank by rank, from each message's arrival."""
    chains = np.empty(len(plan.program.kind))
    for rk in ranks:
        ready = np.full(rk.hi - rk.lo, -np.inf)
        ready[rk.recv_at] = arrival[rk.recv_msg]
        chains[rk.lo : rk.hi] = chain(rk.duration, ready, rk.cumulative)
    return chains


def _timeline(plan: Plan, chains: np.ndarray, arrival: np.ndarray,
              link_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of every action: an action starts when the one before it on its rank ends (the
    first at 0) and ends at its chain time, except a send, from its link start to its arrival,
    and an all-reduce start, from its group's start for the group's seconds."""
    prog = plan.program
    start = np.empty(len(chains))
    start[1:] = chains[:-1]
    start[prog.offsets[:-1]] = 0.0
    end = chains
    sends = np.flatnonzero(prog.kind == SEND)
    start[sends] = link_start[sends]
    end[sends] = arrival[prog.message[sends]]
    reduces = np.flatnonzero(prog.kind == ALLREDUCE)
    start[reduces] = link_start[reduces]
    end[reduces] = link_start[reduces] + prog.group_seconds[prog.collective[reduces]]
    return start, end
