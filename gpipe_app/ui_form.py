"""The scenario form: sidebar widgets that build scenario data (validated later by parse_scenario)."""

from __future__ import annotations

import copy
import math
import types
import typing
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import streamlit as st

from gpipe_sim.errors import GpipeError
from gpipe_sim.hardware.presets import hardware_presets
from gpipe_sim.hardware.hardware import Hardware
from gpipe_sim.model.layers import describe_layer_count
from gpipe_sim.model.model import AmoebaNetModel, ConvNetModel, MlpModel, TransformerModel, UniformModel
from gpipe_sim.scenario.scenario import DEFAULT_SCENARIO, PARTITION_METHODS, REMAT_MODES, Scenario, load_scenario
from gpipe_sim.schedule import SCHEDULES
from gpipe_sim.scenario.scenario import DTYPE_BYTES, OPTIMIZER_STATES, OPTIMIZER_STEPS, ZERO_STAGES
from gpipe_app.ui_data import read_layer_table
from gpipe_app.ui_scenario import (
    KEPT_TABLE as _KEPT_TABLE, PREFIX, TENSOR_PARALLEL_CHOICES, carry_unheld, choice_value, file_choice, finish_boxes, form_base,
    upload_box,
)
MODEL_CLASSES = {
    cls.model_fields["preset"].default: cls
    for cls in (TransformerModel, UniformModel, MlpModel, ConvNetModel, AmoebaNetModel)
}
MODEL_CHOICES = (*MODEL_CLASSES, "table")
_DECIMAL = (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3), ("", 1.0))
_BINARY = (("Ti", 2.0**40), ("Gi", 2.0**30), ("Mi", 2.0**20))
_SUFFIX = {"bytes": "B", "bandwidth": "B/s", "flops": "FLOPS"}


@lru_cache(maxsize=1)
def _default_data() -> dict[str, Any]:
    try:
        return load_scenario(DEFAULT_SCENARIO).to_dict()
    except GpipeError:
        return Scenario().to_dict()


def default_scenario_data() -> dict[str, Any]:
    """The app's starting scenario (gpipe_sim/scenarios/default.yaml, or the schema defaults) as plain data."""
    return copy.deepcopy(_default_data())


@lru_cache(maxsize=32)
def _hardware_data(preset: str) -> dict[str, Any]:
    return Hardware.model_validate({"preset": preset}).model_dump(mode="python")


def format_quantity(value: float, kind: str) -> str:
    """`value` as text with a unit that `gpipe_sim.schema.units.parse_quantity` reads back exactly enough."""
    if math.isinf(value):
        return "inf"
    if kind == "seconds":
        for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
            if abs(value) >= scale:
                return f"{value / scale:.6g} {unit}"
        return f"{value / 1e-9:.6g} ns" if value else "0 s"
    suffix = _SUFFIX[kind]
    if kind == "bytes":
        for prefix, scale in _BINARY:
            if value >= scale and value % scale == 0:  # whole GiB etc.; else decimal units
                return f"{value / scale:g} {prefix}{suffix}"
    for prefix, scale in _DECIMAL:
        if abs(value) >= scale:
            return f"{value / scale:.6g} {prefix}{suffix}"
    return f"{value:.6g} {suffix}"


@dataclass(frozen=True)
class FormNotice:
    """Why the form has no scenario yet: a missing upload (info) or a bad one (error)."""

    message: str
    error: bool = False

    def show(self) -> None:
        """Show it on the page: st.error for bad input, st.info otherwise."""
        if self.error:
            st.error(self.message, icon=":material/error:")
        else:
            st.info(self.message, icon=":material/upload_file:")


def _init(key: str, value: Any) -> str:
    if key not in st.session_state:
        st.session_state[key] = value
    return key


def _label(name: str) -> str:
    return name.replace("_", " ")


