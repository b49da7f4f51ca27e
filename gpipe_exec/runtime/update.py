"""A rank's optimizer update: the scenario's optimizer and fp32 master weights (ZeRO-1's shards: runtime.zero_shards)."""

from __future__ import annotations

import torch
from torch import nn

from gpipe_sim.scenario.scenario import Scenario

LEARNING_RATES = {"sgd": 0.05, "momentum": 0.05, "rmsprop": 1e-3, "adagrad": 0.01, "adam": 1e-3, "adamw": 1e-3}
STEP_OPTIONS = {"for_loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def make_optimizer(params: list[nn.Parameter], scenario: Scenario) -> torch.optim.Optimizer:
    """The scenario's optimizer (`training.optimizer`) with a fixed learning rate, stepping as
    `Scenario.optimizer_step` says: one tensor at a time ("for_loop"), on lists ("foreach") or
    fused."""
    name = scenario.training.optimizer
    lr, how = LEARNING_RATES[name], STEP_OPTIONS[scenario.optimizer_step]
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, **how)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, **how)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr, **how)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, **how)
    if name == "adamw":  # torch's default decoupled weight decay (0.01)
        return torch.optim.AdamW(params, lr=lr, **how)
    return torch.optim.Adam(params, lr=lr, **how)


class Update:
    """The update of `params` as gpipe_sim counts its memory (`Training.bytes_per_param`).

    In fp32 the optimizer steps the parameters themselves. In bf16/fp16 (mixed precision) the
    parameters and their gradients stay in the low-precision type and the optimizer steps fp32
    master copies with fp32 states: the step copies every gradient to fp32 (freed when it ends),
    steps the masters and copies them back into the parameters."""

    def __init__(self, params: list[nn.Parameter], scenario: Scenario) -> None:
        self.params = list(params)
        mixed = scenario.training.dtype != "fp32"
        self.masters = [nn.Parameter(p.detach().to(torch.float32, copy=True)) for p in self.params] if mixed else []
        self.optimizer = make_optimizer(self.masters if mixed else self.params, scenario)

    def step(self) -> None:
        """One optimizer step from the parameters' accumulated gradients."""
        if not self.masters:
            self.optimizer.step()
            return
        for master, p in zip(self.masters, self.params):
            master.grad = None if p.grad is None else p.grad.to(torch.float32)
        self.optimizer.step()
        with torch.no_grad():
            for master, p in zip(self.masters, self.params):
                master.grad = None
                p.copy_(master)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the parameters' gradients (zeroed in place unless `set_to_none`)."""
        for p in self.params:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()
