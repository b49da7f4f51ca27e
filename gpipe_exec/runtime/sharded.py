"""ZeRO-2 and ZeRO-3/HSDP in gpipe-exec: a chunk's layers wrapped with PyTorch FSDP2 `fully_shard` over the D x C devices holding them.

Without pipelining (K = 1) ZeRO-3 runs as FSDP2 does on its own: it reshards after every forward
and backward and reduce-scatters every micro-batch's gradients. ZeRO-2 keeps the gathered
parameters from the step's first forward to the chunk's last backward of the step, as DeepSpeed's
stage 2 keeps the whole weights, all-gathered once after the optimizer step (`BackwardSharding`:
FSDP2's `reshard_after_forward` False and `set_reshard_after_backward(False)` until the last
backward), and reduce-scatters every micro-batch's gradients into the replica's shard (only the
shard of the gradient is kept), at any K.
With pipelining (K > 1) the chunks are sharded as torchtitan composes FSDP2 with
torch.distributed.pipelining (`BackwardSharding`): the gathered parameters are kept from the
step's first forward to the chunk's last backward of the step (torchtitan's `apply_fsdp`:
`reshard_after_forward` False under pipelining; the pipeline stage's backward
`set_reshard_after_backward(False)` until its last); ZeRO-3's gradients accumulate unsharded and
are reduce-scattered in the chunk's last backward, each layer's as its backward ends
(`set_requires_gradient_sync` on that backward only, as FSDP2's gradient accumulation and the
pipeline stage's deferred reduction do).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
from torch.distributed.tensor import DTensor

from gpipe_exec.runtime.comm import reduce_scatter_in_place
from gpipe_sim.plan.sharding import shard_degree
from gpipe_sim.schedule import Action, Kind
from gpipe_sim.scenario.scenario import Scenario


def shard_mesh(device_type: str, D: int, S: int, C: int = 1, K: int = 1) -> DeviceMesh:
    """The D replicas of this process's pipeline rank as FSDP2's mesh: one dimension of D x C
    (FSDP), or (D / S, S x C) replicate x shard (HSDP: shards within groups of S consecutive
    replicas, replicated across the groups), as `gpipe_sim.plan.compile.shard_members` counts them.
    Every process of the world makes it (a collective): at K = 1 process d*C + c, at K > 1 (C = 1,
    T = 1) process d*K + r is replica d of pipeline rank r, so the (.., K) grid's leading
    dimensions, sliced, are rank r's replicas."""
    names, shape = (("shard",), (D * C,)) if S == D else (("replicate", "shard"), (D // S, S * C))
    if K == 1:
        return init_device_mesh(device_type, shape, mesh_dim_names=names)
    return init_device_mesh(device_type, (*shape, K), mesh_dim_names=(*names, "pp"))[names]


class InPlaceReduceScatter(ReduceScatter):
    """FSDP2's reduce-scatter reading its input buffer where it lies (`reduce_scatter_in_place`):
    over gloo FSDP2's default (`reduce_scatter_single`, gloo's flat form) would first copy the whole
    unit's gradient, a buffer FSDP2 on NCCL does not hold."""

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, op: Any,
                 async_op: bool = False) -> Any:
        return reduce_scatter_in_place(output_tensor, input_tensor, group, op=op, async_op=async_op)


def _fully_shard(unit: nn.Module, mesh: DeviceMesh, reshard: bool, ignored: set[nn.Parameter]) -> None:
    """`fully_shard` one unit, its gradients reduce-scattered as plain sums (`shard_chunk`), in
    place (`InPlaceReduceScatter`)."""
    fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, ignored_params=ignored or None)
    unit.set_gradient_divide_factor(1.0)  # each unit reduces its own parameters
    unit.set_force_sum_reduction_for_comms(True)  # a plain sum (gloo has no pre-multiplied sum)
    unit.set_custom_reduce_scatter(InPlaceReduceScatter())


def shard_chunk(module: nn.Sequential, mesh: DeviceMesh, zero: int, pipelined: bool = False,
                experts: DeviceMesh | bool = False) -> None:
    """Wrap each layer holding parameters, then the chunk, with `fully_shard` (torchtitan's units:
    one a block, the rest with the root). ZeRO-3 without pipelining reshards after forward (each
    layer gathered again for its backward); ZeRO-2, and ZeRO-3 under pipelining, keep the gathered
    parameters from forward to backward. Gradients are reduce-scattered summed, not averaged: each
    replica's loss divides by the global batch already, as the executor's all-reduce sums.
    With expert parallelism (`experts`: the expert-data-parallel mesh, or True where that group is
    this process alone) each routed expert is its own unit on that mesh first, as torchtitan shards
    a MoE block's experts over dp_shard_mod_ep; alone, they are left whole and unreduced."""
    reshard = zero == 3 and not pipelined
    ignored: set[nn.Parameter] = set()
    routed = [expert for layer in module if getattr(layer, "moe", None) is not None
              for expert in layer.moe.local_experts] if experts is not False else []
    for expert in routed:
        if isinstance(experts, DeviceMesh):
            _fully_shard(expert, experts, reshard, set())
        else:
            ignored.update(expert.parameters())
    units = [layer for layer in module if any(True for _ in layer.parameters())] + [module]
    for unit in units:
        _fully_shard(unit, mesh, reshard, ignored.intersection(unit.parameters()))


