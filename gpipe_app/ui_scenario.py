"""Scenario files in the app: open one into the sidebar form (an upload, or the file named after
`--` in `streamlit run app/streamlit_app.py -- scenario.yaml`) and save the form's scenario as YAML.

A loaded scenario becomes the data the form starts from (`form_base`): its widgets are cleared and
re-initialised from it. A bad file is one error line in the sidebar; the form keeps what it had.
A CSV schedule and a list of layer counts are options of their boxes (`file_choice`); the fields
the form has no widget for (per-pair links, host costs...) are carried through unchanged
(`carry_unheld`); anything still left out is named in a warning.
"""

from __future__ import annotations

import copy
import math
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import streamlit as st
import yaml

from gpipe_sim.errors import GpipeError, first_line, one_line
from gpipe_sim.schema.files import read_data_file
from gpipe_sim.hardware.presets import hardware_presets
from gpipe_sim.scenario.scenario import load_scenario, parse_scenario, with_default_sections
from gpipe_app.ui_run import round_floats

PREFIX = "cfg."  # widget keys with this prefix keep their values across pages (the form's)
KEPT_TABLE = "kept.layer_table"  # (file name, table model) the form's `table` preset uses
BASE = "scenario.base"  # the data the form starts from: a loaded scenario (else the default)
SET_ASIDE = "scenario.set_aside"  # this run's note on carried fields left out (links, placement for other K, D)
CHECK = "scenario.check"  # (file name, its scenario data): the next form run names what it leaves out
NOTICE = "scenario.notice"  # (kind: "error" | "warning" | "success", one line) about the last file
APPLIED = "scenario.upload_id"  # the upload already applied (the uploader keeps its file on reruns)
ARGV_DONE = "scenario.argv_done"  # the command line's scenario is opened once per session
UPLOAD_KEY = "upload.scenario"
SHOWN_FIELDS = 6  # fields named in the "not held" warning, then a count


TENSOR_PARALLEL_CHOICES = (1, 2, 4, 8, 16, 32, 64)  # the form's tensor-parallel sizes


