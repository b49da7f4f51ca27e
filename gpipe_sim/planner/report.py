"""The planner's outputs: the ranked table as text, CSV and JSON, and an HTML page with the Pareto chart."""

from __future__ import annotations

import csv
import html
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from gpipe_sim.api import model_figures
from gpipe_sim.results.result import NO_FIGURES, ModelFigures
from gpipe_sim.schema.units import format_bytes, format_seconds
from gpipe_sim.planner.search import PlanEntry, PlanSearch, family
from gpipe_sim.planner.run_table import entry_run, run_cells, run_dict, table_run_columns
from gpipe_sim.results.run_cost import run_columns
from gpipe_sim.planner.axis_choice import axis_text
from gpipe_sim.planner.tp_choice import cp_text, ep_text, searched_cp, searched_ep, searched_tp, tp_text
from gpipe_sim.scenario.scenario import Scenario

if TYPE_CHECKING:
    import plotly.graph_objects as go

GIB = 2.0**30
# the axes as the table, CSV and configuration text show them: T first (devices = T x D x K)
SHOWN_AXES = ("T", "D", "K", "v", "M", "schedule", "remat", "partition", "zero")
COLUMNS = ("rank", "T", "D", "K", "v", "M", "schedule", "remat", "partition", "zero", "step", "vs fastest", "samples/s",
           "per device", "tokens/s", "TFLOP/s/dev", "MFU", "bubble", "exposed AR", "peak / capacity", "limiter",
           "alike")
_LEFT = {"schedule", "remat", "partition", "peak / capacity", "limiter", "alike"}  # the rest: right-justified
UNEVEN = "*"  # after M in the table: M does not divide the per-replica batch


def search_figures(search: PlanSearch) -> ModelFigures:
    """Parameters, model FLOPs, tokens and peak: what every configuration of the search shares
    (the model, global batch, dtype and accelerator are not axes)."""
    return model_figures(search.base)


def entry_figures(e: PlanEntry, figures: ModelFigures | None) -> dict[str, Any]:
    """An entry's parameters, tokens_per_s, tflops_per_device and mfu (as `Result.to_dict` names them)."""
    return figures.rates(e.step_time_s, e.devices) if figures is not None else dict(NO_FIGURES)


def entry_dict(e: PlanEntry, figures: ModelFigures, base: Scenario) -> dict[str, Any]:
    """An entry's plain figures (JSON, CSV) with the four quoted figures and, where the scenario
    asks for them, its training run's (`training_run`)."""
    return {**e.to_dict(), **entry_figures(e, figures), **run_dict(base, e, figures)}


def entry_row_dict(e: PlanEntry, figures: ModelFigures, base: Scenario) -> dict[str, Any]:
    """`entry_dict` flat, for a CSV row: the training run's figures as RUN_COLUMNS."""
    return {**e.to_dict(), **entry_figures(e, figures), **run_columns(entry_run(base, e, figures))}


def table_columns(search: PlanSearch) -> tuple[str, ...]:
    """The ranked table's columns: COLUMNS (with C after T where the search tried C > 1), then the
    run's where the scenario asks for them."""
    axes = _shown_axes(search)
    return (COLUMNS[0], *axes, *COLUMNS[1 + len(SHOWN_AXES):]) + table_run_columns(search.base)


def _shown_axes(search: PlanSearch) -> tuple[str, ...]:
    """SHOWN_AXES, with C and E after T where the search tried more than one of each."""
    extra = tuple(axis for axis, values in (("C", searched_cp(search)), ("E", searched_ep(search))) if len(values) > 1)
    return ("T", *extra, *SHOWN_AXES[1:])


def table_rows(search: PlanSearch, top: int, entries: Sequence[PlanEntry] | None = None) -> list[list[str]]:
    """The ranked table's first `top` rows as text, under `table_columns`: of `entries`, by
    default `search.order`."""
    figures = search_figures(search)
    axes = _shown_axes(search)
    return [entry_row(i + 1, e, figures, axes) + run_cells(search.base, e, figures)
            for i, e in enumerate((search.order if entries is None else entries)[:top])]


