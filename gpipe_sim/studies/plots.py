"""Plotly figure builders for results: timeline Gantt, memory, bubble vs M, predicted vs measured, sweeps."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gpipe_sim.results.result import Result, Timeline
from gpipe_sim.schedule import ACTION_KINDS, SCHEDULES

KIND_COLORS: dict[str, str] = {
    "forward": "#4C78A8",
    "backward": "#F58518",
    "backward_input": "#E45756",
    "backward_weight": "#FFBF79",
    "recompute": "#B279A2",
    "send": "#54A24B",
    "recv": "#9ACD78",
    "update": "#8C8C8C",
    "allreduce": "#17BECF",
}
# Bar placement within a rank's row, as (offset, thickness) in row units; transfers get thin lanes
# above and below the compute lane so that they never hide compute.
_LANES: dict[str, tuple[float, float]] = {
    "recv": (-0.46, 0.14),
    "send": (0.32, 0.07),
    "allreduce": (0.40, 0.07),  # a data-parallel reduction runs beside compute, on the network
}
_COMPUTE_LANE = (-0.3, 0.6)
# Below the time axis, so that it never covers a title in narrow (side-by-side) charts.
_BOTTOM_LEGEND = dict(orientation="h", yanchor="bottom", y=0.0, yref="container", xanchor="left", x=0.0)
GIB = 2.0**30
_GOLDEN = 0.381966  # hue step between neighbouring ranks (the golden angle): neighbours never look alike


def rank_colors(n: int) -> list[str]:
    """One colour per rank, `n` of them, neighbours far apart in hue (and alternating in lightness),
    all distinct: rank k's hue is k golden-angle steps round the wheel."""
    import colorsys

    out = []
    for k in range(n):
        hue = (0.6 + k * _GOLDEN) % 1.0
        light = (0.42, 0.58)[k % 2] if n > 8 else 0.48
        r, g, b = colorsys.hls_to_rgb(hue, light, 0.75)
        out.append(f"#{round(255 * r):02x}{round(255 * g):02x}{round(255 * b):02x}")
    return out


def time_unit(seconds: float) -> tuple[str, float]:
    """A readable unit for a time axis spanning `seconds`: (name, seconds per unit)."""
    if seconds >= 1.0:
        return "s", 1.0
    if seconds >= 1e-3:
        return "ms", 1e-3
    return "us", 1e-6


@dataclass(frozen=True)
class GanttBars:
    """Bars to draw, one row per rank; `actions` counts the timeline's actions.

    Few actions: one bar per action. Many (`merged`): consecutive actions of one kind on one rank
    are merged into runs, each drawn as long as its busy time (never its span), inside its span,
    on its rank's lane (compute, send or recv) without overlapping another bar there; a run may
    be drawn in a few pieces. So per rank and kind the drawn lengths add up to the time the rank
    ran that kind. A bar lies within its `gap_s` (the longest gap its run closed) of an action of
    its kind, so idle gaps longer than that are never painted, and it draws its run's busy time
    within `shift_s` (the run's gaps summed) of where that work ran.
    """

    rank: np.ndarray
    kind: np.ndarray
    chunks: np.ndarray  # text per bar: "3", "0, 4", "-" (the update)
    first_micro_batch: np.ndarray
    last_micro_batch: np.ndarray
    count: np.ndarray  # the actions of the bar's run
    start_s: np.ndarray  # drawn
    end_s: np.ndarray
    span_start_s: np.ndarray  # the run's first start and last end
    span_end_s: np.ndarray
    busy_s: np.ndarray  # the run's busy time (all its pieces together)
    gap_s: np.ndarray  # the longest gap between two actions of the run
    shift_s: np.ndarray  # the run's gaps summed: its span less its busy time
    actions: int
    merged: bool

    def __len__(self) -> int:
        return len(self.rank)

    def _max(self, values: np.ndarray, compute: bool | None = None) -> float:
        if compute is not None:
            values = values[~np.isin(self.kind, list(_LANE_CODES)) == compute]
        return float(values.max()) if len(values) else 0.0

    def max_gap_s(self, compute: bool | None = None) -> float:
        """The longest gap merged over, on every lane, the compute lane or the transfer lanes."""
        return self._max(self.gap_s, compute)

    def max_shift_s(self, compute: bool | None = None) -> float:
        """The most that busy time is drawn away from where it ran (see `max_gap_s`)."""
        return self._max(self.shift_s, compute)

    @property
    def note(self) -> str:
        """A sentence saying how the drawing differs from the full timeline ('' when it does not)."""
        if not self.merged:
            return ""

        def text(seconds: float) -> str:
            unit, scale = time_unit(seconds)
            return f"{seconds / scale:.3g} {unit}"

        note = (f"The timeline has {self.actions:,} actions: adjacent actions of one kind on one rank "
                f"are merged into {len(self):,} bars, each as long as the busy time it stands for. "
                f"Compute is drawn within {text(self.max_shift_s(True))} of where it ran and idle gaps "
                f"longer than {text(self.max_gap_s(True))} are never painted")
        if self.max_shift_s(False) > self.max_shift_s(True) or self.max_gap_s(False) > self.max_gap_s(True):
            note += (f" (transfers: {text(self.max_shift_s(False))} and "
                     f"{text(self.max_gap_s(False))})")
        return note + ". Hover shows the chunks and micro-batches."


