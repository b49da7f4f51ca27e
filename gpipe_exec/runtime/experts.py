"""Expert parallelism's process groups: E replicas of a pipeline rank share their experts, as
Megatron-LM carves the expert-model-parallel group from the data-parallel one (tp-cp-ep-dp-pp).

Processes are numbered by `gpipe_sim.mesh.Mesh`: replica d of pipeline rank r at context rank c and
tensor rank t is process ((d*K + r)*C + c)*T + t. Its expert group is the E consecutive replicas
(d // E) * E ... + E - 1 at the same c and t (`Mesh.expert_members`; each tensor rank's experts are
its T-th of every expert's width, Megatron-LM's expert tensor parallelism of T); its experts'
gradients are summed over the D x C / E processes holding the same experts (the replicas with the
same d mod E, every c, the same t: `Mesh.expert_gradient_group`), the rest over all D x C."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from gpipe_exec.moe import ExpertGroup
from gpipe_sim.mesh import Mesh

EXPERT_PARAMETER = ".moe.local_experts."  # in the name of every routed expert's parameter
_GROUPS: tuple[Any, tuple[int, ...], dict[tuple[Any, ...], Any]] | None = None


def _all_groups(mesh: Mesh) -> dict[tuple[Any, ...], Any]:
    """Every expert group ("ep", r, d // E, c, t) and expert data-parallel group ("edp", r, d % E, t),
    made once per (default group, K, D, C, T, E); collective: every process makes all, in the same order."""
    global _GROUPS
    default = dist.distributed_c10d._get_default_group()
    K, D, C, T, E = mesh.stages, mesh.data_parallel, mesh.context_parallel, mesh.tensor_parallel, mesh.expert_parallel
    if _GROUPS is None or _GROUPS[0] is not default or _GROUPS[1] != (K, D, C, T, E):
        groups: dict[tuple[Any, ...], Any] = {}
        process = lambda d, r, c, t: mesh.process(mesh.program_rank(d, r), c, t)  # noqa: E731
        for r in range(K):
            for t in range(T):
                for j in range(D // E):
                    for c in range(C):
                        groups["ep", r, j, c, t] = dist.new_group([process(j * E + e, r, c, t) for e in range(E)])
                for e in range(E):
                    groups["edp", r, e, t] = dist.new_group(sorted(process(j * E + e, r, c, t)
                                                                   for j in range(D // E) for c in range(C)))
        _GROUPS = (default, (K, D, C, T, E), groups)
    return _GROUPS[2]


def expert_groups(mesh: Mesh, process: int) -> tuple[ExpertGroup | None, Any]:
    """(the expert group of `process`, the group its experts' gradients are summed over: None where
    D x C / E is 1); (None, None) for E = 1, where the gradient group reduces every gradient."""
    if mesh.expert_parallel == 1:
        return None, None
    E = mesh.expert_parallel
    g, c, t = mesh.coordinates(process)
    replica, pipeline_rank = mesh.replica(g), mesh.pipeline_rank(g)
    groups = _all_groups(mesh)
    ep = ExpertGroup(E, replica % E, groups["ep", pipeline_rank, replica // E, c, t])
    return ep, (groups["edp", pipeline_rank, replica % E, t] if mesh.expert_gradient_group > 1 else None)


def expert_mask(module: torch.nn.Module) -> list[bool]:
    """Per parameter of `module`, in `parameters()` order, whether it is a routed expert's."""
    return [EXPERT_PARAMETER in f".{name}" for name, _ in module.named_parameters()]


__all__ = ["expert_groups", "expert_mask", "flat", "global_names", "reduction_buckets", "unflat"]


def reduction_buckets(module: torch.nn.Module, split: bool, dp_group: Any, expert_dp_group: Any
                      ) -> list[tuple[list[bool], Any]]:
    """The gradient buckets of `module`'s reduction: (per parameter, whether it is in the bucket;
    the group summing it). With `split` (E > 1) the routed experts' over `expert_dp_group` (no
    bucket where that is None: a group of one sums nothing), then the rest over `dp_group`;
    otherwise every gradient over `dp_group`."""
    experts = expert_mask(module)
    if not split:
        return [([True] * len(experts), dp_group)]
    own = [(experts, expert_dp_group)] if expert_dp_group is not None else []
    return own + [([not e for e in experts], dp_group)]


def flat(grads: list[torch.Tensor], mask: list[bool], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The gradients `mask` selects, flattened into one new bucket (empty where it selects none)."""
    mine = [g.reshape(-1) for g, m in zip(grads, mask) if m]
    return torch.cat(mine) if mine else torch.zeros(0, dtype=dtype, device=device)


def unflat(bucket: torch.Tensor, grads: list[torch.Tensor], mask: list[bool]) -> None:
    """Copy `bucket` (as `flat` made it) back into the gradients `mask` selects."""
    mine = [g for g, m in zip(grads, mask) if m]
    for g, part in zip(mine, bucket.split([g.numel() for g in mine])):
        g.copy_(part.view_as(g))


def global_names(named: dict[str, Any], group: ExpertGroup | None, experts: int) -> dict[str, Any]:
    """`named` (parameter name -> value) with each local expert's index made its index in the
    whole model (member rank holds experts rank x experts / E onwards)."""
    if group is None:
        return named
    out: dict[str, Any] = {}
    for name, value in named.items():
        head, sep, tail = name.partition(EXPERT_PARAMETER[1:])
        if sep:
            index, rest = tail.split(".", 1)
            name = f"{head}{sep}{group.rank * experts // group.size + int(index)}.{rest}"
        out[name] = value
    return out
