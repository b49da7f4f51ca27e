"""Checks that a schedule's programs are a complete, well-ordered training step (deadlocks are the engines')."""

from __future__ import annotations

import numpy as np

from gpipe_sim.errors import ScheduleError
from gpipe_sim.schedule.actions import Action, Kind
from gpipe_sim.schedule.program import Schedule


def check_schedule(schedule: Schedule) -> None:
    """Raise ScheduleError (one line) unless, for every chunk and micro-batch: the chunk's rank
    forwards it once and backwards it once (a full backward, or an input-gradient pass and a
    weight-gradient pass after it); re-computation and backward passes come after the forward;
    hand-overs between chunks of one rank come in data order; every send has exactly one receive."""
    c = schedule.columns
    C, M = schedule.num_chunks, schedule.micro_batches
    position = np.arange(len(c.kind)) - c.offsets[c.rank]
    rank_of = np.asarray(schedule.placement)
    passes = _COMPUTE_PASS[c.kind]
    if passes.any():
        wrong = rank_of[c.chunk[passes]] != c.rank[passes]
        if wrong.any():
            i = np.flatnonzero(passes)[np.argmax(wrong)]
            raise ScheduleError(f"rank {int(c.rank[i])}: it runs chunk {int(c.chunk[i])}, which lives on "
                                f"rank {int(rank_of[c.chunk[i]])}")

    def where(kind: Kind) -> tuple[np.ndarray, np.ndarray]:
        """(count, program position) of `kind` per [chunk, micro-batch] (position -1: none)."""
        sel = np.flatnonzero(c.kind == int(kind))
        chunk, micro = c.chunk[sel], c.micro_batch[sel]
        if len(sel) and not (chunk.min() >= 0 and chunk.max() < C and micro.min() >= 0 and micro.max() < M):
            return _where_by_pairs(chunk, micro, position[sel], C, M)
        cell = chunk.astype(np.int64) * M + micro
        at = np.full(C * M, -1, dtype=np.int64)
        at[cell] = position[sel]
        return np.bincount(cell, minlength=C * M).reshape(C, M), at.reshape(C, M)

    n_f, at_f = where(Kind.FORWARD)
    n_b, at_b = where(Kind.BACKWARD)
    n_i, at_i = where(Kind.BACKWARD_INPUT)
    n_w, at_w = where(Kind.BACKWARD_WEIGHT)
    _require(n_f == 1, "is forwarded once")
    _require(n_b + n_i == 1, "is backwarded once (a backward, or a backward_input)")
    _require(n_w == n_i, "has one backward_weight after each backward_input")
    first_backward = np.where(n_b == 1, at_b, at_i)
    _require(first_backward > at_f, "is backwarded after its forward")
    _require((n_w == 0) | (at_w > at_i), "has its backward_weight after its backward_input")
    rc = c.kind == Kind.RECOMPUTE
    early = position[rc] < at_f[c.chunk[rc], c.micro_batch[rc]]
    if early.any():
        i = np.flatnonzero(rc)[np.argmax(early)]
        raise ScheduleError(f"rank {int(c.rank[i])}: {_action(schedule, i)} comes before its forward")
    local = rank_of[1:] == rank_of[:-1]  # chunk b hands over to chunk b+1 on the same rank
    if local.any():
        b = np.flatnonzero(local)
        if (at_f[b + 1] < at_f[b]).any():
            bad = int(b[np.argwhere(at_f[b + 1] < at_f[b])[0][0]])
            raise ScheduleError(f"rank {int(rank_of[bad])}: chunk {bad + 1} is forwarded before chunk {bad}, "
                                "which feeds it on the same rank")
        if (first_backward[b] < first_backward[b + 1]).any():
            bad = int(b[np.argwhere(first_backward[b] < first_backward[b + 1])[0][0]])
            raise ScheduleError(f"rank {int(rank_of[bad])}: chunk {bad} is backwarded before chunk {bad + 1}, "
                                "whose input gradient it needs, on the same rank")
    _check_transfers(schedule)


