"""Running scenarios for the app: cached simulation, headline metrics, memory verdict and downloads."""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any

import streamlit as st
import yaml

from gpipe_sim.errors import GpipeError
from gpipe_sim.results.fit import over_capacity_text
from gpipe_sim.results.result import Result
from gpipe_sim.results.run_cost import run_cost_rows
from gpipe_sim.scenario.scenario import Scenario, parse_scenario
from gpipe_sim.api import simulate
from gpipe_sim.results.trace import chrome_trace
from gpipe_sim.schema.units import format_bytes, format_seconds
from gpipe_sim.summary import parameters_short

MAX_GANTT_BARS = 2500  # beyond, the chart merges actions (never misstating busy time)
_RUN_STARTED = "_run_started"
ANALYTIC_LABEL = "Analytic bubble"


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
    return simulate(parse_scenario(json.loads(scenario_json)))


def simulate_cached(scenario: Scenario) -> Result:
    """`simulate(scenario)` (the default engine), cached by the scenario's JSON."""
    return _simulate_json(json.dumps(scenario.to_dict(), sort_keys=True))


def try_run(data: dict[str, Any] | None, what: str = "") -> tuple[Scenario, Result] | None:
    """Validate and simulate; on bad input show the one-line message (naming the form's widget,
    not the dotted field) with st.error and return None."""
    if data is None:
        return None
    try:
        scenario = to_scenario(data)
        return scenario, simulate_cached(scenario)
    except GpipeError as exc:
        st.error(f"{what}{label_error(str(exc))}", icon=":material/error:")
        return None


# The form's widget labels by the dotted field they set (model fields: their own name, spaced).
FIELD_LABELS: dict[str, str] = {
    "pipeline.stages": "stages K", "pipeline.micro_batches": "micro-batches M",
    "pipeline.chunks": "chunks per rank v", "pipeline.batch_size": "mini-batch size",
    "pipeline.schedule": "schedule", "pipeline.remat": "re-materialization", "pipeline.partition": "partition",
    "pipeline.tensor_parallel": "tensor parallel T", "pipeline.sequence_parallel": "sequence parallel",
    "pipeline.context_parallel": "context parallel C", "pipeline.expert_parallel": "expert parallel E",
    "training.optimizer": "optimizer", "training.dtype": "dtype", "model.preset": "model preset",
    "training.optimizer_step": "optimizer step", "training.zero": "ZeRO stage", "training.tokens": "tokens to train on",
    "pipeline.data_parallel": "data-parallel D", "hardware.price_per_device_hour": "price per device-hour",
    "hardware.devices_per_node": "devices per node",
    "hardware.network.bandwidth": "network bandwidth (per port or NIC)",
    "model": "model", "hardware.preset": "hardware preset", "hardware.stage_to_device": "rank → device map",
    "hardware.accelerator.efficiency": "compute efficiency", "hardware.accelerator.memory_bytes": "device memory",
    "hardware.accelerator.memory_bandwidth": "memory bandwidth",
    "hardware.accelerator.kernel_overhead_s": "per-kernel overhead",
    "hardware.link.bandwidth": "link bandwidth (per direction)", "hardware.link.latency_s": "link latency",
}
_FIELD = re.compile(r"^([a-z_]+(?:\.[A-Za-z0-9_\-]+)*): ")


def field_label(dotted: str) -> str | None:
    """The widget label for a dotted field, or None where the form has no such widget (`readable_field`
    names those)."""
    if dotted in FIELD_LABELS:
        return FIELD_LABELS[dotted]
    parts = dotted.split(".")
    if parts[:3] == ["hardware", "accelerator", "peak_flops"] and len(parts) == 4:
        return f"peak compute ({parts[3]})"
    if parts[0] == "model" and len(parts) == 2:
        return parts[1].replace("_", " ")
    return None


def readable_field(dotted: str) -> str:
    """A dotted field as a person reads it: its widget's label, else its last part spaced with
    where it is ("latency s (hardware.network)")."""
    label = field_label(dotted)
    if label is not None:
        return label
    *where, name = dotted.split(".")
    return name.replace("_", " ") + (f" ({'.'.join(where)})" if where else "")


def label_error(message: str) -> str:
    """A one-line scenario error with its leading dotted field replaced by the widget's label
    ("pipeline.stages: ..." -> "stages K: ..."); unchanged where no widget sets that field."""
    match = _FIELD.match(message)
    label = field_label(match.group(1)) if match else None
    return message if label is None else f"{label}: {message[match.end():]}"


def bubble_text(value: float) -> str:
    """How every page prints a bubble fraction."""
    return f"{value:.4f}"


