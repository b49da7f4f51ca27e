"""The step's global program: every replica's ranks, their data-parallel collectives and step-unique message ids.

Built once from a Schedule and D by `global_program` and used as it is by the simulator's compile
step (`gpipe_sim.plan.compile`), by each of the executor's ranks (its slice, `GlobalProgram.rank`)
and by the measured timelines (which pair sends with receives by these ids).

Data parallelism: each rank's program gains, after the last backward pass of each of its chunks
(a full backward, or the weight pass of a split one; with `overlap`, before it: its buckets are
reduced while it runs, gpipe_sim.plan.buckets), an `allreduce` of that chunk's gradients
(asynchronous: the rank goes on while the D replicas of the chunk reduce, as DDP's buckets do), and
before its update a `recv` of the REDUCED gradients of each chunk, which waits for that reduction to
end. Replica d runs the same programs as global ranks d*K .. d*K+K-1. With D = 1 nothing is added.

Messages: replica d's point-to-point messages are numbered d*P + key (`ProgramColumns.message_keys`,
P keys per replica); the wait for chunk c's all-reduce on replica d is message S*P + c*S + d, with S
the replicas the program holds: all D, or replica 0 alone where the simulator times alike replicas
once (`gpipe_sim.plan.replica_symmetry`; its all-reduces still reduce over D replicas).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpipe_sim.kept import Kept
from gpipe_sim.mesh import Mesh, tensor_parallel_rank
from gpipe_sim.schedule.actions import Action, Kind, Tensor
from gpipe_sim.schedule.program import ProgramColumns, Schedule

_COLUMNS = ("kind", "chunk", "micro_batch", "peer", "tensor", "save")


@dataclass(frozen=True)
class RankProgram:
    """One global rank's slice of the step: its ordered actions and each one's message id (-1:
    not a transfer or a wait for an all-reduce)."""

    rank: int
    actions: tuple[Action, ...]
    message: tuple[int, ...]


@dataclass(frozen=True)
class GlobalProgram:
    """Every global rank's program (rank g = d*K + r runs pipeline rank r's for replica d) and the
    message id of each action (see the module docstring); `num_messages` bounds the ids."""

    columns: ProgramColumns
    message: np.ndarray
    num_messages: int
    keys: np.ndarray  # a point-to-point transfer's key in its replica (ProgramColumns.message_keys); -1 elsewhere

    def rank(self, g: int) -> RankProgram:
        """Global rank g's actions and message ids, what its process runs."""
        lo, hi = int(self.columns.offsets[g]), int(self.columns.offsets[g + 1])
        return RankProgram(g, self.columns.actions(g), tuple(self.message[lo:hi].tolist()))


def per_replica_messages(num_chunks: int, micro_batches: int) -> int:
    """P: message keys one replica's point-to-point transfers can use (2 tensors x M per boundary)."""
    return max(num_chunks - 1, 1) * 2 * micro_batches


def global_program(schedule: Schedule, replicas: int, held: int | None = None,
                   overlap: bool = False, reduced: bool | None = None) -> GlobalProgram:
    """The schedule's programs for D = `replicas` replicas, with the all-reduces and their waits
    when D > 1, and every message numbered uniquely in the step. `held`: the replicas the program
    holds, S (default all D; 1: replica 0 alone, whose all-reduces stand for D replicas');
    `overlap`: each all-reduce starts with its chunk's last backward pass (`with_collectives`).
    `reduced`: whether the gradients are reduced at all (default D > 1; context parallelism reduces
    them over D x C devices, so one replica does too: gpipe_sim.mesh.Mesh.gradient_group).
    Kept for the next call with the same schedule (the same object: a search asks for the
    programs of each of its kept schedules many times) and arguments; its arrays are read-only."""
    S = replicas if held is None else held
    reduced = replicas > 1 if reduced is None else reduced
    key = (id(schedule), replicas, S, overlap, reduced)
    kept, program = _KEPT.get(key, lambda: (schedule, _global_program(schedule, replicas, S, overlap, reduced)))
    # the key's schedule is alive while its entry is (the entry holds it), so its id names it alone
    return program if kept is schedule else _global_program(schedule, replicas, S, overlap, reduced)


_KEPT: Kept[tuple[Schedule, GlobalProgram]] = Kept(32)  # the last programs, by schedule and arguments


def _global_program(schedule: Schedule, D: int, S: int, overlap: bool, reduced: bool) -> GlobalProgram:
    """`global_program`'s programs for D replicas of which S are held, made afresh, read-only."""
    M, C = schedule.micro_batches, schedule.num_chunks
    if not 1 <= S <= D:
        raise ValueError(f"held: {S} replicas of {D}")
    cols = with_collectives(schedule.columns, overlap) if reduced else schedule.columns
    cols = cols if S == 1 else replicate(cols, S)
    replica = Mesh(S, schedule.ranks).replica(cols.rank.astype(np.int64))
    P = per_replica_messages(C, M)
    keys = cols.message_keys(M) if reduced else schedule.message_keys
    message = np.where(keys >= 0, keys + replica * P, -1)
    waits = np.flatnonzero((cols.kind == Kind.RECV) & (cols.tensor == Tensor.REDUCED))
    message[waits] = S * P + cols.chunk[waits].astype(np.int64) * S + replica[waits]
    num_messages = S * P + (C * S if reduced else 0)
    fresh = (message,) if cols is schedule.columns else (*vars(cols).values(), message, keys)
    for array in fresh:  # (the schedule's own columns and keys are its to mark)
        array.flags.writeable = False
    return GlobalProgram(cols, message, num_messages, keys)


