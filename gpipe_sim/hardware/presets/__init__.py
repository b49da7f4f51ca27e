"""Hardware presets, read from `hardware.yaml` beside this file (each cites its sources)."""

from __future__ import annotations

import copy
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from gpipe_sim.schema.files import YAML_LOADER


@lru_cache(maxsize=1)
def hardware_presets() -> dict[str, dict[str, Any]]:
    """All hardware presets by name, as plain data, each with its `base` (another preset, the
    cluster presets' accelerator) merged in: the preset's own fields over the base's, mappings
    field by field (`_over`). Do not mutate the result: it is cached."""
    text = resources.files(__package__).joinpath("hardware.yaml").read_text()
    raw: dict[str, dict[str, Any]] = yaml.load(text, Loader=YAML_LOADER)
    return {name: _resolved(name, raw, ()) for name in raw}


def _resolved(name: str, raw: dict[str, dict[str, Any]], seen: tuple[str, ...]) -> dict[str, Any]:
    data = raw[name]
    base_name = data.get("base")
    if base_name is None:
        return data
    if base_name not in raw or base_name in seen + (name,):
        raise ValueError(f"hardware preset {name!r}: base {base_name!r} is not another preset")
    base = _resolved(base_name, raw, seen + (name,))
    own = {key: value for key, value in data.items() if key != "base"}
    return _over(base, own)


def _over(base: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """`base` with `own`'s fields over it; where both hold a mapping, merged the same way."""
    merged = copy.deepcopy(base)
    for key, value in own.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _over(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def hardware_preset(name: str) -> dict[str, Any]:
    """One hardware preset's data; ValueError naming `hardware.preset` if unknown."""
    presets = hardware_presets()
    if name not in presets:
        raise ValueError(
            f"hardware.preset: unknown hardware preset {name if len(name) <= 40 else name[:37] + '...'!r} "
            f"(choose from {', '.join(presets)})"
        )
    return presets[name]