def family_heads(search: PlanSearch) -> list[PlanEntry]:
    """The pick, then the fastest of each other schedule family (`search.family_best`)."""
    if not search.order:
        return []
    pick = search.order[0]
    return [pick, *(e for e in search.family_best if family(e.candidate) != family(pick.candidate))]


def family_first(search: PlanSearch) -> list[PlanEntry]:
    """The configurations with the schedules compared first: `family_heads`, then the rest of
    `search.order` (the near-copies: other M, remat, partition... of the families shown)."""
    heads = family_heads(search)
    shown = {id(e) for e in heads}
    return heads + [e for e in search.order if id(e) not in shown]


def schedules_text(search: PlanSearch) -> str:
    """One line comparing the schedule families: the pick's, then each other family's fastest
    step against the pick's ("fastest found" where not proven)."""
    heads = family_heads(search)
    pick = heads[0]

    def one(e: PlanEntry) -> str:
        name = family(e.candidate)
        found = ", fastest found" if name in search.family_unproven else ""
        return f"{name} {format_seconds(e.step_time_s)} ({e.step_time_s / pick.step_time_s - 1:+.1%}{found})"

    return (f"each schedule family's fastest that fits, against the pick's {format_seconds(pick.step_time_s)} "
            f"({family(pick.candidate)}): " + ", ".join(one(e) for e in heads[1:]))


def family_text(search: PlanSearch, count: int) -> str:
    """What the first `count` rows of `family_first` are: the pick, and why, then each other
    family's fastest."""
    o = search.options
    pick = (f"row 1 is the pick: of the {search.tied} configurations within {o.tie:.0%} of the fastest step "
            "(the model's error, docs/measurements/accuracy.md: a tie) the simplest, then the roomiest"
            if search.tied > 1 else f"row 1 is the fastest; nothing else is within {o.tie:.0%} of its step")
    if count <= 1:
        return pick
    unproven = sorted(search.family_unproven & {family(e.candidate) for e in family_first(search)[1:count]})
    return (pick + f"; rows 2-{count}: the fastest configuration of each other schedule family"
            + (f" (for {', '.join(unproven)}: the fastest found, not proven)" if unproven else "")
            + "; then the rest by the ranking")


def _peak_text(e: PlanEntry) -> str:
    cap = e.capacity_bytes
    if not math.isfinite(cap) or cap <= 0:
        return format_bytes(e.peak_memory_bytes)
    return f"{format_bytes(e.peak_memory_bytes)} / {format_bytes(cap)} ({e.peak_memory_bytes / cap:.0%})"


def entry_row(rank: int, e: PlanEntry, figures: ModelFigures | None = None,
              axes: Sequence[str] = SHOWN_AXES) -> list[str]:
    """One table row, as text ("-" for a figure not known: tokens of a non-token model, FLOPs of
    layers timed in seconds), its axes `axes`."""
    q = entry_figures(e, figures)
    tokens, tflops, mfu = q["tokens_per_s"], q["tflops_per_device"], q["mfu"]
    return [str(rank), *(_axis_text(e, k) for k in axes), format_seconds(e.step_time_s),
            f"+{e.vs_fastest:.1%}" if e.vs_fastest > 0 else "fastest",
            f"{e.throughput_samples_per_s:,.2f}", f"{e.throughput_per_device:,.2f}",
            "-" if tokens is None else f"{tokens:,.0f}", "-" if tflops is None else f"{tflops:,.1f}",
            "-" if mfu is None else f"{mfu:.1%}", f"{e.bubble_fraction:.1%}", format_seconds(e.exposed_allreduce_s),
            _peak_text(e), e.limiter,
            f"+{e.alike}" if e.alike else ""]


