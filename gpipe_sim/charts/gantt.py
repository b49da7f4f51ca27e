"""Timeline (Gantt) charts: a timeline's actions as bars per rank, merged when there are very many."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gpipe_sim.results.result import Timeline
from gpipe_sim.schedule import ACTION_KINDS
from gpipe_sim.charts.style import time_unit

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
# Tensor-parallel collectives: a thinner, darker bar inside the pass bar they belong to.
_TP_LANE = (-0.14, 0.28)
TP_NAME = "tensor-parallel collectives (inside the pass, drawn at its end)"
_TP_COLOR = "rgba(0, 0, 0, 0.55)"
# Below the time axis, so that it never covers a title in narrow (side-by-side) charts.
_BOTTOM_LEGEND = dict(orientation="h", yanchor="bottom", y=0.0, yref="container", xanchor="left", x=0.0)


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

    `tp_s` (None where the timeline has no such column): per bar, the seconds tensor-parallel
    collectives add to its run's actions, summed (a bar of one action: its own); `drawn_tp_s`
    is the part of it drawn in this bar, so that per rank the drawn parts add up to the total.
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
    tp_s: np.ndarray | None = None

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
    def drawn_tp_s(self) -> np.ndarray | None:
        """Per bar, the length of its collectives overlay (None without `tp_s`): its run's `tp_s`
        shared among the run's pieces as their lengths share its busy time (a bar of one action:
        its own `tp_s`), never longer than the bar, drawn at the bar's end."""
        if self.tp_s is None:
            return None
        length = self.end_s - self.start_s
        share = np.divide(length, self.busy_s, out=np.zeros(len(length)), where=self.busy_s > 0)
        return np.minimum(self.tp_s * share, length)

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
    """Each action's chunk as text, "-" for the update (chunk -1)."""
    return np.array(["-" if c < 0 else str(c) for c in chunks.tolist()], dtype=object)


def _exact_bars(timeline: Timeline) -> GanttBars:
    """One bar per action, drawn where it ran (no gaps closed, nothing shifted)."""
    start = np.asarray(timeline.start_s, dtype=float)
    end = np.asarray(timeline.end_s, dtype=float)
    mb = np.asarray(timeline.micro_batch)
    zero = np.zeros(len(start))
    tp = None if timeline.tp_s is None else np.asarray(timeline.tp_s, dtype=float)
    return GanttBars(np.asarray(timeline.rank), np.asarray(timeline.kind), _chunk_text(np.asarray(timeline.chunk)),
                     mb, mb, np.ones(len(start), dtype=int), start, end, start, end, end - start, zero, zero,
                     len(start), merged=False, tp_s=tp)


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
    tp: np.ndarray | None  # the seconds tensor-parallel collectives add to it (None: not known)

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
        tp = None if timeline.tp_s is None else np.asarray(timeline.tp_s, dtype=float)[keep]
        return cls(rank, kind, np.asarray(timeline.chunk)[keep], np.asarray(timeline.micro_batch)[keep],
                   start, end, first, gap, weighed, weighed_before, new_time, int(group[-1]) + 1 if n else 0, tp)

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
    """The runs that `breaks` starts (one per True) as bars: each run laid out by `_edf` on its
    rank's lane as long as its busy time, inside its span; `actions` is the timeline's count."""
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
    tp = None
    if acts.tp is not None:
        tp = (np.add.reduceat(acts.tp, first) if n else np.empty(0))[pick]
    return GanttBars(rank[pick], kind[pick], chunks[pick], lo[pick], hi[pick], count[pick],
                     np.asarray(start, dtype=float), np.asarray(end, dtype=float), span_start[pick],
                     span_end[pick], busy[pick], gap[pick], shift[pick], actions, merged=True, tp_s=tp)


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


def _tp_suffixes(bars: GanttBars, sel: np.ndarray, scale: float, unit: str) -> list[str]:
    """Per bar of `sel`: "<br>of which TP collectives X" where its run's collectives add time, else ''."""
    if bars.tp_s is None:
        return [""] * int(np.count_nonzero(sel))
    return [f"<br>of which TP collectives {x:.4g} {unit}" if x > 0 else "" for x in (bars.tp_s[sel] / scale).tolist()]


