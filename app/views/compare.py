"""Compare: the sidebar configuration (A) against a variant (B), side by side with differences marked."""

from __future__ import annotations

import copy
from typing import Any

import pandas as pd
import streamlit as st

from gpipe_sim.studies import plots
from gpipe_sim.spec.presets import hardware_presets
from gpipe_sim.spec.scenario import PARTITION_METHODS, REMAT_MODES
from gpipe_sim.schedule import SCHEDULES
from gpipe_sim.spec.units import format_bytes, format_seconds
from ui_form import scenario_form
from ui_run import MAX_GANTT_BARS, download_buttons, show_elapsed, show_metrics, try_run

B = "cfg.cmp.b."  # B's widget keys; the cfg. prefix keeps them across pages
B_FIELDS = ("pipeline.schedule", "pipeline.remat", "pipeline.stages", "pipeline.micro_batches",
            "pipeline.batch_size", "pipeline.partition", "hardware.preset")


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: data}


def _b_defaults(a: dict[str, Any]) -> dict[str, Any]:
    flat = _flatten(a)
    defaults = {f: flat.get(f) for f in B_FIELDS}
    defaults["pipeline.schedule"] = "1f1b" if flat["pipeline.schedule"] != "1f1b" else "gpipe"
    return defaults


def _copy_a_into_b(a: dict[str, Any]) -> None:
    flat = _flatten(a)
    for f in B_FIELDS:
        st.session_state[B + f] = flat[f]


def _variant_form(a: dict[str, Any]) -> dict[str, Any]:
    defaults = _b_defaults(a)
    for f, value in defaults.items():
        st.session_state.setdefault(B + f, value)
    st.subheader("Configuration B: A with these changes")
    c = st.columns(7)
    c[0].selectbox("schedule", list(SCHEDULES), key=B + "pipeline.schedule")
    c[1].selectbox("re-materialization", REMAT_MODES, key=B + "pipeline.remat")
    c[2].number_input("stages K", min_value=1, max_value=1024, step=1, key=B + "pipeline.stages")
    c[3].number_input("micro-batches M", min_value=1, max_value=8192, step=1, key=B + "pipeline.micro_batches")
    c[4].number_input("mini-batch", min_value=1, max_value=10_000_000, step=1, key=B + "pipeline.batch_size")
    c[5].selectbox("partition", PARTITION_METHODS, key=B + "pipeline.partition")
    c[6].selectbox("hardware", list(hardware_presets()), key=B + "hardware.preset")
    st.button("Reset B to A", on_click=_copy_a_into_b, args=(a,), key="btn.cmp.reset")
    b = copy.deepcopy(a)
    for f in B_FIELDS[:-1]:
        section, name = f.split(".")
        b[section][name] = st.session_state[B + f]
    if b["pipeline"]["schedule"] == "naive":
        b["pipeline"]["micro_batches"] = 1
    if st.session_state[B + "hardware.preset"] != a["hardware"]["preset"]:
        b["hardware"] = {"preset": st.session_state[B + "hardware.preset"]}
    return b


def _figures_table(named: list[tuple[str, Any]]) -> pd.DataFrame:
    rows = {
        "step time": [format_seconds(r.step_time_s) for _, r in named],
        "throughput (samples/s)": [f"{r.throughput_samples_per_s:,.1f}" for _, r in named],
        "bubble fraction": [f"{r.bubble_fraction:.4f}" for _, r in named],
        "analytic (K-1)/(M+K-1)": [f"{r.analytic_bubble_fraction:.4f}" for _, r in named],
        "fits in memory": ["yes" if r.fits_in_memory else "NO" for _, r in named],
        "largest device peak": [format_bytes(max(r.device_peak_memory_bytes.values(), default=0.0))
                                for _, r in named],
    }
    return pd.DataFrame(rows, index=[n for n, _ in named]).T


def _highlight_differences(df: pd.DataFrame) -> Any:
    def row_style(row: pd.Series) -> list[str]:
        differs = row.nunique(dropna=False) > 1
        return ["background-color: rgba(255, 196, 0, 0.35)" if differs else ""] * len(row)
    return df.style.apply(row_style, axis=1)


st.title("Compare two configurations")
st.caption("A is the sidebar configuration; B changes a few of its fields. Rows that differ are highlighted.")
a_data, notice = scenario_form(st.sidebar)
if notice:
    notice.show()
    st.stop()
b_data = _variant_form(a_data)
run_a = try_run(a_data, "Configuration A: ")
run_b = try_run(b_data, "Configuration B: ")
if run_a is None or run_b is None:
    st.stop()
(sa, ra), (sb, rb) = run_a, run_b

fa, fb = _flatten(sa.to_dict()), _flatten(sb.to_dict())
changed = [k for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]
inputs = pd.DataFrame({"A": [str(fa.get(k, "")) for k in changed], "B": [str(fb.get(k, "")) for k in changed]},
                      index=changed)
left, right = st.columns([2, 3])
left.markdown("**Inputs that differ**")
if changed:
    left.dataframe(_highlight_differences(inputs))
else:
    left.info("A and B are the same configuration.")
right.markdown("**Figures**")
right.dataframe(_highlight_differences(_figures_table([("A", ra), ("B", rb)])))

for name, scenario, result, reference in (("A", sa, ra, None), ("B", sb, rb, ra)):
    st.markdown(f"#### {name}" + (" (deltas against A)" if reference is not None else ""))
    show_metrics(scenario, result, reference=reference)

span = max(ra.step_time_s, rb.step_time_s)
cols = st.columns(2)
for col, (name, scenario, result) in zip(cols, (("A", sa, ra), ("B", sb, rb))):
    p = scenario.pipeline
    fig, bars = plots.timeline_figure(result.timeline, max_bars=MAX_GANTT_BARS, x_range_s=span,
                                      title=f"{name}: {p.schedule}, K={p.stages}, "
                                            f"M={p.micro_batches}, remat {p.remat}")
    col.plotly_chart(fig, key=f"cmp.gantt.{name}")
    if bars.note:
        col.caption(bars.note)
    col.plotly_chart(plots.stage_memory_figure(result), key=f"cmp.mem.{name}")
    with col.expander(f"Downloads for {name}"):
        download_buttons(scenario, result, f"cmp.{name}")
show_elapsed()