def _model_fields(box: Any, preset: str, base: dict[str, Any]) -> dict[str, Any]:
    cls = MODEL_CLASSES[preset]
    model: dict[str, Any] = {"preset": preset}
    for name, field in cls.model_fields.items():
        if name == "preset":
            continue
        default = base.get(name, field.default) if base.get("preset") == preset else field.default
        kind = _optional_kind(field.annotation)
        if kind is not None:  # an optional size (kv_heads, expert_d_ff, ...): a widget only where given
            if default is None:
                continue
            key = _init(f"{PREFIX}model.{preset}.{name}", kind(default))
            model[name] = box.number_input(_label(name), step=1 if kind is int else 0.1,
                                           format="%d" if kind is int else "%g", key=key)
            continue
        key = _init(f"{PREFIX}model.{preset}.{name}", default)
        if field.annotation is int:
            model[name] = box.number_input(_label(name), step=1, key=key)
        elif field.annotation is float:
            st.session_state[key] = float(st.session_state[key])
            value = float(default) or 1.0
            step = 10.0 ** math.floor(math.log10(abs(value)))
            model[name] = box.number_input(_label(name), step=step, format="%g", key=key)
        elif typing.get_origin(field.annotation) is typing.Literal:  # a choice, e.g. attention
            model[name] = box.selectbox(_label(name), typing.get_args(field.annotation), key=key)
    caption = layer_count_caption(model)
    if caption:
        box.caption(caption)
    return model


def _optional_kind(annotation: Any) -> type | None:
    """int or float for an optional number field (`X | None`, X an int or float kind), else None."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    if type(None) not in args:
        return None
    inner = next(a for a in args if a is not type(None))
    inner = typing.get_args(inner)[0] if typing.get_origin(inner) is typing.Annotated else inner
    return inner if inner in (int, float) else None


def layer_count_caption(model: dict[str, Any]) -> str | None:
    """The model box's caption: how many layers the preset builds, e.g. "This model has 26 layers
    (24 blocks + embedding + head)." (None while its fields are invalid; the scenario's check names them)."""
    cls = MODEL_CLASSES.get(model.get("preset"))  # type: ignore[arg-type]
    if cls is None:
        return None
    try:
        return f"This model has {describe_layer_count(cls.model_validate(model))}."
    except ValueError:
        return None


def _table_model(box: Any) -> tuple[dict[str, Any] | None, FormNotice | None]:
    upload = box.file_uploader(
        "per-layer table (YAML/JSON from the profiler)", type=["yaml", "yml", "json"],
        key="upload.layer_table",
        help="The rows `gpipe-exec profile` writes: name, params, activation/output bytes per sample, "
             "forward/backward FLOPs or seconds per sample or measured timings.",
    )
    if upload is None:
        kept = st.session_state.get(_KEPT_TABLE)
        if kept is None:
            return None, FormNotice("Upload a per-layer table (YAML or JSON) to simulate a `table` model.")
        name, model = kept
        box.caption(f"Using {name} ({len(model['layers'])} layers), uploaded earlier.")
        box.button("Forget this table", key="btn.forget_table", on_click=st.session_state.pop, args=(_KEPT_TABLE,))
        return model, None
    try:
        model = _read_table(upload.name, upload.getvalue())
    except ValueError as exc:
        return None, FormNotice(f"model: {exc}", error=True)
    st.session_state[_KEPT_TABLE] = (upload.name, model)  # the upload widget resets on other pages
    return model, None


@st.cache_data(max_entries=16, show_spinner=False)
def _read_table(name: str, data: bytes) -> dict[str, Any]:
    return read_layer_table(name, data)


