"""The layers a profile measures: whole in one process, or split over a rank's T processes as the executor does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from gpipe_exec.zoo import build_layer, loss_sum
from gpipe_sim.errors import GpipeError
from gpipe_sim.scenario.scenario import Scenario

# The loss that ends the model's last layer's passes: (output, target, mini-batch size) -> the
# micro-batch's share of the mean (`zoo.loss_sum`, or `vocab_parallel_loss` on a split head).
LossFn = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


@dataclass(frozen=True)
class LayerBuilder:
    """Builds the model's layers as a profile measures them, and the loss ending the last one's passes.

    Without a `mesh`: each layer whole (`zoo.build_layer`), ended by `zoo.loss_sum`. With `mesh`,
    the tensor-parallel mesh of a rank's T processes (`runtime.tensor_parallel.device_mesh(...)["tp"]`):
    each layer built whole from its seed with the vocabulary padded for T, then split over the mesh
    (`split_layer`, with the scenario's sequence parallelism), the head's passes ended by the
    vocabulary-parallel loss -- what the executor's rank runs, DTensor dispatch and gloo
    collectives included. Every pass of a split layer is a collective: all T processes of the mesh
    must build and run the same layers in the same order.
    The processes of `together` (a process group holding the mesh's; None: the mesh's own) time
    their repeats in step (`agree`): profiling at once, every pipeline rank's group times the same
    repeats at the same time, so each repeat runs under the contention of a pipeline's steady state.
    """

    scenario: Scenario
    seed: int = 0
    dropout: float | None = None
    mesh: Any = None  # a DeviceMesh of the rank's T processes, or None
    together: Any = None  # the process group that agrees on repeats (None: the mesh's)

    @property
    def tensor_parallel(self) -> int:
        """T: the devices each layer is split over (1 without a mesh)."""
        return 1 if self.mesh is None else int(self.mesh.size())

    def build(self, index: int, device: torch.device) -> tuple[nn.Module, int]:
        """(layer `index` on `device` as this process holds it (split with a mesh), the parameters
        of the whole layer, counted before the split)."""
        from gpipe_exec.runtime.tensor_parallel import split_layer

        with torch.device(device):
            layer = build_layer(self.scenario.model, index, seed=self.seed, dropout=self.dropout,
                                dtype=self.scenario.training.dtype, tensor_parallel=self.tensor_parallel)
        layer.to(device)
        whole = sum(p.numel() for p in layer.parameters())
        if self.mesh is not None:
            split_layer(layer, self.mesh, self.scenario.pipeline.sequence_parallel)
        return layer, whole

    def loss(self) -> LossFn:
        """The loss the model's last layer's passes end with (the vocabulary-parallel one with a mesh)."""
        from gpipe_exec.runtime.tensor_parallel import vocab_parallel_loss

        return loss_sum if self.mesh is None else vocab_parallel_loss(self.mesh)

    def agree(self, more: bool) -> bool:
        """Whether the processes of `together` time another repeat: any one of them wants to (a MAX
        all-reduce of the wish, outside the timed passes); without a mesh, this process's wish."""
        if self.mesh is None:
            return more
        import torch.distributed as dist

        flag = torch.tensor([int(more)], device=self.mesh.device_type)
        group = self.mesh.get_group() if self.together is None else self.together
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return bool(flag.item())


def check_meta(meta: bool, tensor_parallel: int) -> None:
    """GpipeError (one line naming the field) for a profile of split layers on the meta device
    (`meta`, or a model too large to build here), which splits none."""
    if meta and tensor_parallel > 1:
        raise GpipeError(f"pipeline.tensor_parallel: {tensor_parallel}: the meta device splits no layers "
                         f"(--meta, or a model too large to build here); profile at 1, or a model that fits")


def local_parameters(layer: nn.Module) -> list[nn.Parameter]:
    """The layer's parameters as this process's optimizer steps them: a DTensor's local shard as a
    plain parameter sharing its storage, its gradient the shard of the DTensor's (`LocalShards`)."""
    from gpipe_exec.runtime.tensor_parallel import LocalShards

    shards = LocalShards(list(layer.parameters()))
    shards.sync()
    return shards.local
