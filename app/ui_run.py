"""Running scenarios for the app: cached simulation, headline metrics, memory verdict and downloads."""

from __future__ import annotations

import json
import time
from typing import Any

import streamlit as st

from gpipe_sim.errors import GpipeError
from gpipe_sim.results.result import Result
from gpipe_sim.spec.scenario import Scenario, parse_scenario
from gpipe_sim.api import simulate
from gpipe_sim.results.trace import chrome_trace
from gpipe_sim.spec.units import format_bytes, format_seconds

MAX_GANTT_BARS = 1000
_RUN_STARTED = "_run_started"


def start_timer() -> None:
    """Mark the start of this script run (shown by `show_elapsed`)."""
    st.session_state[_RUN_STARTED] = time.perf_counter()


def show_elapsed() -> None:
    """A caption with the server time this interaction took."""
    started = st.session_state.get(_RUN_STARTED)
    if started is not None:
        st.caption(f"Page computed in {1000 * (time.perf_counter() - started):.0f} ms "
                   "(simulations are cached by scenario).")


def to_scenario(data: dict[str, Any]) -> Scenario:
    """Validate scenario data (raises ScenarioError with one line naming the field)."""
    return parse_scenario(data)


@st.cache_data(max_entries=512, show_spinner=False)
def _simulate_json(scenario_json: str) -> Result:
    return simulate(parse_scenario(json.loads(scenario_json)), engine="auto")


def simulate_cached(scenario: Scenario) -> Result:
    """`simulate(scenario, engine="auto")`, cached by the scenario's JSON."""
    return _simulate_json(json.dumps(scenario.to_dict(), sort_keys=True))


def try_run(data: dict[str, Any] | None, what: str = "") -> tuple[Scenario, Result] | None:
    """Validate and simulate; on bad input show the one-line message with st.error and return None."""
    if data is None:
        return None
    try:
        scenario = to_scenario(data)
        return scenario, simulate_cached(scenario)
    except GpipeError as exc:
        st.error(f"{what}{exc}", icon=":material/error:")
        return None


def bubble_text(value: float) -> str:
    """How every page prints a bubble fraction."""
    return f"{value:.4f}"


def show_metrics(scenario: Scenario, result: Result, box: Any = st, reference: Result | None = None) -> None:
    """Step time, throughput, bubble beside the analytic (K-1)/(M+K-1), and the memory verdict."""
    cols = box.columns(4)

    def delta(value: float, ref: float | None, fmt: str) -> str | None:
        if reference is None or ref is None:
            return None
        return fmt.format(value - ref)

    cols[0].metric("Step time", format_seconds(result.step_time_s),
                   delta(result.step_time_s * 1e3, reference and reference.step_time_s * 1e3, "{:+.3g} ms"),
                   delta_color="inverse")
    cols[1].metric("Throughput", f"{result.throughput_samples_per_s:,.1f} samples/s",
                   delta(result.throughput_samples_per_s,
                         reference and reference.throughput_samples_per_s, "{:+,.1f}"))
    cols[2].metric("Bubble fraction", bubble_text(result.bubble_fraction),
                   delta(result.bubble_fraction, reference and reference.bubble_fraction, "{:+.4f}"),
                   delta_color="inverse", help="Share of device time idle within the step (simulated).")
    cols[3].metric("Analytic (K-1)/(M+K-1)", bubble_text(result.analytic_bubble_fraction),
                   help="GPipe's bubble overhead for K stages and M micro-batches.")
    show_memory_verdict(result, box)


def memory_lines(result: Result) -> list[str]:
    """One line per device over capacity (empty when everything fits)."""
    cap = format_bytes(result.memory_capacity_bytes)
    return [
        f"device {device} (stage {', '.join(map(str, stages))}) needs {format_bytes(peak)} but has {cap}"
        for device, stages, peak in result.devices_over_capacity()
    ]


def show_memory_verdict(result: Result, box: Any = st) -> None:
    """A clear error when a device's peak memory exceeds its capacity, else how full the fullest is."""
    over = memory_lines(result)
    cap = result.memory_capacity_bytes
    if over:
        box.error("Does not fit in memory: " + "; ".join(over) + ".", icon=":material/memory:")
        return
    peak = max(result.device_peak_memory_bytes.values(), default=0.0)
    share = f" ({100 * peak / cap:.0f}% of {format_bytes(cap)})" if cap != float("inf") else ""
    box.success(f"Fits in memory: the fullest device peaks at {format_bytes(peak)}{share}.",
                icon=":material/check_circle:")


def download_buttons(scenario: Scenario | None, result: Result, key: str, box: Any = st) -> None:
    """Download the scenario (YAML), the result (JSON) and the timeline (Chrome trace JSON)."""
    cols = box.columns(3)
    if scenario is not None:
        cols[0].download_button("Scenario (YAML)", scenario.to_yaml(), file_name="scenario.yaml",
                                mime="application/x-yaml", key=f"dl.{key}.yaml", on_click="ignore",
                                icon=":material/download:")
    cols[1].download_button("Result (JSON)", lambda: result.to_json(indent=1), file_name="result.json",
                            mime="application/json", key=f"dl.{key}.json", on_click="ignore",
                            icon=":material/download:")
    cols[2].download_button("Timeline (Chrome trace)", lambda: json.dumps(chrome_trace(result.timeline)),
                            file_name="trace.json", mime="application/json", key=f"dl.{key}.trace",
                            on_click="ignore", icon=":material/download:",
                            help="Open in ui.perfetto.dev or chrome://tracing.")


def stage_table(result: Result) -> list[dict[str, Any]]:
    """Per-stage rows for st.dataframe."""
    return [
        {"stage": s.index, "layers": s.layers_text, "device": s.device,
         "busy": format_seconds(s.busy_s), "parameters": format_bytes(s.param_bytes),
         "grads + optimizer": format_bytes(s.state_bytes),
         "peak activations": format_bytes(s.peak_activation_bytes),
         "peak memory": format_bytes(s.peak_memory_bytes)}
        for s in result.stages
    ]
