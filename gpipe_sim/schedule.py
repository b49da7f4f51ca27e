"""Schedules as data: per-stage ordered action lists, run as-is by the simulator and the executor.

A schedule generator only orders each stage's forward and backward passes; `build_schedule` adds
the transfers (activations forward, gradients backward), the re-computation that
re-materialization needs, and the optimizer update, the same way for every schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Literal, NamedTuple

import numpy as np

from gpipe_sim.errors import ScheduleError

ActionKind = Literal["forward", "backward", "recompute", "send", "recv", "update"]
ACTION_KINDS: tuple[ActionKind, ...] = ("forward", "backward", "recompute", "send", "recv", "update")
COMPUTE_KINDS: frozenset[str] = frozenset({"forward", "backward", "recompute", "update"})
Tensor = Literal["activation", "gradient"]
RematMode = Literal["none", "except_last", "always"]

# A generator's output: for each stage, its passes in order as ("F" | "B", micro_batch).
PassOrder = list[list[tuple[Literal["F", "B"], int]]]
Generator = Callable[[int, int], PassOrder]
SCHEDULES: dict[str, Generator] = {}


class Action(NamedTuple):
    """One step of one stage (an immutable tuple, cheap to build in the millions).

    `save` (forward only): keep the activations for backward; False under re-materialization,
    where only the stage input is kept and a `recompute` action precedes the `backward`.
    `peer` and `tensor` (send/recv only): the other stage and what travels.
    """

    kind: ActionKind
    micro_batch: int = -1
    peer: int = -1
    tensor: Tensor | None = None
    save: bool = True

    def __str__(self) -> str:
        if self.kind in ("send", "recv"):
            arrow = "->" if self.kind == "send" else "<-"
            return f"{self.kind}({self.tensor},{self.micro_batch}{arrow}{self.peer})"
        if self.kind == "update":
            return "update"
        return f"{self.kind}({self.micro_batch}{'' if self.save else ',remat'})"


TENSOR_CODES: dict[str | None, int] = {None: -1, "activation": 0, "gradient": 1}


@dataclass(frozen=True)
class ScheduleColumns:
    """All actions of a schedule as NumPy columns, stage by stage (action i of stage k is at
    `offsets[k] + i`); `kind` indexes ACTION_KINDS, `tensor` indexes TENSOR_CODES."""

    offsets: np.ndarray
    stage: np.ndarray
    kind: np.ndarray
    micro_batch: np.ndarray
    peer: np.ndarray
    tensor: np.ndarray
    save: np.ndarray


@dataclass(frozen=True)
class Schedule:
    """The action lists of all stages for one training step.

    Stored as columns (built vectorised, so K=128 x M=1024 takes milliseconds); `actions` gives
    the same lists as `Action` tuples, `stage_actions(k)` one stage's.
    """

    name: str
    stages: int
    micro_batches: int
    remat: RematMode
    columns: ScheduleColumns

    def stage_actions(self, k: int) -> tuple[Action, ...]:
        """Stage `k`'s ordered actions."""
        c = self.columns
        lo, hi = int(c.offsets[k]), int(c.offsets[k + 1])
        tensors = ("activation", "gradient", None)
        return tuple(
            Action(ACTION_KINDS[kind], mb, peer, tensors[tensor], save)
            for kind, mb, peer, tensor, save in zip(
                c.kind[lo:hi].tolist(), c.micro_batch[lo:hi].tolist(), c.peer[lo:hi].tolist(),
                c.tensor[lo:hi].tolist(), c.save[lo:hi].tolist(),
            )
        )

    @cached_property
    def actions(self) -> tuple[tuple[Action, ...], ...]:
        return tuple(self.stage_actions(k) for k in range(self.stages))

    def count(self, kind: ActionKind) -> int:
        return int((self.columns.kind == ACTION_KINDS.index(kind)).sum())


def register(name: str) -> Callable[[Generator], Generator]:
    """Register a schedule generator under `name`; it becomes valid in `pipeline.schedule`."""

    def add(fn: Generator) -> Generator:
        SCHEDULES[name] = fn
        return fn

    return add


@register("gpipe")
def gpipe_order(stages: int, micro_batches: int) -> PassOrder:
    """Fill-drain: all forwards, then all backwards in reverse micro-batch order."""
    order: list[tuple[Literal["F", "B"], int]] = [("F", m) for m in range(micro_batches)]
    order += [("B", m) for m in reversed(range(micro_batches))]
    return [list(order) for _ in range(stages)]


