"""Fixtures for the app tests: AppTest on the real entry point, validation and sweep files."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpipe_sim import parse_scenario, simulate
from gpipe_sim.schedule.registry import fill_drain_bubble

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app" / "streamlit_app.py"
# A uniform model on ideal hardware without re-materialization: its GPipe bubble is exactly
# (K-1)/(M+K-1) (interleaved 1F1B's: (K-1)/(v*M+K-1)), so the shown bubble must equal the analytic value.
UNIFORM = {"model.preset": "uniform", "hardware.preset": "ideal", "pipeline.remat": "none",
           "pipeline.partition": "uniform", "pipeline.schedule": "gpipe", "pipeline.chunks": 1}
ANALYTIC = "Analytic bubble"  # the metric beside the simulated bubble: the schedule's own formula


def app_test(timeout: float = 60):
    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(str(APP), default_timeout=timeout)


def metric(at: Any, label: str) -> str:
    values = [m.value for m in at.metric if m.label == label]
    assert values, f"no metric {label!r} among {[m.label for m in at.metric]}"
    return values[0]


def set_widget(at: Any, key: str, value: Any) -> None:
    """Set a widget by key wherever it is (sidebar or main)."""
    for kind in ("number_input", "selectbox", "text_input", "multiselect", "toggle"):
        widgets = [w for w in getattr(at, kind) if w.key == key]
        if widgets:
            widgets[0].set_value(value)
            return
    raise KeyError(key)


def uniform_data(stages: int, micro_batches: int, hardware: str = "ideal", **pipeline: Any) -> dict[str, Any]:
    return {
        "model": {"preset": "uniform", "layers": 16},
        "hardware": {"preset": hardware},
        "pipeline": {"stages": stages, "micro_batches": micro_batches, "batch_size": 64,
                     "remat": "none", "partition": "uniform", **pipeline},
    }


def write_validation(path: Path, stages: int = 4, micro_batches: int = 8) -> dict[str, Any]:
    """A validation document: the uniform scenario on ideal hardware against the same on `cpu`."""
    predicted = simulate(parse_scenario(uniform_data(stages, micro_batches)), engine="auto")
    measured = simulate(parse_scenario(uniform_data(stages, micro_batches, "cpu")), engine="auto")
    measured.source = "measured"
    fields = ("step_time_s", "throughput_samples_per_s", "bubble_fraction")
    rel = {f: abs(getattr(predicted, f) - getattr(measured, f)) / getattr(measured, f) for f in fields}
    for p, m in zip(predicted.stages, measured.stages):
        rel[f"stage{p.index}.peak_activation_bytes"] = abs(
            p.peak_activation_bytes - m.peak_activation_bytes) / m.peak_activation_bytes
    steps = [measured.step_time_s * (1 + 0.01 * i) for i in range(5)]
    doc = {"predicted": predicted.to_dict(), "measured": measured.to_dict(), "relative_error": rel,
           "measured_step_times_s": steps, "link": {"bandwidth": 2e9, "latency_s": 5e-5}}
    path.write_text(json.dumps(doc))
    return doc


def sweep_table(stages=(2, 4, 8), micro=(1, 2, 4, 8, 16)) -> pd.DataFrame:
    """A sweep table in the sweep format: dotted inputs, scalar results, per-stage lists, one failure."""
    rows = []
    for i, (k, m) in enumerate([(k, m) for k in stages for m in micro] + [(32, 4)]):
        data = uniform_data(k, m)
        row: dict[str, Any] = {"sweep.index": i}
        row.update({f"pipeline.{n}": v for n, v in data["pipeline"].items()})
        row.update({"model.preset": "uniform", "model.layers": 16, "hardware.preset": "ideal"})
        try:
            r = simulate(parse_scenario(data), engine="auto")
        except Exception as exc:  # the failing row, as the sweep runner records it
            row.update({"error": str(exc), "status": "error"})
        else:
            row.update({
                "step_time_s": r.step_time_s, "throughput_samples_per_s": r.throughput_samples_per_s,
                "bubble_fraction": r.bubble_fraction, "analytic_bubble_fraction": fill_drain_bubble(k, m),
                "fits_in_memory": r.fits_in_memory,
                "stage_peak_memory_bytes": [s.peak_memory_bytes for s in r.stages],
                "status": "ok", "error": None,
            })
        rows.append(row)
    return pd.DataFrame(rows)


def _decode(value: Any) -> Any:
    """Plotly's JSON encodes numpy arrays as {"dtype", "bdata"(, "shape")}: back to lists."""
    if isinstance(value, dict):
        if "bdata" in value and "dtype" in value:
            array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
            if "shape" in value:
                array = array.reshape([int(n) for n in str(value["shape"]).split(",")])
            return array.tolist()
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def plotly_specs(at: Any) -> list[dict[str, Any]]:
    """The page's plotly figures as plain JSON data (arrays decoded)."""
    return [_decode(json.loads(chart.proto.spec)) for chart in at.get("plotly_chart")]


def page_ms(at: Any) -> float | None:
    for caption in at.caption:
        match = re.match(r"Page computed in (\d+) ms", caption.value)
        if match:
            return float(match.group(1))
    return None
