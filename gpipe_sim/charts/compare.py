"""Prediction-against-measurement charts: relative errors, step times, per-rank figures side by side."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from gpipe_sim.results.result import Result
from gpipe_sim.charts.style import GIB


def relative_error_figure(errors: Mapping[str, float], threshold: float = 0.2) -> go.Figure:
    """Relative error of the prediction per field, in percent; bars beyond `threshold` in red."""
    names = [k for k, v in errors.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    values = [100.0 * float(errors[k]) for k in names]
    signed = any(v < 0 for v in values)
    fig = go.Figure(go.Bar(
        x=names, y=values,
        marker_color=["#E45756" if abs(v) > 100 * threshold else "#4C78A8" for v in values],
        text=[f"{v:+.1f}%" if signed else f"{v:.1f}%" for v in values], textposition="outside",
        hovertemplate="%{x}<br>%{y:.2f}%<extra></extra>",
    ))
    skipped = len(errors) - len(names)
    title = "Relative error of the prediction"
    if skipped:
        title += f"<br><sup>{skipped} field(s) not finite (measured 0) left out</sup>"
    fig.update_layout(title=title, yaxis_title="error (%)", height=360,
                      margin=dict(l=10, r=10, t=60, b=40))
    return fig


def step_times_figure(predicted_s: float, measured_s: Sequence[float]) -> go.Figure:
    """Every measured step time against the predicted one."""
    steps = list(range(1, len(measured_s) + 1))
    fig = go.Figure(go.Scatter(x=steps, y=list(measured_s), mode="markers+lines", name="measured",
                               hovertemplate="step %{x}<br>%{y:.4g} s<extra></extra>"))
    fig.add_trace(go.Scatter(x=[steps[0], steps[-1]] if steps else [0, 1], y=[predicted_s] * 2,
                             mode="lines", name="predicted", line=dict(dash="dash", color="crimson")))
    fig.update_layout(title="Measured step times against the prediction", xaxis_title="step",
                      yaxis_title="seconds", height=360, margin=dict(l=10, r=10, t=50, b=40))
    return fig


def stage_comparison_figure(named: Sequence[tuple[str, Result]], field: str = "busy_s") -> go.Figure:
    """One per-rank figure (`busy_s`, `peak_memory_bytes`, ...) for several results, grouped."""
    fig = go.Figure()
    in_gib = field.endswith("_bytes")
    for name, result in named:
        values = np.array([getattr(s, field) for s in result.stages], dtype=float)
        fig.add_trace(go.Bar(x=[f"rank {s.index}" for s in result.stages],
                             y=values / GIB if in_gib else values, name=name))
    label = field.replace("_bytes", "").replace("_s", "").replace("_", " ")
    fig.update_layout(barmode="group", title=f"Per-rank {label}",
                      yaxis_title="GiB" if in_gib else "seconds", height=340,
                      margin=dict(l=10, r=10, t=50, b=40))
    return fig
