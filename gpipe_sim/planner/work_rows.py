"""Every M's `Work` of one (cost table, D, C, remat, ZeRO sharding) at once, as `candidate_work` computes each."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpipe_sim.planner.bounds import CostTable, Work
from gpipe_sim.planner.space import Candidate
from gpipe_sim.schedule.lower import saves_activations

# The micro-batch size of each group `_group_counts` counts, past the smallest: (size, kept),
# (size, re-computed), (size + 1, kept), (size + 1, re-computed).
_SHIFTS = (0, 0, 1, 1)


class WorkRows:
    """`candidate_work` for M = 1 .. batch / D of candidates alike in T, C, E, D, remat and whether
    ZeRO shards, as arrays over M (row M - 1): `total` and `chain` (`Work.total`, `Work.chain`) and
    `largest`; `work(M)` is that M's `Work`, equal to `candidate_work`'s element for element.

    The same sums in the same order: per M, the update, then n x (forward, re-computed or not, plus
    the cheaper backward) for each (micro-batch size, re-computation) in sorted order, a group
    that M lacks adding n = 0."""

    def __init__(self, costs: CostTable, cand: Candidate) -> None:
        costs = costs.of(cand)
        self.costs = costs
        D, remat = cand.data_parallel, cand.remat
        share = costs.base.pipeline.batch_size // D
        update = costs.update / (D * cand.context_parallel if cand.zero else 1)
        Ms = np.arange(1, share + 1)
        size, extra = np.divmod(share, Ms)
        counts = _group_counts(remat, Ms, extra)
        costs.price({*size.tolist(), *(b for slot, shift in enumerate(_SHIFTS)  # every size it asks for, at once
                                       for b in (size + shift)[counts[:, slot] > 0].tolist())})
        work = np.broadcast_to(update, (share, costs.L))
        trail = work
        for slot, (shift, recompute) in enumerate(zip(_SHIFTS, (0.0, 1.0, 0.0, 1.0))):
            n = counts[:, slot]
            per_pass = np.zeros((share, costs.L))
            weight = np.zeros((share, costs.L))
            for b in np.unique((size + shift)[n > 0]).tolist():  # the sizes some M has
                rows = (size + shift == b) & (n > 0)
                per_pass[rows], weight[rows] = costs.pass_terms(b, recompute)
            work = work + n[:, None] * per_pass
            trail = trail + n[:, None] * weight
        self.work_, self.trail_ = work, trail
        self.size, self.largest = size, size + (extra > 0)
        self.largest_of: list[int] = self.largest.tolist()  # row M - 1's, as ints
        self.total = work.sum(axis=1)
        self._chain: dict[int, tuple[np.ndarray, np.ndarray, float]] = {}
        self._works: dict[int, Work] = {}
        self.chain = np.array([self._pass(b)[2] for b in size.tolist()])

    def _pass(self, b: int) -> tuple[np.ndarray, np.ndarray, float]:
        """One micro-batch of b samples: (forward, backward, their sum over the layers)."""
        got = self._chain.get(b)
        if got is None:
            small = self.costs.times(b)
            forward, backward = small[:, 0].copy(), np.minimum(small[:, 1], small[:, 2])
            got = self._chain[b] = (forward, backward, float(forward.sum() + backward.sum()))
        return got

    def work(self, M: int) -> Work:
        """The `Work` of M micro-batches (1 <= M <= batch / D), made once."""
        got = self._works.get(M)
        if got is None:
            forward, backward, _ = self._pass(int(self.size[M - 1]))
            got = self._works[M] = Work(self.work_[M - 1], self.trail_[M - 1], forward, backward,
                                        int(self.largest[M - 1]), int(self.size[M - 1]))
        return got


def _group_counts(remat: str, Ms: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """Per M (row M - 1): how many micro-batches are (size, kept), (size, re-computed), (size + 1,
    kept), (size + 1, re-computed), as `candidate_work` groups them: the first `extra` have one
    sample more, and only the step's last micro-batch may re-compute otherwise than the others
    (`saves_activations` tells the last from the others, as it does for every remat mode)."""
    others = 0 if saves_activations(remat, 0, 2) else 1  # type: ignore[arg-type]
    last = 0 if saves_activations(remat, 1, 2) else 1  # type: ignore[arg-type]
    counts = np.zeros((len(Ms), 4))
    counts[:, 2 + others] += extra  # the first `extra`, one sample more (never the last: extra < M)
    counts[:, others] += Ms - extra - 1  # the rest but the last
    counts[:, last] += 1
    return counts


def rows_key(cand: Candidate) -> tuple[Any, ...]:
    """What a candidate's `WorkRows` depend on: T, C, E, D, remat and whether ZeRO shards."""
    return (cand.tensor_parallel, cand.context_parallel, cand.expert_parallel, cand.data_parallel,
            cand.remat, cand.zero > 0)


class WorkCache:
    """Each `WorkRows` of a search, built once."""

    def __init__(self, costs: CostTable) -> None:
        self.costs = costs
        self.rows: dict[tuple[Any, ...], WorkRows] = {}

    def of(self, cand: Candidate) -> WorkRows:
        """The candidate's rows (its M is any)."""
        key = rows_key(cand)
        got = self.rows.get(key)
        if got is None:
            got = self.rows[key] = WorkRows(self.costs, cand)
        return got

    def work(self, cand: Candidate) -> Work:
        """`candidate_work(costs, cand)`, from the rows."""
        return self.of(cand).work(cand.micro_batches)
