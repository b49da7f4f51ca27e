"""Plan: the fastest configurations of the form's model and hardware on N devices, ranked."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import streamlit as st

from gpipe_sim.errors import GpipeError
from gpipe_sim.schedule import SCHEDULES
from gpipe_sim.scenario.scenario import PARTITION_METHODS, parse_scenario
from gpipe_sim import charts as plots
from gpipe_sim.planner.report import (
    config_text, counts_text, family_first, family_heads, family_text, memory_text, nothing_fits_text, pareto_figure,
    table_columns, table_rows, tp_text,
)
from gpipe_sim.planner.command import MAX_DEVICES  # the CLI's limit: one for both
from gpipe_sim.planner.search import DEFAULT_PARTITIONS, DEFAULT_RESERVE, TIE, PlanOptions, search_configurations
from gpipe_app.ui_plan_search import searched_or_stop
from gpipe_app.ui_form import PREFIX, scenario_form
from gpipe_app.ui_run import (MAX_GANTT_BARS, framework_downloads, label_error, show_elapsed, show_metrics,
                              simulate_cached)

def _plan_options(options: dict[str, Any]) -> PlanOptions:
    return PlanOptions(**{k: tuple(v) if isinstance(v, list) else v for k, v in options.items()})


GOTO_EXPLORE = "plan.goto_explore"


def _open_in_explore(overrides: dict[str, Any]) -> None:
    """Put a configuration into the form (kept across pages); the rerun then goes to Explore
    (a button callback: it runs before the form's widgets exist)."""
    for dotted, value in overrides.items():
        if dotted.startswith("pipeline.") or dotted == "training.zero":
            st.session_state[PREFIX + dotted] = value
    st.session_state[GOTO_EXPLORE] = True


if st.session_state.pop(GOTO_EXPLORE, False):
    st.switch_page("views/explore.py")
st.title("Plan: the fastest configuration on N devices")
data, notice = scenario_form(st.sidebar)
if notice:
    notice.show()
    st.stop()
if data is None:
    st.stop()
st.caption("The form's model, hardware and training set the question; the planner searches T x D x K = N, "
           "chunks v, micro-batches M, every schedule, re-materialization, partition and ZeRO, keeps what "
           "fits in memory and ranks it by throughput.")
c1, c2, c3 = st.columns(3)
form_devices = (int(data["pipeline"]["stages"]) * int(data["pipeline"]["data_parallel"])
                * int(data["pipeline"].get("tensor_parallel", 1)))
devices = c1.number_input("devices N", min_value=1, max_value=MAX_DEVICES, step=1,
                          value=min(max(form_devices, 1), MAX_DEVICES), key="plan.devices")
batch = c2.number_input("global batch", min_value=1, max_value=1_000_000, step=1,
                        value=int(data["pipeline"]["batch_size"]), key="plan.batch")
top = c3.number_input("configurations shown", min_value=1, max_value=100, step=1, value=10, key="plan.top")
with st.expander("Search space", expanded=False):
    fewer = st.checkbox("also fewer devices", value=False, key="plan.fewer")
    schedules = st.multiselect("schedules", list(SCHEDULES), default=list(SCHEDULES), key="plan.schedules")
    partitions = st.multiselect("partitions", list(PARTITION_METHODS), default=list(DEFAULT_PARTITIONS),
                                key="plan.partitions",
                                help="memory and fit run a partition search per configuration (slower).")
    s1, s2, s3 = st.columns(3)
    tie = s1.number_input("tie (% of the fastest step)", min_value=0.0, max_value=100.0, step=1.0,
                          value=100 * TIE, key="plan.tie",
                          help="Step times this close to the fastest are a tie (the model's error, docs/measurements/accuracy.md): "
                               "the simplest configuration, then the one with most free memory, is picked.")
    reserve = s2.number_input("memory reserve (%)", min_value=0.0, max_value=99.0, step=1.0,
                              value=100 * DEFAULT_RESERVE, key="plan.reserve",
                              help="Kept free on each device for the CUDA context, communicator buffers and "
                                   "fragmentation (a hardware reserving more keeps its own).")
    headroom = s3.number_input("headroom (% left free)", min_value=0.0, max_value=99.0, step=1.0, value=0.0,
                               key="plan.headroom")
    k1, k2, k3 = st.columns(3)
    min_k = k1.number_input("fewest stages K", min_value=1, max_value=MAX_DEVICES, step=1, value=1,
                            key="plan.min_stages")
    max_k = k2.number_input("most stages K", min_value=1, max_value=MAX_DEVICES, step=1, value=MAX_DEVICES,
                            key="plan.max_stages")
    even = k3.checkbox("even M only", value=False, key="plan.even",
                       help="Only micro-batch counts that divide the per-replica batch (others are marked *).")
    tensor_parallel = st.multiselect(
        "tensor parallel T", [1, 2, 4, 8, 16], default=[1, 2, 4, 8, 16], key="plan.tensor_parallel",
        help="T devices per pipeline rank (devices = T x D x K); only the powers of two that fit a node and "
             "divide the model's heads and d_ff are tried (the transformer preset).")
    sequence = st.checkbox("sequence parallel (T > 1)", key="plan.sequence_parallel",
                           value=bool(data["pipeline"].get("sequence_parallel", False)))
if not schedules or not partitions or not tensor_parallel:
    st.error("Choose at least one schedule, partition method and T.", icon=":material/error:")
    st.stop()

question = {**data, "pipeline": {**data["pipeline"], "batch_size": int(batch)}}
question["pipeline"].update({"stages": 1, "data_parallel": 1, "micro_batches": 1, "chunks": 1,
                             "schedule": "gpipe", "tensor_parallel": 1})  # a valid base: the planner replaces these
question["hardware"] = {k: v for k, v in question["hardware"].items() if k not in ("stage_to_device", "placement")}
options = {"devices": int(devices), "fewer_devices": bool(fewer), "top": int(top),
           "schedules": list(schedules), "partitions": list(partitions), "tie": float(tie) / 100,
           "reserve": float(reserve) / 100, "tensor_parallel": sorted(int(t) for t in tensor_parallel),
           "sequence_parallel": bool(sequence), "headroom": float(headroom) / 100, "even_micro_batches": bool(even),
           "stages": None if (int(min_k), int(max_k)) == (1, MAX_DEVICES)
           else list(range(int(min_k), min(int(max_k), int(devices)) + 1))}
try:
    base = parse_scenario(question)
except GpipeError as exc:
    st.error(label_error(str(exc)), icon=":material/error:")
    st.stop()
search = searched_or_stop(json.dumps([base.to_dict(), options], sort_keys=True),
                          lambda progress: search_configurations(base, _plan_options(options), progress=progress))

st.caption(memory_text(search) + ". " + counts_text(search))
if not search.ranked:
    st.warning(nothing_fits_text(search), icon=":material/memory:")
    if search.enumerated == 0:
        st.info("No D x K split of these devices suits the model and batch (K at most the layers, D dividing "
                "the batch): try another number of devices or 'also fewer devices'.")
    show_elapsed()
    st.stop()

shown = family_first(search)[: int(top)]  # the schedules compared first, then the near-copies
heads = min(len(shown), len(family_heads(search)))
rows = table_rows(search, int(top), shown)
st.subheader("Ranked configurations")
st.dataframe(pd.DataFrame(rows, columns=list(table_columns(search))), hide_index=True, key="plan.table")
why = ". ".join(t for t in (family_text(search, heads), tp_text(search, config_text)) if t)
st.caption(why + ("; * after M: it does not divide the per-replica batch" if any(not e.even for e in shown) else ""))
labels = {f"#{i + 1}: " + config_text(e): i for i, e in enumerate(shown)}
choice = st.selectbox("configuration", list(labels), key="plan.choice")
chosen = shown[labels[choice]]
st.plotly_chart(pareto_figure(search.simulated_entries, search.front, search.capacity_bytes, chosen),
                key="plan.pareto")

st.subheader(f"Configuration {choice.split(':')[0]}")
scenario = search.base.with_updates(chosen.overrides)  # the base as ranked: the planner's reserve held back
result = simulate_cached(scenario)
show_metrics(scenario, result)
st.button("Open in Explore", key="plan.open", icon=":material/insights:", on_click=_open_in_explore,
          args=(chosen.overrides,), help="Load this configuration into the form and show it in Explore.")
framework_downloads(scenario, key="plan")
p = scenario.pipeline
title = (f"Timeline (data parallel with gradient accumulation, D={p.data_parallel}, M={p.micro_batches})"
         if p.stages == 1 else f"Schedule timeline ({p.schedule}, D={p.data_parallel}, K={p.stages}, "
                               f"v={p.chunks}, M={p.micro_batches})")
fig, bars = plots.timeline_figure(result.timeline, max_bars=MAX_GANTT_BARS, stages=p.stages, title=title)
st.plotly_chart(fig, key="plan.gantt")
if bars.note:
    st.caption(bars.note)
left, right = st.columns(2)
left.plotly_chart(plots.stage_memory_figure(result), key="plan.stage_memory")
right.plotly_chart(plots.memory_timeline_figure(result), key="plan.memory_time")
show_elapsed()
