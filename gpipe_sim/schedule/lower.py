"""Lowering: per-rank pass orders become per-rank programs, the same way for every schedule.

Around the generator's passes: a forward receives its input when the previous chunk sits on
another rank and sends its output when the next one does (a hand-over between chunks of one rank
is free); the first backward pass (a full backward, or the input-gradient pass of a split one)
is preceded by the re-computation when the forward did not keep its activations (placed before
the gradient's receive so the two overlap), receives the output's gradient and sends the input's;
a weight-gradient pass needs nothing from other ranks. The optimizer update ends every program.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from gpipe_sim.errors import ScheduleError
from gpipe_sim.schedule.actions import PASS_KINDS, Kind, Pass, Tensor
from gpipe_sim.schedule.check import check_schedule
from gpipe_sim.schedule.program import ProgramColumns, RematMode, Schedule
from gpipe_sim.schedule.registry import SCHEDULES, schedule_family



def saves_activations(remat: RematMode, micro_batch: int, micro_batches: int) -> bool:
    """Whether a forward keeps its activations (True) or is re-computed before its backward. The
    per-layer modes (full, selective) keep every forward: they change what each layer keeps."""
    if remat in ("none", "full", "selective"):
        return True
    if remat == "except_last":
        return micro_batch == micro_batches - 1
    return False


# The last schedules built, by arguments: (family, schedule), each memo dropping its oldest past its
# size. A search asks for a hundred small ones in turn, so those of at most SMALL_ACTIONS actions
# (about 27 B an action: 28 MB in all) are kept in a longer memo than the larger ones.
_BUILT: dict[tuple, tuple[object, Schedule]] = {}
_BUILT_SIZE = 64
_BUILT_SMALL: dict[tuple, tuple[object, Schedule]] = {}
_BUILT_SMALL_SIZE = 256
SMALL_ACTIONS = 4096
# The per-layer modes keep every forward (`saves_activations`), as "none" does: the same programs.
_SAME_PROGRAMS: dict[str, RematMode] = {"full": "none", "selective": "none"}


def build_schedule(ranks: int, micro_batches: int, schedule: str = "gpipe", remat: RematMode = "none",
                   chunks: int = 1) -> Schedule:
    """The programs of the registered schedule `schedule` for K=`ranks`, M=`micro_batches` and
    v=`chunks` chunks per rank; ScheduleError (one line naming the field) if it cannot run them.
    Kept for the next call with the same family and arguments (the planner asks for each many
    times): its columns are read-only, and shared by the remat modes whose programs are the same."""
    family = SCHEDULES.get(schedule)
    key = (schedule, ranks, micro_batches, remat, chunks)
    kept = _BUILT_SMALL.get(key) or _BUILT.get(key)
    if kept is not None and kept[0] is family:  # the same registered generator
        return kept[1]
    if remat in _SAME_PROGRAMS:
        built = replace(build_schedule(ranks, micro_batches, schedule, _SAME_PROGRAMS[remat], chunks), remat=remat)
    else:
        built = _build(ranks, micro_batches, schedule, remat, chunks)
    for column in vars(built.columns).values():
        if isinstance(column, np.ndarray):
            column.flags.writeable = False
    memo, size = (_BUILT_SMALL, _BUILT_SMALL_SIZE) if len(built.columns.kind) <= SMALL_ACTIONS else (_BUILT, _BUILT_SIZE)
    _BUILT_SMALL.pop(key, None), _BUILT.pop(key, None)  # another family's, registered under this name before
    if len(memo) >= size:
        _drop(memo, next(iter(memo)))
    memo[key] = (family, built)
    return built


def _drop(memo: dict[tuple, tuple[object, Schedule]], key: tuple) -> None:
    """Drop a kept schedule and, with a remat mode's own programs, the modes that share them: a
    mode kept past its programs' owner would no longer share the owner's next build."""
    memo.pop(key)
    name, ranks, micro_batches, remat, chunks = key
    for mode, owner in _SAME_PROGRAMS.items():
        if owner == remat:
            memo.pop((name, ranks, micro_batches, mode, chunks), None)


def _build(ranks: int, micro_batches: int, schedule: str, remat: RematMode, chunks: int) -> Schedule:
    if ranks < 1 or micro_batches < 1 or chunks < 1:
        raise ScheduleError(
            f"pipeline: stages, micro_batches and chunks must be >= 1, got {ranks}, {micro_batches}, {chunks}"
        )
    family = schedule_family(schedule)
    problem = family.problem(ranks, micro_batches, chunks)
    if problem:
        raise ScheduleError(problem)
    orders = family.generate(ranks, micro_batches, chunks)
    return lower(schedule, orders, family.placement(ranks, chunks), micro_batches, remat, chunks)


def lower(name: str, orders: Sequence[Sequence[Pass]], placement: Sequence[int], micro_batches: int,
          remat: RematMode = "none", chunks: int = 1) -> Schedule:
    """Programs from per-rank pass orders (a generator's, or read from a file), checked."""
    ranks = len(orders)
    placement = tuple(int(r) for r in placement)
    if len(placement) != ranks * chunks or any(not 0 <= r < ranks for r in placement):
        raise ScheduleError(f"schedule {name!r}: its placement does not put {chunks} chunks on each of {ranks} ranks")
    saved = np.array([saves_activations(remat, m, micro_batches) for m in range(micro_batches)], dtype=bool)
    rank_of = np.asarray(placement, dtype=np.int32)
    passes: list[np.ndarray] = []
    for order in orders:
        try:
            passes.append(np.asarray(order, dtype=np.int64).reshape(-1, 3))
        except (TypeError, ValueError):
            _check_passes(passes, len(rank_of), micro_batches)  # a rank before it may be wrong first
            raise
    _check_passes(passes, len(rank_of), micro_batches)
    result = Schedule(name, ranks, micro_batches, chunks, remat, placement, _program(passes, rank_of, saved))
    check_schedule(result)
    return result


def _check_passes(passes: list[np.ndarray], num_chunks: int, micro_batches: int) -> None:
    """ScheduleError naming the first rank (and, within it, the first problem) whose passes are
    missing, not passes, or name a chunk or micro-batch out of range."""
    every = np.concatenate(passes) if passes else np.zeros((0, 3), dtype=np.int64)
    op, ch, mb = every[:, 0], every[:, 1], every[:, 2]
    if (all(len(p) for p in passes) and _PASS_CODE[np.clip(op, 0, len(_PASS_CODE) - 1)].all()
            and ((op >= 0) & (op < len(_PASS_CODE))).all() and ((ch >= 0) & (ch < num_chunks)).all()
            and ((mb >= 0) & (mb < micro_batches)).all()):
        return
    for r, arr in enumerate(passes):
        if not len(arr):
            raise ScheduleError(f"rank {r}: the schedule gives it no passes")
        op, ch, mb = arr[:, 0], arr[:, 1], arr[:, 2]
        if not np.isin(op, sorted(PASS_KINDS)).all():
            raise ScheduleError(f"rank {r}: a pass is not forward, backward, backward_input or backward_weight")
        if (ch < 0).any() or (ch >= num_chunks).any():
            raise ScheduleError(f"rank {r}: a pass names a chunk outside 0..{num_chunks - 1}")
        if (mb < 0).any() or (mb >= micro_batches).any():
            raise ScheduleError(f"rank {r}: a pass names a micro-batch outside 0..{micro_batches - 1}")


_PASS_CODE = np.zeros(max(Kind) + 1, dtype=bool)  # by Kind code: a pass a generator may order
_PASS_CODE[sorted(PASS_KINDS)] = True
FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, RECOMPUTE, SEND, RECV, UPDATE = (
    int(k) for k in (Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT, Kind.RECOMPUTE,
                     Kind.SEND, Kind.RECV, Kind.UPDATE))
ACTIVATION, GRADIENT = int(Tensor.ACTIVATION), int(Tensor.GRADIENT)


def _program(passes: list[np.ndarray], rank_of: np.ndarray, saved: np.ndarray) -> ProgramColumns:
    """Every rank's columns (kind, chunk, micro_batch, peer, tensor, save) from its pass rows (all
    ranks at once; rank r's program ends with its update, so its passes sit r rows further on)."""
    ranks = len(passes)
    prev_remote = np.zeros(len(rank_of), dtype=bool)
    prev_remote[1:] = rank_of[1:] != rank_of[:-1]
    next_remote = np.zeros(len(rank_of), dtype=bool)
    next_remote[:-1] = prev_remote[1:]
    every = np.concatenate(passes)
    op, ch, mb = every[:, 0], every[:, 1], every[:, 2]
    is_f, is_w = op == FORWARD, op == BACKWARD_WEIGHT
    is_bi = (op == BACKWARD) | (op == BACKWARD_INPUT)
    keep = saved[mb]
    pr, nr = prev_remote[ch].astype(np.int64), next_remote[ch].astype(np.int64)
    counts = np.where(is_f, pr + 1 + nr, np.where(is_bi, (~keep) + nr + 1 + pr, 1))
    owner = np.repeat(np.arange(ranks), [len(p) for p in passes])
    starts = np.cumsum(counts) - counts + owner
    lengths = np.bincount(owner, weights=counts, minlength=ranks).astype(np.int64) + 1
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    n = int(offsets[-1])
    kind = np.empty(n, dtype=np.int8)
    chunk = np.empty(n, dtype=np.int32)
    micro = np.empty(n, dtype=np.int32)
    peer = np.full(n, -1, dtype=np.int32)
    tensor = np.full(n, -1, dtype=np.int8)
    save = np.ones(n, dtype=bool)

    def put(pos: np.ndarray, code: np.ndarray | int, c: np.ndarray, m: np.ndarray,
            to: np.ndarray | int = -1, what: int = -1) -> None:
        kind[pos], chunk[pos], micro[pos], peer[pos], tensor[pos] = code, c, m, to, what

    # forward: [recv activation] forward [send activation]
    pos, c, m = starts[is_f], ch[is_f], mb[is_f]
    has = pr[is_f] == 1
    put(pos[has], RECV, c[has], m[has], rank_of[c[has] - 1], ACTIVATION)
    pos = pos + has
    put(pos, FORWARD, c, m)
    save[pos] = keep[is_f]
    has = nr[is_f] == 1
    put(pos[has] + 1, SEND, c[has], m[has], rank_of[c[has] + 1], ACTIVATION)
    # first backward pass: [recompute] [recv gradient] backward|backward_input [send gradient]
    pos, c, m, k = starts[is_bi], ch[is_bi], mb[is_bi], keep[is_bi]
    put(pos[~k], RECOMPUTE, c[~k], m[~k])
    save[pos[~k]] = False
    pos = pos + (~k)
    has = nr[is_bi] == 1
    put(pos[has], RECV, c[has], m[has], rank_of[np.minimum(c[has] + 1, len(rank_of) - 1)], GRADIENT)
    pos = pos + has
    put(pos, op[is_bi], c, m)
    save[pos] = k
    has = pr[is_bi] == 1
    put(pos[has] + 1, SEND, c[has], m[has], rank_of[c[has] - 1], GRADIENT)
    # weight-gradient pass
    pos = starts[is_w]
    put(pos, BACKWARD_WEIGHT, ch[is_w], mb[is_w])
    save[pos] = keep[is_w]
    updates = offsets[1:] - 1
    put(updates, UPDATE, np.full(ranks, -1), np.full(ranks, -1))
    return ProgramColumns(offsets=offsets, rank=np.repeat(np.arange(ranks, dtype=np.int32), lengths),
                          kind=kind, chunk=chunk, micro_batch=micro, peer=peer, tensor=tensor, save=save)
