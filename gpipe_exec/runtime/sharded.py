"""ZeRO-2 and ZeRO-3/HSDP in gpipe-exec: a chunk's layers wrapped with PyTorch FSDP2 `fully_shard` over the D x C devices holding them."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from gpipe_sim.plan.sharding import shard_degree
from gpipe_sim.scenario.scenario import Scenario


def shard_mesh(device_type: str, D: int, S: int, C: int = 1) -> DeviceMesh:
    """The D replicas' C context-parallel devices each (process d*C + c: one stage, T = 1) as
    FSDP2's mesh: one dimension of D x C (FSDP), or (D / S, S x C) replicate x shard (HSDP: shards
    within groups of S consecutive replicas, replicated across the groups), as
    `gpipe_sim.plan.compile.shard_members` counts them."""
    if S == D:
        return init_device_mesh(device_type, (D * C,), mesh_dim_names=("shard",))
    return init_device_mesh(device_type, (D // S, S * C), mesh_dim_names=("replicate", "shard"))


def shard_chunk(module: nn.Sequential, mesh: DeviceMesh, zero: int) -> None:
    """Wrap each layer holding parameters, then the chunk, with `fully_shard` (torchtitan's units:
    one a block, the rest with the root). ZeRO-3 reshards after forward (each layer gathered again
    for its backward); ZeRO-2 keeps the gathered parameters from forward to backward. Gradients are
    reduce-scattered summed, not averaged: each replica's loss divides by the global batch already,
    as the executor's all-reduce sums."""
    reshard = zero == 3
    units = [layer for layer in module if any(True for _ in layer.parameters())] + [module]
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard)
        unit.set_gradient_divide_factor(1.0)  # each unit reduces its own parameters
        unit.set_force_sum_reduction_for_comms(True)  # a plain sum (gloo has no pre-multiplied sum)


def shard_chunks(modules: list[nn.Sequential], scenario: Scenario, device_type: str) -> bool:
    """Shard these chunks (`shard_chunk`) where the scenario asks for ZeRO-2 or 3 over D x C > 1
    devices (the shard group: `gpipe_sim.plan.sharding.shard_degree` replicas x C); whether it did."""
    D, C, zero = scenario.pipeline.data_parallel, scenario.pipeline.context_parallel, scenario.training.zero
    if D * C == 1 or zero < 2:
        return False
    mesh = shard_mesh(device_type, D, shard_degree(scenario), C)
    for module in modules:
        shard_chunk(module, mesh, zero)
    return True


def whole(named: dict[str, nn.Parameter]) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """Every parameter and its gradient whole on the CPU: a DTensor's gathered (a collective every
    replica calls, in the same order), any other copied."""
    out: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
    for key, p in named.items():
        param, grad = (t.full_tensor() if isinstance(t, DTensor) else t for t in (p.detach(), p.grad))
        out[key] = (param.cpu().clone(), None if grad is None else grad.cpu().clone())
    return out


__all__ = ["shard_chunk", "shard_chunks", "shard_mesh", "whole"]
