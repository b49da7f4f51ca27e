"""One rank's receives and sends as the vectorised sweeps recompute them, and its state between sweeps.

A rank's time after action i is C[i] + s[i], with C the inclusive prefix sum of its durations and
s[i] = max(0, max over its receives j <= i of (arrival[j] - (C[j] - d[j]))): a send's posting time
needs only the running maximum at the last receive before it, so only receives and sends are
visited, and a rank whose inputs changed from its j-th receive on is recomputed from there.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from gpipe_sim.engines.chain import RankSlices, chain


class _LinkOrder(NamedTuple):
    """Where each send's link was before it: `same[k]` is the previous send on send k's link, or n
    (the rank's n sends) for a link's first, where `ser[n]` = 0 and the rank's `start[n]` = 0
    stand for an idle link; `no_link`: the sends on no link (None for none)."""

    same: np.ndarray
    ser: np.ndarray
    no_link: np.ndarray | None


class SweepRank:
    """One rank's receives and sends prepared for sweeps, and its state between them.

    For the times (and, suffixed `_depth`, for the depths: the same chain with unit durations):
    `base[j]` is receive j's C - d, `incl[k]` send k's C, `run[j + 1]` the wait s after receive j
    (`run[0]` = 0); `prev[k]` is the index into `run` of send k's wait; `start[k]` is send k's link
    start (`start[n]` = 0, see `_LinkOrder`)."""

    def __init__(self, rk: RankSlices) -> None:
        self.rk = rk
        cumulative = rk.cumulative
        self.base = (cumulative - rk.duration)[rk.recv_at]
        self.base_depth = rk.recv_at.astype(np.float64)
        self.incl = cumulative[rk.send_at]
        self.incl_depth = rk.send_at + 1.0
        self.run = np.zeros(len(rk.recv_at) + 1)
        self.run_depth = np.zeros(len(rk.recv_at) + 1)
        self.prev = np.searchsorted(rk.recv_at, rk.send_at)
        used = np.flatnonzero(np.bincount(rk.send_link + 1)) - 1  # the links it sends on, ascending
        self.links = [(link, np.flatnonzero(rk.send_link == link)) for link in used.tolist()]
        self.start = np.zeros(len(rk.send_at) + 1)
        self.order: _LinkOrder | None = None

    def _link_order(self) -> _LinkOrder:
        """The sends' `_LinkOrder`, built on first use (only passes after the first read it)."""
        if self.order is None:
            rk, n = self.rk, len(self.rk.send_at)
            same = np.full(n, n)
            for link, idx in self.links:
                if link >= 0:
                    same[idx[1:]] = idx[:-1]
            no_link = np.flatnonzero(rk.send_link < 0)
            self.order = _LinkOrder(same, np.append(rk.send_ser, 0.0), no_link if len(no_link) else None)
        return self.order

    def waits(self, j0: int, arrival: np.ndarray, depth: np.ndarray) -> int:
        """Recompute `run` and `run_depth` from receive j0 on, from the messages' `arrival` and
        `depth`; return the first send that follows receive j0."""
        msg = self.rk.recv_msg[j0:]
        for values, base, run in ((arrival, self.base, self.run), (depth, self.base_depth, self.run_depth)):
            gaps = values[msg] - base[j0:]
            np.maximum.accumulate(gaps, out=gaps)
            np.maximum(gaps, run[j0], out=gaps)
            run[j0 + 1 :] = gaps
        return int(self.prev.searchsorted(j0 + 1))

    def post_sequential(self, k0: int, posted: np.ndarray) -> np.ndarray:
        """Arrivals of sends k0.. posted at `posted`, each link's sends one after another from its
        state after send k0 - 1: start = max(free, posted), free = start + ser, arrival = free +
        latency (the per-transfer pass's arithmetic); updates `start`."""
        rk, start, order = self.rk, self.start, self._link_order()
        start[k0:-1] = posted
        same = order.same[k0:]
        if np.count_nonzero(posted < start[same] + order.ser[same]):  # some send waits for its link: one by one
            self._queue(k0, posted, order)
        arrive = (start[k0:-1] + rk.send_ser[k0:]) + rk.send_lat[k0:]
        if order.no_link is not None:
            mine = order.no_link[order.no_link >= k0]
            arrive[mine - k0] = posted[mine - k0]
        return arrive

    def _queue(self, k0: int, posted: np.ndarray, order: _LinkOrder) -> None:
        """`start` of sends k0.. by the sequential recurrence, send by send."""
        start, ser, same = self.start, order.ser.tolist(), order.same.tolist()
        free: dict[int, float] = {}
        for k, (link, p) in enumerate(zip(self.rk.send_link[k0:].tolist(), posted.tolist()), k0):
            if link < 0:
                continue
            f = free.get(link)
            if f is None:
                f = float(start[same[k]]) + ser[same[k]]
            s = f if f > p else p
            start[k] = s
            free[link] = s + ser[k]

    def post_prefix_sum(self, posted: np.ndarray) -> np.ndarray:
        """Arrivals of all the rank's sends posted at `posted`, each link's queue as a prefix-sum
        chain (the first pass's arithmetic); `start` gets free - ser as each send's link start."""
        rk = self.rk
        arrive = posted.copy()
        for link, idx in self.links:
            if link < 0:
                self.start[idx] = posted[idx]
                continue
            ser = rk.send_ser[idx]
            free = chain(ser, posted[idx])
            self.start[idx] = free - ser
            arrive[idx] = free + rk.send_lat[idx]
        return arrive
