"""Explore: one configuration's step time, bubble, memory, timeline and bubble-vs-M curves."""

from __future__ import annotations

import streamlit as st

from gpipe_sim import charts as plots
from gpipe_sim.errors import GpipeError
from gpipe_sim.results.result import Result
from gpipe_sim.schedule import SCHEDULES
from gpipe_sim.scenario.scenario import Scenario
from gpipe_app.ui_form import scenario_form
from gpipe_app.ui_run import (
    MAX_GANTT_BARS, download_buttons, show_elapsed, show_metrics, simulate_cached, stage_table, try_run,
)

BUBBLE_K = (2, 4, 8, 16)


def _bubble_vs_m(scenario: Scenario, result: Result) -> None:
    """The bubble against M for K = 2, 4, 8, 16 (analytic) with the current K simulated at powers
    of two of M where the schedule takes that M (its own check), the current point marked."""
    p = scenario.pipeline
    K, M, v = p.stages, p.micro_batches, p.chunks
    family = SCHEDULES[p.schedule]
    simulated: dict[int, float] = {}
    m = 1
    while m <= min(p.batch_size, max(64, M)):
        if family.problem(K, m, v) is None:
            try:
                simulated[m] = simulate_cached(scenario.with_updates({"pipeline.micro_batches": m})).bubble_fraction
            except GpipeError:
                pass
        m *= 2
    st.plotly_chart(plots.bubble_vs_m_figure(BUBBLE_K, K, M, result.bubble_fraction, m_max=max(64, M),
                                             simulated=simulated, schedule=p.schedule, chunks=v,
                                             current_analytic=result.analytic_bubble_fraction),
                    key="explore.bubble_vs_m")


def show_results(scenario: Scenario, result: Result) -> None:
    """Everything the page shows for one result (live, or the last good one, greyed)."""
    p = scenario.pipeline
    K, v, M = p.stages, p.chunks, p.micro_batches
    st.caption(f"{scenario.model.preset} model on {scenario.hardware.preset or 'custom'} hardware: "
               f"K={K} ranks with v={v} chunk{'s' if v > 1 else ''} each, M={M} micro-batches of a mini-batch "
               f"of {p.batch_size}, {p.schedule_name} schedule, re-materialization {p.remat}, {p.partition} partition.")
    show_metrics(scenario, result)

    timed = int(result.timeline.rank.max()) + 1 if len(result.timeline) else 0  # replica 0 alone where alike
    once = " (alike: replica 0 shown, each replica runs its times)" if timed <= K else ""
    replicas = f"D={p.data_parallel}{once}, " if p.data_parallel > 1 else ""
    fig, bars = plots.timeline_figure(result.timeline, max_bars=MAX_GANTT_BARS, stages=K,
                                      title=f"Schedule timeline ({p.schedule_name}, {replicas}K={K}, v={v}, M={M})")
    st.plotly_chart(fig, key="explore.gantt")
    if bars.note:
        st.caption(bars.note + " Download the Chrome trace below for every action.")

    left, right = st.columns(2)
    left.plotly_chart(plots.stage_memory_figure(result), key="explore.stage_memory")
    right.plotly_chart(plots.memory_timeline_figure(result), key="explore.memory_time")

    if p.schedule_csv is not None:  # a schedule read from a CSV file is for its own K and M only
        st.caption(f"Bubble against M: not drawn for a schedule read from {p.schedule_csv} (its K and M only).")
    else:
        _bubble_vs_m(scenario, result)

    st.subheader("Ranks")
    st.dataframe(stage_table(result), hide_index=True)
    st.subheader("Downloads")
    download_buttons(scenario, result, "explore")


LAST_GOOD = "explore.last_good"  # the last (scenario, result) that ran: shown, greyed, under an error
STALE_KEY = "explore-stale"  # the container key (CSS class st-key-explore-stale) that greys it

st.title("Explore a pipeline")
data, notice = scenario_form(st.sidebar)
if notice:
    notice.show()
    st.stop()
run = try_run(data)  # on bad input: the error, naming the widget, above everything
stale = run is None
if run is None:
    run = st.session_state.get(LAST_GOOD)
    if run is None:
        st.stop()
    st.warning("Showing the last result that ran (greyed, stale): fix the input named above to update it.",
               icon=":material/history:")
    st.markdown(f"<style>.st-key-{STALE_KEY} {{opacity: 0.45; filter: grayscale(100%);}}</style>",
                unsafe_allow_html=True)
else:
    st.session_state[LAST_GOOD] = run
scenario, result = run
page = st.container(key=STALE_KEY if stale else "explore-live")
with page:
    show_results(scenario, result)
show_elapsed()
