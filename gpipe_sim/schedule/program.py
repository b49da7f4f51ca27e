"""A schedule's programs: one ordered list of actions per pipeline rank, stored as columns."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np

from gpipe_sim.schedule.actions import Action, Kind, Tensor
from gpipe_sim.schedule.registry import rank_chunks

RematMode = Literal["none", "except_last", "always", "full", "selective"]
SEND, RECV = int(Kind.SEND), int(Kind.RECV)
ACTIVATION, GRADIENT = int(Tensor.ACTIVATION), int(Tensor.GRADIENT)


@dataclass(frozen=True)
class ProgramColumns:
    """Every rank's program as NumPy columns, rank by rank (action i of rank r is at
    `offsets[r] + i`); `kind` holds Kind codes, `tensor` Tensor codes (-1: none)."""

    offsets: np.ndarray
    rank: np.ndarray
    kind: np.ndarray
    chunk: np.ndarray
    micro_batch: np.ndarray
    peer: np.ndarray
    tensor: np.ndarray
    save: np.ndarray

    def message_keys(self, micro_batches: int) -> np.ndarray:
        """For each point-to-point send and receive, the key of its message (-1 elsewhere): the chunk boundary it
        crosses (b: between chunks b and b+1), the tensor and the micro-batch. A send and its
        receive share the key."""
        kind, tensor = self.kind, self.tensor
        rows = np.flatnonzero(((kind == SEND) | (kind == RECV)) & (tensor <= GRADIENT))  # not all-reduce waits
        kind, tensor, chunk = kind[rows], tensor[rows].astype(np.int64), self.chunk[rows].astype(np.int64)
        # activation: sent by chunk b, received by b+1; gradient: sent by b+1, received by b
        lower_end = ((kind == SEND) & (tensor == ACTIVATION)) | ((kind == RECV) & (tensor == GRADIENT))
        boundary = np.where(lower_end, chunk, chunk - 1)
        keys = np.full(len(self.kind), -1, dtype=np.int64)
        keys[rows] = (boundary * 2 + tensor) * micro_batches + self.micro_batch[rows]
        return keys

    def actions(self, r: int) -> tuple[Action, ...]:
        """Rank `r`'s ordered actions as `Action` tuples."""
        lo, hi = int(self.offsets[r]), int(self.offsets[r + 1])
        return tuple(map(Action.of, self.kind[lo:hi].tolist(), self.chunk[lo:hi].tolist(),
                         self.micro_batch[lo:hi].tolist(), self.peer[lo:hi].tolist(),
                         self.tensor[lo:hi].tolist(), self.save[lo:hi].tolist()))

@dataclass(frozen=True)
class Schedule:
    """One training step's programs: for each pipeline rank, its ordered actions.

    `chunks` is v, the model chunks per rank (K*v in all); `placement[c]` is the rank holding
    chunk c. Stored as columns (built vectorised: K=128 x M=1024 takes milliseconds);
    `actions` gives the same programs as `Action` tuples, `rank_actions(r)` one rank's.
    """

    name: str
    ranks: int
    micro_batches: int
    chunks: int
    remat: RematMode
    placement: tuple[int, ...]
    columns: ProgramColumns

    @property
    def num_chunks(self) -> int:
        return len(self.placement)

    def rank_actions(self, r: int) -> tuple[Action, ...]:
        """Rank `r`'s ordered actions."""
        return self.columns.actions(r)

    @cached_property
    def message_keys(self) -> np.ndarray:
        """`columns.message_keys(micro_batches)`, computed once (read-only)."""
        keys = self.columns.message_keys(self.micro_batches)
        keys.flags.writeable = False
        return keys

    @cached_property
    def actions(self) -> tuple[tuple[Action, ...], ...]:
        return tuple(self.rank_actions(r) for r in range(self.ranks))

    def count(self, kind: Kind) -> int:
        return int((self.columns.kind == kind).sum())

    def chunks_of(self, r: int) -> tuple[int, ...]:
        """The chunks rank `r` holds, in model order."""
        return self._rank_chunks[r]

    @cached_property
    def _rank_chunks(self) -> tuple[tuple[int, ...], ...]:
        return rank_chunks(self.placement, self.ranks)