def compact_number(value: float) -> str:
    """A rate short enough for a metric: '0.0078', '58.4', '9,999.9', '12.35k', '1.2M'."""
    if not math.isfinite(value):
        return str(value)
    if abs(value) < 100:
        return f"{value:.3g}"
    if abs(value) < 1e4:
        return f"{value:,.1f}"
    for suffix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.4g}{suffix}"
    return f"{value:.4g}"


def duration_text(seconds: float) -> str:
    """A duration short enough for a metric: '12.3 ms', '1.1 s', '2.5 min', '2.29 h'."""
    if abs(seconds) >= 3600:
        return f"{seconds / 3600:.3g} h"
    if abs(seconds) >= 60:
        return f"{seconds / 60:.3g} min"
    return format_seconds(seconds)


def _signed(text: str, negative: bool) -> str:
    return ("-" if negative else "+") + text


def delta_parts(value: float, reference: float, kind: str) -> tuple[str, str | None]:
    """`value - reference` with its sign and units, and the relative change (None for fractions,
    which are shares already, or a zero reference): ('-1.33 s', '-52.1%'), ('+1.20 GiB', 'x3.5')."""
    diff = value - reference
    if kind == "fraction":
        return f"{diff:+.4f}", None
    if kind == "seconds":
        text = _signed(duration_text(abs(diff)), diff < 0)
    elif kind == "bytes":
        text = _signed(format_bytes(abs(diff)), diff < 0)
    else:
        text = _signed(compact_number(abs(diff)), diff < 0)
    if not reference:
        return text, None
    relative = 100 * diff / abs(reference)
    return text, f"{relative:+.1f}%" if abs(relative) < 1000 else f"x{value / reference:.3g}"


def delta_text(value: float, reference: float, kind: str) -> str:
    """`value - reference` readable, for a metric's delta: '-1.33 s (-52.1%)', '+1.20 GiB (+8.8%)',
    '+0.0123' (fractions), '+3.2 (+5.5%)' (rates), 'no change'."""
    if value == reference:
        return "no change"
    text, relative = delta_parts(value, reference, kind)
    return text if relative is None else f"{text} ({relative})"


def largest_peak(result: Result) -> float:
    return max(result.device_peak_memory_bytes.values(), default=0.0)


IMBALANCE_LABEL = "Imbalance"
FILL_DRAIN_LABEL = "Fill/drain (busiest rank idle)"


def show_metrics(scenario: Scenario, result: Result, box: Any = st, reference: Result | None = None) -> None:
    """Rows of short metrics: step time, throughput and the largest device peak; the bubble,
    its two factors (imbalance between ranks, the busiest rank's fill/drain idle) and the
    schedule's analytic bubble; parameters, tokens/s, TFLOP/s per device and MFU. Deltas against
    `reference`, with units and percentages. Then the memory verdict."""

    def delta(value: float, ref: float | None, kind: str) -> str | None:
        if reference is None or ref is None or value == ref:
            return None  # no arrow for no change
        return delta_text(value, ref, kind)

    r, ref = result, reference
    top = box.columns(3)
    top[0].metric("Step time", duration_text(r.step_time_s),
                  delta(r.step_time_s, ref and ref.step_time_s, "seconds"), delta_color="inverse")
    top[1].metric("Throughput (samples/s)", compact_number(r.throughput_samples_per_s),
                  delta(r.throughput_samples_per_s, ref and ref.throughput_samples_per_s, "rate"))
    top[2].metric("Largest device peak", format_bytes(largest_peak(r)),
                  delta(largest_peak(r), ref and largest_peak(ref), "bytes"), delta_color="inverse",
                  help="Parameters, gradients, optimizer states and the activations held at the peak.")
    low = box.columns(4)
    low[0].metric("Bubble fraction", bubble_text(r.bubble_fraction),
                  delta(r.bubble_fraction, ref and ref.bubble_fraction, "fraction"),
                  delta_color="inverse", help="Share of device time idle within the step (simulated): "
                  "1 - bubble = (1 - imbalance) x (1 - fill/drain) when every rank has its own device.")
    low[1].metric(IMBALANCE_LABEL, bubble_text(r.imbalance_fraction),
                  delta(r.imbalance_fraction, ref and ref.imbalance_fraction, "fraction"),
                  delta_color="inverse", help="Lost to uneven ranks: 1 - mean busy / busiest rank's busy. "
                  "The time and fit partitions lower it.")
    low[2].metric(FILL_DRAIN_LABEL, bubble_text(r.busiest_idle_fraction),
                  delta(r.busiest_idle_fraction, ref and ref.busiest_idle_fraction, "fraction"),
                  delta_color="inverse", help="The share of the step the busiest rank idles: the "
                  "pipeline's own fill and drain, what the analytic bubble describes.")
    p, mesh = scenario.pipeline, scenario.mesh
    if mesh.data_parallel > 1 or mesh.devices_per_rank > 1:
        dp = box.columns(3)
        shape = f"{mesh.data_parallel} x {mesh.stages}" if mesh.devices_per_rank == 1 else \
            f"T={mesh.tensor_parallel} x " + (f"C={mesh.context_parallel} x " if mesh.context_parallel > 1 else "") \
            + f"K={mesh.stages} x D={mesh.data_parallel}"
        dp[0].metric("Devices", f"{r.num_devices} ({shape})",
                     help="D data-parallel replicas of the K-rank pipeline, each rank on T x C devices.")
        dp[1].metric("Throughput per device", compact_number(r.throughput_per_device),
                     delta(r.throughput_per_device, ref and ref.throughput_per_device, "rate"))
        dp[2].metric("Exposed all-reduce", duration_text(r.exposed_allreduce_s),
                     delta(r.exposed_allreduce_s, ref and ref.exposed_allreduce_s, "seconds"),
                     delta_color="inverse", help="The longest time a rank waits for its chunks' gradient "
                     "all-reduces before the update (what the backward passes did not hide).")
    low[3].metric(ANALYTIC_LABEL, bubble_text(r.analytic_bubble_fraction),
                  help=f"The {p.schedule_name} schedule's own bubble overhead for K={p.stages} ranks, "
                       f"v={p.chunks} chunks per rank and M={p.micro_batches} micro-batches "
                       "(fill-drain schedules: (K-1)/(v*M+K-1), GPipe's (K-1)/(M+K-1) at v = 1).")
    show_model_metrics(result, box, reference)
    show_memory_verdict(result, box)


