"""Validate: a `gpipe-exec validate --json` output, predicted against measured."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from gpipe_sim import charts as plots
from gpipe_sim.schema.units import format_bytes, format_seconds
from gpipe_sim.results.validation import ValidationDocument as Validation
from gpipe_sim.errors import GpipeError
from gpipe_app.ui_run import MAX_GANTT_BARS, bubble_text, download_buttons, show_elapsed, to_scenario

FIELDS = (
    ("step_time_s", "step time", format_seconds),
    ("throughput_samples_per_s", "throughput (samples/s)", lambda v: f"{v:,.2f}"),
    ("bubble_fraction", "bubble fraction", bubble_text),
    ("analytic_bubble_fraction", "analytic bubble", bubble_text),
)


@st.cache_data(max_entries=8, show_spinner=False)
def _load(data: bytes) -> Validation:
    return Validation.from_json(data)


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


def _relative(pred: float, meas: float) -> float | None:
    """|predicted - measured| / |measured|, as `gpipe-exec validate` reports it."""
    return abs(pred - meas) / abs(meas) if meas else None


def _figures_table(v: Validation) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for field, label, fmt in FIELDS:
        pred, meas = getattr(v.predicted, field), getattr(v.measured, field)
        err = v.relative_error.get(field, _relative(pred, meas))
        rows.append({"figure": label, "predicted": fmt(pred), "measured": fmt(meas),
                     "relative error": _pct(err)})
    for p, m in zip(v.predicted.stages, v.measured.stages):
        for field, key, label in (("busy_s", "busy_s", "busy"),
                                  ("peak_memory_bytes", "peak_memory_bytes", "peak memory (measured by the tracker)"),
                                  ("peak_activation_bytes", "accounting.peak_activation_bytes",
                                   "saved-tensor accounting (a check, not a measurement)")):
            pred, meas = getattr(p, field), getattr(m, field)
            err = v.relative_error.get(f"stage{p.index}.{key}", _relative(pred, meas))
            fmt = format_seconds if field == "busy_s" else format_bytes
            rows.append({"figure": f"rank {p.index} {label}", "predicted": fmt(pred),
                         "measured": fmt(meas), "relative error": _pct(err)})
    return pd.DataFrame(rows)


def _pct(value: float | None) -> str:
    if value is None:
        return ""
    return f"{100 * value:+.1f}%" if value < 0 else f"{100 * value:.1f}%"


st.title("Validate: predicted against measured")
source = _source()
if source is None:
    st.info(
        "No validation loaded. Run the executor on a scenario, for example "
        "`gpipe-exec validate scenarios/exec/transformer_k2.yaml --json > validate.json`, then upload the file "
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
           f"K={len(v.predicted.stages)} ranks ({len(v.predicted.chunks) or len(v.predicted.stages)} chunks), "
           f"M={v.predicted.micro_batches} micro-batches, "
           f"mini-batch {v.predicted.batch_size}.")
cols = st.columns(4)
cols[0].metric("Predicted step", format_seconds(v.predicted.step_time_s))
cols[1].metric("Measured step", format_seconds(v.measured.step_time_s),
               _pct(v.relative_error.get("step_time_s")) or None, delta_color="off",
               help="Delta: relative error of the prediction.")
cols[2].metric("Predicted bubble", bubble_text(v.predicted.bubble_fraction))
cols[3].metric("Measured bubble", bubble_text(v.measured.bubble_fraction))
link = v.link
if link is not None and "bandwidth" in link:
    st.caption(f"Calibrated link used by the prediction: {float(link['bandwidth']) / 1e9:.3g} GB/s, "
               f"latency {format_seconds(float(link.get('latency_s', 0.0)))}.")
cal = v.calibration or {}
if cal.get("action_s") is not None:
    st.caption("Calibrated host time of the runtime: "
               + ", ".join(f"{label} {format_seconds(float(cal[key]))}" for label, key in
                           (("per compute action", "action_s"), ("per send", "send_s"), ("per receive", "recv_s")))
               + ".")
st.dataframe(_figures_table(v), hide_index=True)
for note in v.notes:
    st.warning(note)
rounds = v.rounds
if len(rounds) > 1:
    table = pd.DataFrame([{"round": i + 1, "predicted step": format_seconds(p), "measured step": format_seconds(m),
                           "relative error": _pct(_relative(p, m))} for i, (p, m) in enumerate(rounds)])
    st.caption(f"{len(rounds)} rounds (profile, predict, run each): the figures above compare the "
               "round with the median prediction and the one with the median measurement.")
    st.dataframe(table, hide_index=True)

if len(v.predicted.timeline) or len(v.measured.timeline):
    fig, all_bars = plots.compare_timelines_figure(
        [("predicted", v.predicted.timeline), ("measured", v.measured.timeline)], max_bars=MAX_GANTT_BARS,
        stages=len(v.predicted.stages))  # rows named replica and rank where D > 1
    st.plotly_chart(fig, key="validate.gantt")
    notes = [b.note for b in all_bars if b.note]
    if notes:
        st.caption(" ".join(notes))
else:
    st.info("The file has no timelines (written with `--no-timeline`): only the figures are compared.")
left, right = st.columns(2)
if v.relative_error:
    left.plotly_chart(plots.relative_error_figure(v.relative_error), key="validate.errors")
else:
    left.info("The file has no relative errors.")
pair = [("predicted", v.predicted), ("measured", v.measured)]
right.plotly_chart(plots.stage_comparison_figure(pair, "busy_s"), key="validate.busy")
left, right = st.columns(2)
left.plotly_chart(plots.stage_comparison_figure(pair, "peak_memory_bytes"), key="validate.memory")
steps = v.measured_step_times_s
if steps:
    right.plotly_chart(plots.step_times_figure(v.predicted.step_time_s, steps), key="validate.steps")
scenario_data = v.scenario
if scenario_data is not None:
    try:
        st.download_button("Scenario (YAML)", to_scenario(scenario_data).to_yaml(), file_name="scenario.yaml",
                           mime="application/x-yaml", key="dl.validate.yaml", on_click="ignore",
                           icon=":material/download:")
    except GpipeError as exc:
        st.warning(f"The file's scenario is not valid here: {exc}")
for label, result in pair:
    with st.expander(f"Downloads: {label}"):
        download_buttons(None, result, f"validate.{label}")
show_elapsed()