@register("1f1b")
def one_f_one_b_order(stages: int, micro_batches: int) -> PassOrder:
    """1F1B (PipeDream-Flush): warm-up forwards, then alternate one forward and one backward."""
    result: PassOrder = []
    for k in range(stages):
        warmup = min(stages - k - 1, micro_batches)
        order: list[tuple[Literal["F", "B"], int]] = [("F", m) for m in range(warmup)]
        for i in range(micro_batches - warmup):
            order += [("F", warmup + i), ("B", i)]
        order += [("B", m) for m in range(micro_batches - warmup, micro_batches)]
        result.append(order)
    return result


@register("naive")
def naive_order(stages: int, micro_batches: int) -> PassOrder:
    """No micro-batching: the mini-batch goes through the stages whole (micro_batches is 1)."""
    return gpipe_order(stages, 1)


def saves_activations(remat: RematMode, micro_batch: int, micro_batches: int) -> bool:
    """Whether a forward keeps its activations (True) or is re-computed before backward."""
    if remat == "none":
        return True
    if remat == "except_last":
        return micro_batch == micro_batches - 1
    return False


_F, _B, _RC, _SEND, _RECV, _UPD = (ACTION_KINDS.index(k) for k in
                                   ("forward", "backward", "recompute", "send", "recv", "update"))
_ACT, _GRAD = TENSOR_CODES["activation"], TENSOR_CODES["gradient"]


def build_schedule(
    stages: int, micro_batches: int, schedule: str = "gpipe", remat: RematMode = "none"
) -> Schedule:
    """Per-stage action lists for `schedule` with K=`stages` and M=`micro_batches`.

    Around the generator's passes: a forward receives its input from the previous stage and
    sends its output to the next; a backward is preceded by its re-computation (when the forward
    did not keep activations; placed before the gradient's receive so the two overlap), receives
    the gradient from the next stage and sends the input's gradient to the previous one. The
    optimizer update ends every stage's list.
    """
    if schedule not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {schedule!r} (choose from {', '.join(SCHEDULES)})")
    if stages < 1 or micro_batches < 1:
        raise ScheduleError(f"stages and micro_batches must be >= 1, got {stages} and {micro_batches}")
    order = SCHEDULES[schedule](stages, micro_batches)
    if len(order) != stages:
        raise ScheduleError(f"schedule {schedule!r} gave {len(order)} stages, expected {stages}")
    m_total = 1 if schedule == "naive" else micro_batches
    saved = np.array([saves_activations(remat, m, m_total) for m in range(m_total)], dtype=bool)
    parts = [_expand_stage(k, stages, passes, saved) for k, passes in enumerate(order)]
    lengths = [len(p[0]) for p in parts]
    columns = ScheduleColumns(
        offsets=np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
        stage=np.repeat(np.arange(stages, dtype=np.int32), lengths),
        kind=np.concatenate([p[0] for p in parts]),
        micro_batch=np.concatenate([p[1] for p in parts]),
        peer=np.concatenate([p[2] for p in parts]),
        tensor=np.concatenate([p[3] for p in parts]),
        save=np.concatenate([p[4] for p in parts]),
    )
    result = Schedule(schedule, stages, m_total, remat, columns)
    validate_schedule(result)
    return result