_LANE_CODES = {ACTION_KINDS.index("send"): 1, ACTION_KINDS.index("recv"): 2,
               ACTION_KINDS.index("allreduce"): 3}  # else the compute lane
# Gaps (idle time, other kinds' work) are kept first: all gaps longer than _KEEP_GAP of the step
# where the bars allow, at least _GAP_SHARE of the bars; the rest cut runs finer. Transfers, in
# their thin lanes, count their gaps _TRANSFER_WEIGHT as long as compute does.
_KEEP_GAP = 5e-3
_GAP_SHARE = 0.5
_TRANSFER_WEIGHT = 0.25


def _chunk_text(chunks: np.ndarray) -> np.ndarray:
    return np.array(["-" if c < 0 else str(c) for c in chunks.tolist()], dtype=object)


def _exact_bars(timeline: Timeline) -> GanttBars:
    start = np.asarray(timeline.start_s, dtype=float)
    end = np.asarray(timeline.end_s, dtype=float)
    mb = np.asarray(timeline.micro_batch)
    zero = np.zeros(len(start))
    return GanttBars(np.asarray(timeline.rank), np.asarray(timeline.kind), _chunk_text(np.asarray(timeline.chunk)),
                     mb, mb, np.ones(len(start), dtype=int), start, end, start, end, end - start, zero, zero,
                     len(start), merged=False)


