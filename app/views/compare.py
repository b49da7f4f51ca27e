"""Compare: the sidebar configuration (A) and up to three variants (B, C, D) side by side.

A variant stores only the fields changed in its column (its overrides); everything else is A's,
so a variant follows every later change of A. Figures are shown with their differences from A
(units, signs, percentages); inputs and figures that differ are highlighted.
"""

from __future__ import annotations

import copy
from typing import Any

import pandas as pd
import streamlit as st

from gpipe_sim.results.result import Result
from gpipe_sim.schedule import SCHEDULES
from gpipe_sim.hardware.presets import hardware_presets
from gpipe_sim.scenario.scenario import DTYPE_BYTES, OPTIMIZER_STATES, OPTIMIZER_STEPS, PARTITION_METHODS, REMAT_MODES
from gpipe_sim.schema.units import format_bytes
from gpipe_sim import charts as plots
from gpipe_app.ui_form import MODEL_CLASSES, scenario_form
from gpipe_app.ui_scenario import choice_value, file_choice
from gpipe_app.ui_run import (
    MAX_GANTT_BARS, bubble_text, compact_number, delta_parts, download_buttons, duration_text, largest_peak,
    readable_field,
    show_elapsed, show_metrics, try_run,
)

MAX_VARIANTS = 3
NAMES = "BCD"
VARIANTS = "cfg.cmp.variants"  # a list: each variant's overrides {dotted field: value} (cfg.: kept across pages)
A_DATA = "cmp.a_data"  # A's data as last drawn: what a variant's change is compared against
WIDGET = "cmp.w."  # + "B.pipeline.stages": a variant's widgets, set from A and its overrides on every run

# The fields a variant can change: (dotted field, widget kind, options or (min, max)).
PIPELINE_FIELDS: tuple[tuple[str, str, Any], ...] = (
    ("pipeline.schedule", "select", lambda: list(SCHEDULES)),
    ("pipeline.chunks", "number", (1, 64)),
    ("pipeline.stages", "number", (1, 1024)),
    ("pipeline.micro_batches", "number", (1, 8192)),
    ("pipeline.batch_size", "number", (1, 10_000_000)),
    ("pipeline.remat", "select", lambda: list(REMAT_MODES)),
    ("pipeline.partition", "select", lambda: list(PARTITION_METHODS)),
    ("training.optimizer", "select", lambda: list(OPTIMIZER_STATES)),
    ("training.optimizer_step", "select", lambda: ["default", *OPTIMIZER_STEPS]),
    ("training.dtype", "select", lambda: list(DTYPE_BYTES)),
    ("hardware.preset", "select", lambda: list(hardware_presets())),
)


CHOICES = ("pipeline.schedule", "pipeline.partition")  # a CSV schedule, a list of layer counts: one option


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested scenario data as {dotted field: value}; a schedule or partition as the form's option
    (`file_choice`: 'csv: PATH', 'layers: 6, 8')."""
    if prefix[:-1] in CHOICES:
        return {prefix[:-1]: file_choice(data)}
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: data}


def variant_data(a: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A's data with a variant's overrides: another model or hardware preset starts from that
    preset's defaults (then the variant's own model fields); every other field is A's."""
    data = copy.deepcopy(a)
    preset = overrides.get("model.preset", a["model"].get("preset"))
    if preset != a["model"].get("preset"):
        data["model"] = MODEL_CLASSES[preset]().model_dump() if preset in MODEL_CLASSES else {"preset": preset}
    fields = MODEL_CLASSES[preset].model_fields if preset in MODEL_CLASSES else {}
    for dotted, value in overrides.items():
        section, name = dotted.split(".", 1)
        if dotted == "model.preset":
            continue
        if section == "model":
            if name in fields:
                data["model"][name] = value
        elif dotted == "hardware.preset":
            if value != a["hardware"].get("preset"):
                data["hardware"] = {"preset": value}
        else:
            data.setdefault(section, {})[name] = choice_value(value) if dotted in CHOICES else value
    return data


def model_fields(preset: str) -> list[str]:
    """A model preset's whole-number fields (layers, widths...): what a variant's column offers."""
    cls = MODEL_CLASSES.get(preset)
    if cls is None:
        return []
    return [name for name, f in cls.model_fields.items() if name != "preset" and f.annotation is int]


