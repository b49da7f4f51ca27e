"""Megatron-LM's activation checkpoint (`tensor_parallel.checkpoint`, torch's reentrant checkpoint).

The function runs without a graph and its inputs are saved for backward (`save_for_backward`, so
the saved-tensor hooks of `measure.meters.SavedBytesMeter` count them); its backward restores the
forward's RNG state (the same dropout masks), re-runs the function with a graph and
backpropagates through it.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


def rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The CPU generator's state, and `device`'s where it is a GPU."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def set_rng_state(state: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
    """Restore a `rng_state`."""
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


class _Checkpoint(torch.autograd.Function):
    """Run `fn(*inputs)` without a graph; in backward, again with one from the forward's RNG state."""

    @staticmethod
    def forward(ctx: Any, fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
        ctx.fn = fn
        ctx.device = inputs[0].device
        ctx.rng = rng_state(ctx.device)
        ctx.save_for_backward(*inputs)
        with torch.no_grad():
            return fn(*inputs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
        current = rng_state(ctx.device)
        set_rng_state(ctx.rng, ctx.device)
        try:
            with torch.enable_grad():
                out = ctx.fn(*inputs)
        finally:
            set_rng_state(current, ctx.device)
        torch.autograd.backward(out, grad)
        return (None, *(t.grad for t in inputs))


def checkpointed(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
    """`fn(*inputs)`, its activations re-made in backward; plain `fn` where no graph is recorded."""
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in inputs):
        return fn(*inputs)
    return _Checkpoint.apply(fn, *inputs)


__all__ = ["checkpointed", "rng_state", "set_rng_state"]
