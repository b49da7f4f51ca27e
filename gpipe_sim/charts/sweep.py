"""Sweep and plan charts: the analytic bubble against M for several K, a sweep's result against an input."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from gpipe_sim.schedule import SCHEDULES
from gpipe_sim.charts.style import (
    _DASHES, _SYMBOLS, category_colors, log_x_axis, schedule_colors,
)


def bubble_vs_m_figure(stages_list: Sequence[int], current_k: int, current_m: int,
                       current_bubble: float, *, m_max: int = 64,
                       simulated: Mapping[int, float] | None = None, schedule: str = "gpipe",
                       chunks: int = 1, current_analytic: float | None = None) -> go.Figure:
    """The schedule's analytic bubble against M for several K (GPipe's (K-1)/(M+K-1) by default,
    (K-1)/(v*M+K-1) for interleaved 1F1B), with the current point marked. Each curve has only
    the M that the schedule accepts for its K and v.

    `simulated` optionally maps M to the simulated bubble of the current configuration;
    `current_analytic` marks the current result's own analytic bubble.
    """
    family = SCHEDULES[schedule]
    m_max = max(m_max, current_m)
    candidates = np.unique(np.round(np.geomspace(1, m_max, 60)).astype(int)).tolist()
    fig = go.Figure()
    for K in sorted(set(stages_list) | {current_k}):
        ms = [m for m in candidates if family.problem(K, m, chunks) is None]
        if not ms:
            multiple = [m for m in range(1, m_max + 1) if family.problem(K, m, chunks) is None]
            ms = multiple[:: max(1, len(multiple) // 60)]
        fig.add_trace(go.Scatter(
            x=ms, y=[family.analytic_bubble(K, m, chunks) for m in ms],
            mode="lines" if len(ms) > 1 else "markers", name=f"K={K} analytic",
            line=dict(width=3 if K == current_k else 1.5, dash=None if K == current_k else "dot"),
            hovertemplate=f"K={K}<br>M=%{{x}}<br>bubble %{{y:.3f}}<extra></extra>",
        ))
    if simulated:
        m_sim = sorted(simulated)
        fig.add_trace(go.Scatter(
            x=m_sim, y=[simulated[m] for m in m_sim], mode="markers+lines", name=f"K={current_k} simulated",
            line=dict(color="black", dash="dash"), marker=dict(size=7, color="black"),
            hovertemplate="simulated<br>M=%{x}<br>bubble %{y:.3f}<extra></extra>",
        ))
    if current_analytic is not None:
        fig.add_trace(go.Scatter(
            x=[current_m], y=[current_analytic], mode="markers", name="current (analytic)",
            marker=dict(size=13, symbol="diamond-open", color="black", line=dict(width=2)),
            hovertemplate="current, analytic<br>M=%{x}<br>bubble %{y:.4f}<extra></extra>",
        ))
    fig.add_trace(go.Scatter(
        x=[current_m], y=[current_bubble], mode="markers", name="current (simulated)",
        marker=dict(size=15, symbol="star", color="crimson", line=dict(width=1, color="black")),
        hovertemplate="current<br>M=%{x}<br>bubble %{y:.4f}<extra></extra>",
    ))
    log_x_axis(fig, [x for trace in fig.data for x in (trace.x or ())])  # ticked at the M values drawn
    what = schedule if chunks == 1 else f"{schedule}, v={chunks}"
    fig.update_layout(title=f"Bubble fraction against micro-batches M ({what})",
                      xaxis_title="micro-batches M", yaxis_title="bubble fraction", height=380,
                      yaxis_range=[0, 1], margin=dict(l=10, r=10, t=50, b=40))
    return fig


def sweep_figure(rows: Any, x: str, y: str, color: str | None = None, lines: bool = True,
                 log_x: bool = False, split: Sequence[str] = ()) -> go.Figure:
    """A sweep's result column `y` against input column `x`, one series per value of `color` and,
    within it, one per combination of the `split` columns (schedule, remat... variants), so a
    line never joins different variants into a zig-zag. A colour per `color` value; the variants
    of one colour differ in dash and marker."""
    df = rows.sort_values(x, kind="stable")
    if df[y].dtype == bool or str(df[y].dtype) == "boolean":
        df = df.assign(**{y: df[y].astype(float)})
    split = [c for c in split if c in df.columns and c not in (x, color)]
    colours = [None] if not color else list(dict.fromkeys(v for v, _ in df.groupby(color, sort=True, dropna=False)))
    if len(colours) <= 1:
        palette: list[str | None] = [None]
    elif color == "pipeline.schedule":
        palette = list(schedule_colors([str(v) for v in colours]))
    else:
        palette = list(category_colors(len(colours)))
    fig = go.Figure()
    for index, value in enumerate(colours):
        part = df if color is None else df[_equal(df[color], value)]
        variants = [((), part)] if not split else list(part.groupby(split, sort=True, dropna=False))
        for number, (key, piece) in enumerate(variants):
            key = key if isinstance(key, tuple) else (key,)
            names = ([] if value is None and color is None else [f"{color}={value}"]) + [
                f"{c}={v}" for c, v in zip(split, key)]
            fig.add_trace(go.Scatter(
                x=piece[x], y=piece[y], mode="lines+markers" if lines else "markers",
                name=", ".join(names) or y, legendgroup=str(value),
                line=dict(color=palette[index], dash=_DASHES[number % len(_DASHES)]),
                marker=dict(symbol=_SYMBOLS[number % len(_SYMBOLS)]),
                hovertemplate=f"{', '.join(names) or y}<br>{x}=%{{x}}<br>{y}=%{{y:.4g}}<extra></extra>",
            ))
    if log_x:
        log_x_axis(fig, df[x].tolist())
    fig.update_layout(title=f"{y} against {x}", xaxis_title=x, yaxis_title=y, height=420,
                      legend_title_text=", ".join([c for c in (color, *split) if c]),
                      margin=dict(l=10, r=10, t=50, b=40))
    return fig


def _equal(column: Any, value: Any) -> Any:
    """Rows of `column` equal to `value` (NaN equal to NaN)."""
    if isinstance(value, float) and math.isnan(value):
        return column.isna()
    return column == value
