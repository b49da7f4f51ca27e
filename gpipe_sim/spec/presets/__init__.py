"""Hardware presets, read from `hardware.yaml` beside this file (each cites its sources)."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

import yaml


@lru_cache(maxsize=1)
def hardware_presets() -> dict[str, dict[str, Any]]:
    """All hardware presets by name, as plain data."""
    text = resources.files(__package__).joinpath("hardware.yaml").read_text()
    return yaml.safe_load(text)


def hardware_preset(name: str) -> dict[str, Any]:
    """One hardware preset's data; ValueError naming `hardware.preset` if unknown."""
    presets = hardware_presets()
    if name not in presets:
        raise ValueError(
            f"hardware.preset: unknown hardware preset {name if len(name) <= 40 else name[:37] + '...'!r} "
            f"(choose from {', '.join(presets)})"
        )
    return presets[name]
