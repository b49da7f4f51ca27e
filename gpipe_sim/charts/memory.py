"""Memory charts: each rank's memory over the step, and what each rank holds at its peak."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from gpipe_sim.results.result import Result
from gpipe_sim.charts.style import GIB, category_colors, rank_colors, time_unit


def _memory_steps(times: np.ndarray, held: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """A rank's activation bytes as a time-ordered step function, binned to at most `max_points`."""
    delta = np.diff(np.asarray(held, dtype=float), prepend=0.0)
    order = np.lexsort((delta, times))  # frees before allocations at equal times
    t = np.asarray(times, dtype=float)[order]
    level = np.cumsum(delta[order])
    if len(t) > max_points and len(t):
        edges = np.linspace(t[0], t[-1], max_points // 2 + 1)
        idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, len(edges) - 2)
        peak = np.full(len(edges) - 1, -np.inf)
        np.maximum.at(peak, idx, level)
        filled = np.isfinite(peak)
        t, level = edges[:-1][filled], peak[filled]
    return t, level


# Above this many changes of what a rank holds (the default scenario's ranks change 226 times at
# 16 micro-batches, 450 at 32) the step lines of several ranks are a sawtooth nobody reads: each
# rank is drawn as its envelope instead.
STEP_LINES_MAX_CHANGES = 250
# An envelope's time slices each span this many of the busiest rank's changes (a micro-batch
# changes a rank's memory 10-14 times), so that a slice holds a whole rise and fall and the band
# is steady where the schedule is; at most ENVELOPE_MAX_SLICES.
CHANGES_PER_SLICE = 16
ENVELOPE_MAX_SLICES = 120


def _envelope(times: np.ndarray, held: np.ndarray, end: float, slices: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A rank's activation bytes over [0, end] cut into `slices` equal time slices: each slice's
    start, and the least and the most the rank holds during it (the level carried in counted).
    The most over all slices is the rank's exact peak."""
    delta = np.diff(np.asarray(held, dtype=float), prepend=0.0)
    order = np.lexsort((delta, times))  # frees before allocations at equal times
    t = np.asarray(times, dtype=float)[order]
    level = np.cumsum(delta[order])
    edges = np.linspace(0.0, max(end, float(t[-1]) if len(t) else 0.0), slices + 1)
    idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, slices - 1)
    before = np.searchsorted(t, edges[:-1], side="right") - 1  # the last change at or before each start
    carried = np.where(before >= 0, level[np.maximum(before, 0)] if len(level) else 0.0, 0.0)
    most, least = carried.copy(), carried.copy()
    np.maximum.at(most, idx, level)
    np.minimum.at(least, idx, level)
    return edges, least, most


def memory_timeline_figure(result: Result, *, max_points_per_stage: int = 600) -> go.Figure:
    """Each rank's memory (static + activations held) over the step, with the device capacity: a
    step line per rank, or, where a rank's memory changes more than STEP_LINES_MAX_CHANGES times
    (many micro-batches), a band per rank from the least to the most it holds in each of
    time slices of CHANGES_PER_SLICE changes each, its top line the exact peaks."""
    unit, scale = time_unit(result.step_time_s)
    fig = go.Figure()
    colors = rank_colors(len(result.memory_timeline))
    changes = max((len(times) for times, _ in result.memory_timeline), default=0)
    slices = min(ENVELOPE_MAX_SLICES, -(-changes // CHANGES_PER_SLICE)) if changes > STEP_LINES_MAX_CHANGES else 0
    for k, (times, held) in enumerate(result.memory_timeline):
        stage = result.stages[k]
        static = stage.param_bytes + stage.state_bytes
        if slices:
            _add_band(fig, k, colors[k], static, _envelope(times, held, result.step_time_s, slices), scale, unit)
            continue
        t, level = _memory_steps(times, held, max_points_per_stage)
        t = np.concatenate([[0.0], t, [result.step_time_s]])
        level = np.concatenate([[0.0], level, [level[-1] if len(level) else 0.0]])
        fig.add_trace(go.Scatter(
            x=t / scale, y=(static + level) / GIB, mode="lines", line_shape="hv", name=f"rank {k}",
            line=dict(color=colors[k]),
            hovertemplate=f"rank {k}<br>%{{x:.4g}} {unit}<br>%{{y:.3f}} GiB<extra></extra>",
        ))
    cap = result.memory_capacity_bytes
    peak = max(result.device_peak_memory_bytes.values(), default=0.0)
    notes = [f"each rank's band: the least and most it holds in each of {slices} time slices "
             "(too many changes to draw each)"] if slices else []
    if peak >= 0.5 * cap:
        _capacity_line(fig, cap)
    elif math.isfinite(cap):
        notes.append(f"device capacity {cap / GIB:.1f} GiB is off the chart")
    title = "Memory over time (parameters, states and activations held)"
    title += f"<br><sup>{'; '.join(notes)}</sup>" if notes else ""
    fig.update_layout(title=title,
                      xaxis_title=f"time ({unit})", yaxis_title="GiB", height=360,
                      margin=dict(l=10, r=10, t=50, b=40))
    fig.update_yaxes(rangemode="tozero")  # memory from 0: the static part is a real share
    fig.update_xaxes(range=[0, result.step_time_s / scale] if result.step_time_s > 0 else None)
    return fig


def _add_band(fig: go.Figure, k: int, color: str, static: float,
              envelope: tuple[np.ndarray, np.ndarray, np.ndarray], scale: float, unit: str) -> None:
    """Rank k's envelope: its least level as a hidden line, its most as a line filled down to it."""
    edges, least, most = envelope
    x = edges / scale  # each slice's level held to its end: steps at the slice edges
    for y, top in ((least, False), (most, True)):
        y = np.append((static + y) / GIB, (static + y[-1]) / GIB)
        fig.add_trace(go.Scatter(
            x=x, y=y, mode="lines", line_shape="hv", name=f"rank {k}", legendgroup=f"rank {k}",
            showlegend=top, line=dict(color=color, width=2 if top else 0),
            fill="tonexty" if top else None, opacity=1.0,
            fillcolor=_translucent(color) if top else None,
            hovertemplate=f"rank {k} {'most' if top else 'least'}<br>%{{x:.4g}} {unit}<br>%{{y:.3f}} GiB"
                          "<extra></extra>",
        ))


def _translucent(color: str) -> str:
    """'#rrggbb' as an rgba() at a quarter opacity (a band's fill)."""
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},0.25)"


