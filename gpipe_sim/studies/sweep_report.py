"""The sweep report: one self-contained HTML page of plotly figures drawn from a sweep's table."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from gpipe_sim.results.result import analytic_bubble
from gpipe_sim.studies.plot_style import _DASHES, _SYMBOLS, rank_colors
from gpipe_sim.studies.sweep_best import varying_inputs

K, M = "pipeline.stages", "pipeline.micro_batches"
GIB = 2.0**30
MAX_TRACES = 24
RESULT_PREFIXES = ("sweep.", "status", "error", "elapsed_s")


def _label(values: dict[str, Any]) -> str:
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in values.items())


def _lines(ok: pd.DataFrame, x: str, y: str, colour: str, others: list[str]) -> list[go.Scatter]:
    """One line per value of `colour` (and of the other varying axes, while they are few)."""
    groups = [colour, *others]
    grouped = list(ok.groupby(groups, dropna=False, sort=True)) if groups else [((), ok)]
    aggregate = len(grouped) > MAX_TRACES
    if aggregate:  # too many combinations: the median over the other axes
        grouped = list(ok.groupby([colour], dropna=False, sort=True))
        groups = [colour]
    # One colour per value of `colour` (all distinct), the other axes' combinations in dashes and
    # markers: never two legend entries that look alike.
    keys = [key if isinstance(key, tuple) else (key,) for key, _ in grouped]
    firsts = list(dict.fromkeys(str(k[0]) for k in keys))
    rests = list(dict.fromkeys(str(k[1:]) for k in keys))
    palette = rank_colors(len(firsts))
    traces = []
    for key, (_, part) in zip(keys, grouped):
        series = part.groupby(x, sort=True)[y].median() if aggregate else part.sort_values(x).set_index(x)[y]
        name = _label(dict(zip(groups, key))) + (" (median)" if aggregate else "")
        variant = rests.index(str(key[1:]))
        traces.append(go.Scatter(
            x=series.index.tolist(), y=series.tolist(), mode="lines+markers", name=name,
            line={"color": palette[firsts.index(str(key[0]))], "dash": _DASHES[variant % len(_DASHES)]},
            marker={"symbol": _SYMBOLS[variant % len(_SYMBOLS)]}))
    return traces


def figure_bubble(ok: pd.DataFrame, varying: list[str]) -> go.Figure | None:
    if M not in varying:
        return None
    others = [c for c in varying if c not in (K, M)]
    fig = go.Figure(_lines(ok, M, "bubble_fraction", K, others))
    ks = sorted(ok[K].unique())
    ms = sorted(ok[M].unique())
    for k in ks:
        fig.add_trace(go.Scatter(
            x=ms, y=[analytic_bubble(int(k), int(m)) for m in ms], mode="lines", name=f"(K-1)/(M+K-1), K={k}",
            line={"dash": "dot", "width": 1}, visible="legendonly",
        ))
    fig.update_layout(title="Bubble fraction against M, one line per K", xaxis_title="micro-batches M",
                      yaxis_title="bubble fraction", xaxis_type="log")
    return fig


def figure_throughput(ok: pd.DataFrame, varying: list[str]) -> go.Figure | None:
    if K not in varying:
        return None
    others = [c for c in varying if c not in (K, M)]
    colour = M if M in varying else (others.pop(0) if others else None)
    if colour is None:
        fig = go.Figure(_lines(ok.assign(_all="all"), K, "throughput_samples_per_s", "_all", []))
    else:
        fig = go.Figure(_lines(ok, K, "throughput_samples_per_s", colour, others))
    fig.update_layout(title="Throughput against K", xaxis_title="stages K",
                      yaxis_title="samples / s", xaxis_type="log")
    return fig


def figure_memory(ok: pd.DataFrame) -> go.Figure | None:
    rows = ok.dropna(subset=["stage_peak_memory_bytes"])
    if rows.empty:
        return None
    fig = go.Figure()
    ks = sorted(rows[K].unique())
    palette = rank_colors(len(ks[:MAX_TRACES]))
    for k, color in zip(ks[:MAX_TRACES], palette):
        part = rows[rows[K] == k]
        xs, ys, texts = [], [], []
        for _, row in part.iterrows():
            for stage, peak in enumerate(_as_list(row["stage_peak_memory_bytes"])):
                xs.append(stage)
                ys.append(peak / GIB)
                texts.append(f"scenario {row['sweep.index']}")
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=f"K={k}", text=texts,
                                 marker={"size": 5, "opacity": 0.6, "color": color}))
    caps = sorted({float(c) for c in rows["memory_capacity_bytes"].dropna()})
    for cap in caps[:6]:
        fig.add_hline(y=cap / GIB, line_dash="dash", line_color="red",
                      annotation_text=f"capacity {cap / GIB:.1f} GiB")
    fig.update_layout(title="Per-stage peak memory against capacity", xaxis_title="stage",
                      yaxis_title="peak memory (GiB)")
    return fig


def figure_axis(ok: pd.DataFrame, table: pd.DataFrame, axis: str) -> go.Figure:
    """Throughput (and the share of scenarios that fit) for each value of one further axis."""
    values = sorted(table[axis].dropna().unique(), key=lambda v: (str(type(v)), v))
    labels = [str(v) for v in values]
    fig = go.Figure()
    fig.add_trace(go.Box(x=ok[axis].astype(str), y=ok["throughput_samples_per_s"], name="throughput",
                         boxpoints="all", jitter=0.3))
    fits = [float(table.loc[table[axis] == v, "fits_in_memory"].fillna(False).astype(bool).mean()) for v in values]
    fig.add_trace(go.Scatter(x=labels, y=fits, name="share that fits", yaxis="y2", mode="lines+markers"))
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=labels)
    fig.update_layout(title=f"Throughput and memory fit by {axis}", xaxis_title=axis,
                      yaxis_title="samples / s",
                      yaxis2={"title": "share fitting in memory", "overlaying": "y", "side": "right",
                              "tickformat": ".0%", "tickmode": "linear", "dtick": 0.25, "showgrid": False,
                              "range": [0, 1.05]})
    return fig


def _as_list(value: Any) -> list[float]:
    if isinstance(value, str):
        return [float(v) for v in json.loads(value)]
    return [float(v) for v in value]


def _failures(table: pd.DataFrame) -> str:
    failed = table[table["status"] != "ok"]
    if failed.empty:
        return "<p>No scenario failed.</p>"
    rows = "".join(
        f"<tr><td>{int(r['sweep.index'])}</td><td>{html.escape(str(r['error']))}</td></tr>"
        for _, r in failed.head(100).iterrows()
    )
    more = f"<p>... and {len(failed) - 100} more</p>" if len(failed) > 100 else ""
    return f"<table><tr><th>#</th><th>error</th></tr>{rows}</table>{more}"


def build_report(table: pd.DataFrame, title: str = "sweep", axes: list[str] | None = None) -> str:
    """The whole report as one HTML string (plotly's JavaScript inlined once); `axes` names the
    sweep's varied fields (default: every input column that varies)."""
    ok = table[table["status"] == "ok"]
    varying = varying_inputs(table, axes)
    figures = []
    if not ok.empty:
        for fig in (figure_bubble(ok, varying), figure_throughput(ok, varying), figure_memory(ok)):
            if fig is not None:
                figures.append(fig)
        for axis in varying:
            if axis not in (K, M) and table[axis].astype(str).nunique() <= 40:
                figures.append(figure_axis(ok, table, axis))
    parts = []
    for i, fig in enumerate(figures):
        fig.update_layout(template="plotly_white", height=460)
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0)))
    summary = (f"{len(table)} scenarios, {len(ok)} ok, {len(table) - len(ok)} failed; "
               f"varying: {', '.join(varying) or 'nothing'}")
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:left}</style>"
        f"</head><body><h1>{html.escape(title)}</h1><p>{html.escape(summary)}</p>"
        + "".join(f"<div>{p}</div>" for p in parts)
        + "<h2>Failed scenarios</h2>" + _failures(table) + "</body></html>"
    )


def write_report(table: pd.DataFrame, path: str | Path, title: str = "sweep",
                 axes: list[str] | None = None) -> Path:
    """Write the report to `path` (normally DIR/report.html)."""
    path = Path(path)
    path.write_text(build_report(table, title, axes))
    return path
