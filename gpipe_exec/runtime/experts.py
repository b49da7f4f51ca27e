"""Expert parallelism's process groups: E replicas of a pipeline rank share their experts, as
Megatron-LM carves the expert-model-parallel group from the data-parallel one (tp-cp-ep-dp-pp).

Replica d of pipeline rank r is global rank d*K + r (T = 1). Its expert group is the E consecutive
replicas (d // E) * E ... + E - 1; its experts' gradients are summed over the D / E replicas
holding the same experts (those with the same d mod E), the rest over all D."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from gpipe_exec.moe import ExpertGroup

EXPERT_PARAMETER = ".moe.local_experts."  # in the name of every routed expert's parameter
_GROUPS: tuple[Any, int, int, int, dict[tuple[str, int, int], Any]] | None = None


def _all_groups(K: int, D: int, E: int) -> dict[tuple[str, int, int], Any]:
    """Every pipeline rank's expert groups ("ep", r, d // E) and expert data-parallel groups
    ("edp", r, d % E), made once per (default group, K, D, E); collective: every process makes all,
    in the same order."""
    global _GROUPS
    default = dist.distributed_c10d._get_default_group()
    if _GROUPS is None or _GROUPS[0] is not default or _GROUPS[1:4] != (K, D, E):
        groups: dict[tuple[str, int, int], Any] = {}
        for r in range(K):
            for j in range(D // E):
                groups["ep", r, j] = dist.new_group([(j * E + e) * K + r for e in range(E)])
            for e in range(E):
                groups["edp", r, e] = dist.new_group([(j * E + e) * K + r for j in range(D // E)])
        _GROUPS = (default, K, D, E, groups)
    return _GROUPS[4]


def expert_groups(K: int, D: int, E: int, program_rank: int) -> tuple[ExpertGroup | None, Any]:
    """(the expert group of program rank d*K + r, the group its experts' gradients are summed over:
    None where D / E is 1); (None, None) for E = 1, where the data-parallel group reduces every gradient."""
    if E == 1:
        return None, None
    replica, pipeline_rank = divmod(program_rank, K)
    groups = _all_groups(K, D, E)
    ep = ExpertGroup(E, replica % E, groups["ep", pipeline_rank, replica // E])
    return ep, (groups["edp", pipeline_rank, replica % E] if D > E else None)


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