def _capacity_line(fig: go.Figure, capacity: float) -> None:
    """A dashed horizontal line at the device capacity (a layout shape: cheaper than add_hline)."""
    if math.isfinite(capacity):
        y = capacity / GIB
        fig.update_layout(
            shapes=[dict(type="line", xref="paper", x0=0, x1=1, yref="y", y0=y, y1=y,
                         line=dict(color="crimson", dash="dash", width=2))],
            annotations=[dict(xref="paper", x=0, yref="y", y=y, text=f"capacity {y:.1f} GiB",
                              showarrow=False, xanchor="left", yanchor="bottom",
                              font=dict(color="crimson"))],
        )


def stage_memory_figure(result: Result) -> go.Figure:
    """Each rank's peak memory (all its chunks), split into what it holds at that moment:
    parameters, gradients/optimizer states, the activations held, the temporaries of the pass or
    update running, and the runtime's buffers (from `memory_breakdown`; without one, the peak
    activations and the rest, unsplit). The bar's height is the rank's `peak_memory_bytes`."""
    stages = result.stages
    x = [f"rank {s.index}" for s in stages]
    over = [
        result.device_peak_memory_bytes.get(s.device, s.peak_memory_bytes) > result.memory_capacity_bytes
        for s in stages
    ]
    # the simulator's breakdown names the moment of the peak; without one (a measurement, an older
    # result) only the activation peak is known, and the rest is not split
    at_peak = all("activations" in s.memory_breakdown for s in stages)
    held = [s.memory_breakdown["activations"] if at_peak else s.peak_activation_bytes for s in stages]
    temporaries = [s.memory_breakdown.get("transient", 0.0) if at_peak else 0.0 for s in stages]
    # the breakdown's other named parts (sent tensors, all-reduce buckets, ZeRO shards...), each a bar;
    # what is left is the step buffers
    shown = {"parameters", "gradients_and_optimizer_states", "activations", "transient", "step_buffers"}
    named = sorted({k for s in stages for k in s.memory_breakdown} - shown) if at_peak else []
    extras = [(name.replace("_", " "), [s.memory_breakdown.get(name, 0.0) for s in stages], color)
              for name, color in zip(named, category_colors(len(named) + 8)[8:])]
    rest = [max(s.peak_memory_bytes - s.param_bytes - s.state_bytes - h - t - sum(v[i] for _, v, _ in extras), 0.0)
            for i, (s, h, t) in enumerate(zip(stages, held, temporaries))]
    fig = go.Figure()
    parts = (("parameters", [s.param_bytes for s in stages], "#72B7B2"),
             ("gradients + optimizer states", [s.state_bytes for s in stages], "#EECA3B"),
             ("activations held" if at_peak else "peak activations", held, "#E45756"),
             ("temporaries (running pass or update)", temporaries, "#B279A2"),
             *extras,
             ("runtime buffers" if at_peak else "temporaries and buffers", rest, "#9D755D"))
    for name, values, color in parts:
        if name != "parameters" and not any(values):
            continue
        fig.add_trace(go.Bar(x=x, y=np.asarray(values) / GIB, name=name, marker_color=color,
                             hovertemplate="%{x}<br>" + name + ": %{y:.3f} GiB<extra></extra>"))
    # Ranks whose device is over capacity: a marker on the bar (named once, in the legend), never
    # a text label per bar, which would overlap its neighbours' on a deep pipeline.
    fig.add_trace(go.Scatter(
        x=[x[i] for i, o in enumerate(over) if o],
        y=[stages[i].peak_memory_bytes / GIB for i, o in enumerate(over) if o],
        mode="markers", name="does not fit", showlegend=any(over),
        marker=dict(symbol="x-thin", size=14, color="crimson", line=dict(width=3, color="crimson")),
        hovertemplate="%{x} does not fit: %{y:.3f} GiB<extra></extra>",
    ))
    _capacity_line(fig, result.memory_capacity_bytes)
    title = "What each rank holds at its peak"
    if any(over):
        title += f"<br><sup>{sum(over)} of {len(over)} ranks do not fit (marked x)</sup>"
    fig.update_layout(barmode="stack", title=title, yaxis_title="GiB", height=360,
                      margin=dict(l=10, r=10, t=60, b=40))
    return fig
