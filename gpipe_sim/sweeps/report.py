"""The sweep report: one self-contained HTML page of plotly figures drawn from a sweep's table."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from gpipe_sim.charts.style import (
    _DASHES, _SYMBOLS, GIB, category_colors, log_x_axis, schedule_colors,
)
from gpipe_sim.sweeps.best import varying_inputs

K, M = "pipeline.stages", "pipeline.micro_batches"
MAX_TRACES = 24
RESULT_PREFIXES = ("sweep.", "status", "error", "elapsed_s")


S = "pipeline.schedule"


def _label(values: dict[str, Any]) -> str:
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in values.items())


def _configs(rows: pd.DataFrame, varying: list[str]) -> list[str]:
    """Each row's configuration as hover text: its varying inputs (and its sweep index)."""
    shown = [c for c in varying if c in rows.columns]
    return [f"#{int(r['sweep.index'])}: " + _label({c: r[c] for c in shown}) if "sweep.index" in rows.columns
            else _label({c: r[c] for c in shown}) for _, r in rows.iterrows()]


def colour_axis(ok: pd.DataFrame, varying: list[str], exclude: tuple[str, ...] = ()) -> str | None:
    """The input the lines are coloured by: the schedule when it varies, else K, else the first
    other varying input (one with more than one value among the rows that ran)."""
    for column in (S, K, *varying):
        if column in varying and column not in exclude and column in ok.columns \
                and ok[column].astype(str).nunique(dropna=False) > 1:
            return column
    return None


def _palette(colour: str, values: list[str]) -> list[str]:
    return schedule_colors(values) if colour == S else category_colors(len(values))


def _lines(ok: pd.DataFrame, x: str, y: str, colour: str | None, others: list[str],
           varying: list[str]) -> list[go.Scatter]:
    """One line per value of `colour` (and of the other varying axes, while they are few); each
    point's hover names its configuration."""
    if colour is None:
        ok, colour = ok.assign(_all="all"), "_all"
    # an input that follows the colour (chunks with the schedule that needs them) is no variant
    others = [c for c in others if c != colour and c in ok.columns
              and ok.groupby(colour, dropna=False)[c].nunique(dropna=False).max() > 1]
    groups = [colour, *others]
    grouped = list(ok.groupby(groups, dropna=False, sort=True))
    aggregate = len(grouped) > MAX_TRACES
    if aggregate:  # too many combinations: the median over the other axes
        grouped = list(ok.groupby([colour], dropna=False, sort=True))
        groups = [colour]
    # One colour per value of `colour` (all distinct, a qualitative palette), the other axes'
    # combinations in dashes and markers: never two legend entries that look alike.
    keys = [key if isinstance(key, tuple) else (key,) for key, _ in grouped]
    firsts = list(dict.fromkeys(str(k[0]) for k in keys))
    rests = list(dict.fromkeys(str(k[1:]) for k in keys))
    palette = _palette(colour, firsts)
    traces = []
    for key, (_, part) in zip(keys, grouped):
        shown = {g: v for g, v in zip(groups, key) if g != "_all"}
        name = (_label(shown) or y) + (" (median)" if aggregate else "")
        if aggregate:
            series = part.groupby(x, sort=True)[y].median()
            texts = [f"{name}, {x.split('.')[-1]}={v}" for v in series.index]
        else:
            part = part.sort_values([x, "sweep.index"] if "sweep.index" in part.columns else x)
            series = part.set_index(x)[y]
            texts = _configs(part, varying)
        variant = rests.index(str(key[1:]))
        traces.append(go.Scatter(
            x=series.index.tolist(), y=series.tolist(), mode="lines+markers", name=name, text=texts,
            line={"color": palette[firsts.index(str(key[0]))], "dash": _DASHES[variant % len(_DASHES)]},
            marker={"symbol": _SYMBOLS[variant % len(_SYMBOLS)]},
            hovertemplate=f"%{{text}}<br>{y}=%{{y:.4g}}<extra></extra>"))
    return traces


def _against(ok: pd.DataFrame, varying: list[str], x: str, y: str) -> tuple[go.Figure, str] | None:
    """`y` against `x` (a varied input), one line and one colour per schedule (else K, else
    another varying input), the other varying inputs in dashes and markers, on a log x axis
    ticked at the values used; with what the colour stands for, in words. None when `x` is fixed."""
    if x not in varying:
        return None
    colour = colour_axis(ok, varying, exclude=(x,))
    others = [c for c in varying if c not in (x, colour)]
    fig = go.Figure(_lines(ok, x, y, colour, others, varying))
    log_x_axis(fig, ok[x].tolist())
    return fig, "schedule" if colour == S else (colour.split(".")[-1] if colour else "configuration")


def figure_step_time(ok: pd.DataFrame, varying: list[str]) -> go.Figure | None:
    """Step time against M, one line (and one colour) per schedule; K and the other varying
    inputs in dashes and markers."""
    drawn = _against(ok, varying, M, "step_time_s")
    if drawn is None:
        return None
    fig, what = drawn
    fig.update_layout(title=f"Step time against M, one line per {what}", xaxis_title="micro-batches M",
                      yaxis_title="step time (s)")
    return fig


