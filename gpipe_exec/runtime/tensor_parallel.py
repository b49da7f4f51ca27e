"""Tensor parallelism on a rank: the (dp, pp, tp) mesh, Megatron's split of the layers, the vocabulary-parallel loss."""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, ParallelStyle, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

from gpipe_exec.expert_tensor import TensorGroup
from gpipe_exec.measure.saved_hooks import nested_saved_tensors_hooks
from gpipe_exec.moe import MoeMlp
from gpipe_exec.zoo import Block, Embedding, Head
from gpipe_sim.errors import ScenarioError
from gpipe_sim.mesh import Mesh


_MESH: tuple[Any, tuple[int, ...], DeviceMesh] | None = None  # (default group, shape, mesh)


def device_mesh(device_type: str, mesh: Mesh) -> DeviceMesh:
    """The processes as a torch DeviceMesh of `mesh.process_grid`: (dp, pp, tp), or with context
    parallelism (dp, pp, cp, tp) (process ((d*K + k)*C + c)*T + t, as `Mesh.process` numbers
    them), made once per default group and shape (collective: every process makes it, in the
    same order)."""
    global _MESH
    default = dist.distributed_c10d._get_default_group()
    names = tuple(name for name, _ in mesh.process_grid)
    shape = tuple(size for _, size in mesh.process_grid)
    if _MESH is None or _MESH[0] is not default or _MESH[1] != shape:
        _MESH = (default, shape, init_device_mesh(device_type, shape, mesh_dim_names=names))
    return _MESH[2]


def device_major_rows(heads: int, kv_heads: int, head_dim: int, T: int) -> torch.Tensor:
    """The QKV rows reordered from the model's (queries of every head | keys | values of every
    key/value head) to T contiguous shares, each (its heads' queries | its key/value heads' keys |
    their values), so that a contiguous split gives each device whole heads with the keys and
    values of their groups (Megatron-LM's query-group layout); its argsort restores the model's
    order. T must divide kv_heads (`gpipe_sim.model.block_shape.kv_heads_per_device`)."""
    q = torch.arange(heads * head_dim).view(T, -1)
    k = heads * head_dim + torch.arange(kv_heads * head_dim).view(T, -1)
    v = k + kv_heads * head_dim
    return torch.cat((q, k, v), dim=1).reshape(-1)


def _keep_input_sharded(module: nn.Module, mesh: DeviceMesh) -> None:
    """For a column-parallel GEMM under sequence parallelism, what torch's `input_reshard` does
    for a checkpointed module: the all-gathered input that autograd saves for the weight's
    gradient is kept as this device's 1/T (a copy), and all-gathered again when a backward pass
    reads it -- Megatron-LM's way, and what gpipe_sim counts (the LayerNorm's output sharded:
    Korthikanti et al.'s 34sbh/t). Only the replicated DTensors the GEMM saves are resharded (not
    its weight); the hooks nest (measure.saved_hooks), so the saved-bytes meter counts the shard."""
    entered: list[Any] = []

    def enter(_module: nn.Module, _args: Any) -> None:
        mine: dict[int, weakref.ref[torch.Tensor]] = {}  # the shards this call packed, by id

        def pack(t: torch.Tensor) -> torch.Tensor:
            if isinstance(t, DTensor) and all(p.is_replicate() for p in t.placements):
                with torch.no_grad():
                    t = t.redistribute(mesh, [Shard(0)])
                mine[id(t)] = weakref.ref(t)
            return t

        def unpack(t: torch.Tensor) -> torch.Tensor:
            ref = mine.get(id(t))
            return t.redistribute(mesh, [Replicate()]) if ref is not None and ref() is t else t

        hooks = nested_saved_tensors_hooks(pack, unpack)
        hooks.__enter__()
        entered.append(hooks)

    def leave(_module: nn.Module, _args: Any, _output: Any) -> None:
        entered.pop().__exit__(None, None, None)

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(leave)