def _axis_text(e: PlanEntry, key: str) -> str:
    """An axis as the table shows it: "-" where K=1 has none, M marked when uneven."""
    value = e.shown(key)
    if value is None:
        return "-"
    return f"{value}{UNEVEN}" if key == "M" and not e.even else str(value)


def choice_text(search: PlanSearch, top: int | None = None) -> str:
    """What the first rows are and why the first is the pick. Past the `top` rows shown (at most
    the options' `top`, which the search makes exact) the tied configurations are those the search
    found, not all: it stops resolving the tie once those rows are known."""
    o = search.options
    if not search.order:
        return ""
    shown = o.top if top is None else min(top, o.top)
    first = "row 1" if shown == 1 else f"rows 1-{shown}"
    rows = (f"rows 1-{search.tied} are" if search.tied <= shown else
            f"{first} (and at least {search.tied - shown:,} more configurations) {'is' if shown == 1 else 'are'}")
    return (f"{rows} within {o.tie:.0%} of the fastest step, the model's error "
            f"(docs/measurements/accuracy.md), so a tie: ordered simplest first (T=1, then smaller T, fewer stages, no "
            f"re-computation, no "
            f"ZeRO, v=1, even M, plainer schedule), then by memory headroom; row 1 is the pick"
            if search.tied > 1 else "row 1 is the fastest; nothing else is within "
            f"{o.tie:.0%} of its step")


def memory_text(search: PlanSearch) -> str:
    """The capacity the search held configurations to: reserve and headroom."""
    o = search.options
    accel = search.base.hardware.accelerator
    if not math.isfinite(search.capacity_bytes):
        return "memory: unlimited"
    reserved = accel.memory_bytes - search.capacity_bytes
    text = (f"memory: {format_bytes(search.capacity_bytes)} usable of {format_bytes(accel.memory_bytes)} per "
            f"device ({format_bytes(reserved)} reserved for the CUDA context, communicator buffers and "
            f"fragmentation: --reserve {o.reserve:.0%} or the hardware's own)")
    if o.headroom > 0:
        text += f"; at least {o.headroom:.0%} of it left free (--headroom): peak <= {format_bytes(search.limit_bytes)}"
    return text


def counts_text(search: PlanSearch) -> str:
    """The counts line: how many configurations were enumerated, simulated and pruned, and how fast."""
    return (f"{search.enumerated:,} configurations: {search.simulated:,} simulated, {search.reused:,} reused "
            f"(the same plan as one simulated), {search.pruned_by_memory:,} pruned by memory bound, "
            f"{search.pruned_by_bound:,} pruned by step-time bound, {search.infeasible:,} infeasible; {search.seconds:.2f} s "
            f"({search.configs_per_second:,.0f} configurations/s)")


def nothing_fits_text(search: PlanSearch) -> str:
    """Why no configuration fits: the smallest peak found against the capacity."""
    cap = format_bytes(search.capacity_bytes)
    least = search.smallest_peak
    if least is None:
        return f"no configuration of the {search.enumerated:,} enumerated could be simulated (capacity {cap})"
    config = config_text(least)
    return (f"no configuration fits: the smallest peak is {format_bytes(least.peak_memory_bytes)} per device "
            f"against a capacity of {cap} ({config}); try more devices, a smaller batch or another dtype")


def plan_text(search: PlanSearch, top: int = 10) -> str:
    """The top configurations as an aligned table, then the counts line and any notes."""
    figures = search_figures(search)
    lines = [header_text(search, figures), memory_text(search)]
    if search.order:
        columns = table_columns(search)
        rows = [list(columns)] + table_rows(search, top)
        widths = [max(len(r[j]) for r in rows) for j in range(len(columns))]
        for r in rows:
            lines.append("  ".join(cell.ljust(w) if name in _LEFT else cell.rjust(w)
                                   for name, cell, w in zip(columns, r, widths)).rstrip())
        lines.append(choice_text(search, top))
        for why in (tp_text(search, config_text), cp_text(search, config_text), ep_text(search, config_text),
                    axis_text(search, "remat"),
                    axis_text(search, "zero")):
            if why:
                lines.append(why)
        if len(family_heads(search)) > 1:
            lines.append(schedules_text(search))
        if any(not e.even for e in search.order[:top]):
            lines.append(f"{UNEVEN}: M does not divide the per-replica batch: micro-batches differ by one sample "
                         "(--even-m: only M that divide it)")
    else:
        lines.append(nothing_fits_text(search))
    lines.append(counts_text(search))
    lines.extend(f"note: {n}" for n in search.notes)
    return "\n".join(lines)


