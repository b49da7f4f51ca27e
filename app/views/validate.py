"""Validate: a `gpipe-exec validate --json` output, predicted against measured."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from gpipe_sim import plots
from gpipe_sim.units import format_bytes, format_seconds
from ui_data import Validation, load_validation
from ui_run import MAX_GANTT_BARS, bubble_text, download_buttons, show_elapsed

FIELDS = (
    ("step_time_s", "step time", format_seconds),
    ("throughput_samples_per_s", "throughput (samples/s)", lambda v: f"{v:,.2f}"),
    ("bubble_fraction", "bubble fraction", bubble_text),
    ("analytic_bubble_fraction", "analytic (K-1)/(M+K-1)", bubble_text),
)


@st.cache_data(max_entries=8, show_spinner=False)
def _load(data: bytes) -> Validation:
    return load_validation(data)


def _source() -> tuple[str, bytes] | None:
    upload = st.file_uploader("validation JSON (`gpipe-exec validate --json`)", type=["json"],
                              key="upload.validate")
    path = st.text_input("... or a path on the server", key="cfg.validate.path",
                         placeholder="out/validate.json")
    if upload is not None:
        return upload.name, upload.getvalue()
    if path.strip():
        try:
            with open(path.strip(), "rb") as handle:
                return path.strip(), handle.read()
        except OSError as exc:
            st.error(f"cannot read {path.strip()!r}: {exc.strerror}", icon=":material/error:")
            st.stop()
    return None


def _figures_table(v: Validation) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for field, label, fmt in FIELDS:
        pred, meas = getattr(v.predicted, field), getattr(v.measured, field)
        err = v.relative_error.get(field)
        if err is None and meas:
            err = (pred - meas) / meas
        rows.append({"figure": label, "predicted": fmt(pred), "measured": fmt(meas),
                     "relative error": "" if err is None else f"{100 * err:+.1f}%"})
    peak = [max(r.device_peak_memory_bytes.values(), default=0.0) for r in (v.predicted, v.measured)]
    rows.append({"figure": "largest device peak memory", "predicted": format_bytes(peak[0]),
                 "measured": format_bytes(peak[1]),
                 "relative error": _pct(v.relative_error.get("peak_memory_bytes"))})
    return pd.DataFrame(rows)


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:+.1f}%"


st.title("Validate: predicted against measured")
source = _source()
if source is None:
    st.info(
        "No validation loaded. Run the executor on a scenario, for example "
        "`gpipe-exec validate scenarios/default.yaml --json > validate.json`, then upload the file "
        "here or type its path. The page then plots the predicted and the measured timelines "
        "side by side, with the relative error of every figure.",
        icon=":material/fact_check:",
    )
    st.stop()
name, data = source
try:
    v = _load(data)
except ValueError as exc:
    st.error(f"{name}: {exc}", icon=":material/error:")
    st.stop()

st.caption(f"Loaded {name}: {v.predicted.source} against {v.measured.source}, "
           f"K={len(v.predicted.stages)} stages, M={v.predicted.micro_batches} micro-batches, "
           f"mini-batch {v.predicted.batch_size}.")
cols = st.columns(4)
cols[0].metric("Predicted step", format_seconds(v.predicted.step_time_s))
cols[1].metric("Measured step", format_seconds(v.measured.step_time_s),
               _pct(v.relative_error.get("step_time_s")) or None, delta_color="off",
               help="Delta: relative error of the prediction.")
cols[2].metric("Predicted bubble", bubble_text(v.predicted.bubble_fraction))
cols[3].metric("Measured bubble", bubble_text(v.measured.bubble_fraction))
st.dataframe(_figures_table(v), hide_index=True)

fig, all_bars = plots.compare_timelines_figure(
    [("predicted", v.predicted.timeline), ("measured", v.measured.timeline)], max_bars=MAX_GANTT_BARS)
st.plotly_chart(fig, key="validate.gantt")
notes = [b.note for b in all_bars if b.note]
if notes:
    st.caption(" ".join(notes))
left, right = st.columns(2)
if v.relative_error:
    left.plotly_chart(plots.relative_error_figure(v.relative_error), key="validate.errors")
else:
    left.info("The file has no relative errors.")
pair = [("predicted", v.predicted), ("measured", v.measured)]
right.plotly_chart(plots.stage_comparison_figure(pair, "busy_s"), key="validate.busy")
st.plotly_chart(plots.stage_comparison_figure(pair, "peak_memory_bytes"), key="validate.memory")
for label, result in pair:
    with st.expander(f"Downloads: {label}"):
        download_buttons(None, result, f"validate.{label}")
show_elapsed()
