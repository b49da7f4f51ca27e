"""Plain single-process training of the same model on the whole mini-batch (the correctness baseline)."""

from __future__ import annotations

from typing import Any

import torch

from gpipe_exec.runtime.update import Update
from gpipe_exec.zoo import build_model, loss_sum, make_batch
from gpipe_sim.scenario.scenario import Scenario


def reference_step(scenario: Scenario, *, seed: int = 0, dropout: float | None = 0.0,
                   steps: int = 1) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """Parameters and gradients after `steps` plain steps, keyed like `RankRunner.params`."""
    # the vocabulary padded as the scenario's T devices split it (T = 1: as always)
    model = build_model(scenario.model, seed=seed, dropout=dropout, dtype=scenario.training.dtype,
                        tensor_parallel=scenario.pipeline.tensor_parallel)
    update = Update(list(model.parameters()), scenario)
    x, y = make_batch(scenario.model, scenario.pipeline.batch_size, seed=seed,
                      dtype=scenario.training.dtype)
    for _ in range(steps):
        update.zero_grad(set_to_none=True)
        loss_sum(model(x), y, scenario.pipeline.batch_size).backward()
        update.step()
    out: dict[str, Any] = {}
    for name, p in model.named_parameters():
        out[name] = (p.detach().clone(), None if p.grad is None else p.grad.detach().clone())
    return out