def form_base(default: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The scenario data the form initialises its widgets from: the last opened file's, else `default()`."""
    base = st.session_state.get(BASE)
    return copy.deepcopy(base) if base is not None else default()


def read_scenario_upload(name: str, data: bytes) -> dict[str, Any]:
    """An uploaded scenario file (YAML, or JSON by its name) validated, as plain data; ScenarioError
    with one line naming the upload (not a temporary path) on any problem."""
    suffix = ".json" if name.lower().endswith(".json") else ".yaml"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"scenario{suffix}"
        path.write_bytes(data)
        try:  # an upload has no folder: its relative file names are the app's (not the temporary one's)
            return parse_scenario(with_default_sections(read_data_file(path, "scenario"))).to_dict()
        except GpipeError as exc:
            raise type(exc)(str(exc).replace(repr(str(path)), repr(name)).replace(str(path), name)) from None


def _form_ready(data: dict[str, Any]) -> dict[str, Any]:
    """Scenario data the form's widgets can start from: custom hardware (no preset) as its figures
    over the `ideal` preset's (every figure of it is the file's: to_dict resolved them all)."""
    base = copy.deepcopy(data)
    hardware = base.setdefault("hardware", {})
    if hardware.get("preset") not in hardware_presets():
        hardware["preset"] = "ideal"
    return base


_CSV, _LAYERS = "csv: ", "layers: "  # the options a CSV schedule and a list of layer counts show as


def file_choice(value: Any) -> Any:
    """A scenario's schedule or partition as the form's selectbox option: a CSV schedule as
    'csv: PATH', a list of layer counts as 'layers: 6, 8'; a name as it is (`choice_value` inverts)."""
    if isinstance(value, dict) and "csv" in value:
        return _CSV + str(value["csv"])
    if isinstance(value, (list, tuple)):
        return _LAYERS + ", ".join(str(v) for v in value)
    return value


def choice_value(option: Any) -> Any:
    """The scenario value of a schedule or partition option (`file_choice`'s inverse)."""
    if isinstance(option, str) and option.startswith(_CSV):
        return {"csv": option[len(_CSV):]}
    if isinstance(option, str) and option.startswith(_LAYERS):
        return [int(v) for v in option[len(_LAYERS):].split(",")]
    return option


def carry_unheld(data: dict[str, Any]) -> dict[str, Any]:
    """The form's scenario `data` with every field of the opened scenario that no widget holds
    carried through unchanged (host costs, per-pair links, placement, the network's latency, ports
    and NICs, the goodput model, kernel tables...), so that the app runs what the file says. Only
    into a model or hardware section of the file's preset (another preset is another device); a
    field the form gives, None included (a widget left empty), is the form's. The file's per-pair
    links and placement are left out, and named (`set_aside`), while the form's K or D differ
    from theirs (they come back with them)."""
    opened = st.session_state.get(BASE)  # set by opening a file only
    st.session_state.pop(SET_ASIDE, None)
    if not opened:
        return data
    out = copy.deepcopy(data)
    for section, given in opened.items():
        mine = out.get(section)
        if not isinstance(mine, dict) or not isinstance(given, dict):
            continue
        if section in ("model", "hardware") and mine.get("preset") != given.get("preset"):
            continue
        _fill(mine, given)
    aside = set_aside(out)
    if aside:
        st.session_state[SET_ASIDE] = ("Not used while K or D differ from the file's: " + "; ".join(aside)
                                       + " (they come back with the file's K and D).")
    return out


def set_aside(data: dict[str, Any]) -> list[str]:
    """Remove from scenario `data` the per-pair links and the placement that do not fit its K and
    D (carried from a file for other ones); what was removed, one phrase each."""
    hardware, pipeline = data.get("hardware") or {}, data.get("pipeline") or {}
    stages, replicas = int(pipeline.get("stages", 1)), int(pipeline.get("data_parallel", 1))
    out = []
    links = hardware.get("links")
    if links is not None and len(links) != stages - 1:
        del hardware["links"]
        out.append(f"hardware.links ({len(links)} per-pair links, for {len(links) + 1} stages)")
    placement = hardware.get("placement")
    if placement is not None and (len(placement) != replicas or any(len(row) != stages for row in placement)):
        del hardware["placement"]
        out.append(f"hardware.placement ({len(placement)} replicas of {len(placement[0]) if placement else 0} ranks)")
    return out


def _fill(mine: dict[str, Any], given: dict[str, Any]) -> None:
    for key, value in given.items():
        if key not in mine:
            mine[key] = copy.deepcopy(value)
        elif isinstance(mine[key], dict) and isinstance(value, dict):
            _fill(mine[key], value)


def open_in_form(name: str, data: dict[str, Any]) -> None:
    """Make validated scenario `data` the form's: every form widget re-initialised from it (call
    before the form's widgets are drawn in this run)."""
    for key in [k for k in st.session_state.keys() if isinstance(k, str) and k.startswith(PREFIX)]:
        del st.session_state[key]
    st.session_state[BASE] = _form_ready(data)
    model = data.get("model", {})
    if model.get("preset") == "table":
        st.session_state[KEPT_TABLE] = (name, copy.deepcopy(model))
    st.session_state[CHECK] = (name, data)
    st.session_state[NOTICE] = ("success", f"Opened {name}.")


def _failed(name: str, exc: BaseException) -> None:
    message = str(exc) if isinstance(exc, GpipeError) else f"{type(exc).__name__}: {first_line(exc)}"
    st.session_state[NOTICE] = ("error", one_line(f"Could not open {name}: {message}", 400))


def command_line_path(argv: list[str], app_file: Path) -> str | None:
    """The scenario file named on the command line: `streamlit run app/streamlit_app.py -- FILE`
    sets sys.argv to [the script, FILE]; None when the script is not this app (a test runner)."""
    if len(argv) < 2 or not argv[0]:
        return None
    try:
        if Path(argv[0]).resolve() != app_file.resolve():
            return None
    except (OSError, ValueError):
        return None
    return argv[1]


def open_command_line_scenario(app_file: Path, argv: list[str] | None = None) -> None:
    """Open the command line's scenario file into the form, once per browser session."""
    if st.session_state.get(ARGV_DONE):
        return
    st.session_state[ARGV_DONE] = True
    path = command_line_path(sys.argv if argv is None else argv, app_file)
    if path is None:
        return
    try:
        data = load_scenario(path).to_dict()
    except Exception as exc:  # noqa: BLE001 - any problem is one line in the app, never a traceback
        _failed(path, exc)
        return
    open_in_form(path, data)


def upload_box(box: Any) -> None:
    """The scenario uploader in `box`; a new file is opened into the form (before its widgets)."""
    upload = box.file_uploader(
        "open a scenario (YAML/JSON)", type=["yaml", "yml", "json"], key=UPLOAD_KEY,
        help="A scenario file as `gpipe-sim simulate` reads it: its model, hardware, pipeline and "
             "training fill the form.")
    if upload is None or st.session_state.get(APPLIED) == upload.file_id:
        return
    st.session_state[APPLIED] = upload.file_id
    try:
        data = read_scenario_upload(upload.name, upload.getvalue())
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback; the form keeps its values
        _failed(upload.name, exc)
        return
    open_in_form(upload.name, data)


def differing_fields(got: Any, want: Any, where: str = "") -> list[str]:
    """The dotted fields where `got` differs from `want` (floats to 1e-5: the form shows 6 digits)."""
    if isinstance(got, dict) and isinstance(want, dict):
        out: list[str] = []
        for key in list(want) + [k for k in got if k not in want]:
            out += differing_fields(got.get(key), want.get(key), f"{where}.{key}" if where else str(key))
        return out
    if isinstance(got, (list, tuple)) and isinstance(want, (list, tuple)):
        same = len(got) == len(want) and not any(differing_fields(a, b) for a, b in zip(got, want))
        return [] if same else [where]
    if isinstance(got, (int, float)) and isinstance(want, (int, float)) and not isinstance(got, bool):
        if got == want or (math.isfinite(got) and math.isfinite(want) and math.isclose(got, want, rel_tol=1e-5)):
            return []
        return [where]
    return [] if got == want else [where]


def check_form(data: dict[str, Any] | None) -> None:
    """After the first form run on an opened file: a warning naming the fields the form left out."""
    pending = st.session_state.pop(CHECK, None)
    if pending is None or data is None:
        return
    name, wanted = pending
    try:
        held = parse_scenario(copy.deepcopy(data)).to_dict()
    except GpipeError:
        return  # the page shows the form's own error
    missing = differing_fields(held, wanted)
    if missing:
        shown = ", ".join(missing[:SHOWN_FIELDS]) + (f" and {len(missing) - SHOWN_FIELDS} more"
                                                      if len(missing) > SHOWN_FIELDS else "")
        st.session_state[NOTICE] = ("warning", f"Opened {name}; the form does not hold {shown}: "
                                               "they are at the form's values.")


def scenario_download_yaml(data: dict[str, Any]) -> str:
    """The form's scenario as YAML: validated and with presets resolved (as `gpipe-sim simulate`
    reads it back), or as the form holds it, marked, while it does not validate."""
    try:
        return yaml.safe_dump(round_floats(parse_scenario(copy.deepcopy(data)).to_dict()), sort_keys=False)
    except GpipeError as exc:
        return f"# does not validate yet: {one_line(str(exc), 300)}\n" + yaml.safe_dump(data, sort_keys=False)


def finish_boxes(notice_box: Any, box: Any, data: dict[str, Any] | None) -> None:
    """After the form: the notice about the last file opened (in `notice_box`, atop the form) and
    the download of the form's scenario (in `box`, under the uploader)."""
    check_form(data)
    aside = st.session_state.get(SET_ASIDE)
    if aside:
        notice_box.warning(aside, icon=":material/warning:")
    notice = st.session_state.get(NOTICE)
    if notice is not None:
        kind, text = notice
        if kind == "error":
            notice_box.error(text, icon=":material/error:")
        elif kind == "warning":
            notice_box.warning(text, icon=":material/warning:")
        else:
            notice_box.caption(text)
    if data is not None:
        box.download_button("Download this scenario (YAML)", lambda: scenario_download_yaml(data),
                            file_name="scenario.yaml", mime="application/x-yaml", key="dl.form.yaml",
                            on_click="ignore", icon=":material/download:",
                            help="The form's scenario, for `gpipe-sim simulate FILE` or to open here later.")
