"""The layers a profile measures: whole in one process, or split as the executor splits them (over T, C or E processes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from gpipe_exec.context_parallel import SequenceShard
from gpipe_exec.moe import ExpertGroup
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
    With `sequence` (context parallelism, C > 1) each layer runs this device's share of the sequence
    and each block's attention the group's ring (`runtime.context_parallel.split_sequence`), the
    last layer's loss divided by C (`context_loss`); with `experts` (E > 1) a MoE block holds the
    group's share of the routed experts and dispatches its tokens to the others by all-to-all
    (gpipe_exec.moe). Either way every pass is a collective among the group, as with a mesh.
    The processes of `together` (a process group holding the mesh's or the groups'; None: the
    mesh's own) time their repeats in step (`agree`): profiling at once, every pipeline rank's group
    times the same repeats at the same time, so each repeat runs under the contention of a
    pipeline's steady state.
    """

    scenario: Scenario
    seed: int = 0
    dropout: float | None = None
    mesh: Any = None  # a DeviceMesh of the rank's T processes, or None
    together: Any = None  # the process group that agrees on repeats (None: the mesh's)
    sequence: SequenceShard | None = None  # this device's share of each sequence (C > 1), or None
    experts: ExpertGroup | None = None  # the expert group whose share of the experts it holds (E > 1), or None

    @property
    def tensor_parallel(self) -> int:
        """T: the devices each layer is split over (1 without a mesh)."""
        return 1 if self.mesh is None else int(self.mesh.size())

    @property
    def context_parallel(self) -> int:
        """C: the devices each sequence is split over (1 without a `sequence`)."""
        return 1 if self.sequence is None else self.sequence.size

    @property
    def expert_parallel(self) -> int:
        """E: the devices a MoE block's routed experts are spread over (1 without `experts`)."""
        return 1 if self.experts is None else self.experts.size

    @property
    def split(self) -> bool:
        """Whether the layers are split over other processes (T, C or E > 1): one device's share,
        collectives inside every pass."""
        return self.tensor_parallel * self.context_parallel * self.expert_parallel > 1

    def build(self, index: int, device: torch.device) -> tuple[nn.Module, int]:
        """(layer `index` on `device` as this process holds it (split with a mesh, on its share of
        the sequence with `sequence`, its share of the experts with `experts`), the parameters of
        the whole layer, counted before the split, every routed expert included)."""
        from gpipe_exec.runtime.context_parallel import split_sequence
        from gpipe_exec.runtime.tensor_parallel import split_layer

        with torch.device(device):
            layer = build_layer(self.scenario.model, index, seed=self.seed, dropout=self.dropout,
                                dtype=self.scenario.training.dtype, tensor_parallel=self.tensor_parallel,
                                experts=self.experts)
        layer.to(device)
        # every member holds experts / E routed experts of one size: the others' are E - 1 times its own
        whole = sum(p.numel() for p in layer.parameters()) + (self.expert_parallel - 1) * expert_parameters(layer)
        if self.mesh is not None:
            split_layer(layer, self.mesh, self.scenario.pipeline.sequence_parallel)
        if self.sequence is not None:
            split_sequence(layer, self.sequence)
        return layer, whole

    def loss(self) -> LossFn:
        """The loss the model's last layer's passes end with (the vocabulary-parallel one with a mesh)."""
        from gpipe_exec.runtime.context_parallel import context_loss
        from gpipe_exec.runtime.tensor_parallel import vocab_parallel_loss

        loss = loss_sum if self.mesh is None else vocab_parallel_loss(self.mesh)
        return loss if self.sequence is None else context_loss(loss, self.sequence.size)

    def agree(self, more: bool) -> bool:
        """Whether the processes of `together` time another repeat: any one of them wants to (a MAX
        all-reduce of the wish, outside the timed passes); without a mesh or `together`, this
        process's wish."""
        if self.mesh is None and self.together is None:
            return more
        import torch.distributed as dist

        flag = torch.tensor([int(more)], device=self.mesh.device_type if self.mesh is not None else "cpu")
        group = self.mesh.get_group() if self.together is None else self.together
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return bool(flag.item())


def check_meta(meta: bool, tensor_parallel: int, context_parallel: int = 1, expert_parallel: int = 1) -> None:
    """GpipeError (one line naming the field) for a profile of split layers (over T, C or E devices)
    on the meta device (`meta`, or a model too large to build here), which splits none."""
    if not meta:
        return
    for field, value in (("tensor_parallel", tensor_parallel), ("context_parallel", context_parallel),
                         ("expert_parallel", expert_parallel)):
        if value > 1:
            raise GpipeError(f"pipeline.{field}: {value}: the meta device splits no layers "
                             f"(--meta, or a model too large to build here); profile at 1, or a model that fits")


def expert_parameters(layer: nn.Module) -> int:
    """The routed experts' parameters `layer` holds, as this device holds them (a split DTensor's
    local shard; 0 for a layer without experts)."""
    from gpipe_exec.measure.meters import local_data
    from gpipe_exec.runtime.experts import expert_mask

    return sum(local_data(p).numel() for p, routed in zip(layer.parameters(), expert_mask(layer)) if routed)


def local_parameters(layer: nn.Module) -> list[nn.Parameter]:
    """The layer's parameters as this process's optimizer steps them: a DTensor's local shard as a
    plain parameter sharing its storage, its gradient the shard of the DTensor's (`LocalShards`)."""
    from gpipe_exec.runtime.tensor_parallel import LocalShards

    shards = LocalShards(list(layer.parameters()))
    shards.sync()
    return shards.local
