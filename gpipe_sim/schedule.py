"""Schedules as data: per-stage ordered action lists, run as-is by the simulator and the executor.

A schedule generator only orders each stage's forward and backward passes; `build_schedule` adds
the transfers (activations forward, gradients backward), the re-computation that
re-materialization needs, and the optimizer update, the same way for every schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Literal

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


@dataclass(frozen=True, slots=True)
class Action:
    """One step of one stage.

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


@dataclass(frozen=True)
class Schedule:
    """The action lists of all stages for one training step."""

    name: str
    stages: int
    micro_batches: int
    remat: RematMode
    actions: tuple[tuple[Action, ...], ...]

    def __iter__(self) -> Iterator[tuple[Action, ...]]:
        return iter(self.actions)

    @property
    def num_actions(self) -> int:
        return sum(len(stage) for stage in self.actions)

    def count(self, kind: ActionKind) -> int:
        return sum(1 for stage in self.actions for a in stage if a.kind == kind)


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


def build_schedule(
    stages: int, micro_batches: int, schedule: str = "gpipe", remat: RematMode = "none"
) -> Schedule:
    """Per-stage action lists for `schedule` with K=`stages` and M=`micro_batches`."""
    if schedule not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {schedule!r} (choose from {', '.join(SCHEDULES)})")
    if stages < 1 or micro_batches < 1:
        raise ScheduleError(f"stages and micro_batches must be >= 1, got {stages} and {micro_batches}")
    order = SCHEDULES[schedule](stages, micro_batches)
    m_total = 1 if schedule == "naive" else micro_batches
    last = stages - 1
    lists: list[tuple[Action, ...]] = []
    for k, passes in enumerate(order):
        acts: list[Action] = []
        for op, m in passes:
            if op == "F":
                if k > 0:
                    acts.append(Action("recv", m, k - 1, "activation"))
                acts.append(Action("forward", m, save=saves_activations(remat, m, m_total)))
                if k < last:
                    acts.append(Action("send", m, k + 1, "activation"))
            else:
                # Re-compute before waiting for the gradient, so the two overlap.
                if not saves_activations(remat, m, m_total):
                    acts.append(Action("recompute", m))
                if k < last:
                    acts.append(Action("recv", m, k + 1, "gradient"))
                acts.append(Action("backward", m))
                if k > 0:
                    acts.append(Action("send", m, k - 1, "gradient"))
        acts.append(Action("update"))
        lists.append(tuple(acts))
    result = Schedule(schedule, stages, m_total, remat, tuple(lists))
    validate_schedule(result)
    return result


def validate_schedule(schedule: Schedule) -> None:
    """Check each stage forwards and backwards every micro-batch once, and transfers match up."""
    sends: set[tuple[int, int, str | None, int]] = set()
    recvs: set[tuple[int, int, str | None, int]] = set()
    for k, stage in enumerate(schedule.actions):
        forwards = [a.micro_batch for a in stage if a.kind == "forward"]
        backwards = [a.micro_batch for a in stage if a.kind == "backward"]
        expected = list(range(schedule.micro_batches))
        if sorted(forwards) != expected or sorted(backwards) != expected:
            raise ScheduleError(f"stage {k}: each micro-batch must be forwarded and backwarded once")
        seen_forward: set[int] = set()
        for a in stage:
            if a.kind == "forward":
                seen_forward.add(a.micro_batch)
            elif a.kind in ("backward", "recompute") and a.micro_batch not in seen_forward:
                raise ScheduleError(f"stage {k}: {a} comes before forward({a.micro_batch})")
            elif a.kind == "send":
                sends.add((k, a.peer, a.tensor, a.micro_batch))
            elif a.kind == "recv":
                recvs.add((a.peer, k, a.tensor, a.micro_batch))
    unmatched = sends ^ recvs
    if unmatched:
        src, dst, tensor, m = sorted(unmatched, key=str)[0]
        raise ScheduleError(f"transfer of {tensor} {m} from stage {src} to {dst} has no partner")
