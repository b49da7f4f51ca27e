"""A scenario's layer table as its devices run it: split over T devices, blocks as the remat mode keeps them."""

from __future__ import annotations

from gpipe_sim.spec.layers import build_layers, selective_bytes_per_token
from gpipe_sim.spec.model import LayerSpec, TransformerModel
from gpipe_sim.spec.recompute import recompute_layers
from gpipe_sim.spec.scenario import Scenario


def scenario_layers(scenario: Scenario) -> list[LayerSpec]:
    """The scenario's layer table as its devices run it: one of T devices' share, the blocks as
    `pipeline.remat` checkpoints them (gpipe_sim.spec.recompute)."""
    return layer_table(scenario, scenario.pipeline.tensor_parallel, scenario.pipeline.remat)


def layer_table(scenario: Scenario, tensor_parallel: int, remat: str) -> list[LayerSpec]:
    """`scenario_layers` at another T and remat mode (the planner's candidates)."""
    p, dtype_bytes = scenario.pipeline, scenario.training.dtype_bytes
    mask = scenario.hardware.accelerator.dropout_mask_bytes(dtype_bytes)
    model = scenario.model
    layers = build_layers(model, dtype_bytes, mask, tensor_parallel, p.sequence_parallel)
    if remat != "selective" or not isinstance(model, TransformerModel):
        return recompute_layers(layers, model, remat, tensor_parallel)
    dropout_mask = mask if model.dropout > 0 else 0
    return recompute_layers(layers, model, remat, tensor_parallel, selective_bytes_per_token(
        model, dtype_bytes, dropout_mask, tensor_parallel, p.sequence_parallel))


__all__ = ["layer_table", "scenario_layers"]