def header_text(search: PlanSearch, figures: ModelFigures) -> str:
    """The first line: devices, global batch, parameters and the T searched."""
    o = search.options
    return (f"plan: {o.devices} device{'s' if o.devices != 1 else ''}{' or fewer' if o.fewer_devices else ''}, "
            f"global batch {search.base.pipeline.batch_size}, {figures.parameters:,} parameters{_tp_header(search)}")


def _tp_header(search: PlanSearch) -> str:
    """", T in 1, 2, 4 (sequence parallel)" when the search tried T > 1."""
    values = searched_tp(search)
    if len(values) < 2:
        return ""
    sp = " (sequence parallel)" if search.base.pipeline.sequence_parallel else ""
    return f", T in {', '.join(map(str, values))}{sp}"


def plan_dict(search: PlanSearch, top: int = 10) -> dict[str, Any]:
    """The search as plain data (JSON-ready): options, counts, the top entries and the Pareto front."""
    o = search.options
    figures = search_figures(search)
    return {
        "devices": o.devices, "fewer_devices": o.fewer_devices, "batch_size": search.base.pipeline.batch_size,
        "capacity_bytes": search.capacity_bytes if math.isfinite(search.capacity_bytes) else None,
        "enumerated": search.enumerated, "simulated": search.simulated, "reused": search.reused,
        "pruned_by_memory": search.pruned_by_memory, "pruned_by_bound": search.pruned_by_bound,
        "infeasible": search.infeasible, "seconds": search.seconds,
        "configs_per_second": search.configs_per_second,
        **figures.to_dict(),  # parameters, model_flops_per_step, tokens_per_step, peak_flops_per_device
        "tie": o.tie, "reserve": o.reserve, "headroom": o.headroom, "limit_bytes": _finite(search.limit_bytes),
        "tensor_parallel": searched_tp(search),
        "sequence_parallel": search.base.pipeline.sequence_parallel, "why_tensor_parallel": tp_text(search, config_text) or None,
        "context_parallel": searched_cp(search), "why_context_parallel": cp_text(search, config_text) or None,
        "expert_parallel": searched_ep(search), "why_expert_parallel": ep_text(search, config_text) or None,
        "why_remat": axis_text(search, "remat") or None, "why_zero": axis_text(search, "zero") or None,
        "tied": search.tied, "pick": entry_dict(search.pick, figures, search.base) if search.pick else None,
        "ranked": [entry_dict(e, figures, search.base) for e in search.order[:top]],
        "pareto_front": [entry_dict(e, figures, search.base) for e in search.front],
        "nothing_fits": None if search.ranked else nothing_fits_text(search),
        "notes": list(search.notes),
    }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def plan_json(search: PlanSearch, top: int = 10) -> str:
    return json.dumps(plan_dict(search, top), indent=2, allow_nan=False)


CSV_AXES = (*SHOWN_AXES, "C", "E")


def _reason(code: str, figure: float, limit: float) -> str:
    """A pruned configuration's reason, in words."""
    if code == "memory":
        return f"memory bound: needs at least {format_bytes(figure)} per device > {format_bytes(limit)}"
    if code == "bound":
        return f"step-time bound: at least {format_seconds(figure)} > {format_seconds(limit)} (top and tie found)"
    if code == "preferred":
        return f"within the tie (step <= {format_seconds(limit)}) but simpler tied configurations rank before it"
    if code.startswith("infeasible:"):
        return "does not compile: " + code.split(":", 1)[1].strip()
    return code


