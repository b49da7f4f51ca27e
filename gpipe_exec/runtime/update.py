"""A rank's optimizer update: the scenario's optimizer, fp32 master weights, ZeRO-1 shards."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
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


class ZeroShardUpdate:
    """ZeRO-1 on one global rank: the rank's parameters flattened (padded to a multiple of D), this
    replica's 1/D of them as the one tensor its optimizer steps (states for the shard only, and the
    shard's master copy in fp32); after the step the replicas all-gather the updated shards into
    every parameter (`gather`, a collective the runtime calls out of the device lock). The same
    interface as `Update` (`optimizer`, `masters`, `step`)."""

    def __init__(self, params: list[torch.nn.Parameter], scenario: Scenario, replica: int, D: int,
                 group: Any) -> None:
        self.params, self.D, self.group = params, D, group
        total = sum(q.numel() for q in params)
        self.size = -(-total // D) if total else 0
        self.lo, self.hi = min(replica * self.size, total), min((replica + 1) * self.size, total)
        flat = self._flat([q.detach() for q in params])
        # fp32 like every master copy (in fp32 training the shard's own copy)
        self.master = torch.nn.Parameter(flat[self.lo:self.hi].to(torch.float32, copy=True))
        self.optimizer = make_optimizer([self.master], scenario)
        self.masters = [self.master]

    def _flat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.zeros(0)
        return torch.nn.functional.pad(flat, (0, self.size * self.D - flat.numel()))

    def step(self) -> None:
        """This replica's shard: its optimizer step (compute: under the device lock)."""
        grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in self.params]
        self.master.grad = self._flat(grads)[self.lo:self.hi].to(torch.float32, copy=True)
        self.optimizer.step()

    def gather(self) -> None:
        """Every replica's updated shard into the parameters (a collective: outside the device lock,
        which a replica sharing this device may need to reach it)."""
        mine = torch.zeros(self.size, dtype=self.params[0].dtype, device=self.master.device)
        mine[:self.hi - self.lo] = self.master.detach()
        parts = [torch.empty_like(mine) for _ in range(self.D)]
        dist.all_gather(parts, mine, group=self.group)
        flat = torch.cat(parts)
        at = 0
        with torch.no_grad():
            for q in self.params:
                q.copy_(flat[at:at + q.numel()].view_as(q))
                at += q.numel()