def first_variant(a: dict[str, Any]) -> dict[str, Any]:
    """B's first overrides: the next registered schedule after A's that takes A's K and M (with A's
    v, or one chunk per rank)."""
    p = a["pipeline"]
    names = list(SCHEDULES)
    start = names.index(p["schedule"]) if p["schedule"] in names else -1
    for name in names[start + 1:] + names[:start]:
        family = SCHEDULES[name]
        if family.problem(p["stages"], p["micro_batches"], p["chunks"]) is None:
            return {"pipeline.schedule": name}
        if family.problem(p["stages"], p["micro_batches"], 1) is None:
            return {"pipeline.schedule": name, "pipeline.chunks": 1}
    return {}


def _variants() -> list[dict[str, Any]]:
    return st.session_state[VARIANTS]


def _changed(index: int, dotted: str) -> None:
    """A variant's widget changed: keep the value as an override, or drop the override when the
    value is what the variant would have anyway (A's)."""
    a = st.session_state[A_DATA]
    overrides = _variants()[index]
    value = st.session_state[f"{WIDGET}{NAMES[index]}.{dotted}"]
    if dotted == "model.preset":  # another model: its own fields start from that preset's defaults
        for key in [k for k in overrides if k.startswith("model.")]:
            del overrides[key]
    rest = {k: v for k, v in overrides.items() if k != dotted}
    if flatten(variant_data(a, rest)).get(dotted) == value:
        overrides.pop(dotted, None)
    else:
        overrides[dotted] = value


def _add_variant() -> None:
    if len(_variants()) < MAX_VARIANTS:
        _variants().append({})


def _remove_variant(index: int) -> None:
    del _variants()[index]


def _reset_variant(index: int) -> None:
    _variants()[index].clear()


_label = readable_field


def _widget(box: Any, name: str, index: int, dotted: str, kind: str, spec: Any, value: Any) -> None:
    key = f"{WIDGET}{name}.{dotted}"
    st.session_state[key] = value  # A's value, or the variant's own
    common = dict(key=key, on_change=_changed, args=(index, dotted), label_visibility="visible")
    if kind == "select":
        options = list(spec())
        if value not in options:
            options.append(value)
        box.selectbox(_label(dotted), options, **common)
    else:
        low, high = spec
        box.number_input(_label(dotted), min_value=low, max_value=max(high, value), step=1, **common)


def variant_column(box: Any, index: int, a: dict[str, Any]) -> dict[str, Any]:
    """Draw one variant's column; return its scenario data (A with the variant's overrides)."""
    name = NAMES[index]
    overrides = _variants()[index]
    data = variant_data(a, overrides)
    flat = flatten(data)
    box.markdown(f"**{name}**: A with {len(overrides) or 'no'} change{'s' if len(overrides) != 1 else ''}")
    box.caption(", ".join(f"{_label(k)} = {v}" for k, v in overrides.items()) or "Follows A exactly.")
    for dotted, kind, spec in PIPELINE_FIELDS:
        _widget(box, name, index, dotted, kind, spec, flat[dotted])
    with box.expander("Model", expanded="model.preset" in overrides or any(
            k.startswith("model.") for k in overrides)):
        presets = list(MODEL_CLASSES) + ([a["model"]["preset"]] if a["model"]["preset"] not in MODEL_CLASSES else [])
        _widget(st, name, index, "model.preset", "select", lambda: presets, data["model"]["preset"])
        for field in model_fields(data["model"]["preset"]):
            _widget(st, name, index, f"model.{field}", "number", (1, 10**9), int(flat[f"model.{field}"]))
    b1, b2 = box.columns(2)
    b1.button("Reset to A", key=f"btn.cmp.reset.{name}", on_click=_reset_variant, args=(index,),
              disabled=not overrides)
    b2.button(f"Remove {name}", key=f"btn.cmp.remove.{name}", on_click=_remove_variant, args=(index,))
    return data


def _a_column(box: Any, a: dict[str, Any]) -> None:
    flat = flatten(a)
    box.markdown("**A**: the sidebar")
    shown = [d for d, _, _ in PIPELINE_FIELDS] + ["model.preset"] + [f"model.{f}" for f in model_fields(a["model"]["preset"])]
    box.dataframe(pd.DataFrame({"A": [str(flat.get(d, "")) for d in shown]}, index=[_label(d) for d in shown]),
                  height=35 * (len(shown) + 1) + 3)


FIGURES: tuple[tuple[str, Any, str], ...] = (  # (row, value of a result, kind of value)
    ("step time", lambda r: r.step_time_s, "seconds"),
    ("throughput (samples/s)", lambda r: r.throughput_samples_per_s, "rate"),
    ("bubble fraction", lambda r: r.bubble_fraction, "fraction"),
    ("imbalance", lambda r: r.imbalance_fraction, "fraction"),
    ("fill/drain (busiest rank idle)", lambda r: r.busiest_idle_fraction, "fraction"),
    ("analytic bubble", lambda r: r.analytic_bubble_fraction, "fraction"),
    ("largest device peak", largest_peak, "bytes"),
)