def csv_rows(search: PlanSearch) -> list[dict[str, Any]]:
    """One row per configuration considered: the simulated ones with their figures (fitting ones
    first, in the table's order, ranked), then the pruned ones with the reason, then the ones
    the space refused (for every remat, partition and ZeRO)."""
    figures = search_figures(search)
    shown = {id(e) for e in search.order}
    fitting = search.order + [e for e in search.ranked if id(e) not in shown]
    rows = [{"rank": i + 1 if i < len(search.order) else "", "status": "fits",
             "reason": "tied with the fastest" if e.tied else "", **entry_row_dict(e, figures, search.base)}
            for i, e in enumerate(fitting)]
    for e in search.simulated_entries:
        if not e.fits:
            over = e.peak_memory_bytes > search.capacity_bytes
            reason = (f"does not fit: peak {format_bytes(e.peak_memory_bytes)} > {format_bytes(search.capacity_bytes)}"
                      if over else f"leaves less than the {search.options.headroom:.0%} headroom")
            rows.append({"rank": "", "status": "simulated", "reason": reason, **entry_row_dict(e, figures, search.base)})
    for i in sorted(search.pruned):
        rows.append({"rank": "", "status": "pruned", "reason": _reason(*search.pruned[i]),
                     **search.candidates[i].shown_axes()})
    for D, K, v, M, name, why, *rest in search.rejected:
        rows.append({"rank": "", "status": "refused", "reason": why, "T": rest[0] if rest else 1,
                     "D": D, "K": K, "v": v, "M": M,
                     "schedule": name, "remat": "any", "partition": "any", "zero": "any"})
    return rows


def write_csv(search: PlanSearch, path: str | Path) -> None:
    """Every configuration considered (`csv_rows`), one row each."""
    rows = csv_rows(search)
    keys: list[str] = ["rank", "status", "reason", *CSV_AXES]
    for row in rows:
        keys.extend(k for k in row if k not in keys)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys, restval="")
        writer.writeheader()
        writer.writerows(rows)


def config_text(e: PlanEntry) -> str:
    """The configuration in words: "T=1, D=16, K=1, data parallel, M=16, remat=none, zero=0" at K=1
    (", C=4" after T where it splits the sequence)."""
    cp = (f", C={e.get('C')}" if e.get("C") > 1 else "") + (f", E={e.get('E')}" if e.get("E") > 1 else "")
    if e.data_parallel_only:
        return (f"T={e.get('T')}{cp}, D={e.get('D')}, K=1, {e.shown('schedule')}, M={e.get('M')}{'' if e.even else UNEVEN}, "
                f"remat={e.get('remat')}, zero={e.get('zero')}")
    return ", ".join(f"{k}={_axis_text(e, k)}" for k in SHOWN_AXES).replace(f"T={e.get('T')}", f"T={e.get('T')}{cp}", 1)