MFU_HELP = ("Model FLOPs utilisation: the model FLOPs of the step (for a transformer Megatron-LM's count: its "
            "GEMMs and causal attention, 3x the forward; for other models every layer's forward + backward; "
            "re-computation not counted) over step time x devices x the accelerator's peak FLOP/s for the "
            "training dtype. PaLM's convention (6 N + 12 L H Q T per token) is the result JSON's mfu_palm.")


def show_model_metrics(result: Result, box: Any = st, reference: Result | None = None) -> None:
    """The figures people quote: parameters, tokens/s, model TFLOP/s per device and MFU ("-"
    where not known: tokens of a non-token model, FLOPs of layers timed in seconds)."""
    if result.figures is None:
        return
    q = result.quoted_figures
    ref = reference.quoted_figures if reference is not None else {}

    def delta(key: str, kind: str) -> str | None:
        value, before = q[key], ref.get(key)
        if value is None or before is None or value == before:
            return None
        return delta_text(value, before, kind)

    row = box.columns(4)
    row[0].metric("Parameters", parameters_short(q["parameters"]), help=f"{q['parameters']:,} parameters in all "
                  "(one replica).")
    row[1].metric("Tokens/s", "-" if q["tokens_per_s"] is None else compact_number(q["tokens_per_s"]),
                  delta("tokens_per_s", "rate"), help="Batch x sequence length / step time (token models only; "
                  "others: samples/s).")
    row[2].metric("TFLOP/s per device", "-" if q["tflops_per_device"] is None else f"{q['tflops_per_device']:,.1f}",
                  delta("tflops_per_device", "rate"), help="Model FLOPs of the step / step time / devices "
                  "(needs FLOPs for every layer).")
    row[3].metric("MFU", "-" if q["mfu"] is None else f"{q['mfu']:.1%}", delta("mfu", "fraction"), help=MFU_HELP)
    show_run_metrics(result, box)


def show_run_metrics(result: Result, box: Any = st) -> None:
    """The training run's days, device-hours, goodput and cost, where the scenario asks for them
    (training.tokens, training.goodput, hardware.price_per_device_hour); "-" where one is not given."""
    run = result.run
    if run is None:
        return
    row = box.columns(4)
    row[0].metric("Days to train", "-" if run.days is None else f"{run.days:,.1f}",
                  help="steps (tokens / tokens per step, rounded up) x step time / goodput; needs training.tokens.")
    row[1].metric("Device-hours", "-" if run.device_hours is None else compact_number(run.device_hours),
                  help="The run's wall-clock hours x devices.")
    row[2].metric("Goodput", "-" if run.goodput is None else f"{run.goodput.goodput:.1%}",
                  help="The share of wall-clock time that trains, after failures and checkpoints "
                       "(training.goodput; docs/guide/cost-and-frameworks.md).")
    cost = run.cost if run.cost is not None else run.cost_per_hour
    row[3].metric("Cost" if run.cost is not None else "Cost per hour", "-" if cost is None else compact_number(cost),
                  help="device-hours x hardware.price_per_device_hour (without training.tokens: per hour).")
    box.caption("; ".join(f"{name}: {text}" for name, text in run_cost_rows(run)))