def with_collectives(columns: ProgramColumns, overlap: bool = False) -> ProgramColumns:
    """The pipeline's per-rank programs with each chunk's `allreduce` after its last backward pass
    (`overlap`: right before it) and the waits for them before the update (see the module
    docstring): a rank's reductions start, and its waits stand, in the order its chunks' last
    backward passes run. Every rank's inserts in one array pass (each rank needs an update)."""
    kind, rank = columns.kind, columns.rank.astype(np.int64)
    n_ranks = len(columns.offsets) - 1
    backward = np.flatnonzero(np.isin(kind, (Kind.BACKWARD, Kind.BACKWARD_WEIGHT)))
    # each (rank, chunk)'s last backward pass, in program order: their reductions' order
    pair = rank[backward] * (int(columns.chunk.max(initial=0)) + 1) + columns.chunk[backward]
    _, from_end = np.unique(pair[::-1], return_index=True)
    last = np.sort(backward[len(backward) - 1 - from_end])
    updates = np.flatnonzero(kind == Kind.UPDATE)
    update = np.zeros(n_ranks, dtype=np.int64)
    np.maximum.at(update, rank[updates], updates)  # each rank's last update
    if len(np.unique(rank[updates])) < n_ranks:  # the waits go before each rank's update
        raise ValueError("with_collectives: a rank's program has no update")
    owner = rank[last]
    n = len(last)
    # (insert before, rank, allreduce 0 / wait 1, reduction order): ties kept in this order
    at = np.concatenate([last + (0 if overlap else 1), update[owner]])
    order = np.lexsort((np.tile(np.arange(n), 2), np.repeat([0, 1], n), np.tile(owner, 2), at))
    at, who = at[order], np.tile(owner, 2)[order]
    new = {"kind": np.where(order < n, Kind.ALLREDUCE, Kind.RECV), "chunk": np.tile(columns.chunk[last], 2)[order],
           "micro_batch": -1, "peer": -1, "tensor": Tensor.REDUCED, "save": True}
    added = np.bincount(owner, minlength=n_ranks)
    # as np.insert places them (`at` sorted): insert j lands at at[j] + j, the old rows in the rest
    dest = at + np.arange(len(at))
    old = np.ones(len(kind) + len(at), dtype=bool)
    old[dest] = False

    def inserted(column: np.ndarray, values: object) -> np.ndarray:
        out = np.empty(len(old), dtype=column.dtype)
        out[old], out[dest] = column, values
        return out

    return ProgramColumns(
        offsets=(columns.offsets + np.concatenate(([0], np.cumsum(2 * added)))).astype(np.int64),
        rank=inserted(columns.rank, who).astype(np.int32, copy=False),
        **{name: inserted(getattr(columns, name), new[name]) for name in _COLUMNS},
    )


def replicate(columns: ProgramColumns, replicas: int) -> ProgramColumns:
    """Program ranks d*K + r (`Mesh.program_rank`) for every replica d: the same programs, each
    peer that replica's rank (every column tiled once, not rank by rank)."""
    ranks, n = len(columns.offsets) - 1, len(columns.kind)
    shift = np.repeat(np.arange(replicas, dtype=np.int64) * ranks, n)  # d*K on replica d's rows
    peer = np.tile(columns.peer, replicas)
    rank = (np.tile(columns.rank, replicas) + shift).astype(np.int32)
    return ProgramColumns(
        offsets=np.concatenate(([0], (np.arange(replicas)[:, None] * n + columns.offsets[1:]).ravel())
                               ).astype(np.int64),
        rank=rank,
        peer=np.where(peer >= 0, peer + shift, peer).astype(peer.dtype),
        **{name: np.tile(getattr(columns, name), replicas) for name in _COLUMNS if name != "peer"},
    )


# Tensor parallelism (`pipeline.tensor_parallel` T): program rank g runs on T processes, numbered
# by the mesh (gpipe_sim.mesh.Mesh.process). Every one of them runs g's program; a transfer goes
# to the same t of the peer rank. The simulator prices the T devices of a rank as one; the
# executor runs one process per device, and its measured timeline is each rank's t = 0 process.

def process_program(program: GlobalProgram, process: int, tp: int) -> RankProgram:
    """The slice a process runs: its program rank's actions, each transfer's peer the same
    tensor-parallel rank t of the peer's program rank (message ids unchanged: a pair of processes
    exchanges exactly what their program ranks exchange)."""
    g, t = tensor_parallel_rank(process, tp)
    mine = program.rank(g)
    if tp == 1:
        return mine
    grid = Mesh(tensor_parallel=tp)
    actions = tuple(a._replace(peer=grid.process(a.peer, 0, t)) if a.peer >= 0 else a for a in mine.actions)
    return RankProgram(process, actions, mine.message)
