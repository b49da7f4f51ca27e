"""One model chunk on its rank: its sub-module and the state each micro-batch keeps between passes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from gpipe_exec.measure.meters import SavedBytesMeter, tensor_bytes
from gpipe_exec.runtime.checkpoint import rng_state, set_rng_state
from gpipe_exec.runtime.split_backward import (Accumulated, WeightPass, WeightWork, backward_input,
                                               backward_weight)


@dataclass
class MicroBatch:
    """What a micro-batch keeps on a chunk between its forward and its last backward pass."""

    input: torch.Tensor | None = None
    output: torch.Tensor | None = None  # the graph's end (the loss on the model's last chunk)
    rng: tuple[torch.Tensor, torch.Tensor | None] | None = None  # for re-computation
    weight: WeightWork | None = None  # between a backward_input and its backward_weight


@dataclass
class Chunk:
    """Layers `first_layer..` of the model (chunk `index` of `num_chunks`) on its rank, with the
    passes a program names. The model's first chunk takes the inputs, its last computes the loss
    (whatever rank holds them). Parameters' gradients accumulate in `.grad`; the rank's optimizer
    steps every chunk it holds."""

    index: int
    num_chunks: int
    first_layer: int
    module: nn.Sequential
    device: torch.device
    loss: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
    batch_size: int
    parent_meter: SavedBytesMeter | None = None  # the rank's meter (all its chunks)
    weight_pass: WeightPass = "reuse"  # how backward_weight works (split_backward)
    # told each group of parameters a weight pass has just added gradients to (split_backward:
    # overlap_grad_reduce's buckets count them, as autograd's hooks do for a full backward)
    accumulated: Accumulated | None = None
    meter: SavedBytesMeter = field(init=False)
    micro: dict[int, MicroBatch] = field(default_factory=dict)
    losses: dict[int, float] = field(default_factory=dict)
    # Saved bytes per (pass, micro-batch size), measured with saved_tensors_hooks the first time:
    # the hooks cost time on every saved tensor, and shapes (hence bytes) repeat exactly.
    saved_bytes: dict[tuple[str, int], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.meter = SavedBytesMeter([self.module], parent=self.parent_meter)

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.num_chunks - 1

    @property
    def last_layer(self) -> int:
        return self.first_layer + len(self.module) - 1

    def _run(self, x: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
        out = self.module(x)
        if self.is_last:
            assert target is not None
            out = self.loss(out, target, self.batch_size)
        return out

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_first or not x.is_floating_point():
            return x
        return x.detach().requires_grad_(True)

    def forward(self, m: int, x: torch.Tensor, target: torch.Tensor | None, save: bool) -> torch.Tensor:
        """Run micro-batch m; keep the graph (`save`) or only the input and the RNG state.
        Returns the output, detached (the loss on the last chunk)."""
        mb = self.micro.setdefault(m, MicroBatch())
        if save:
            mb.input = self._input(x)
            mb.output = self._tracked("forward", m, mb.input, target, 0)
        else:
            mb.rng = rng_state(self.device)
            mb.input = x.detach()
            self.meter.retain(m, tensor_bytes(mb.input))
            with torch.no_grad():
                mb.output = self._run(mb.input, target)
        if self.is_last:
            self.losses[m] = float(mb.output.detach())
        return mb.output.detach()

    def recompute(self, m: int, target: torch.Tensor | None) -> None:
        """Re-run micro-batch m's forward with its RNG state restored, keeping the graph this time."""
        mb = self.micro[m]
        assert mb.input is not None and mb.rng is not None
        current = rng_state(self.device)
        set_rng_state(mb.rng, self.device)
        try:
            retained = tensor_bytes(mb.input)
            mb.input = self._input(mb.input)
            mb.output = self._tracked("recompute", m, mb.input, target, retained)
        finally:
            set_rng_state(current, self.device)

    def _tracked(self, phase: str, m: int, x: torch.Tensor, target: torch.Tensor | None,
                 retained: int) -> torch.Tensor:
        key = (phase, int(x.shape[0]))
        known = self.saved_bytes.get(key)
        if known is not None:
            out = self._run(x, target)
            self.meter.add_saved(m, known, retained)
            return out
        with self.meter.track(m, retained):
            out = self._run(x, target)
        self.saved_bytes[key] = self.meter.last_packed
        return out

    def backward(self, m: int, grad_output: torch.Tensor | None) -> torch.Tensor | None:
        """Backpropagate micro-batch m (parameter gradients accumulate) and free it; return the
        input's gradient (None on the model's first chunk)."""
        mb = self.micro.pop(m)
        assert mb.output is not None and mb.input is not None
        torch.autograd.backward(mb.output, None if self.is_last else grad_output)
        self.meter.release(m)
        return None if self.is_first else mb.input.grad

    def backward_input(self, m: int, grad_output: torch.Tensor | None) -> torch.Tensor | None:
        """The input's gradient of micro-batch m only (None on the model's first chunk, which
        still keeps its graph); the weights wait for `backward_weight`. Frees nothing."""
        mb = self.micro[m]
        assert mb.output is not None and mb.input is not None
        grad, mb.weight = backward_input(mb.output, None if self.is_last else grad_output, mb.input,
                                         list(self.module.parameters()), self.weight_pass)
        mb.output = None  # the weight pass holds what it needs
        return None if self.is_first else grad

    def backward_weight(self, m: int) -> None:
        """Accumulate micro-batch m's parameter gradients and free it (its last backward pass)."""
        mb = self.micro.pop(m)
        assert mb.weight is not None, f"chunk {self.index}: backward_weight of micro-batch {m} before its backward_input"
        backward_weight(mb.weight, list(self.module.parameters()), self.accumulated)
        self.meter.release(m)

    def named_parameters(self) -> dict[str, torch.nn.Parameter]:
        """This chunk's parameters, keyed by their name in the whole model ("layer.rest")."""
        out = {}
        for name, p in self.module.named_parameters():
            idx, rest = name.split(".", 1)
            out[f"{self.first_layer + int(idx)}.{rest}"] = p
        return out

    def reset(self) -> None:
        """Forget the previous step's micro-batches, losses and memory counts."""
        self.micro.clear()
        self.losses.clear()
        self.meter.reset()