def show_memory_verdict(result: Result, box: Any = st) -> None:
    """A clear error when a device's peak memory exceeds its capacity, else how full the fullest is."""
    over = over_capacity_text(result)  # the devices over capacity, one line (None: all fit)
    cap = result.memory_capacity_bytes
    if over:
        box.error(f"Does not fit in memory: {over}.", icon=":material/memory:")
        return
    peak = max(result.device_peak_memory_bytes.values(), default=0.0)
    share = f" ({100 * peak / cap:.0f}% of {format_bytes(cap)})" if cap != float("inf") else ""
    box.success(f"Fits in memory: the fullest device peaks at {format_bytes(peak)}{share}.",
                icon=":material/check_circle:")


FRAMEWORK_FILES = {"megatron": ("Megatron-LM (launch line)", "megatron.sh", "text/x-shellscript"),
                   "torchtitan": ("torchtitan (job TOML)", "torchtitan.toml", "application/toml"),
                   "deepspeed": ("DeepSpeed (JSON)", "deepspeed.json", "application/json")}


def framework_downloads(scenario: Scenario, key: str, box: Any = st) -> None:
    """The configuration as each framework's file to download (`gpipe-sim simulate --emit`), and
    what each cannot express, one line each, in an expander."""
    from gpipe_sim.frameworks.command import writer

    cols = box.columns(len(FRAMEWORK_FILES))
    notes = []
    for col, (framework, (label, name, mime)) in zip(cols, FRAMEWORK_FILES.items()):
        written = writer(framework)(scenario)
        col.download_button(label, written.text + "\n", file_name=name, mime=mime, key=f"dl.{key}.{framework}",
                            on_click="ignore", icon=":material/download:")
        notes += [f"{label}: {note}" for note in written.notes]
    if notes:
        box.expander("What the frameworks' files cannot express").markdown("\n".join(f"- {note}" for note in notes))


def download_buttons(scenario: Scenario | None, result: Result, key: str, box: Any = st) -> None:
    """Download the scenario (YAML), the result (JSON) and the timeline (Chrome trace JSON)."""
    cols = box.columns(3)
    if scenario is not None:
        cols[0].download_button("Scenario (YAML)", scenario_yaml(scenario), file_name="scenario.yaml",
                                mime="application/x-yaml", key=f"dl.{key}.yaml", on_click="ignore",
                                icon=":material/download:")
    cols[1].download_button("Result (JSON)", lambda: result.to_json(indent=1), file_name="result.json",
                            mime="application/json", key=f"dl.{key}.json", on_click="ignore",
                            icon=":material/download:")
    cols[2].download_button("Timeline (Chrome trace)", lambda: json.dumps(chrome_trace(result.timeline)),
                            file_name="trace.json", mime="application/json", key=f"dl.{key}.trace",
                            on_click="ignore", icon=":material/download:",
                            help="Open in ui.perfetto.dev or chrome://tracing.")


def round_floats(data: Any, digits: int = 12) -> Any:
    """`data` with every float rounded to `digits` significant digits (2039000000000.0002 -> 2.039e12,
    written 2039000000000.0); whole floats and non-finite ones kept."""
    if isinstance(data, dict):
        return {k: round_floats(v, digits) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [round_floats(v, digits) for v in data]
    if isinstance(data, float) and math.isfinite(data) and data != 0:
        return float(f"{data:.{digits}g}")
    return data


def scenario_yaml(scenario: Scenario) -> str:
    """The scenario as YAML for download: floats to 12 significant digits, so unit conversions
    ('2039 GB/s' -> 2039000000000.0002) read as typed; it loads back to the same scenario."""
    return yaml.safe_dump(round_floats(scenario.to_dict()), sort_keys=False)


def stage_table(result: Result) -> list[dict[str, Any]]:
    """Per-rank rows for st.dataframe: the rank's chunks and their layers, and its figures."""
    return [
        {"rank": s.index, "chunks": ", ".join(map(str, s.chunks)), "layers": s.layers_text, "device": s.device,
         "busy": format_seconds(s.busy_s), "parameters": format_bytes(s.param_bytes),
         "grads + optimizer": format_bytes(s.state_bytes),
         "peak activations": format_bytes(s.peak_activation_bytes),
         "peak memory": format_bytes(s.peak_memory_bytes)}
        for s in result.stages
    ]
