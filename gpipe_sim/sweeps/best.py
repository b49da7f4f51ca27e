"""The best configurations of a sweep's table, as a terminal table (or one line when none fits)."""

from __future__ import annotations

import math
from typing import Any, Sequence

from gpipe_sim.errors import one_line
from gpipe_sim.sweeps.spec import SCENARIO_SECTIONS

BEST_SHOWN = 5


def varying_inputs(table: Any, axes: Sequence[str] | None = None, *, keep_named: bool = False) -> list[str]:
    """The input columns that tell the rows apart. Of the sweep's `axes` (a mapping value is several
    columns: `pipeline.schedule.csv`), those whose value differs between rows (with `keep_named`,
    all of them when none differs); with no axes given, or none of them a column, every input
    column that differs, leaving out the accelerator and link fields a varying `hardware.preset`
    fills in."""
    inputs = [c for c in table.columns if c.split(".", 1)[0] in SCENARIO_SECTIONS]
    varying = [c for c in inputs if table[c].astype(str).nunique(dropna=False) > 1]
    named = [c for c in inputs if any(c == a or c.startswith(a + ".") for a in axes or ())]
    if named:
        return [c for c in named if c in varying] or (named if keep_named else [])
    if "hardware.preset" in varying:
        varying = [c for c in varying if not c.startswith(("hardware.accelerator.", "hardware.link."))]
    return varying


def _fitting(table: Any) -> Any:
    return table[(table["status"] == "ok") & table["fits_in_memory"].fillna(False).astype(bool)]


def device_counts_differ(table: Any) -> bool:
    """Whether the rows that ran and fit use different numbers of devices (throughputs on different
    device counts answer different questions: the ranking then groups by device count)."""
    return "num_devices" in table.columns and len(table) > 0 and _fitting(table)["num_devices"].nunique() > 1


def best_configurations(table: Any, top: int = BEST_SHOWN) -> Any:
    """The rows that ran and fit in memory, fastest (highest throughput) first (a DataFrame): the
    `top` fastest where all use the same number of devices, else the fastest of each device count,
    fewest devices first (like compared with like)."""
    if not len(table):
        return table
    ok = _fitting(table).sort_values(["throughput_samples_per_s", "sweep.index"], ascending=[False, True],
                                     kind="stable")
    if not device_counts_differ(table):
        return ok.head(top)
    return ok.drop_duplicates("num_devices").sort_values(["num_devices", "sweep.index"], kind="stable")


def best_text(table: Any, axes: Sequence[str] = (), top: int = BEST_SHOWN) -> str:
    """The best configurations that fit, as a table: their varying inputs, devices N, step time,
    throughput (and per device), bubble and largest device peak; or one line saying that none fits
    (and the nearest miss)."""
    from rich.table import Table

    from gpipe_sim.summary import render
    from gpipe_sim.schema.units import format_bytes, format_seconds

    ran = table[table["status"] == "ok"] if len(table) else table
    if not len(ran):
        return "no configuration ran: nothing to rank"
    best = best_configurations(table, top)
    if not len(best):
        near = ran.sort_values(["max_device_peak_memory_bytes", "sweep.index"], kind="stable").iloc[0]
        cap = near["memory_capacity_bytes"]
        capacity = format_bytes(float(cap)) if cap is not None and cap == cap else "inf"
        return (f"none of the {len(ran)} configurations that ran fits in memory; the nearest, sweep.index "
                f"{int(near['sweep.index'])}, needs {format_bytes(float(near['max_device_peak_memory_bytes']))} "
                f"on its fullest device (capacity {capacity})")
    fits = int(ran["fits_in_memory"].fillna(False).astype(bool).sum())
    grouped = device_counts_differ(table)
    columns = varying_inputs(table, axes, keep_named=True)
    short = _short_names(columns)
    title = (f"the fastest of each device count among the {fits} configurations that fit in memory"
             if grouped else f"best {len(best)} of the {fits} configurations that fit in memory (by throughput)")
    caps = {float(c) for c in best["memory_capacity_bytes"] if c is not None and c == c}
    shared_cap = len(caps) == 1 and best["memory_capacity_bytes"].notna().all()
    if shared_cap:
        title += f"; capacity {format_bytes(caps.pop())} a device"
    out = Table(title=title)
    out.add_column("#", justify="right")
    for name in columns:
        out.add_column(short[name])
    per_device = "num_devices" in best.columns
    run = {c: label for c, label in RUN_SHOWN.items() if c in best.columns and best[c].notna().any()}
    if "run_cost" in run:
        run.pop("run_cost_per_hour", None)  # the run's cost says it
    for name in ("N",) * per_device + ("step time", "samples/s") + ("per device",) * per_device \
            + ("bubble", "largest device peak", *run.values()):
        out.add_column(name, justify="right")
    for rank, (_, row) in enumerate(best.iterrows(), start=1):
        cap = row["memory_capacity_bytes"]
        peak = format_bytes(float(row["max_device_peak_memory_bytes"]))
        if cap is not None and cap == cap and not shared_cap:
            peak += f" of {format_bytes(float(cap))}"
        rate = float(row["throughput_samples_per_s"])
        devices = int(row["num_devices"]) if per_device else 1
        out.add_row(
            str(rank), *(_cell(row[name]) for name in columns),
            *((str(devices),) if per_device else ()),
            format_seconds(float(row["step_time_s"])),
            f"{rate:,.1f}",
            *((f"{rate / devices:,.2f}",) if per_device else ()),
            f"{float(row['bubble_fraction']):.3f}",
            peak,
            *(_run_cell(row[c], c) for c in run),
        )
    return render(out)


# The training run's columns shown where the sweep's scenarios ask for them (gpipe_sim.results.run_cost)
RUN_SHOWN = {"run_days": "days", "run_goodput": "goodput", "run_cost": "cost", "run_cost_per_hour": "cost/h"}


def _run_cell(value: Any, column: str) -> str:
    """A run figure: days to one decimal, goodput in percent, costs with thousands separators."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if column == "run_goodput":
        return f"{float(value):.1%}"
    return f"{float(value):,.1f}" if column == "run_days" else f"{float(value):,.2f}"


def _short_names(columns: Sequence[str]) -> dict[str, str]:
    """"pipeline.stages" -> "stages" where the last part names one column only."""
    last = [c.rsplit(".", 1)[-1] for c in columns]
    return {c: (tail if last.count(tail) == 1 else c) for c, tail in zip(columns, last)}


def _cell(value: Any) -> str:
    """A table cell: "-" for a missing value, whole floats as integers, at most 60 characters."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return one_line(str(value), 60)