def pareto_figure(entries: Sequence[PlanEntry], front: Sequence[PlanEntry], capacity_bytes: float,
                  chosen: PlanEntry | None = None) -> go.Figure:
    """Throughput (samples/s) against peak memory per device (GiB) of every simulated configuration,
    the capacity as a vertical line, the Pareto front of what fits as a line and its continuation
    past the capacity (configurations that do not fit) dotted and grey; hover shows the configuration."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for fits, name, color in ((True, "fits", "#4c78a8"), (False, "over capacity", "#bbbbbb")):
        part = [e for e in entries if e.fits == fits]
        if part:
            fig.add_trace(go.Scattergl(
                x=[e.peak_memory_bytes / GIB for e in part], y=[e.throughput_samples_per_s for e in part],
                mode="markers", name=name, marker={"color": color, "size": 6, "opacity": 0.6},
                text=[config_text(e) for e in part],
                hovertemplate="%{text}<br>peak %{x:.2f} GiB<br>%{y:.2f} samples/s<extra></extra>"))
    inside = [e for e in front if e.fits]  # the front of what fits (a fitting entry has less memory)
    beyond = inside[-1:] + [e for e in front if not e.fits]
    for part, name, style in ((inside, "Pareto front", {"color": "#e45756", "shape": "hv"}),
                              (beyond if len(beyond) > len(inside[-1:]) else [], "front past capacity (does not fit)",
                               {"color": "#bbbbbb", "shape": "hv", "dash": "dot"})):
        if part:
            fig.add_trace(go.Scatter(
                x=[e.peak_memory_bytes / GIB for e in part], y=[e.throughput_samples_per_s for e in part],
                mode="lines+markers", name=name, line=style, marker={"size": 9 if part is inside else 6},
                text=[config_text(e) for e in part],
                hovertemplate=f"%{{text}}<br>peak %{{x:.2f}} GiB<br>%{{y:.2f}} samples/s<extra>{name}</extra>"))
    if chosen is not None:
        fig.add_trace(go.Scatter(
            x=[chosen.peak_memory_bytes / GIB], y=[chosen.throughput_samples_per_s], mode="markers",
            name="chosen", marker={"symbol": "star", "size": 16, "color": "#f58518"},
            text=[config_text(chosen)], hovertemplate="%{text}<extra>chosen</extra>"))
    if math.isfinite(capacity_bytes) and capacity_bytes > 0:
        fig.add_vline(x=capacity_bytes / GIB, line_dash="dash", line_color="#54a24b",
                      annotation_text=f"capacity {format_bytes(capacity_bytes)}", annotation_position="top left")
    fig.update_layout(title="Throughput against peak memory (every simulated configuration)",
                      xaxis_title="peak memory per device (GiB)", yaxis_title="throughput (samples/s)",
                      template="plotly_white", height=480, legend={"orientation": "h", "y": -0.2})
    fig.update_xaxes(rangemode="tozero")
    throughputs = [e.throughput_samples_per_s for e in [*entries, *front, *([chosen] if chosen else [])]]
    y_range = padded_range(throughputs)
    if y_range is not None:  # the data's own range: from 0, every point would sit on one line
        fig.update_yaxes(range=y_range)
    return fig


def padded_range(values: Sequence[float], pad: float = 0.06) -> list[float] | None:
    """[low, high] around the finite `values`, padded by `pad` of their span (of their size when
    they are all equal); None when there is none."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None
    low, high = min(finite), max(finite)
    margin = (high - low) * pad or abs(high) * pad or 1.0
    return [low - margin, high + margin]


def plan_html(search: PlanSearch, top: int = 10, title: str = "gpipe-sim plan") -> str:
    """A self-contained page: the ranked table, the counts and the Pareto chart (plotly inlined)."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table_columns(search))
    figures = search_figures(search)
    if search.order:
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                       for row in table_rows(search, top))
        table = (f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
                 f"<p>{html.escape(choice_text(search, top))}</p><p>{html.escape(tp_text(search, config_text))}</p>")
    else:
        table = f"<p><b>{html.escape(nothing_fits_text(search))}</b></p>"
    chart = pareto_figure(search.simulated_entries, search.front, search.capacity_bytes,
                          search.pick).to_html(full_html=False, include_plotlyjs=True)
    notes = "".join(f"<p>note: {html.escape(n)}</p>" for n in search.notes)
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#f4f4f4}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<p>{html.escape(header_text(search, figures))}</p>"
            f"<p>{html.escape(memory_text(search))}</p>{table}"
            f"<p>{html.escape(counts_text(search))}</p>{notes}{chart}</body></html>")


def write_html(search: PlanSearch, path: str | Path, top: int = 10) -> None:
    Path(path).write_text(plan_html(search, top))