def _hover_lines(bars: GanttBars, sel: np.ndarray, scale: float, unit: str) -> list[str]:
    """Hover text of the bars `sel`: chunks, micro-batches and times (busy time and span if merged),
    and the seconds of it that tensor-parallel collectives add (the run's, summed, if merged)."""
    lo, hi, cnt = bars.first_micro_batch[sel].tolist(), bars.last_micro_batch[sel].tolist(), bars.count[sel].tolist()
    chunks = bars.chunks[sel].tolist()
    start, end = (bars.start_s[sel] / scale).tolist(), (bars.end_s[sel] / scale).tolist()
    tp = _tp_suffixes(bars, sel, scale, unit)
    if not bars.merged:
        return [f"chunk {c}<br>micro-batch {'-' if a < 0 else a}<br>{s:.6g} - {e:.6g} {unit}{x}"
                for c, a, s, e, x in zip(chunks, lo, start, end, tp)]
    busy = (bars.busy_s[sel] / scale).tolist()
    s0, s1 = (bars.span_start_s[sel] / scale).tolist(), (bars.span_end_s[sel] / scale).tolist()
    lines = []
    for c, a, b, n, w, x0, x1, x in zip(chunks, lo, hi, cnt, busy, s0, s1, tp):
        what = "micro-batch -" if a < 0 else (f"micro-batch {a}" if a == b else f"micro-batches {a}-{b}")
        lines.append(f"chunk{'s' if ',' in c else ''} {c}<br>{what} ({n} action{'s' if n != 1 else ''})<br>"
                     f"busy {w:.4g} {unit} within {x0:.6g} - {x1:.6g} {unit}{x}")
    return lines


def row_names(ranks: int, stages: int | None = None) -> list[str]:
    """The Gantt rows' names: "rank k"; with `stages` K per replica and more rows than K (D x K
    global ranks, replica d's rank r on row d*K + r), "replica d · rank r"."""
    if not stages or ranks <= stages:
        return [f"rank {k}" for k in range(ranks)]
    return [f"replica {k // stages} · rank {k % stages}" for k in range(ranks)]


def _tp_trace(bars: GanttBars, scale: float, unit: str, legend: bool, legendgroup_suffix: str,
              labels: np.ndarray) -> go.Bar | None:
    """The tensor-parallel collectives overlay: on every bar whose run they add time to, a thinner,
    darker bar `drawn_tp_s` long at the bar's end, inside it (None where no bar has any)."""
    drawn, total = bars.drawn_tp_s, bars.tp_s
    if drawn is None or total is None or not np.any(drawn > 0):
        return None
    sel = drawn > 0
    end, length = bars.end_s[sel] / scale, drawn[sel] / scale
    kinds = [ACTION_KINDS[int(k)] for k in bars.kind[sel].tolist()]
    if bars.merged:
        text = [f"{k}: the run's TP collectives {t:.4g} {unit} (this bar: {x:.4g} {unit}), drawn at its end"
                for k, t, x in zip(kinds, (total[sel] / scale).tolist(), length.tolist())]
    else:
        text = [f"{k}: TP collectives {t:.4g} {unit}, inside the pass (drawn at its end)"
                for k, t in zip(kinds, (total[sel] / scale).tolist())]
    return go.Bar(
        name=TP_NAME, legendgroup="tp" + legendgroup_suffix, showlegend=legend, orientation="h",
        y=bars.rank[sel], base=end - length, x=length, offset=_TP_LANE[0], width=_TP_LANE[1],
        marker=dict(color=_TP_COLOR, line=dict(width=0)), hovertext=text, customdata=labels[bars.rank[sel]],
        hovertemplate="%{customdata}<br>%{hovertext}<extra></extra>",
    )


def _gantt_traces(bars: GanttBars, scale: float, unit: str, legend: bool,
                  legendgroup_suffix: str = "", names: Sequence[str] | None = None,
                  tp_legend: bool | None = None) -> list[go.Bar]:
    """One horizontal bar trace per action kind present, on its lane, coloured by KIND_COLORS,
    then the tensor-parallel collectives overlay where any (its legend entry per `tp_legend`,
    default `legend`); the hover names each bar's row (`names`, by global rank; default "rank k")."""
    traces = []
    ranks = int(bars.rank.max()) + 1 if len(bars) else 0
    labels = np.asarray(list(names) if names is not None else row_names(ranks), dtype=object)
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
            hovertext=_hover_lines(bars, sel, scale, unit), customdata=labels[bars.rank[sel]],
            hovertemplate=f"%{{customdata}}<br>{name}, %{{hovertext}}<extra></extra>",
        ))
    tp = _tp_trace(bars, scale, unit, legend if tp_legend is None else tp_legend, legendgroup_suffix, labels)
    if tp is not None:
        traces.append(tp)
    return traces


