"""The mixture-of-experts MLP a MoE block runs in place of its dense MLP, with expert parallelism.

As Megatron-LM's MoE layer (megatron/core/transformer/moe/): a linear router (d x experts, no
bias) scores each token in fp32 and keeps its `top_k` experts, their weights the softmax over the
kept scores (Megatron's default, Mixtral's); the (token, expert) rows are sorted by expert, sent
to the device holding that expert with `all_to_all_single` over the expert group (E devices, each
holding `experts / E` consecutive experts), run through the expert MLPs, sent back by a second
all-to-all and summed into their tokens by their router weights; the shared experts (one MLP of
shared x expert_d_ff) run on every token beside them. With `capacity_factor` an expert keeps at
most ceil(tokens x top_k x capacity_factor / experts) rows of a device's tokens, the first in
token order (Megatron's "position" drop policy); rows are not padded to the capacity. With tensor
parallelism (T > 1, sequence parallel: runtime.tensor_parallel.split_moe) each device routes its
1/T of the tokens and runs its T-th of every local expert's width on the rows of all T
(gpipe_exec.expert_tensor), the shared experts split as the dense MLP is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from gpipe_exec.expert_tensor import GatherRows, SumRows, TensorGroup, local_weight, member_counts
from gpipe_sim.model.model import TransformerModel


class _AllToAll(torch.autograd.Function):
    """`all_to_all_single` of rows over `group`, sending `send[j]` rows to member j and receiving
    `recv[j]` from it; its backward is the reverse exchange of the gradients."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = rows.new_empty(sum(recv), *rows.shape[1:])
        dist.all_to_all_single(out, rows.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        out = grad.new_empty(sum(ctx.send), *grad.shape[1:])
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return out, None, None, None


@dataclass(frozen=True)
class ExpertGroup:
    """This process's place in its expert-parallel group: `size` E members, it the `rank`-th, over
    the process group `group` (Megatron-LM's expert-model-parallel group)."""

    size: int
    rank: int
    group: Any


class ExpertMlp(nn.Module):
    """One MLP of intermediate width `f`: fc1, GeLU, fc2, or silu(fc1) x up, then fc2 (the dense
    block's own layout, so the simulator's per-expert parameter count holds)."""

    def __init__(self, model: TransformerModel, f: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(model.d_model, f, bias=model.bias)
        self.up = nn.Linear(model.d_model, f, bias=model.bias) if model.mlp == "swiglu" else None
        self.fc2 = nn.Linear(f, model.d_model, bias=model.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x)) if self.up is None else F.silu(self.fc1(x)) * self.up(x)
        return self.fc2(h)

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """fc2's output without its bias from this device's share of the width (split over T:
        `local_weight`), to be summed over the T devices."""
        w = local_weight
        h = F.linear(x, w(self.fc1.weight), w(self.fc1.bias))
        h = F.gelu(h) if self.up is None else F.silu(h) * F.linear(x, w(self.up.weight), w(self.up.bias))
        return F.linear(h, w(self.fc2.weight))


class MoeMlp(nn.Module):
    """The router, this device's `experts / ep_size` routed experts and the shared experts.

    Contract: routed expert e is initialised from `seed + e` whatever E is (a member holds experts
    rank x experts / E onwards), so every E builds the
    same model; the router and shared experts draw from the caller's generator state. `group` is
    the expert-parallel process group (None: one device holds every expert); each member must call
    forward on the same number of MoE blocks in the same order (the all-to-alls are collective)."""

    def __init__(self, model: TransformerModel, *, seed: int, group: ExpertGroup | None = None) -> None:
        super().__init__()
        self.experts, self.top_k, self.capacity_factor = model.experts, model.top_k, model.capacity_factor
        ep_size, ep_rank = (1, 0) if group is None else (group.size, group.rank)
        self.ep_size, self.group = ep_size, None if group is None or group.size == 1 else group.group
        self.local = model.experts // ep_size
        self.router = nn.Linear(model.d_model, model.experts, bias=False)
        f = model.expert_d_ff or model.d_ff
        self.shared = ExpertMlp(model, f * model.shared_experts) if model.shared_experts else None
        local = []
        for e in range(ep_rank * self.local, (ep_rank + 1) * self.local):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed + e)
                local.append(ExpertMlp(model, f))
        self.local_experts = nn.ModuleList(local)
        self.tensor: TensorGroup | None = None  # the T devices splitting each expert (set by split_moe)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's MLP output for `x` (batch, tokens, d); split over T, `x` is the DTensor of
        this device's 1/T of the tokens and the output this device's share, a plain tensor."""
        if x.is_meta:  # shapes only (runtime.interpreter.boundary_shapes): routing needs values
            return torch.empty_like(x)
        local = x.to_local() if isinstance(x, DTensor) else x
        tokens = local.reshape(-1, local.shape[-1])
        scores, chosen = F.linear(tokens, local_weight(self.router.weight)).float().topk(self.top_k, dim=-1)
        weights = scores.softmax(dim=-1).to(local.dtype)
        rows, token_of, weight = self._kept_rows(chosen, weights)
        order = torch.argsort(rows, stable=True)
        counts = torch.bincount(rows, minlength=self.experts)
        out = self._run_experts(tokens[token_of[order]], counts)
        combined = torch.zeros_like(tokens).index_add(0, token_of[order], out * weight[order, None])
        if self.shared is not None:  # split over T, it takes the DTensor and gives this device's tokens
            combined = combined + (self.shared(x).reshape(tokens.shape) if local is not x else self.shared(tokens))
        return combined.reshape(local.shape)

    def _kept_rows(self, chosen: torch.Tensor, weights: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(expert, token, router weight) of every routed row kept, in token order; with a capacity
        factor the rows past an expert's capacity are dropped."""
        n = chosen.shape[0]
        expert = chosen.reshape(-1)
        token = torch.arange(n, device=chosen.device).repeat_interleave(self.top_k)
        weight = weights.reshape(-1)
        if self.capacity_factor is not None:
            capacity = math.ceil(n * self.top_k * self.capacity_factor / self.experts)
            one_hot = F.one_hot(expert, self.experts)
            position = (one_hot.cumsum(0) * one_hot).sum(-1) - 1
            keep = position < capacity
            expert, token, weight = expert[keep], token[keep], weight[keep]
        return expert, token, weight

    def _run_experts(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The expert outputs of `rows` (sorted by expert, `counts` of each), in the same order:
        dispatched to the experts' devices, run, and returned."""
        if self.group is None and self.tensor is None:
            return torch.cat([mlp(part) for mlp, part in zip(self.local_experts, rows.split(counts.tolist()))]
                             + [rows[:0]])
        if self.group is None:
            return self._local_experts(rows, counts.view(1, self.local))
        received_counts = torch.empty_like(counts)
        dist.all_to_all_single(received_counts, counts, group=self.group)  # [source][local expert]
        send = counts.view(self.ep_size, self.local).sum(1).tolist()
        by_source = received_counts.view(self.ep_size, self.local)
        recv = by_source.sum(1).tolist()
        received = _AllToAll.apply(rows, send, recv, self.group)
        return _AllToAll.apply(self._local_experts(received, by_source), recv, send, self.group)

    def _local_experts(self, received: torch.Tensor, by_source: torch.Tensor) -> torch.Tensor:
        """This device's experts run on `received` (per source, its rows for each local expert:
        `by_source[source][expert]` of them), their outputs in the same order. Split over T, the
        rows of all T devices are gathered, each expert's share of the width run on them, and the
        partial outputs summed back over the T devices (gpipe_exec.expert_tensor), fc2's bias added
        once, after the sum."""
        sizes = by_source.reshape(-1)
        gathered, members, per_member = received, 1, [received.shape[0]]
        if self.tensor is not None:
            every = member_counts(sizes, self.tensor)  # [member][source x local expert]
            members, per_member = self.tensor.size, every.sum(1).tolist()
            gathered, sizes = GatherRows.apply(received, per_member, self.tensor), every.reshape(-1)
        pieces = gathered.split(sizes.tolist())
        outs, sources = list(pieces), by_source.shape[0]
        for e, mlp in enumerate(self.local_experts):
            idx = [(m * sources + s) * self.local + e for m in range(members) for s in range(sources)]
            x = torch.cat([pieces[i] for i in idx])
            y = mlp(x) if self.tensor is None else mlp.partial(x)
            for i, part in zip(idx, y.split([pieces[i].shape[0] for i in idx])):
                outs[i] = part
        out = torch.cat(outs + [gathered[:0]])
        if self.tensor is None:
            return out
        out = SumRows.apply(out, per_member, self.tensor)
        if self.local_experts[0].fc2.bias is None:
            return out
        bias = torch.stack([local_weight(mlp.fc2.bias) for mlp in self.local_experts])  # type: ignore[misc]
        expert_of_row = torch.arange(self.local, device=out.device).repeat(sources)
        return out + bias[expert_of_row.repeat_interleave(by_source.reshape(-1))]


__all__ = ["ExpertGroup", "ExpertMlp", "MoeMlp"]
