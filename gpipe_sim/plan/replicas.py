"""Data parallelism: D replicas of the pipeline's programs, each chunk's gradients all-reduced among
its replicas, and where every (replica, rank) runs.

Each rank's program gains, after the last backward pass of each of its chunks (a full backward,
or the weight pass of a split one), an `allreduce` of that chunk's gradients (asynchronous: the
rank goes on while the D replicas of the chunk reduce, as DDP's buckets do), and before its update
a `recv` of the REDUCED gradients of each chunk, which waits for that reduction to end. Replica d
runs the same programs as global ranks d*K .. d*K+K-1. With D = 1 nothing is added.
"""

from __future__ import annotations

import numpy as np

from gpipe_sim.schedule import Kind, ProgramColumns, Tensor

_LAST_BACKWARD = (int(Kind.BACKWARD), int(Kind.BACKWARD_WEIGHT))


def with_collectives(columns: ProgramColumns) -> ProgramColumns:
    """The pipeline's per-rank programs with each chunk's `allreduce` after its last backward pass
    and the waits for them before the update (see the module docstring)."""
    parts = []
    for r in range(len(columns.offsets) - 1):
        lo, hi = int(columns.offsets[r]), int(columns.offsets[r + 1])
        kind, chunk = columns.kind[lo:hi], columns.chunk[lo:hi]
        backward = np.isin(kind, _LAST_BACKWARD)
        mine = sorted(set(chunk[backward].tolist()))
        last = {c: int(np.flatnonzero(backward & (chunk == c))[-1]) for c in mine}
        order = sorted(mine, key=last.__getitem__)  # reductions start in this order
        update = int(np.flatnonzero(kind == int(Kind.UPDATE))[-1])
        # (position to insert before, kind, chunk): each allreduce right after its pass
        inserts = [(last[c] + 1, int(Kind.ALLREDUCE), c) for c in order]
        inserts += [(update, int(Kind.RECV), c) for c in order]
        at = np.array([p for p, _, _ in inserts], dtype=np.int64)
        cols = {}
        for name in ("kind", "chunk", "micro_batch", "peer", "tensor", "save"):
            values = getattr(columns, name)[lo:hi]
            new = {"kind": [k for _, k, _ in inserts], "chunk": [c for _, _, c in inserts],
                   "micro_batch": [-1] * len(inserts), "peer": [-1] * len(inserts),
                   "tensor": [int(Tensor.REDUCED)] * len(inserts), "save": [True] * len(inserts)}[name]
            cols[name] = np.insert(values, at, np.asarray(new, dtype=values.dtype))
        parts.append(cols)
    return _stack(parts)


def replicate(columns: ProgramColumns, replicas: int) -> ProgramColumns:
    """Global ranks d*K + r for every replica d: the same programs, peers shifted by d*K."""
    K = len(columns.offsets) - 1
    parts = []
    for d in range(replicas):
        for r in range(K):
            lo, hi = int(columns.offsets[r]), int(columns.offsets[r + 1])
            peer = columns.peer[lo:hi]
            parts.append({
                "kind": columns.kind[lo:hi], "chunk": columns.chunk[lo:hi],
                "micro_batch": columns.micro_batch[lo:hi], "peer": np.where(peer >= 0, peer + d * K, peer),
                "tensor": columns.tensor[lo:hi], "save": columns.save[lo:hi],
            })
    return _stack(parts)


def _stack(parts: list[dict[str, np.ndarray]]) -> ProgramColumns:
    lengths = [len(p["kind"]) for p in parts]
    return ProgramColumns(
        offsets=np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
        rank=np.repeat(np.arange(len(parts), dtype=np.int32), lengths),
        **{name: np.concatenate([p[name] for p in parts]) for name in
           ("kind", "chunk", "micro_batch", "peer", "tensor", "save")},
    )


def ring_allreduce_seconds(nbytes: float, members: int, bandwidth: float, latency_s: float) -> float:
    """A ring all-reduce on dedicated links: 2(D-1)/D x bytes / bandwidth + 2(D-1) x latency
    (a reduce-scatter and an all-gather, each D-1 steps of bytes/D). 0 for one member."""
    if members <= 1:
        return 0.0
    return 2 * (members - 1) / members * nbytes / bandwidth + 2 * (members - 1) * latency_s
