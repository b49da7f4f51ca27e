"""The Plan page's search: run only when asked (a button), in the background, with progress and a cancel."""

from __future__ import annotations

from typing import Any, Callable

import streamlit as st

from gpipe_app.ui_background import BackgroundJob
from gpipe_app.ui_run import label_error

JOB = "plan.job"  # the session's search (one at a time), a BackgroundJob
RESULTS = "plan.results"  # question key -> its finished PlanSearch, the latest few
KEPT_RESULTS = 8
POLL_S = 0.5  # how often the page looks at a running search


def searched_or_stop(key: str, work: Callable[[Callable[[int, int], None]], Any]) -> Any:
    """The finished search of the question `key` (this session's, from earlier), else: its
    progress and a Cancel button while it runs, a Search button (and any error or cancel note)
    when not; then the page stops there. `work(progress)` runs the search; a running search of
    another question (the form changed) is cancelled."""
    results: dict[str, Any] = st.session_state.setdefault(RESULTS, {})
    if key in results:
        return results[key]
    job: BackgroundJob | None = st.session_state.get(JOB)
    if job is not None and job.key != key and job.running:
        job.cancel()  # the question changed: nobody waits for that answer
    if job is not None and job.key == key:
        if job.running:
            _watch()
            st.stop()
        if job.result is not None:
            _keep(results, key, job.result)
            return job.result
        if job.error:
            st.error(label_error(job.error), icon=":material/error:")
        elif job.cancelled:
            st.info(f"Search cancelled after {job.done:,} of {job.total:,} configurations.",
                    icon=":material/cancel:")
    st.button("Search", type="primary", key="plan.search", icon=":material/travel_explore:",
              on_click=_start, args=(key, work),
              help="Search every configuration of the question above (it runs in the background; "
                   "the page shows its progress and can cancel it).")
    st.stop()


def _keep(results: dict[str, Any], key: str, search: Any) -> None:
    results[key] = search
    while len(results) > KEPT_RESULTS:
        results.pop(next(iter(results)))


def _start(key: str, work: Callable[[Callable[[int, int], None]], Any]) -> None:
    """The Search button: cancel any search still running, start this one."""
    job: BackgroundJob | None = st.session_state.get(JOB)
    if job is not None and job.running:
        job.cancel()
    st.session_state[JOB] = BackgroundJob(key, work).start()


@st.fragment(run_every=POLL_S)
def _watch() -> None:
    """The running search's progress bar and Cancel button, redrawn every POLL_S; the whole page
    reruns when it ends."""
    job: BackgroundJob | None = st.session_state.get(JOB)
    if job is None:
        return
    job.seen()
    if not job.running:
        st.rerun()
    text = (f"Searching: {job.done:,} of {job.total:,} configurations decided" if job.total
            else "Searching: listing the configurations...")
    st.progress(job.fraction, text=text)
    st.button("Cancel", key="plan.cancel", icon=":material/cancel:", on_click=job.cancel)
