"""Every M's `Work` of one (cost table, D, C, remat, ZeRO sharding) at once, as `candidate_work` computes each."""

from __future__ import annotations

from functools import cached_property
from typing import Any, Iterable

import numpy as np

from gpipe_sim.planner.bounds import CostTable
from gpipe_sim.planner.work import Work
from gpipe_sim.planner.segments import cumulative_rows
from gpipe_sim.planner.size_terms import SizeTerms
from gpipe_sim.planner.space import Candidate
from gpipe_sim.schedule.lower import saves_activations

# The micro-batch size of each group `_group_counts` counts, past the smallest: (size, kept),
# (size, re-computed), (size + 1, kept), (size + 1, re-computed).
_SHIFTS = (0, 0, 1, 1)
_RECOMPUTES = (0.0, 1.0, 0.0, 1.0)


class _Split:
    """How `candidate_work` splits a candidate's per-replica batch for every M = 1 .. batch / D
    (row M - 1): the smallest micro-batch `size`, how many have one sample more (`extra`) and
    each group's count (`_group_counts`)."""

    def __init__(self, costs: CostTable, cand: Candidate) -> None:
        self.share = costs.base.pipeline.batch_size // cand.data_parallel
        self.size, self.extra = np.divmod(self.share, np.arange(1, self.share + 1))
        self.counts = _group_counts(cand.remat, np.arange(1, self.share + 1), self.extra)

    @cached_property
    def sizes(self) -> list[int]:
        """Every micro-batch size some M has, ascending: the smallest, and each group's that counts any."""
        asked = [self.size] + [(self.size + shift)[self.counts[:, slot] > 0] for slot, shift in enumerate(_SHIFTS)]
        return np.unique(np.concatenate(asked)).tolist()


class WorkRows:
    """`candidate_work` for M = 1 .. batch / D of candidates alike in T, C, E, D, remat and whether
    ZeRO shards, as arrays over M (row M - 1): `total` and `chain` (`Work.total`, `Work.chain`) and
    `largest`; `work(M)` is that M's `Work`, equal to `candidate_work`'s element for element.

    The same sums in the same order: per M, the update, then n x (forward, re-computed or not, plus
    the cheaper backward) for each (micro-batch size, re-computation) in sorted order, a group
    that M lacks adding n = 0. Each size's terms are read from its table's `SizeTerms` (`terms`,
    holding every size of `split`) for all the Ms that have it at once."""

    def __init__(self, costs: CostTable, cand: Candidate, split: _Split, terms: SizeTerms) -> None:
        costs = costs.of(cand)
        self.costs, self.terms = costs, terms
        share, size, extra, counts = split.share, split.size, split.extra, split.counts
        update = costs.update / (cand.data_parallel * cand.context_parallel if cand.zero else 1)
        work = np.broadcast_to(update, (share, costs.L))
        trail = work
        for slot, (shift, recompute) in enumerate(zip(_SHIFTS, _RECOMPUTES)):
            n = counts[:, slot]
            live = (n > 0)[:, None]  # a group M lacks adds 0
            at = terms.rows(size + shift)
            work = work + n[:, None] * np.where(live, terms.per_pass[recompute][at], 0.0)
            trail = trail + n[:, None] * np.where(live, terms.weight[recompute][at], 0.0)
        self.work_, self.trail_ = work, trail
        self.size, self.largest = size, size + (extra > 0)
        self.largest_of: list[int] = self.largest.tolist()  # row M - 1's, as ints
        self.total = work.sum(axis=1)
        self._at = terms.rows(size)  # each M's smallest micro-batch's row
        self.chain = terms.chain[self._at]
        self._works: dict[int, Work] = {}
        self._cums: tuple[np.ndarray, np.ndarray] | None = None  # running sums of work_ and trail_, when asked

    def work(self, M: int) -> Work:
        """The `Work` of M micro-batches (1 <= M <= batch / D), made once, its cached figures
        (`Work.total`, `chain`, `cums`) read from the rows: the sums `Work` makes of its arrays,
        made for every M at once (`cumulative_rows`; a row's sum along the rows is its own sum)."""
        got = self._works.get(M)
        if got is None:
            at, terms = self._at[M - 1], self.terms
            if self._cums is None:
                self._cums = cumulative_rows(self.work_), cumulative_rows(self.trail_)
            got = self._works[M] = Work.with_sums(
                self.work_[M - 1], self.trail_[M - 1], terms.forward[at], terms.backward[at],
                int(self.largest[M - 1]), int(self.size[M - 1]), total=float(self.total[M - 1]),
                chain=float(self.chain[M - 1]), cums=(self._cums[0][M - 1], terms.forward_cum[at],
                                                      terms.backward_cum[at], self._cums[1][M - 1]))
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
    """Each `WorkRows` of a search, built once, and each cost table's `SizeTerms` they read."""

    def __init__(self, costs: CostTable) -> None:
        self.costs = costs
        self.rows: dict[tuple[Any, ...], WorkRows] = {}
        self.terms: dict[int, SizeTerms] = {}  # by the table's id (the tables live as long as the search)

    def of(self, cand: Candidate) -> WorkRows:
        """The candidate's rows (its M is any)."""
        got = self.rows.get(rows_key(cand))
        if got is None:
            self.build([cand])
            got = self.rows[rows_key(cand)]
        return got

    def build(self, cands: Iterable[Candidate]) -> None:
        """The rows of each of `cands` not built yet, every size each cost table needs for them
        priced in one `CostTable.price` (one array pass per twin, not one per row) and stacked
        once (`SizeTerms`): the figures the table gives each size, bit for bit."""
        todo: dict[tuple[Any, ...], tuple[Candidate, _Split]] = {}
        for cand in cands:
            key = rows_key(cand)
            if key not in self.rows and key not in todo:
                todo[key] = (cand, _Split(self.costs.of(cand), cand))
        sizes: dict[int, tuple[CostTable, set[int]]] = {}
        for cand, split in todo.values():
            table = self.costs.of(cand)
            sizes.setdefault(id(table), (table, set()))[1].update(split.sizes)
        for key, (table, asked) in sizes.items():
            held = self.terms.get(key)
            if held is None or not held.has(asked):
                self.terms[key] = SizeTerms(table, sorted(asked | set(held.sizes.tolist() if held else ())))
        for key, (cand, split) in todo.items():
            self.rows[key] = WorkRows(self.costs, cand, split, self.terms[id(self.costs.of(cand))])

    def work(self, cand: Candidate) -> Work:
        """`candidate_work(costs, cand)`, from the rows."""
        return self.of(cand).work(cand.micro_batches)
