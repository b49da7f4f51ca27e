"""Sweep: a sweep's results table, any result plotted against any input, coloured by another."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from gpipe_sim import charts as plots
from gpipe_sim.errors import GpipeError
from gpipe_sim.scenario.scenario import SECTIONS
from gpipe_sim.schema.units import format_seconds
from gpipe_app.ui_data import load_sweep_path, read_sweep_bytes, row_scenario_data, split_sweep
from gpipe_app.ui_run import download_buttons, show_elapsed, to_scenario, try_run

PREFERRED_X = ("pipeline.micro_batches", "pipeline.stages")
PREFERRED_Y = ("bubble_fraction", "step_time_s", "throughput_samples_per_s")
PREFERRED_COLOR = ("pipeline.stages", "pipeline.schedule")
NONE = "(none)"
MAX_ROW_CHOICES = 500


@st.cache_data(max_entries=8, show_spinner=False)
def _read_upload(name: str, data: bytes) -> pd.DataFrame:
    return read_sweep_bytes(name, data)


def _load() -> tuple[str, pd.DataFrame] | None:
    upload = st.file_uploader("sweep results (results.parquet or results.csv)", type=["parquet", "csv"],
                              key="upload.sweep")
    path = st.text_input("... or a sweep output folder (or results file) on the server",
                         key="cfg.sweep.path", placeholder="out/sweep")
    if upload is not None:
        return upload.name, _read_upload(upload.name, upload.getvalue())
    if path.strip():
        return path.strip(), load_sweep_path(path.strip())
    return None


def _pick(label: str, options: list[str], preferred: tuple[str, ...], key: str, box=st) -> str:
    if st.session_state.get(key) not in options:
        st.session_state[key] = next((p for p in preferred if p in options), options[0])
    return box.selectbox(label, options, key=key)


HIDDEN = ("sweep.key",)  # the result file's hash: no use on screen
FIRST_RESULTS = ("step_time_s", "throughput_samples_per_s", "bubble_fraction", "fits_in_memory",
                 "max_device_peak_memory_bytes")


def table_view(rows: pd.DataFrame, varying: list[str], results: list[str]) -> pd.DataFrame:
    """The rows for reading: the inputs that vary first, then the main results and the others,
    the inputs that never vary last, without the hash column."""
    shown = [c for c in rows.columns if c not in HIDDEN]
    still = [c for c in varying if c in shown and rows[c].astype(str).nunique(dropna=False) > 1]
    main = [c for c in FIRST_RESULTS if c in shown]
    rest_results = [c for c in results if c in shown and c not in main]
    inputs = [c for c in shown if c.split(".", 1)[0] in SECTIONS]
    constant = [c for c in inputs if c not in still]
    middle = [c for c in shown if c not in still + main + rest_results + constant]
    return rows[list(dict.fromkeys(still + main + rest_results + middle + constant))]


st.title("Sweep results")
try:
    loaded = _load()
except ValueError as exc:
    st.error(str(exc), icon=":material/error:")
    st.stop()
if loaded is None:
    st.info(
        "No sweep loaded. Run a sweep (see docs/guide/sweeps.md) and upload its "
        "`results.parquet` or `results.csv`, or type the sweep's output folder. Then plot any "
        "result column against any input column, coloured by another.",
        icon=":material/scatter_plot:",
    )
    st.stop()
name, table = loaded
try:
    cols = split_sweep(table)
except ValueError as exc:
    st.error(f"{name}: {exc}", icon=":material/error:")
    st.stop()
if not cols.results:
    st.error(f"{name}: no numeric result columns to plot", icon=":material/error:")
    st.stop()
st.caption(f"{name}: {len(table)} scenarios, {len(cols.failed)} failed; "
           f"{len(cols.inputs)} input columns, {len(cols.results)} result columns.")

varying = [c for c in cols.inputs if cols.ok[c].nunique(dropna=False) > 1] or cols.inputs
c1, c2, c3 = st.columns(3)
constant = [c for c in cols.inputs if c not in varying]
x = _pick("x axis (input; varying ones first)", varying + constant, PREFERRED_X, "cfg.sweep.x", c1)
y = _pick("y axis (result)", cols.results, PREFERRED_Y, "cfg.sweep.y", c2)
color = _pick("colour by", [NONE] + [c for c in varying + constant if c != x], PREFERRED_COLOR,
              "cfg.sweep.color", c3)
color = None if color == NONE else color

rows = cols.ok
if "fits_in_memory" in rows.columns:
    st.session_state.setdefault("cfg.sweep.fits", False)
    fits = rows["fits_in_memory"].fillna(False).astype(bool)
    if st.toggle(f"only configurations that fit in memory ({int(fits.sum())} of {len(rows)})",
                 key="cfg.sweep.fits"):
        rows = rows[fits]
others = [c for c in varying if c not in (x, color)]
if others:
    with st.expander("Filter the other inputs"):
        for column in others:
            values = sorted(rows[column].dropna().unique().tolist(), key=str)
            key = f"cfg.sweep.filter.{column}"
            if not set(st.session_state.get(key, values)) <= set(values):
                del st.session_state[key]  # a different table: start from every value again
            st.session_state.setdefault(key, values)
            chosen = st.multiselect(column, values, key=key)
            rows = rows[rows[column].isin(chosen)]
if rows.empty:
    st.warning("No successful rows match the filters.")
else:
    st.session_state.setdefault("cfg.sweep.lines", True)
    st.session_state.setdefault("cfg.sweep.log_x", False)
    t1, t2 = st.columns(2)
    lines = t1.toggle("connect points", key="cfg.sweep.lines")
    numeric_x = pd.api.types.is_numeric_dtype(rows[x]) and bool((rows[x] > 0).all())
    log_x = t2.toggle("log x axis", key="cfg.sweep.log_x", disabled=not numeric_x) and numeric_x
    # The inputs still varying among the shown rows besides x and the colour (schedule, remat...):
    # one line per combination, never a zig-zag joining different variants.
    split = [c for c in others if rows[c].astype(str).nunique(dropna=False) > 1]
    st.plotly_chart(plots.sweep_figure(rows, x, y, color, lines=lines, log_x=log_x, split=split),
                    key="sweep.figure")
    if split and lines:
        st.caption(f"One line per combination of {', '.join(split)} (and colour): filter above to show fewer.")
    if "analytic_bubble_fraction" in rows.columns and y == "bubble_fraction":
        st.caption("analytic_bubble_fraction holds each row's schedule's own analytic bubble "
                   "((K-1)/(v*M+K-1) for the fill-drain schedules).")
st.dataframe(table_view(rows, varying, cols.results), hide_index=True)
st.download_button("Shown rows (CSV)", rows.to_csv(index=False), file_name="sweep_rows.csv",
                   mime="text/csv", key="dl.sweep.csv", on_click="ignore", icon=":material/download:")
if not rows.empty:
    st.subheader("One scenario of the sweep")
    shown = rows.head(MAX_ROW_CHOICES)
    labels = {i: ", ".join(f"{c}={shown.at[i, c]}" for c in varying) or f"row {i}" for i in shown.index}
    if st.session_state.get("cfg.sweep.row") not in labels:
        st.session_state["cfg.sweep.row"] = next(iter(labels))
    choice = st.selectbox("scenario", list(labels), format_func=labels.get, key="cfg.sweep.row",
                          help=f"The first {MAX_ROW_CHOICES} shown rows; filter to reach others.")
    try:
        scenario = to_scenario(row_scenario_data(shown.loc[choice], cols.inputs))
    except (GpipeError, ValueError) as exc:
        st.error(f"This row does not rebuild into a scenario: {exc}", icon=":material/error:")
    else:
        run = try_run(scenario.to_dict())
        if run is not None:
            _, result = run
            table_step = shown.at[choice, "step_time_s"] if "step_time_s" in shown.columns else None
            st.caption(f"Re-simulated here: step time {format_seconds(result.step_time_s)}"
                       + (f" (the sweep's table: {format_seconds(float(table_step))})." if table_step is not None else "."))
            download_buttons(scenario, result, "sweep")
if not cols.failed.empty:
    with st.expander(f"{len(cols.failed)} failed scenarios"):
        st.dataframe(cols.failed[[*cols.inputs, "error"]], hide_index=True)
show_elapsed()