def _rank_axis(fig: go.Figure, ranks: int, row: int | None = None, col: int | None = None,
               stages: int | None = None) -> None:
    """A y axis labelled by `row_names` for `ranks` rows, rank 0 at the top; with several
    replicas (`stages` K each), a line between one replica's rows and the next's."""
    fig.update_yaxes(
        autorange="reversed", tickmode="array", tickvals=list(range(ranks)),
        ticktext=row_names(ranks, stages), row=row, col=col,
    )
    if stages and ranks > stages:
        for edge in range(stages, ranks, stages):
            where = {} if row is None else {"row": row, "col": col}
            fig.add_hline(y=edge - 0.5, line=dict(color="#888888", width=1, dash="dot"), **where)


def timeline_figure(timeline: Timeline, *, title: str = "Schedule timeline", max_bars: int = 2500,
                    x_range_s: float | None = None, stages: int | None = None) -> tuple[go.Figure, GanttBars]:
    """Gantt chart: one row per global rank, each drawn from its own actions (with D data-parallel
    replicas of `stages` K ranks: D x K rows, named "replica d · rank r"), actions coloured by kind,
    chunk and micro-batch on hover; where the timeline has `tp_s`, each pass bar's tensor-parallel
    collectives as a darker overlay at its end (`GanttBars.drawn_tp_s`)."""
    bars = gantt_bars(timeline, max_bars)
    span = x_range_s or (float(bars.end_s.max()) if len(bars) else 0.0)
    unit, scale = time_unit(span)
    ranks = int(np.max(timeline.rank)) + 1 if len(timeline) else 0
    fig = go.Figure(_gantt_traces(bars, scale, unit, legend=True, names=row_names(ranks, stages)))
    fig.update_layout(
        title=title, barmode="overlay", bargap=0, xaxis_title=f"time ({unit})",
        height=max(260, 160 + 34 * ranks), margin=dict(l=10, r=10, t=50, b=100),
        legend=_BOTTOM_LEGEND,
    )
    if x_range_s:
        fig.update_xaxes(range=[0, x_range_s / scale])
    _rank_axis(fig, ranks, stages=stages)
    return fig, bars


def compare_timelines_figure(timelines: Sequence[tuple[str, Timeline]], *, max_bars: int = 2500,
                             stages: int | None = None) -> tuple[go.Figure, list[GanttBars]]:
    """Gantt charts stacked on one shared time axis (predicted vs measured, A vs B); `stages` as
    for `timeline_figure`."""
    span = max((float(t.end_s.max()) for _, t in timelines if len(t)), default=0.0)
    unit, scale = time_unit(span)
    sizes = [int(np.max(t.rank)) + 1 if len(t) else 1 for _, t in timelines]
    fig = make_subplots(rows=len(timelines), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[name for name, _ in timelines], row_heights=sizes)
    all_bars: list[GanttBars] = []
    for row, (_, timeline) in enumerate(timelines, start=1):
        bars = gantt_bars(timeline, max_bars)
        tp_legend = not any(b.tp_s is not None and b.tp_s.any() for b in all_bars)  # the first row with any
        all_bars.append(bars)
        for trace in _gantt_traces(bars, scale, unit, legend=row == 1, names=row_names(sizes[row - 1], stages),
                                   tp_legend=tp_legend):
            fig.add_trace(trace, row=row, col=1)
        _rank_axis(fig, sizes[row - 1], row=row, col=1, stages=stages)
    fig.update_layout(barmode="overlay", bargap=0, height=max(340, 160 + 34 * sum(sizes)),
                      margin=dict(l=10, r=10, t=50, b=100), legend=_BOTTOM_LEGEND)
    fig.update_xaxes(title_text=f"time ({unit})", row=len(timelines), col=1)
    return fig, all_bars