def _hardware_fields(box: Any, preset: str, dtype: str, base: dict[str, Any]) -> dict[str, Any]:
    data = _hardware_data(preset)
    if base.get("preset") == preset:
        data = {**data, "accelerator": {**data["accelerator"], **base.get("accelerator", {})},
                "link": {**data["link"], **base.get("link", {})}}
    acc, link = data["accelerator"], data["link"]
    key = f"{PREFIX}hw.{preset}."

    def text(name: str, label: str, value: float, kind: str, help: str) -> str:
        return box.text_input(label, key=_init(key + name, format_quantity(value, kind)), help=help)

    peak = text(f"peak.{dtype}", f"peak compute ({dtype})", acc["peak_flops"][dtype], "flops",
                "Peak FLOP/s in the training dtype, e.g. '312 TFLOPS'.")
    efficiency = box.number_input("compute efficiency", min_value=0.01, max_value=1.0, step=0.05,
                                  key=_init(key + "efficiency", float(acc["efficiency"])))
    memory = text("memory", "device memory", acc["memory_bytes"], "bytes", "e.g. '80 GB', '32 GiB', 'inf'.")
    bandwidth = text("memory_bandwidth", "memory bandwidth", acc["memory_bandwidth"], "bandwidth",
                     "e.g. '2039 GB/s'.")
    overhead = text("kernel_overhead", "per-kernel overhead", acc["kernel_overhead_s"], "seconds",
                    "Fixed cost per kernel launch, e.g. '4 us'.")
    link_bw = text("link_bandwidth", "link bandwidth (per direction)", link["bandwidth"], "bandwidth",
                   "Between consecutive ranks, e.g. '300 GB/s'.")
    latency = text("link_latency", "link latency", link["latency_s"], "seconds", "e.g. '3 us'.")
    per_node, network = _node_fields(box, key, preset, data, base, latency)
    placement = box.text_input(
        "rank → device map",
        key=_init(PREFIX + "hardware.stage_to_device", ", ".join(map(str, base.get("stage_to_device") or ()))),
        help="The device each pipeline rank runs on, e.g. '0,0,1,1': ranks 0-1 on device 0, 2-3 on device 1, "
             "taking turns there and sharing its memory. Empty: one device per rank.")
    device_map = parse_device_map(placement)
    return {
        "stage_to_device": device_map,
        **per_node,
        **network,
        "preset": preset,
        "accelerator": {
            "peak_flops": {**{k: v for k, v in acc["peak_flops"].items()}, dtype: peak},
            "efficiency": efficiency, "memory_bytes": memory, "memory_bandwidth": bandwidth,
            "kernel_overhead_s": overhead,
        },
        "link": {"bandwidth": link_bw, "latency_s": latency},
    }


def _node_fields(box: Any, key: str, preset: str, data: dict[str, Any], base: dict[str, Any],
                 latency: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The devices-per-node and network widgets, from the scenario's own figures (its network where
    it has the same preset) or the preset's (a cluster preset's nodes and NICs); what they give the
    hardware: each field as shown, 0 and an empty network stated (None) where the preset would
    otherwise fill them."""
    mine = base.get("preset") == preset
    nodes = base.get("devices_per_node") or data.get("devices_per_node")
    net = (base.get("network") if mine else None) or data.get("network")
    n1, n2 = box.columns(2)
    per_node = n1.number_input("devices per node", min_value=0, max_value=65_536, step=1,
                               key=_init(key + "devices_per_node", int(nodes or 0)),
                               help="0: every device in one node. Otherwise devices 0..N-1 fill nodes of "
                                    "this many; traffic between nodes uses the network.")
    text = n2.text_input("network bandwidth (per port or NIC)",
                         key=_init(key + "network", format_quantity(net["bandwidth"], "bandwidth") if net else ""),
                         help="Between nodes, e.g. '200 Gb/s' or '25 GB/s': a device's port, or each NIC of a "
                              "cluster preset (empty: the link bandwidth).")
    nodes_out = {"devices_per_node": int(per_node) or None}
    if not text.strip():
        return nodes_out, {"network": None}
    # The network's latency, ports and NICs: the preset's, or the opened scenario's (carried through,
    # ui_scenario.carry_unheld); a network only the form gives runs at the link's latency.
    held = data.get("network") or (mine and base.get("network"))
    return nodes_out, {"network": {"bandwidth": text.strip(), **({} if held else {"latency_s": latency})}}


def parse_device_map(text: str) -> list[int] | str | None:
    """'0, 0, 1, 1' -> [0, 0, 1, 1]; empty -> None; anything else is passed on as typed, for the
    scenario's validation to name the field."""
    tokens = text.replace(",", " ").split()
    if not tokens:
        return None
    try:
        return [int(t) for t in tokens]
    except ValueError:
        return text


def schedule_help() -> str:
    """Every registered schedule with its one-line description (the schedule selectbox's help)."""
    return "  \n".join(f"**{name}**: {family.description}" for name, family in SCHEDULES.items())