@dataclass
class _Actions:
    """A timeline's actions that take time, sorted by rank, kind and start, with what merging needs."""

    rank: np.ndarray
    kind: np.ndarray
    chunk: np.ndarray
    micro_batch: np.ndarray
    start: np.ndarray
    end: np.ndarray
    first: np.ndarray  # the first action of its rank and kind
    gap: np.ndarray  # start minus the latest end before it of its rank and kind (0 for the first)
    weighed: np.ndarray  # positive gaps, transfers' weighed down
    weighed_before: np.ndarray  # `weighed` of its rank and kind up to it, summed
    new_time: np.ndarray  # the part of the action no earlier one of its rank and kind covers
    groups: int  # (rank, kind) pairs

    @classmethod
    def of(cls, timeline: Timeline) -> "_Actions":
        start = np.asarray(timeline.start_s, dtype=float)
        end = np.asarray(timeline.end_s, dtype=float)
        keep = np.flatnonzero(end > start)  # instantaneous actions: nothing to draw
        keep = keep[np.lexsort((start[keep], np.asarray(timeline.kind)[keep], np.asarray(timeline.rank)[keep]))]
        rank, kind = np.asarray(timeline.rank)[keep], np.asarray(timeline.kind)[keep]
        start, end = start[keep], end[keep]
        n = len(keep)
        first = np.ones(n, dtype=bool)
        first[1:] = (rank[1:] != rank[:-1]) | (kind[1:] != kind[:-1])
        group = np.cumsum(first) - 1
        # The latest end so far within each (rank, kind): groups offset apart, one accumulate.
        offset = group * (4.0 * max(float(end.max()) if n else 1.0, 1e-300))
        latest = np.maximum.accumulate(end + offset) - offset
        before = np.empty(n)
        before[1:] = latest[:-1]
        before[first] = start[first]
        gap = start - before
        weighed = np.maximum(gap, 0.0) * np.where(np.isin(kind, list(_LANE_CODES)), _TRANSFER_WEIGHT, 1.0)
        total = np.cumsum(weighed)
        weighed_before = total - total[np.flatnonzero(first)][group]
        new_time = np.maximum(0.0, end - np.maximum(start, before))
        return cls(rank, kind, np.asarray(timeline.chunk)[keep], np.asarray(timeline.micro_batch)[keep],
                   start, end, first, gap, weighed, weighed_before, new_time, int(group[-1]) + 1 if n else 0)

    def gap_breaks(self, runs: int) -> np.ndarray:
        """Where runs start when the longest (weighed) gaps split them, for at most `runs` runs
        (one per rank and kind if fewer). Among gaps as long as the longest one closed, evenly
        spread ones stay open too as far as the budget goes (uniform schedules have many)."""
        breaks = self.first.copy()
        budget = runs - self.groups
        inner = np.flatnonzero(~self.first & (self.weighed > 0))
        if budget <= 0 or not len(inner):
            return breaks
        gaps = self.weighed[inner]
        if budget >= len(inner):
            breaks[inner] = True
            return breaks
        tolerance = float(-np.partition(-gaps, budget)[budget])  # at most `budget` gaps exceed it
        wider = gaps > tolerance
        breaks[inner[wider]] = True
        tied = inner[~wider & (gaps >= tolerance * (1 - 1e-9))]
        spare = budget - int(np.count_nonzero(wider))
        if spare > 0 and len(tied):
            pick = np.unique(np.linspace(0, len(tied) - 1, min(spare, len(tied))).round().astype(int))
            breaks[tied[pick]] = True
        return breaks

    def shift_breaks(self, breaks: np.ndarray, runs: int) -> np.ndarray:
        """`breaks` plus cuts that keep each run's (weighed) gaps, summed, under the smallest bound
        that leaves about `runs` runs: so alternating kinds show as alternating bars."""
        first = np.flatnonzero(breaks)
        slack = np.add.reduceat(np.where(breaks, 0.0, self.weighed), first) if len(first) else np.empty(0)
        spare = runs - len(first)
        if spare <= 0 or not np.any(slack > 0):
            return breaks
        lo, hi = 0.0, float(slack.max())
        for _ in range(50):  # bisect on the cuts each run would take
            mid = 0.5 * (lo + hi)
            if mid <= 0 or np.floor(slack / mid).sum() > spare:
                lo = mid
            else:
                hi = mid
        cell = np.floor(self.weighed_before / hi)
        cuts = np.zeros(len(cell), dtype=bool)
        cuts[1:] = cell[1:] != cell[:-1]
        return breaks | cuts


def _edf(release: np.ndarray, deadline: np.ndarray, length: np.ndarray,
         eps: float) -> list[tuple[int, float, float]]:
    """Place each job (a run) as pieces of total `length` inside [release, deadline] on one lane,
    no two overlapping: preemptive earliest-deadline-first, which finds such a placement whenever
    one exists, and one does: where the actions ran. Returns (job, start, end) pieces."""
    order = np.argsort(release, kind="stable")
    rel, dl, remaining = release[order].tolist(), deadline[order].tolist(), length[order].tolist()
    n, i, t = len(rel), 0, -math.inf
    ready: list[tuple[float, int]] = []
    pieces: list[tuple[int, float, float]] = []
    while i < n or ready:
        if not ready:
            t = max(t, rel[i])
        while i < n and rel[i] <= t:
            heapq.heappush(ready, (dl[i], i))
            i += 1
        _, j = ready[0]
        until = min(t + remaining[j], rel[i] if i < n else math.inf)
        if until > t:
            if pieces and pieces[-1][0] == j and pieces[-1][2] == t:
                pieces[-1] = (j, pieces[-1][1], until)
            else:
                pieces.append((j, t, until))
            remaining[j] -= until - t
            t = until
        if remaining[j] <= eps:
            heapq.heappop(ready)
    return [(int(order[j]), a, b) for j, a, b in pieces]


