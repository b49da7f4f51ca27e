"""The action vocabulary: the one definition of what a rank's program is made of."""

from __future__ import annotations

from enum import IntEnum
from typing import Literal, NamedTuple


class Kind(IntEnum):
    """What an action does. The integer is the code stored in program and timeline columns."""

    FORWARD = 0
    BACKWARD = 1  # full backward: input and weight gradients in one pass
    BACKWARD_INPUT = 2  # the input gradient only (zero-bubble's I pass; on the critical path)
    BACKWARD_WEIGHT = 3  # the weight gradients only (zero-bubble's W pass; may be deferred)
    RECOMPUTE = 4  # re-run a forward whose activations were not kept
    SEND = 5
    RECV = 6
    UPDATE = 7  # the optimizer step over all of a rank's chunks
    ALLREDUCE = 8  # start the data-parallel reduction of a chunk's gradients (asynchronous, a join
    #                of the chunk's D replicas; the update waits for it with a `recv` of REDUCED)

    @property
    def label(self) -> str:
        """The name used in JSON, traces and charts ("forward", "backward_input", ...)."""
        return self.name.lower()


class Tensor(IntEnum):
    """What a transfer carries across a chunk boundary."""

    ACTIVATION = 0  # chunk b's output, to chunk b + 1
    GRADIENT = 1  # the gradient of chunk b + 1's input, back to chunk b
    REDUCED = 2  # a chunk's gradients summed over its data-parallel replicas


ACTION_KINDS: tuple[str, ...] = tuple(k.label for k in Kind)
KindName = Literal[
    "forward", "backward", "backward_input", "backward_weight", "recompute", "send", "recv", "update",
    "allreduce",
]
COMPUTE_KINDS: frozenset[Kind] = frozenset(
    {Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT, Kind.RECOMPUTE, Kind.UPDATE}
)
# Passes a schedule generator orders; the lowering adds transfers, re-computation and the update.
PASS_KINDS: frozenset[Kind] = frozenset(
    {Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT}
)
# Passes that consume the gradient of a chunk's output (and produce its input's gradient).
INPUT_GRADIENT_KINDS: frozenset[Kind] = frozenset({Kind.BACKWARD, Kind.BACKWARD_INPUT})


class Action(NamedTuple):
    """One step of one rank's program (an immutable tuple, cheap to build in the millions).

    `chunk` is the model chunk the action belongs to (a global index, 0 .. K*v-1), -1 for the
    update, which steps every chunk of the rank. `save` (forward, recompute, backward passes):
    the micro-batch's activations were kept by its forward; False under re-materialization, where
    only the chunk input is kept and a `recompute` precedes the first backward pass. `peer` and
    `tensor` (send/recv only): the other rank and what travels.
    """

    kind: Kind
    chunk: int = -1
    micro_batch: int = -1
    peer: int = -1
    tensor: Tensor | None = None
    save: bool = True

    @classmethod
    def of(cls, kind: int, chunk: int, micro_batch: int, peer: int, tensor: int, save: bool) -> "Action":
        """From program column values (integer codes, tensor -1 for none)."""
        return cls(Kind(kind), chunk, micro_batch, peer, None if tensor < 0 else Tensor(tensor), save)

    def __str__(self) -> str:
        if self.kind == Kind.ALLREDUCE or self.tensor == Tensor.REDUCED:
            verb = "allreduce" if self.kind == Kind.ALLREDUCE else "wait for the allreduce"
            return f"{verb}(gradients of chunk {self.chunk})"
        if self.kind in (Kind.SEND, Kind.RECV):
            arrow = "->" if self.kind == Kind.SEND else "<-"
            what = "activation" if self.tensor == Tensor.ACTIVATION else "gradient"
            return f"{self.kind.label}({what} of chunk {self.chunk}, micro-batch {self.micro_batch} {arrow} rank {self.peer})"
        if self.kind == Kind.UPDATE:
            return "update"
        remat = "" if self.save else ", re-materialized"
        return f"{self.kind.label}(chunk {self.chunk}, micro-batch {self.micro_batch}{remat})"


class Pass(NamedTuple):
    """One entry of a generator's compute order: a pass of `chunk` over `micro_batch`."""

    kind: Kind
    chunk: int
    micro_batch: int
