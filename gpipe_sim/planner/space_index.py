"""The planner's space held as its blocks: indexed, iterated and read by column without a Candidate per configuration."""

from __future__ import annotations

import bisect
import itertools
from typing import Any, Iterator, Sequence, overload

import numpy as np

from gpipe_sim.planner.space import DATA_PARALLEL, Block, Candidate

# the axes that are one value per block, by short name (`space.AXES`), and the Block field holding it
BLOCK_AXES = {"D": "data_parallel", "K": "stages", "v": "chunks", "schedule": "schedule",
              "T": "tensor_parallel", "C": "context_parallel", "E": "expert_parallel"}


class CandidateSpace(Sequence[Candidate]):
    """`candidate_space`'s list, read from its blocks (`space_blocks`): `space[i]` is the i-th
    configuration, iteration gives them in order; `column` and `family_codes` read an axis of
    every configuration as an array without making them."""

    def __init__(self, blocks: Sequence[Block]) -> None:
        self.blocks = list(blocks)
        self.starts = [b.start for b in self.blocks]
        self.sizes = np.array([b.size for b in self.blocks], dtype=np.int64)
        self._len = int(self.sizes.sum())

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, i: int) -> Candidate: ...

    @overload
    def __getitem__(self, i: slice) -> list[Candidate]: ...

    def __getitem__(self, i: int | slice) -> Candidate | list[Candidate]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._len))]
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"candidate {i} is outside a space of {self._len}")
        block = self.blocks[bisect.bisect_right(self.starts, i) - 1]
        return block.candidate(i - block.start)

    def __iter__(self) -> Iterator[Candidate]:
        return itertools.chain.from_iterable(b.candidates() for b in self.blocks)

    def block_of(self, i: int) -> Block:
        """The block holding configuration i."""
        return self.blocks[bisect.bisect_right(self.starts, i) - 1]

    def values(self, axis: str) -> set[Any]:
        """The values a block-level axis (`BLOCK_AXES`: D, K, v, schedule, T, C, E) takes in the space."""
        return {getattr(b, BLOCK_AXES[axis]) for b in self.blocks}

    def column(self, axis: str) -> np.ndarray:
        """A block-level axis (`BLOCK_AXES`) of every configuration, in the space's order."""
        values = [getattr(b, BLOCK_AXES[axis]) for b in self.blocks]
        return np.repeat(np.array(values, dtype=object if axis == "schedule" else np.int64), self.sizes)

    def family_codes(self) -> tuple[np.ndarray, list[str]]:
        """Each configuration's schedule family (`search.family`: its schedule, "data parallel" at
        K=1) as an index into the returned names, in the order the names first occur."""
        names: dict[str, int] = {}
        codes = [names.setdefault(DATA_PARALLEL if b.stages == 1 else b.schedule, len(names)) for b in self.blocks]
        return np.repeat(np.array(codes, dtype=np.int64), self.sizes), list(names)