def _merged_bars(acts: _Actions, breaks: np.ndarray, actions: int) -> GanttBars:
    n = len(acts.start)
    first = np.flatnonzero(breaks)
    run_id = np.cumsum(breaks) - 1
    rank, kind = acts.rank[first], acts.kind[first]
    span_start = acts.start[first]
    if n:
        span_end = np.maximum.reduceat(acts.end, first)
        busy = np.add.reduceat(acts.new_time, first)
        gap = np.maximum.reduceat(np.where(breaks, 0.0, np.maximum(acts.gap, 0.0)), first)
        lo = np.minimum.reduceat(acts.micro_batch, first)
        hi = np.maximum.reduceat(acts.micro_batch, first)
    else:
        span_end = busy = gap = np.empty(0)
        lo = hi = np.empty(0, dtype=int)
    count = np.diff(np.append(first, n))
    shift = np.maximum(span_end - span_start - busy, 0.0)
    # Each run's chunks, as text.
    width = int(acts.chunk.max()) + 2 if n else 1  # chunk -1 (the update) in column 0
    if len(first) * width <= 1 << 23:
        held = np.zeros((len(first), width), dtype=bool)
        held[run_id, acts.chunk + 1] = True
        which, column = np.nonzero(held)
    else:  # very many chunks: sort instead
        pairs = np.unique(run_id.astype(np.int64) * width + acts.chunk + 1)
        which, column = pairs // width, pairs % width
    bounds = np.searchsorted(which, np.arange(len(first) + 1)).tolist()
    names = ["-"] + [str(c) for c in range(width - 1)]
    column_list = column.tolist()
    chunks = np.array([", ".join(names[c] for c in column_list[a:b]) for a, b in zip(bounds[:-1], bounds[1:])],
                      dtype=object)
    # Lay each rank's lanes out, every run as long as its busy time.
    lane = np.zeros(len(first), dtype=np.int64)
    for code, number in _LANE_CODES.items():
        lane[kind == code] = number
    eps = 1e-12 * (float(span_end.max()) if n else 0.0)
    key = rank.astype(np.int64) * 4 + lane
    order = np.argsort(key, kind="stable")
    job: list[int] = []
    start: list[float] = []
    end: list[float] = []
    for members in np.split(order, np.flatnonzero(np.diff(key[order])) + 1):
        if len(members):
            for j, a, b in _edf(span_start[members], span_end[members], busy[members], eps):
                job.append(int(members[j]))
                start.append(a)
                end.append(b)
    pick = np.asarray(job, dtype=int)
    return GanttBars(rank[pick], kind[pick], chunks[pick], lo[pick], hi[pick], count[pick],
                     np.asarray(start, dtype=float), np.asarray(end, dtype=float), span_start[pick],
                     span_end[pick], busy[pick], gap[pick], shift[pick], actions, merged=True)


def gantt_bars(timeline: Timeline, max_bars: int = 2500) -> GanttBars:
    """The timeline's actions as at most `max_bars` bars that never misstate busy time.

    Up to `max_bars` actions: one bar per action. Beyond, the actions of one kind on one rank are
    merged into runs: first split at the longest gaps (idle time, or other kinds' work), then cut
    where a run's gaps add up to a bound, the smallest the rest of the bars allow; transfers'
    gaps count less than compute's. Each run is drawn as long as its busy time, inside its span
    (see GanttBars). Where the budget is below two bars per rank and kind, that many are drawn.
    """
    n = len(timeline)
    if n <= max_bars:
        return _exact_bars(timeline)
    acts = _Actions.of(timeline)
    visible = acts.groups + int(np.count_nonzero(acts.weighed > _KEEP_GAP * float(np.max(timeline.end_s))))
    target = int(0.9 * max_bars)  # room for runs laid out in pieces
    while True:
        breaks = acts.gap_breaks(min(target, max(int(_GAP_SHARE * target), visible)))
        breaks = acts.shift_breaks(breaks, target)
        bars = _merged_bars(acts, breaks, n)
        if len(bars) <= max_bars or breaks.sum() == acts.groups:
            return bars
        target = min(target - 1, int(target * max_bars / len(bars) * 0.95))