def scenario_form(box: Any) -> tuple[dict[str, Any] | None, FormNotice | None]:
    """Draw the scenario widgets in `box` (the sidebar); return (scenario data, or None and a notice)."""
    box.header("Scenario")
    notice_box = box.container()
    pipe_box = box.container()
    model_box = box.expander("Model", expanded=True)
    hw_box = box.expander("Hardware", expanded=False)
    train_box = box.container()
    file_box = box.expander("Open or save a scenario file", expanded=False)
    upload_box(file_box)  # first: an opened file sets what the widgets below start from
    base = form_base(default_scenario_data)

    pipeline = _pipeline_fields(pipe_box, base["pipeline"])
    training, price = _training_fields(train_box, base["training"], base["hardware"])

    preset = model_box.selectbox("model preset", MODEL_CHOICES,
                                 key=_init(PREFIX + "model.preset", base["model"]["preset"]))
    notice = None
    if preset == "table":
        model, notice = _table_model(model_box)
    else:
        model = _model_fields(model_box, preset, base["model"])

    hw_presets = list(hardware_presets())
    hw_preset = hw_box.selectbox("hardware preset", hw_presets,
                                 key=_init(PREFIX + "hardware.preset", base["hardware"].get("preset", "v100")))
    hw_box.caption(hardware_presets()[hw_preset].get("description", ""))
    hardware = _hardware_fields(hw_box, hw_preset, training["dtype"], base["hardware"])
    hardware["price_per_device_hour"] = price or None

    data = None if model is None else carry_unheld({
        "model": model, "hardware": hardware, "pipeline": pipeline, "training": training,
    })
    finish_boxes(notice_box, file_box, data)
    return data, None if data is not None else notice


def _pipeline_fields(box: Any, bp: dict[str, Any]) -> dict[str, Any]:
    """The Pipeline section's widgets, started from the scenario's pipeline `bp`; its scenario data
    (tensor and sequence parallel only where T > 1)."""
    box.subheader("Pipeline")
    c1, c2 = box.columns(2)
    stages = c1.number_input("stages K", min_value=1, max_value=1024, step=1,
                             key=_init(PREFIX + "pipeline.stages", bp["stages"]),
                             help="Pipeline ranks: the devices the model is cut across.")
    micro = c2.number_input("micro-batches M", min_value=1, max_value=8192, step=1,
                            key=_init(PREFIX + "pipeline.micro_batches", bp["micro_batches"]))
    s1, s2 = box.columns([3, 2])
    held = file_choice(bp["schedule"])
    schedule = choice_value(s1.selectbox("schedule", list(dict.fromkeys([*SCHEDULES, held])),
                                         key=_init(PREFIX + "pipeline.schedule", held), help=schedule_help()))
    chunks = s2.number_input("chunks per rank v", min_value=1, max_value=64, step=1,
                             key=_init(PREFIX + "pipeline.chunks", bp.get("chunks", 1)),
                             help="The model is cut into K*v chunks, v on each rank (interleaved "
                                  "schedules run several; the others one).")
    b1, b2 = box.columns([3, 2])
    batch = b1.number_input("mini-batch size (global)", min_value=1, max_value=10_000_000, step=1,
                            key=_init(PREFIX + "pipeline.batch_size", bp["batch_size"]))
    replicas = b2.number_input("data-parallel D", min_value=1, max_value=4096, step=1,
                               key=_init(PREFIX + "pipeline.data_parallel", bp.get("data_parallel", 1)),
                               help="Replicas of the K-rank pipeline (D x K devices); the global batch is "
                                    "split evenly over them and each chunk's gradients are all-reduced.")
    tensor = box.selectbox("tensor parallel T", sorted({*TENSOR_PARALLEL_CHOICES, int(bp.get("tensor_parallel", 1))}),
                           key=_init(PREFIX + "pipeline.tensor_parallel", int(bp.get("tensor_parallel", 1))),
                           help="Each rank's layers split over T devices of one node the Megatron way "
                                "(T x K x D devices; transformer preset), with two all-reduces in the "
                                "forward and two in the backward of every block on the node's link.")
    seq_par = box.checkbox("sequence parallel (T > 1)",
                           key=_init(PREFIX + "pipeline.sequence_parallel", bool(bp.get("sequence_parallel", False))),
                           help="Sequence parallelism: shard the LayerNorm and residual activations "
                                "over the T devices too.")
    k1, k2 = box.columns(2)
    context = k1.number_input("context parallel C", min_value=1, max_value=1024, step=1,
                              key=_init(PREFIX + "pipeline.context_parallel", int(bp.get("context_parallel", 1))),
                              help="Each sequence split over C devices, keys and values passed around a ring "
                                   "(T x C x K x D devices; flash attention; docs/guide/context-and-experts.md).")
    experts = k2.number_input("expert parallel E", min_value=1, max_value=1024, step=1,
                              key=_init(PREFIX + "pipeline.expert_parallel", int(bp.get("expert_parallel", 1))),
                              help="A mixture of experts' experts spread over E of the D replicas, tokens "
                                   "sent by all-to-all (model.experts > 0).")
    remat = box.selectbox("re-materialization", REMAT_MODES, key=_init(PREFIX + "pipeline.remat", bp["remat"]),
                          help="always: every forward keeps only its input and is re-computed "
                               "before backward (GPipe); none: keep all activations.")
    held = file_choice(bp["partition"])
    partition = choice_value(box.selectbox("partition", list(dict.fromkeys([*PARTITION_METHODS, held])),
                              key=_init(PREFIX + "pipeline.partition", held),
                              help="uniform: equal layer counts; time: balance compute; memory: the "
                                   "smallest largest device peak, as the schedule holds activations; "
                                   "fit: the fastest partition whose every device fits its memory; "
                                   "layers: the opened file's list of layer counts, one per chunk."))
    return {"stages": stages, "chunks": chunks, "data_parallel": replicas, "micro_batches": micro,
            "batch_size": batch, "schedule": schedule, "remat": remat, "partition": partition,
            "tensor_parallel": int(tensor), "sequence_parallel": bool(seq_par) and tensor > 1,
            "context_parallel": int(context), "expert_parallel": int(experts)}