def _block_plan(sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """Megatron's split of a block: QKV and fc1 column-parallel, the projection and fc2 row-parallel.
    Without sequence parallelism the block's input and output are whole on every device (each
    row-parallel output all-reduced in the forward, each column-parallel input's gradient in the
    backward); with it they hold the device's 1/T of the sequence (torch's tutorial / torchtitan
    plan): both LayerNorms run on the shard, each column-parallel GEMM all-gathers its input (its
    gradient reduce-scattered in the backward), each row-parallel one reduce-scatters its output
    (its gradient all-gathered)."""
    if not sequence_parallel:
        return {"qkv": ColwiseParallel(), "proj": RowwiseParallel(),
                "fc1": ColwiseParallel(), "up": ColwiseParallel(), "fc2": RowwiseParallel()}
    return {"ln1": SequenceParallel(), "qkv": ColwiseParallel(input_layouts=Shard(1)),
            "proj": RowwiseParallel(output_layouts=Shard(1)),
            "ln2": SequenceParallel(), "fc1": ColwiseParallel(input_layouts=Shard(1)),
            "up": ColwiseParallel(input_layouts=Shard(1)), "fc2": RowwiseParallel(output_layouts=Shard(1))}


def _split_block(block: Block, mesh: DeviceMesh, T: int, sequence_parallel: bool) -> None:
    """A block split as `_block_plan` says (SwiGLU's up matrix as fc1), heads / T and key/value
    heads / T per device (QKV rows reordered so each device's share holds whole heads with their
    groups' keys and values: `device_major_rows`)."""
    if block.kv_heads % T:
        raise ScenarioError(f"model.kv_heads: the executor splits key/value heads over tensor_parallel {T} "
                            f"but does not replicate {block.kv_heads} of them (the simulator does)")
    head_dim = block.qkv.out_features // (block.heads + 2 * block.kv_heads)
    rows = device_major_rows(block.heads, block.kv_heads, head_dim, T)
    with torch.no_grad():
        block.qkv.weight.copy_(block.qkv.weight[rows])
        if block.qkv.bias is not None:
            block.qkv.bias.copy_(block.qkv.bias[rows])
    plan = _block_plan(sequence_parallel)
    mlp = block if block.moe is None else None  # a MoE block's experts split apart (split_moe)
    for name in ("fc1", "up", "fc2"):
        if mlp is None or getattr(mlp, name) is None:
            del plan[name]
    parallelize_module(block, mesh, plan)
    if sequence_parallel:
        _keep_input_sharded(block.qkv, mesh)
    if mlp is not None:
        _split_mlp_inputs(mlp, mesh, sequence_parallel)
    else:
        split_moe(block.moe, mesh, sequence_parallel)
    block.heads //= T
    block.kv_heads //= T


def _split_mlp_inputs(mlp: nn.Module, mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Under sequence parallelism, an MLP's column-parallel GEMMs keep their inputs sharded (`_keep_input_sharded`)."""
    if sequence_parallel:
        for name in ("fc1", "up"):
            if getattr(mlp, name) is not None:
                _keep_input_sharded(getattr(mlp, name), mesh)


def split_moe(moe: MoeMlp, mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """A MoE block's MLP split over the mesh's T devices as Megatron-LM splits it by default (expert
    tensor parallelism of T, under sequence parallelism): each routed expert's fc1 and up by rows,
    fc2 by columns (the shard of each built-whole expert: every T builds the same model), its fc2
    bias and the router replicated (their gradients each device's partial sum, summed over T where
    read), the rows of all T devices run through them (gpipe_exec.expert_tensor); the shared
    experts as the dense MLP (`_block_plan`). ScenarioError without sequence parallelism, which
    Megatron-LM refuses for MoE with tensor parallelism in training."""
    if not sequence_parallel:
        raise ScenarioError("pipeline.sequence_parallel: gpipe-exec runs a mixture of experts at tensor_parallel "
                            f"{mesh.size()} with sequence parallelism only, as Megatron-LM trains it")
    replicated = lambda t: nn.Parameter(distribute_tensor(t.detach(), mesh, [Replicate()], src_data_rank=None))  # noqa: E731
    split = lambda t, dim: nn.Parameter(distribute_tensor(t.detach(), mesh, [Shard(dim)], src_data_rank=None))  # noqa: E731
    moe.router.weight = replicated(moe.router.weight)
    for expert in moe.local_experts:
        for name in ("fc1", "up"):
            linear = getattr(expert, name)
            if linear is not None:
                linear.weight = split(linear.weight, 0)
                if linear.bias is not None:
                    linear.bias = split(linear.bias, 0)
        expert.fc2.weight = split(expert.fc2.weight, 1)
        if expert.fc2.bias is not None:
            expert.fc2.bias = replicated(expert.fc2.bias)
    if moe.shared is not None:
        plan = {name: style for name, style in _block_plan(True).items()
                if name in ("fc1", "up", "fc2") and getattr(moe.shared, name) is not None}
        parallelize_module(moe.shared, mesh, plan)
        _split_mlp_inputs(moe.shared, mesh, True)
    moe.tensor = TensorGroup(mesh.size(), mesh.get_local_rank(), mesh.get_group())


def _split_embedding(layer: Embedding, mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """The token table split over the vocabulary (row-parallel): its output all-reduced, or with
    sequence parallelism reduce-scattered over the sequence, the position table then a replicated
    DTensor whose rows each device takes its shard of (their gradients all-gathered in the
    backward), the dropout run on the shard."""
    if not sequence_parallel:
        parallelize_module(layer, mesh, {"tokens": RowwiseParallel(input_layouts=Replicate())})
        return
    parallelize_module(layer, mesh, {
        "tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False),
        "drop": PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Shard(1), use_local_output=True)})
    if layer.positions is None:  # rotary positions: no table
        return
    # equal on every device (built from one seed): no broadcast
    table = distribute_tensor(layer.positions.detach(), mesh, [Replicate()], src_data_rank=None)
    layer.positions = nn.Parameter(table, requires_grad=layer.positions.requires_grad)


def split_layer(layer: nn.Module, mesh: DeviceMesh, sequence_parallel: bool = False) -> nn.Module:
    """The layer split over the mesh's T devices (in place): a block the Megatron way, the
    embedding's table over the vocabulary (row-parallel), the head's projection over the
    vocabulary (column-parallel: each device keeps its logits' share for `vocab_parallel_loss`).
    Whatever is not split (LayerNorms, biases of row-parallel GEMMs, the position table) stays
    whole on every device, with equal gradients. With `sequence_parallel` the activations between
    layers (and so a stage's input and output) are the device's 1/T of the sequence (dimension 1,
    contiguous shards in device order), the LayerNorms run on them, and the head all-gathers its
    LayerNorm's output; the seq_len must split T ways."""
    T = mesh.size()
    if isinstance(layer, Block):
        _split_block(layer, mesh, T, sequence_parallel)
    elif isinstance(layer, Embedding):
        _split_embedding(layer, mesh, sequence_parallel)
    elif isinstance(layer, Head):
        plan: dict[str, ParallelStyle] = {"out": ColwiseParallel()}
        if sequence_parallel:
            plan = {"ln": SequenceParallel(), "out": ColwiseParallel(input_layouts=Shard(1))}
        parallelize_module(layer, mesh, plan)
        if sequence_parallel:
            _keep_input_sharded(layer.out, mesh)
    else:
        raise TypeError(f"tensor parallelism splits transformer layers, not {type(layer).__name__}")
    return layer


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Megatron-LM's cross-entropy over logits split by the vocabulary: three all-reduces forward
    (the maximum, the sum of exponentials, the target's logit), none backward."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, first: int, group: Any) -> torch.Tensor:
        peak = logits.max(-1).values
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - peak[:, None]
        exp = shifted.exp()
        total = exp.sum(-1)
        dist.all_reduce(total, group=group)
        mine = (target >= first) & (target < first + logits.shape[-1])
        local = (target - first).clamp(0, logits.shape[-1] - 1)
        picked = shifted.gather(1, local[:, None])[:, 0] * mine
        dist.all_reduce(picked, group=group)
        ctx.save_for_backward(exp.div_(total[:, None]), mine, local)
        return total.log() - picked

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        softmax, mine, local = ctx.saved_tensors
        out = softmax.scatter_add(1, local[:, None], -mine.to(softmax.dtype)[:, None])
        return out.mul_(grad[:, None]), None, None, None


def vocab_parallel_loss(mesh: DeviceMesh) -> Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]:
    """`zoo.loss_sum` on this device's share of the logits (vocabulary rows t*V/T ..): the same sum."""
    group, t = mesh.get_group(), mesh.get_local_rank()

    def loss_sum(output: torch.Tensor, target: torch.Tensor, batch_size: int) -> torch.Tensor:
        logits = output.reshape(-1, output.shape[-1]).float()
        per_token = _VocabParallelCrossEntropy.apply(logits, target.reshape(-1), t * logits.shape[-1], group)
        return per_token.sum() / (batch_size * output.shape[1])

    return loss_sum


class LocalShards:
    """The rank's parameters as the optimizer, the data-parallel reduction and the memory meter see
    them: a DTensor's local shard as a plain parameter sharing its storage (updated in place, so the
    module sees every step), its gradient the local shard of the DTensor's; other parameters as they
    are. `sync` points the shards' gradients at the parameters' current ones (autograd may replace them)."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params
        self.local = [nn.Parameter(p.to_local(), requires_grad=False) if isinstance(p, DTensor) else p
                      for p in params]

    def sync(self) -> None:
        for p, mine in zip(self.params, self.local):
            if mine is not p:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                elif p.grad.placements != p.placements:
                    # DTensor's backward may leave a gradient whole (the vocabulary-split tables'):
                    # this device keeps its shard (a slice of a replicated one, no communication)
                    p.grad = p.grad.redistribute(p.device_mesh, p.placements)
                mine.grad = p.grad.to_local()

    def grads(self) -> list[torch.Tensor]:
        """Every local gradient, zeros where a parameter has none yet (kept, so reductions land in it)."""
        self.sync()
        for q in self.local:
            if q.grad is None:
                q.grad = torch.zeros_like(q)
        return [q.grad for q in self.local]  # type: ignore[misc]


def full_parameters(named: dict[str, nn.Parameter], heads: int
                    ) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """Every parameter and its gradient whole (gathered from the T devices: a collective every
    device of the rank calls, in the same order), QKV rows back in the model's order (`heads`:
    the model's query heads; its key/value heads and T read off the QKV weight), on the CPU."""
    out: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
    for key, p in named.items():
        whole = [t.full_tensor() if isinstance(t, DTensor) else t for t in (p.detach(), p.grad)]
        if key.endswith(("qkv.weight", "qkv.bias")) and isinstance(p, DTensor):
            weight = named[key[: -len("bias")] + "weight"] if key.endswith("bias") else p
            rows, d_model = weight.shape
            head_dim = d_model // heads
            kv_heads = (rows // head_dim - heads) // 2
            T = p.device_mesh.shape[-1]  # the tp dimension (last also of FSDP2's (dp, tp) mesh)
            order = torch.argsort(device_major_rows(heads, kv_heads, head_dim, T))
            whole = [None if t is None else t[order] for t in whole]
        out[key] = (whole[0].cpu().clone(), None if whole[1] is None else whole[1].cpu().clone())
    return out


def split_chunk(module: nn.Sequential, mesh: DeviceMesh, sequence_parallel: bool = False) -> None:
    """Split every layer of a chunk over the mesh's T devices (`split_layer`)."""
    for layer in module:
        split_layer(layer, mesh, sequence_parallel)


def sequence_shards(shapes: list[tuple[int, ...]], T: int) -> list[tuple[int, ...]]:
    """Layer outputs' shapes (without the batch dimension, the sequence first) as one of T devices
    holds them under sequence parallelism: 1/T of the sequence. A stage sends and receives its
    shard, as Megatron-LM does and as gpipe_sim's `output_bytes_per_sample` counts it (the head's
    output, the loss, is never sent)."""
    return [(shape[0] // T, *shape[1:]) for shape in shapes]
