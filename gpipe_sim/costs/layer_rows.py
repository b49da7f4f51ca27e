"""Layers' pass times remembered by content: a search compiles a thousand candidates whose chunks hold the same layers."""

from __future__ import annotations

from typing import Any, Sequence

from gpipe_sim.costs.content_tokens import ContentTokens
from gpipe_sim.costs.gpu_model import StreamWork
from gpipe_sim.costs.layer_time import layer_pass_times, measured_host_seconds
from gpipe_sim.costs.twins import pricing_key
from gpipe_sim.hardware.hardware import Accelerator
from gpipe_sim.model.model import LayerSpec

Row = tuple[float, float, float, float]

# Accelerators by content: each candidate a search compiles parses its own, equal to the others.
accelerator_token: ContentTokens[Accelerator] = ContentTokens(lambda accel: accel.model_dump_json(), size=64)
_ROWS: dict[tuple[Any, ...], Row] = {}
_HOSTS: dict[tuple[int, int], tuple[float, float]] = {}
# The most rows (and host rows) remembered before starting afresh.
ROWS_SIZE = 1 << 17


def pass_rows(layers: Sequence[LayerSpec], b: int, accel: Accelerator, dtype: str, dtype_bytes: int,
              work: Sequence[StreamWork | None] | None = None) -> list[Row]:
    """Per layer, `layer_pass_times(layer, b, accel, dtype, dtype_bytes, work[i])` (no stream work
    where `work` is None), priced once per (layer's `pricing_key`, accelerator's content, b,
    dtype, stream work) and remembered: twins, and the same layers of every candidate, are
    priced once."""
    a = accelerator_token(accel)
    rows = []
    for i, layer in enumerate(layers):
        w = None if work is None else work[i]
        key = (pricing_key(layer), b, a, dtype, dtype_bytes, w)
        row = _ROWS.get(key)
        if row is None:
            if len(_ROWS) >= ROWS_SIZE:
                _ROWS.clear()
            row = _ROWS[key] = layer_pass_times(layer, b, accel, dtype, dtype_bytes, w)
        rows.append(row)
    return rows


def host_rows(layers: Sequence[LayerSpec], b: int) -> list[tuple[float, float]]:
    """Per layer, `measured_host_seconds(layer, b)`, once per (layer's `pricing_key`, b)."""
    rows = []
    for layer in layers:
        key = (pricing_key(layer), b)
        row = _HOSTS.get(key)
        if row is None:
            if len(_HOSTS) >= ROWS_SIZE:
                _HOSTS.clear()
            row = _HOSTS[key] = measured_host_seconds(layer, b)
        rows.append(row)
    return rows


__all__ = ["Row", "accelerator_token", "host_rows", "pass_rows"]
