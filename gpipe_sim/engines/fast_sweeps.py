"""The fast evaluator's vectorised sweeps: ranks recomputed from the arrivals known so far, up and down, until nothing moves.

Beside the times, each message's depth (actions on the longest chain of dependencies before it) is
iterated the same way: it cannot settle around a cycle, so a deadlock is never taken for a fixed
point of zero-length actions. Costs below are in units of one element of a vectorised sweep, as
measured on the development machine; they only choose between exact paths.
"""

from __future__ import annotations

import numpy as np

from gpipe_sim.engines.chain import RankSlices
from gpipe_sim.engines.sweep_rank import SweepRank

TRANSFER_COST = 30.0  # the per-transfer pass: per receive or send
PASS_SETUP_COST = 2000.0  # the per-transfer pass: once
RANK_COST = 1300.0  # a sweep: each rank recomputed
BUDGET_SHARE = 1.0  # the passes after the first may cost this share of the per-transfer pass
TRIAL_SHARE = 0.3  # they are tried where two whole passes cost at most this share of it
NOT_DIRTY = np.iinfo(np.int64).max


class Sweeps:
    """Sweeps over every rank of a contention-free plan without all-reduces, filling `arrival` (per
    message) and `link_start` (per program row) when they settle."""

    def __init__(self, ranks: list[RankSlices], arrival: np.ndarray, link_start: np.ndarray) -> None:
        self.ranks = [SweepRank(rk) for rk in ranks]
        self.arrival, self.link_start = arrival, link_start
        self.times = np.zeros(len(arrival))  # each message's arrival so far
        self.depth = np.zeros(len(arrival))  # and its depth
        self.receiver = np.zeros(len(arrival), dtype=np.int64)
        self.recv_index = np.zeros(len(arrival), dtype=np.int64)
        for r, rk in enumerate(ranks):
            self.receiver[rk.recv_msg] = r
            self.recv_index[rk.recv_msg] = np.arange(len(rk.recv_msg))
        self.receives = np.array([max(1, len(rk.recv_at)) for rk in ranks], dtype=np.float64)
        self.dirty_from = np.zeros(len(ranks), dtype=np.int64)  # first receive to redo; NOT_DIRTY: none
        self.order = list(range(len(ranks))) + list(reversed(range(len(ranks))))
        transfers = sum(len(rk.recv_at) + len(rk.send_at) for rk in ranks)
        self.transfer_pass_cost = TRANSFER_COST * transfers + PASS_SETUP_COST
        self.pass_cost = 2 * (RANK_COST * len(ranks) + transfers)

    def settle(self) -> bool:
        """True when the sweeps reached the fixed point (the exact times, then written to `arrival`
        and `link_start`); False where they were not worth going on with (the per-transfer pass must
        then run).

        The first pass (ranks up, then down) times links as prefix-sum chains, as fill-drain plans,
        which it settles, have always been timed. The passes after it redo every rank with the
        per-transfer pass's sequential link arithmetic: the fixed point of a deadlock-free plan is
        unique, so it is that pass's result to the bit."""
        settled, _ = self._pass(exact=False, budget=np.inf)
        if not settled and 2 * self.pass_cost <= TRIAL_SHARE * self.transfer_pass_cost:
            settled = self._exact_passes(BUDGET_SHARE * self.transfer_pass_cost)
        if settled:
            self.arrival[:] = self.times
            for sr in self.ranks:
                self.link_start[sr.rk.lo + sr.rk.send_at] = sr.start[:-1]
        return settled

    def waits(self) -> np.ndarray:
        """After `settle` returned True: every rank's waits (`SweepRank.run`), rank after rank."""
        return np.concatenate([sr.run for sr in self.ranks])

    def _exact_passes(self, budget: float) -> bool:
        """Passes with the sequential link arithmetic, the first redoing every rank, until nothing
        moves (True), the budget runs out, or, from the second pass on, the frontier (the least
        share of a rank's receives known final) advances too slowly to settle within it (False)."""
        self.dirty_from.fill(0)
        frontier, passes = 0.0, 0
        while budget > 0:
            before = budget
            settled, budget = self._pass(exact=True, budget=budget)
            if settled:
                return True
            passes += 1
            ahead = float(np.min(self.dirty_from / self.receives))
            progress = ahead - frontier
            # the passes left shrink with the work left: about half the last one's cost each
            if passes >= 2 and (progress <= 0 or (1 - ahead) / progress * (before - budget) / 2 > budget):
                return False
            frontier = ahead
        return False

    def _pass(self, exact: bool, budget: float) -> tuple[bool, float]:
        """One pass over `order`, recomputing each dirty rank (from its first changed receive when
        `exact`, else whole); (no rank dirty after it, the budget left: at most 0 when it ran out)."""
        for r in self.order:
            j0 = int(self.dirty_from[r])
            if j0 == NOT_DIRTY:
                continue
            self.dirty_from[r] = NOT_DIRTY
            sr = self.ranks[r]
            if not exact:
                j0 = 0
            k0 = sr.waits(j0, self.times, self.depth)
            if not j0:
                k0 = 0  # the whole rank: the sends before its first receive too
            budget -= RANK_COST + (len(sr.rk.recv_at) - j0) + (len(sr.prev) - k0)
            self._sends(sr, k0, exact)
            if budget <= 0:
                return False, budget
        return not np.count_nonzero(self.dirty_from != NOT_DIRTY), budget

    def _sends(self, sr: SweepRank, k0: int, exact: bool) -> None:
        """Post the rank's sends k0.. from its waits; where an arrival or depth moved, mark the
        receiver dirty from that receive."""
        prev = sr.prev[k0:]
        posted = sr.run[prev] + sr.incl[k0:]
        arrive = sr.post_sequential(k0, posted) if exact else sr.post_prefix_sum(posted)
        deep = sr.run_depth[prev] + sr.incl_depth[k0:]
        msg = sr.rk.send_msg[k0:]
        moved = (self.times[msg] != arrive) | (self.depth[msg] != deep)
        if np.count_nonzero(moved):
            self.times[msg] = arrive
            self.depth[msg] = deep
            changed = msg[moved]
            np.minimum.at(self.dirty_from, self.receiver[changed], self.recv_index[changed])
