"""Explore: one configuration's step time, bubble, memory, timeline and bubble-vs-M curves."""

from __future__ import annotations

import streamlit as st

from gpipe_sim.studies import plots
from gpipe_sim.errors import GpipeError
from ui_form import scenario_form
from ui_run import (
    MAX_GANTT_BARS, download_buttons, show_elapsed, show_metrics, simulate_cached, stage_table, try_run,
)

BUBBLE_K = (2, 4, 8, 16)

st.title("Explore a pipeline")
data, notice = scenario_form(st.sidebar)
if notice:
    notice.show()
    st.stop()
run = try_run(data)
if run is None:
    st.stop()
scenario, result = run
p = scenario.pipeline
K, M = p.stages, p.micro_batches
st.caption(f"{scenario.model.preset} model on {scenario.hardware.preset or 'custom'} hardware: "
           f"K={K} stages, M={M} micro-batches of a mini-batch of {p.batch_size}, "
           f"{p.schedule} schedule, re-materialization {p.remat}, {p.partition} partition.")
show_metrics(scenario, result)

fig, bars = plots.timeline_figure(result.timeline, max_bars=MAX_GANTT_BARS,
                                  title=f"Schedule timeline ({p.schedule}, K={K}, M={M})")
st.plotly_chart(fig, key="explore.gantt")
if bars.note:
    st.caption(bars.note + " Download the Chrome trace below for every action.")

left, right = st.columns(2)
left.plotly_chart(plots.stage_memory_figure(result), key="explore.stage_memory")
right.plotly_chart(plots.memory_timeline_figure(result), key="explore.memory_time")

simulated: dict[int, float] = {}
if p.schedule != "naive":
    m = 1
    while m <= min(p.batch_size, max(64, M)):
        try:
            simulated[m] = simulate_cached(scenario.with_updates({"pipeline.micro_batches": m})).bubble_fraction
        except GpipeError:
            pass
        m *= 2
st.plotly_chart(plots.bubble_vs_m_figure(BUBBLE_K, K, M, result.bubble_fraction,
                                         m_max=max(64, M), simulated=simulated),
                key="explore.bubble_vs_m")

st.subheader("Stages")
st.dataframe(stage_table(result), hide_index=True)
st.subheader("Downloads")
download_buttons(scenario, result, "explore")
show_elapsed()