def _shown(value: float, kind: str) -> str:
    if kind == "seconds":
        return duration_text(value)
    if kind == "bytes":
        return format_bytes(value)
    if kind == "fraction":
        return bubble_text(value)
    return compact_number(value)


def figures_table(named: list[tuple[str, Result]]) -> pd.DataFrame:
    """Rows of figures, a column per configuration; each variant's cell with its difference from A."""
    (_, ref), rows = named[0], {}
    for row, get, kind in FIGURES:
        cells = []
        for i, (_, result) in enumerate(named):
            text = _shown(get(result), kind)
            if i and get(result) != get(ref):
                text += " (" + ", ".join(x for x in delta_parts(get(result), get(ref), kind) if x) + ")"
            cells.append(text)
        rows[row] = cells
    rows["fits in memory"] = ["yes" if r.fits_in_memory else "NO" for _, r in named]
    return pd.DataFrame(rows, index=[n for n, _ in named]).T


def _highlight_differences(df: pd.DataFrame) -> Any:
    """Cells of a variant that differ from A's (the first column) highlighted."""
    def row_style(row: pd.Series) -> list[str]:
        base = str(row.iloc[0])
        return ["background-color: rgba(255, 196, 0, 0.35)" if i and str(v) != base else ""
                for i, v in enumerate(row)]
    return df.style.apply(row_style, axis=1)


st.title("Compare configurations")
st.caption("A is the sidebar configuration. B, C and D are A with the fields changed in their own "
           "column: they follow every other change of A. Figures show each one's difference from A.")
a_data, notice = scenario_form(st.sidebar)
if notice:
    notice.show()
    st.stop()
st.session_state[A_DATA] = a_data
if VARIANTS not in st.session_state:
    st.session_state[VARIANTS] = [first_variant(a_data)]

count = len(_variants())
columns = st.columns(1 + MAX_VARIANTS)
_a_column(columns[0], a_data)
variants = [variant_column(columns[1 + i], i, a_data) for i in range(count)]
if count < MAX_VARIANTS:
    columns[1 + count].button(f"Add {NAMES[count]}", key="btn.cmp.add", on_click=_add_variant,
                              icon=":material/add:", help="Another variant: A with the changes you make in its column.")

runs: list[tuple[str, Any, Result]] = []
run_a = try_run(a_data, "Configuration A: ")
if run_a is None:
    st.stop()
runs.append(("A", *run_a))
for i, data in enumerate(variants):
    run = try_run(data, f"Configuration {NAMES[i]}: ")
    if run is not None:
        runs.append((NAMES[i], *run))

flats = [(name, flatten(scenario.to_dict())) for name, scenario, _ in runs]
keys = sorted({k for _, f in flats for k in f})
changed = [k for k in keys if len({repr(f.get(k)) for _, f in flats}) > 1]
left, right = st.columns([2, 3])
left.markdown("**Inputs that differ**")
if changed:
    inputs = pd.DataFrame({name: [str(f.get(k, "")) for k in changed] for name, f in flats}, index=changed)
    left.dataframe(_highlight_differences(inputs))
else:
    left.info("The configurations are the same.")
right.markdown("**Figures** (differences from A)")
right.dataframe(_highlight_differences(figures_table([(name, result) for name, _, result in runs])))

span = max(result.step_time_s for _, _, result in runs)
for row in range(0, len(runs), 2):
    cols = st.columns(2)
    for col, (name, scenario, result) in zip(cols, runs[row:row + 2]):
        p = scenario.pipeline
        fig, bars = plots.timeline_figure(result.timeline, max_bars=MAX_GANTT_BARS, x_range_s=span, stages=p.stages,
                                          title=f"{name}: {p.schedule_name}, K={p.stages}, v={p.chunks}, "
                                                f"M={p.micro_batches}, remat {p.remat}")
        col.plotly_chart(fig, key=f"cmp.gantt.{name}")
        if bars.note:
            col.caption(bars.note)

reference = runs[0][2]
for tab, (name, scenario, result) in zip(st.tabs([name for name, _, _ in runs]), runs):
    with tab:
        show_metrics(scenario, result, reference=None if name == "A" else reference)
        st.plotly_chart(plots.stage_memory_figure(result), key=f"cmp.mem.{name}")
        download_buttons(scenario, result, f"cmp.{name}")
show_elapsed()