def _hover_lines(bars: GanttBars, sel: np.ndarray, scale: float, unit: str) -> list[str]:
    lo, hi, cnt = bars.first_micro_batch[sel].tolist(), bars.last_micro_batch[sel].tolist(), bars.count[sel].tolist()
    chunks = bars.chunks[sel].tolist()
    start, end = (bars.start_s[sel] / scale).tolist(), (bars.end_s[sel] / scale).tolist()
    if not bars.merged:
        return [f"chunk {c}<br>micro-batch {'-' if a < 0 else a}<br>{s:.6g} - {e:.6g} {unit}"
                for c, a, s, e in zip(chunks, lo, start, end)]
    busy = (bars.busy_s[sel] / scale).tolist()
    s0, s1 = (bars.span_start_s[sel] / scale).tolist(), (bars.span_end_s[sel] / scale).tolist()
    lines = []
    for c, a, b, n, w, x0, x1 in zip(chunks, lo, hi, cnt, busy, s0, s1):
        what = "micro-batch -" if a < 0 else (f"micro-batch {a}" if a == b else f"micro-batches {a}-{b}")
        lines.append(f"chunk{'s' if ',' in c else ''} {c}<br>{what} ({n} action{'s' if n != 1 else ''})<br>"
                     f"busy {w:.4g} {unit} within {x0:.6g} - {x1:.6g} {unit}")
    return lines


def _gantt_traces(bars: GanttBars, scale: float, unit: str, legend: bool,
                  legendgroup_suffix: str = "") -> list[go.Bar]:
    traces = []
    for code, name in enumerate(ACTION_KINDS):
        sel = bars.kind == code
        if not sel.any():
            continue
        offset, width = _LANES.get(name, _COMPUTE_LANE)
        start, end = bars.start_s[sel] / scale, bars.end_s[sel] / scale
        outline = dict(width=0.6, color="white") if len(bars) <= 1200 else dict(width=0)
        traces.append(go.Bar(
            name=name, legendgroup=name + legendgroup_suffix, showlegend=legend,
            orientation="h", y=bars.rank[sel], base=start, x=end - start,
            offset=offset, width=width, marker=dict(color=KIND_COLORS[name], line=outline),
            hovertext=_hover_lines(bars, sel, scale, unit),
            hovertemplate=f"rank %{{y}}<br>{name}, %{{hovertext}}<extra></extra>",
        ))
    return traces


def _rank_axis(fig: go.Figure, ranks: int, row: int | None = None, col: int | None = None) -> None:
    fig.update_yaxes(
        autorange="reversed", tickmode="array", tickvals=list(range(ranks)),
        ticktext=[f"rank {k}" for k in range(ranks)], row=row, col=col,
    )


def timeline_figure(timeline: Timeline, *, title: str = "Schedule timeline", max_bars: int = 2500,
                    x_range_s: float | None = None) -> tuple[go.Figure, GanttBars]:
    """Gantt chart: one row per rank, actions coloured by kind, chunk and micro-batch on hover."""
    bars = gantt_bars(timeline, max_bars)
    span = x_range_s or (float(bars.end_s.max()) if len(bars) else 0.0)
    unit, scale = time_unit(span)
    ranks = int(np.max(timeline.rank)) + 1 if len(timeline) else 0
    fig = go.Figure(_gantt_traces(bars, scale, unit, legend=True))
    fig.update_layout(
        title=title, barmode="overlay", bargap=0, xaxis_title=f"time ({unit})",
        height=max(260, 160 + 34 * ranks), margin=dict(l=10, r=10, t=50, b=100),
        legend=_BOTTOM_LEGEND,
    )
    if x_range_s:
        fig.update_xaxes(range=[0, x_range_s / scale])
    _rank_axis(fig, ranks)
    return fig, bars


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


