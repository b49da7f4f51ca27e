"""A scenario's layer table as its devices run it: split over T devices and the sequence over C, blocks as the remat mode keeps them."""

from __future__ import annotations

from gpipe_sim.model.context_parallel import local_model, ring_attention_layers
from gpipe_sim.costs.fp8 import FP8, fp8_layers
from gpipe_sim.model.layers import build_layers, selective_bytes_per_token
from gpipe_sim.model.model import LayerSpec, TableModel, TransformerModel
from gpipe_sim.model.model_flops import tied_parameters
from gpipe_sim.kept import Kept
from gpipe_sim.model.recompute import per_layer, recompute_layers
from gpipe_sim.scenario.scenario import Scenario


def scenario_layers(scenario: Scenario) -> list[LayerSpec]:
    """The scenario's layer table as its devices run it: one of T x C devices' share (the layers
    split over T, the sequence over C: gpipe_sim.model.context_parallel; a mixture of experts'
    experts over E: gpipe_sim.model.experts), the blocks as
    `pipeline.remat` checkpoints them (gpipe_sim.model.recompute)."""
    return layer_table(scenario, scenario.pipeline.tensor_parallel, scenario.pipeline.remat,
                       scenario.pipeline.context_parallel)


_BUILT: Kept[tuple[LayerSpec, ...]] = Kept(32)  # the last tables built, by what they depend on


def layer_table(scenario: Scenario, tensor_parallel: int, remat: str, context_parallel: int = 1,
                expert_parallel: int | None = None) -> list[LayerSpec]:
    """`scenario_layers` at another T, remat mode, C and E (the planner's candidates; E None: the
    scenario's). Kept for the next call with the same model, dtype, dropout masks, T, sequence
    parallelism, remat mode, C and E (the planner asks for each many times; layers are
    immutable); a new list each call."""
    ep = scenario.pipeline.expert_parallel if expert_parallel is None else expert_parallel
    dtype_bytes = scenario.training.dtype_bytes
    key = (scenario.model, scenario.training.dtype, dtype_bytes,
           scenario.hardware.accelerator.dropout_mask_bytes(dtype_bytes),
           tensor_parallel, scenario.pipeline.sequence_parallel, remat, context_parallel, ep)
    return list(_BUILT.get(key, lambda: tuple(_layer_table(scenario, tensor_parallel, remat, context_parallel, ep))))


def _layer_table(scenario: Scenario, tensor_parallel: int, remat: str, context_parallel: int,
                 expert_parallel: int) -> list[LayerSpec]:
    p, dtype_bytes = scenario.pipeline, scenario.training.dtype_bytes
    mask = scenario.hardware.accelerator.dropout_mask_bytes(dtype_bytes)
    model = local_model(scenario.model, context_parallel)
    layers = build_layers(model, dtype_bytes, mask, tensor_parallel, p.sequence_parallel, expert_parallel)
    if scenario.training.dtype == FP8:  # GEMM inputs saved in FP8
        layers = fp8_layers(layers, model, tensor_parallel, p.sequence_parallel)
    if remat != "selective" or not isinstance(model, TransformerModel):
        layers = recompute_layers(layers, model, remat, tensor_parallel)
    else:
        dropout_mask = mask if model.dropout > 0 else 0
        layers = recompute_layers(layers, model, remat, tensor_parallel, selective_bytes_per_token(
            model, dtype_bytes, dropout_mask, tensor_parallel, p.sequence_parallel))
    if context_parallel == 1 or isinstance(model, TableModel):  # a table's rows are its C's share already
        return layers
    whole = build_layers(scenario.model, dtype_bytes, mask, tensor_parallel, p.sequence_parallel, expert_parallel)
    return ring_attention_layers(layers, whole, scenario.model, context_parallel, tensor_parallel, dtype_bytes,
                                 per_layer(remat))


__all__ = ["layer_table", "scenario_layers"]


def held_parameters(scenario: Scenario, own: list[LayerSpec], whole: bool) -> int:
    """Parameters a chunk of layers `own` holds on one device: theirs, less the head's copy of a
    tied token table where the chunk is the `whole` model (embedding and head share one tensor,
    as the executor's one-chunk model does); with pipelining each end keeps its own copy."""
    params = sum(layer.params for layer in own)
    if whole and getattr(scenario.model, "tied_embeddings", False):
        params -= tied_parameters(scenario.model) // scenario.pipeline.tensor_parallel
    return params