def figure_bubble(ok: pd.DataFrame, varying: list[str]) -> go.Figure | None:
    """The bubble fraction against M (as `figure_step_time`), with each (schedule, K, v)'s
    analytic bubble as dotted reference lines (the rows' own `analytic_bubble_fraction`, the
    schedule family's formula), hidden until picked in the legend."""
    drawn = _against(ok, varying, M, "bubble_fraction")
    if drawn is None:
        return None
    fig, what = drawn
    keys = [c for c in ("pipeline.schedule", K, "pipeline.chunks") if c in ok.columns]
    for key, rows in ok.groupby(keys, dropna=False, sort=True):
        line = rows.groupby(M, sort=True)["analytic_bubble_fraction"].first()
        label = ", ".join(f"{c.split('.')[-1]}={v}" for c, v in zip(keys, key if isinstance(key, tuple) else (key,)))
        fig.add_trace(go.Scatter(
            x=list(line.index), y=list(line.values), mode="lines", name=f"analytic, {label}",
            line={"dash": "dot", "width": 1, "color": "#888888"}, visible="legendonly",
        ))
    fig.update_layout(title=f"Bubble fraction against M, one line per {what}", xaxis_title="micro-batches M",
                      yaxis_title="bubble fraction")
    return fig


def figure_throughput(ok: pd.DataFrame, varying: list[str]) -> go.Figure | None:
    """Throughput against K (as `figure_step_time`, against K)."""
    drawn = _against(ok, varying, K, "throughput_samples_per_s")
    if drawn is None:
        return None
    fig, _ = drawn
    fig.update_layout(title="Throughput against K", xaxis_title="stages K", yaxis_title="samples / s")
    return fig


def figure_memory(ok: pd.DataFrame, varying: list[str] | None = None) -> go.Figure | None:
    """Every stage's peak memory, a dot per stage of each configuration (coloured by schedule, else
    K), its configuration in the hover."""
    rows = ok.dropna(subset=["stage_peak_memory_bytes"])
    if rows.empty:
        return None
    varying = list(varying or [])
    colour = colour_axis(rows, varying) or (K if K in rows.columns else None)
    fig = go.Figure()
    values = sorted(rows[colour].unique(), key=lambda v: (str(type(v)), v)) if colour else ["all"]
    values = values[:MAX_TRACES]
    palette = _palette(colour or "", [str(v) for v in values])
    for value, color in zip(values, palette):
        part = rows if colour is None else rows[rows[colour] == value]
        xs, ys, texts = [], [], []
        for (_, row), config in zip(part.iterrows(), _configs(part, varying)):
            for stage, peak in enumerate(_as_list(row["stage_peak_memory_bytes"])):
                xs.append(stage)
                ys.append(peak / GIB)
                texts.append(config)
        name = f"{colour.split('.')[-1]}={value}" if colour else "all"
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=name, text=texts,
                                 marker={"size": 6, "opacity": 0.7, "color": color},
                                 hovertemplate="%{text}<br>stage %{x}: %{y:.2f} GiB<extra></extra>"))
    caps = sorted({float(c) for c in rows["memory_capacity_bytes"].dropna()})
    for cap in caps[:6]:
        fig.add_hline(y=cap / GIB, line_dash="dash", line_color="red",
                      annotation_text=f"capacity {cap / GIB:.1f} GiB")
    fig.update_layout(title="Per-stage peak memory against capacity", xaxis_title="stage",
                      yaxis_title="peak memory (GiB)")
    fig.update_xaxes(tickmode="linear", dtick=1)
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


def _notes(table: pd.DataFrame) -> str:
    """The rows' notes (fields filled in for a schedule, values meaningless to it), each once."""
    if "note" not in table.columns:
        return ""
    counts = table["note"].dropna().astype(str).str.split("; ").explode().value_counts(sort=False)
    if counts.empty:
        return ""
    items = "".join(f"<li>{html.escape(str(note))} ({n} row{'s' if n != 1 else ''})</li>"
                    for note, n in counts.items())
    return f"<h2>Notes</h2><ul>{items}</ul>"


def build_report(table: pd.DataFrame, title: str = "sweep", axes: list[str] | None = None) -> str:
    """The whole report as one HTML string (plotly's JavaScript inlined once); `axes` names the
    sweep's varied fields (default: every input column that varies)."""
    ok = table[table["status"] == "ok"]
    varying = varying_inputs(table, axes)
    figures = []
    if not ok.empty:
        for fig in (figure_step_time(ok, varying), figure_bubble(ok, varying), figure_throughput(ok, varying),
                    figure_memory(ok, varying)):
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
        f"</head><body><h1>{html.escape(title)}</h1><p>{html.escape(summary)}</p>" + _notes(table)
        + "".join(f"<div>{p}</div>" for p in parts)
        + "<h2>Failed scenarios</h2>" + _failures(table) + "</body></html>"
    )


def write_report(table: pd.DataFrame, path: str | Path, title: str = "sweep",
                 axes: list[str] | None = None) -> Path:
    """Write the report to `path` (normally DIR/report.html)."""
    path = Path(path)
    path.write_text(build_report(table, title, axes))
    return path