def memory_timeline_figure(result: Result, *, max_points_per_stage: int = 600) -> go.Figure:
    """Each rank's memory (static + activations held) over the step, with the device capacity."""
    unit, scale = time_unit(result.step_time_s)
    fig = go.Figure()
    colors = rank_colors(len(result.memory_timeline))
    for k, (times, held) in enumerate(result.memory_timeline):
        stage = result.stages[k]
        static = stage.param_bytes + stage.state_bytes
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
    title = "Memory over time (parameters, states and activations held)"
    if peak >= 0.5 * cap:
        _capacity_line(fig, cap)
    elif math.isfinite(cap):
        title += f"<br><sup>device capacity {cap / GIB:.1f} GiB is off the chart</sup>"
    fig.update_layout(title=title,
                      xaxis_title=f"time ({unit})", yaxis_title="GiB", height=360,
                      margin=dict(l=10, r=10, t=50, b=40))
    fig.update_yaxes(rangemode="tozero")  # memory from 0: the static part is a real share
    fig.update_xaxes(range=[0, result.step_time_s / scale] if result.step_time_s > 0 else None)
    return fig


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
    rest = [max(s.peak_memory_bytes - s.param_bytes - s.state_bytes - h - t, 0.0)
            for s, h, t in zip(stages, held, temporaries)]
    fig = go.Figure()
    parts = (("parameters", [s.param_bytes for s in stages], "#72B7B2"),
             ("gradients + optimizer states", [s.state_bytes for s in stages], "#EECA3B"),
             ("activations held" if at_peak else "peak activations", held, "#E45756"),
             ("temporaries (running pass or update)", temporaries, "#B279A2"),
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
    ticks = [2**i for i in range(int(math.log2(m_max)) + 2) if 2**i <= 2 * m_max]
    fig.update_xaxes(tickvals=ticks, ticktext=[str(t) for t in ticks])
    what = schedule if chunks == 1 else f"{schedule}, v={chunks}"
    fig.update_layout(title=f"Bubble fraction against micro-batches M ({what})", xaxis_type="log",
                      xaxis_title="micro-batches M", yaxis_title="bubble fraction", height=380,
                      yaxis_range=[0, 1], margin=dict(l=10, r=10, t=50, b=40))
    return fig


def compare_timelines_figure(timelines: Sequence[tuple[str, Timeline]], *,
                             max_bars: int = 2500) -> tuple[go.Figure, list[GanttBars]]:
    """Gantt charts stacked on one shared time axis (predicted vs measured, A vs B)."""
    span = max((float(t.end_s.max()) for _, t in timelines if len(t)), default=0.0)
    unit, scale = time_unit(span)
    sizes = [int(np.max(t.rank)) + 1 if len(t) else 1 for _, t in timelines]
    fig = make_subplots(rows=len(timelines), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[name for name, _ in timelines], row_heights=sizes)
    all_bars = []
    for row, (_, timeline) in enumerate(timelines, start=1):
        bars = gantt_bars(timeline, max_bars)
        all_bars.append(bars)
        for trace in _gantt_traces(bars, scale, unit, legend=row == 1):
            fig.add_trace(trace, row=row, col=1)
        _rank_axis(fig, sizes[row - 1], row=row, col=1)
    fig.update_layout(barmode="overlay", bargap=0, height=max(340, 160 + 34 * sum(sizes)),
                      margin=dict(l=10, r=10, t=50, b=100), legend=_BOTTOM_LEGEND)
    fig.update_xaxes(title_text=f"time ({unit})", row=len(timelines), col=1)
    return fig, all_bars


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
    palette = rank_colors(len(colours)) if len(colours) > 1 else [None]
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
        fig.update_xaxes(type="log")
    fig.update_layout(title=f"{y} against {x}", xaxis_title=x, yaxis_title=y, height=420,
                      legend_title_text=", ".join([c for c in (color, *split) if c]),
                      margin=dict(l=10, r=10, t=50, b=40))
    return fig


_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "star")


def _equal(column: Any, value: Any) -> Any:
    """Rows of `column` equal to `value` (NaN equal to NaN)."""
    if isinstance(value, float) and math.isnan(value):
        return column.isna()
    return column == value