_COMPUTE_PASS = np.zeros(max(Kind) + 1, dtype=bool)  # by Kind code: a pass over a chunk and micro-batch
_COMPUTE_PASS[[Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT, Kind.RECOMPUTE]] = True
SEND, RECV = int(Kind.SEND), int(Kind.RECV)


def _where_by_pairs(chunk: np.ndarray, micro: np.ndarray, position: np.ndarray, C: int,
                    M: int) -> tuple[np.ndarray, np.ndarray]:
    """`where` for columns that name chunks or micro-batches out of range (indexed as NumPy would)."""
    counts = np.zeros((C, M), dtype=np.int64)
    np.add.at(counts, (chunk, micro), 1)
    at = np.full((C, M), -1, dtype=np.int64)
    at[chunk, micro] = position
    return counts, at


def _require(ok: np.ndarray, what: str) -> None:
    if not ok.all():
        chunk, mb = (int(v) for v in np.argwhere(~ok)[0])
        raise ScheduleError(f"schedule: chunk {chunk}, micro-batch {mb} must be one that {what}")


def _action(schedule: Schedule, i: int) -> Action:
    r = int(schedule.columns.rank[i])
    return schedule.rank_actions(r)[i - int(schedule.columns.offsets[r])]


def _check_transfers(schedule: Schedule) -> None:
    """ScheduleError unless every send has exactly one receive, between the same two ranks."""
    c = schedule.columns
    K = schedule.ranks
    send, recv = np.flatnonzero(c.kind == SEND), np.flatnonzero(c.kind == RECV)
    ends = c.peer[np.concatenate((send, recv))]
    if len(ends) and (ends.min() < 0 or ends.max() >= K):
        raise ScheduleError("schedule: a send or receive names a rank outside the pipeline")
    keys = schedule.message_keys
    if _paired(keys[send], c.rank[send], c.peer[send], keys[recv], c.rank[recv], c.peer[recv]):
        return
    # Both ends must also agree on who talks to whom.
    sent = np.sort((keys[send] * K + c.rank[send]) * K + c.peer[send])
    received = np.sort((keys[recv] * K + c.peer[recv]) * K + c.rank[recv])
    if len(sent) != len(received) or (sent != received).any() or (np.diff(sent) == 0).any():
        diff = np.setxor1d(sent, received)
        key = int(diff[0]) if len(diff) else int(sent[np.flatnonzero(np.diff(sent) == 0)[0]])
        key //= K * K
        M = schedule.micro_batches
        m, rest = key % M, key // M
        tensor, boundary = ("activation", "gradient")[rest % 2], rest // 2
        raise ScheduleError(
            f"schedule: the {tensor} of micro-batch {m} across chunks {boundary} and {boundary + 1} "
            "has no single send and receive"
        )


def _paired(sent: np.ndarray, rank: np.ndarray, peer: np.ndarray, received: np.ndarray,
            to: np.ndarray, source: np.ndarray) -> bool:
    """True where each message key is sent once and received once, by the send's peer from the
    sending rank (sends: key, rank, peer; receives: key, receiving rank `to`, peer `source`);
    False says only that the full check must look (keys repeated or out of range are not judged)."""
    if len(sent) != len(received):
        return False
    if not len(sent):
        return True
    if min(sent.min(), received.min()) < 0:
        return False
    bound = int(max(sent.max(), received.max())) + 1
    times_sent = np.bincount(sent, minlength=bound)
    if times_sent.max() > 1 or (np.bincount(received, minlength=bound) != times_sent).any():
        return False
    receiver = np.empty(bound, dtype=np.int64)
    receiver[received] = to
    sender = np.empty(bound, dtype=np.int64)
    sender[received] = source
    return bool((receiver[sent] == peer).all() and (sender[sent] == rank).all())