class BackwardSharding:
    """What a rank tells FSDP2 before each backward pass of its sharded chunks under pipelining or
    ZeRO-2 (module docstring): on a chunk's last backward of the step, reduce the accumulated
    gradients and reshard afterwards; on the others, keep the gathered parameters and (ZeRO-3) the
    unsharded gradients. `modules`: the rank's chunks by index, sharded; `actions`: its program."""

    def __init__(self, modules: dict[int, nn.Module], zero: int, actions: Sequence[Action]) -> None:
        self.modules, self.zero = modules, zero
        self.last = {a.chunk: i for i, a in enumerate(actions) if a.kind == Kind.BACKWARD}

    @classmethod
    def of(cls, modules: dict[int, nn.Module], scenario: Scenario, actions: Sequence[Action]
           ) -> BackwardSharding | None:
        """The control where these chunks are sharded (`shard_chunks`) under pipelining or ZeRO-2, else None."""
        steered = scenario.pipeline.stages > 1 or scenario.training.zero == 2
        if not steered or not all(isinstance(m, FSDPModule) for m in modules.values()):
            return None
        return cls(modules, scenario.training.zero, actions)

    def before_backward(self, index: int, chunk: int) -> None:
        """Set chunk `chunk`'s FSDP2 state for the backward pass at action `index` of the program."""
        module = self.modules[chunk]
        assert isinstance(module, FSDPModule)
        last = self.last[chunk] == index
        module.set_is_last_backward(last or self.zero == 2)  # its end waits for and frees the reductions
        module.set_reshard_after_backward(last)
        module.set_requires_gradient_sync(last or self.zero == 2)


def shard_chunks(modules: Sequence[nn.Sequential], scenario: Scenario, device_type: str,
                 grid: DeviceMesh | None = None, expert_group: Any = None) -> bool:
    """Shard these chunks (`shard_chunk`) where the scenario asks for ZeRO-2 or 3 over D x C > 1
    devices (the shard group: `gpipe_sim.plan.sharding.shard_degree` replicas x C); whether it did.
    With tensor parallelism the chunks are split already (their parameters DTensors on `grid`'s
    "tp" dimension: `runtime.tensor_parallel.device_mesh`) and are sharded on the same grid's "dp"
    dimension (with context parallelism its "dp" and "cp" flattened), torchtitan's 2-D composition
    (FSDP2 then holds each parameter as a (dp, tp) DTensor). With expert parallelism the routed
    experts are sharded over `expert_group` (the D x C / E processes holding the same experts; None
    where that is this process alone). Under pipelining (K > 1) or ZeRO-2 `BackwardSharding` then steers their backward passes."""
    p, zero = scenario.pipeline, scenario.training.zero
    D, C, K = p.data_parallel, p.context_parallel, p.stages
    if D * C == 1 or zero < 2:
        return False
    S = shard_degree(scenario)
    if grid is None:
        mesh = shard_mesh(device_type, D, S, C, K)
    elif C > 1:  # torchtitan's dp_shard_cp: the data- and context-parallel dimensions flattened into one
        mesh = grid["dp", "cp"]._flatten("dp_cp")
    else:  # HSDP: the dp dimension unflattened into (replicate, shard), torchtitan's dp_replicate x dp_shard
        mesh = grid["dp"] if S == D else grid["dp"]._unflatten(0, (D // S, S), ("replicate", "shard"))
    experts: DeviceMesh | bool = p.expert_parallel > 1
    if experts and expert_group is not None:
        experts = DeviceMesh.from_group(expert_group, device_type)
    for module in modules:
        shard_chunk(module, mesh, zero, pipelined=K > 1, experts=experts)
    return True


def whole(named: dict[str, nn.Parameter]) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """Every parameter and its gradient whole on the CPU: a DTensor's gathered (a collective every
    replica calls, in the same order), any other copied."""
    out: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
    for key, p in named.items():
        param, grad = (t.full_tensor() if isinstance(t, DTensor) else t for t in (p.detach(), p.grad))
        out[key] = (param.cpu().clone(), None if grad is None else grad.cpu().clone())
    return out


__all__ = ["BackwardSharding", "shard_chunk", "shard_chunks", "shard_mesh", "whole"]