def _expand_stage(
    k: int, stages: int, passes: list[tuple[str, int]], saved: np.ndarray
) -> tuple[np.ndarray, ...]:
    """One stage's columns (kind, micro_batch, peer, tensor, save) from its pass order."""
    if not passes:
        raise ScheduleError(f"stage {k}: the schedule gives it no passes")
    ops, mbs = zip(*passes)
    mb = np.asarray(mbs, dtype=np.int32)
    if (mb < 0).any() or (mb >= len(saved)).any():
        raise ScheduleError(f"stage {k}: a pass names a micro-batch outside 0..{len(saved) - 1}")
    is_f = np.asarray([op == "F" for op in ops], dtype=bool)
    keep = saved[mb]
    first, last = k > 0, k < stages - 1
    counts = np.where(is_f, first + 1 + last, (~keep).astype(int) + last + 1 + first)
    starts = np.cumsum(counts) - counts
    n = int(counts.sum()) + 1
    kind = np.empty(n, dtype=np.int8)
    micro = np.empty(n, dtype=np.int32)
    peer = np.full(n, -1, dtype=np.int32)
    tensor = np.full(n, -1, dtype=np.int8)
    save = np.ones(n, dtype=bool)

    def put(pos: np.ndarray, code: int, m: np.ndarray, to: int = -1, what: int = -1) -> None:
        kind[pos], micro[pos], peer[pos], tensor[pos] = code, m, to, what

    pos, m = starts[is_f], mb[is_f]
    if first:
        put(pos, _RECV, m, k - 1, _ACT)
        pos = pos + 1
    put(pos, _F, m)
    save[pos] = keep[is_f]
    if last:
        put(pos + 1, _SEND, m, k + 1, _ACT)
    pos, m, keep_b = starts[~is_f], mb[~is_f], keep[~is_f]
    put(pos[~keep_b], _RC, m[~keep_b])
    save[pos[~keep_b]] = False
    pos = pos + (~keep_b)
    if last:
        put(pos, _RECV, m, k + 1, _GRAD)
        pos = pos + 1
    put(pos, _B, m)
    save[pos] = keep_b
    if first:
        put(pos + 1, _SEND, m, k - 1, _GRAD)
    put(np.array([n - 1]), _UPD, np.array([-1]))
    return kind, micro, peer, tensor, save


def validate_schedule(schedule: Schedule) -> None:
    """Check each stage forwards and backwards every micro-batch once, re-computes and backwards
    only after the forward, and that every send has exactly one matching receive."""
    c = schedule.columns
    K, M = schedule.stages, schedule.micro_batches
    codes = {k: i for i, k in enumerate(ACTION_KINDS)}
    position = np.arange(len(c.kind)) - c.offsets[c.stage]
    first_forward = np.full((K, M), -1, dtype=np.int64)
    for kind in ("forward", "backward"):
        sel = c.kind == codes[kind]
        counts = np.zeros((K, M), dtype=np.int64)
        mb_ok = (c.micro_batch[sel] >= 0) & (c.micro_batch[sel] < M)
        if not mb_ok.all():
            k = int(c.stage[sel][~mb_ok][0])
            raise ScheduleError(f"stage {k}: a {kind} names a micro-batch outside 0..{M - 1}")
        np.add.at(counts, (c.stage[sel], c.micro_batch[sel]), 1)
        if (counts != 1).any():
            k = int(np.argwhere(counts != 1)[0][0])
            raise ScheduleError(f"stage {k}: each micro-batch must be forwarded and backwarded once")
        if kind == "forward":
            first_forward[c.stage[sel], c.micro_batch[sel]] = position[sel]
    after = np.isin(c.kind, [codes["backward"], codes["recompute"]])
    early = position[after] < first_forward[c.stage[after], c.micro_batch[after]]
    if early.any():
        i = np.flatnonzero(after)[np.argmax(early)]
        k = int(c.stage[i])
        action = schedule.actions[k][int(position[i])]
        raise ScheduleError(f"stage {k}: {action} comes before forward({action.micro_batch})")
    send, recv = c.kind == codes["send"], c.kind == codes["recv"]

    def keys(src: np.ndarray, dst: np.ndarray, tensor: np.ndarray, mb: np.ndarray) -> np.ndarray:
        return ((src.astype(np.int64) * K + dst) * 2 + tensor) * M + mb

    sent = np.sort(keys(c.stage[send], c.peer[send], c.tensor[send], c.micro_batch[send]))
    received = np.sort(keys(c.peer[recv], c.stage[recv], c.tensor[recv], c.micro_batch[recv]))
    bad_peer = np.concatenate((c.peer[send | recv] < 0, c.peer[send | recv] >= K))
    if bad_peer.any():
        raise ScheduleError("a send or receive names a stage outside the pipeline")
    if len(sent) != len(received) or (sent != received).any() or (np.diff(sent) == 0).any():
        diff = np.setxor1d(sent, received)
        key = int(diff[0]) if len(diff) else int(sent[np.flatnonzero(np.diff(sent) == 0)[0]])
        m, rest = key % M, key // M
        tensor, rest = ("activation", "gradient")[rest % 2], rest // 2
        raise ScheduleError(
            f"transfer of {tensor} {m} from stage {rest // K} to {rest % K} has no single partner"
        )
