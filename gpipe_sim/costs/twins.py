"""Layers priced alike: twins are equal but for their name (a model's blocks), so one pricing serves all."""

from __future__ import annotations

from typing import Sequence

from gpipe_sim.costs.content_tokens import ContentTokens
from gpipe_sim.model.kernels import LayerKernels
from gpipe_sim.model.model import LayerSpec

# What a layer's cost depends on: every field but its name, and its kernels (`ops` where it holds
# them; the cost model reads nothing else there).
pricing_key: ContentTokens[LayerSpec] = ContentTokens(lambda layer: (
    layer.model_dump_json(exclude={"name"}), layer.ops if isinstance(layer.ops, LayerKernels) else None))


def twins(layers: Sequence[LayerSpec]) -> list[int]:
    """Per layer, the index of its first twin in `layers` (itself where none comes before it):
    layers of equal `pricing_key`, which every cost model prices alike."""
    firsts: dict[int, int] = {}
    return [firsts.setdefault(pricing_key(layer), i) for i, layer in enumerate(layers)]


__all__ = ["pricing_key", "twins"]