def _training_fields(box: Any, bt: dict[str, Any], hardware: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The Training section's widgets, started from the scenario's training `bt`; its scenario data
    and the price per device-hour ("" where not given; it belongs to the hardware)."""
    box.subheader("Training")
    t1, t2 = box.columns(2)
    optimizer = t1.selectbox("optimizer", list(OPTIMIZER_STATES), key=_init(PREFIX + "training.optimizer", bt["optimizer"]))
    dtype = t2.selectbox("dtype", list(DTYPE_BYTES), key=_init(PREFIX + "training.dtype", bt["dtype"]))
    step = box.selectbox(
        "optimizer step", ("default", *OPTIMIZER_STEPS),
        key=_init(PREFIX + "training.optimizer_step", bt.get("optimizer_step", "default")),
        help="How the update runs, which sets its temporary memory: for_loop (one tensor at a time, "
             "torch's default on CPU), foreach (lists of all tensors, torch's default on CUDA: Adam "
             "makes an fp32 copy of every parameter), fused (none); default: the hardware's.")
    zero = box.selectbox("ZeRO stage", ZERO_STAGES, key=_init(PREFIX + "training.zero", int(bt.get("zero", 0))),
                         help="Shard over the D replicas: 1 optimizer states (Megatron-LM's distributed "
                              "optimizer), 2 gradients too, 3 parameters too (FSDP2, gathered per layer).")
    run_fields, price = _run_fields(box, bt, hardware)
    return {"optimizer": optimizer, "dtype": dtype, "zero": int(zero), "optimizer_step": step, **run_fields}, price


def _run_fields(box: Any, training: dict[str, Any], hardware: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The training run's fields: the token budget (None where not given) for the training section,
    and the price per device-hour ("" where not given)."""
    r1, r2 = box.columns(2)
    tokens = r1.text_input("tokens to train on", key=_init(PREFIX + "training.tokens", _given(training.get("tokens"))),
                           help="The run's token budget (1T, 300B, 2.5e12): days and device-hours; empty: none.")
    price = r2.text_input("price per device-hour", key=_init(PREFIX + "hardware.price_per_device_hour",
                                                             _given(hardware.get("price_per_device_hour"))),
                          help="Any currency per device per hour: the run's cost; empty: none.")
    fields = {"tokens": tokens.strip() or None}  # the goodput model is carried from the file (carry_unheld)
    return fields, price.strip()


def _given(value: Any) -> str:
    """A scenario's optional number as the form's text, exactly ("" where not given): 1e12 tokens
    as 1000000000000, a price of 2.5 as 2.5."""
    if value is None:
        return ""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def keep_form_state() -> None:
    """Keep the form's values while another page (which does not draw the form) is shown."""
    for key in list(st.session_state.keys()):
        if isinstance(key, str) and key.startswith(PREFIX):
            st.session_state[key] = st.session_state[key]
