"""The scenario schema: model, hardware, pipeline and training, validated and shared by every tool."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from gpipe_sim.errors import ScenarioError
from gpipe_sim.files import read_data_file
from gpipe_sim.units import parse_quantity

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}
OPTIMIZER_STATES: dict[str, int] = {"sgd": 0, "momentum": 1, "rmsprop": 1, "adagrad": 1, "adam": 2}
REMAT_MODES = ("none", "except_last", "always")
PARTITION_METHODS = ("uniform", "time", "memory")


def _quantity(kind: str) -> BeforeValidator:
    return BeforeValidator(lambda value: parse_quantity(value, kind))


Bytes = Annotated[float, _quantity("bytes"), Field(ge=0)]
PositiveBytes = Annotated[float, _quantity("bytes"), Field(gt=0)]
Bandwidth = Annotated[float, _quantity("bandwidth"), Field(gt=0)]
Flops = Annotated[float, _quantity("flops"), Field(gt=0)]
Seconds = Annotated[float, _quantity("seconds"), Field(ge=0)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------------------------------------
# model


class Timing(_Strict):
    """A measured time for one layer at one micro-batch size (the whole micro-batch, not per sample)."""

    micro_batch: PositiveInt
    forward_s: NonNegative
    backward_s: NonNegative


class LayerSpec(_Strict):
    """One layer of the sequential model: its cost and sizes. Per-sample figures scale with batch.

    Time comes from FLOPs on the hardware, from seconds per sample, or from `timings` measured at
    several micro-batch sizes (interpolated; preferred when present). This is also the row format
    that `gpipe-exec profile` writes.
    """

    name: str
    params: Annotated[int, Field(ge=0)] = 0
    activation_bytes_per_sample: NonNegative = 0.0
    output_bytes_per_sample: NonNegative = 0.0
    forward_flops_per_sample: NonNegative | None = None
    backward_flops_per_sample: NonNegative | None = None
    forward_s_per_sample: NonNegative | None = None
    backward_s_per_sample: NonNegative | None = None
    timings: tuple[Timing, ...] = ()
    kernels: Annotated[int, Field(ge=0)] = 1
    update_s: NonNegative | None = None

    @model_validator(mode="after")
    def _has_cost(self) -> "LayerSpec":
        has_flops = self.forward_flops_per_sample is not None
        has_seconds = self.forward_s_per_sample is not None
        if not (has_flops or has_seconds or self.timings):
            raise ValueError(
                f"layer {self.name!r} needs forward_flops_per_sample, forward_s_per_sample or timings"
            )
        if has_flops and self.backward_flops_per_sample is None:
            raise ValueError(f"layer {self.name!r} gives forward_flops_per_sample without backward")
        if has_seconds and self.backward_s_per_sample is None:
            raise ValueError(f"layer {self.name!r} gives forward_s_per_sample without backward")
        sizes = [t.micro_batch for t in self.timings]
        if len(set(sizes)) != len(sizes):
            raise ValueError(f"layer {self.name!r} has two timings for one micro-batch size")
        return self


class UniformModel(_Strict):
    """Identical layers whose time scales linearly with the micro-batch size."""

    preset: Literal["uniform"] = "uniform"
    layers: PositiveInt = 16
    forward_s_per_sample: NonNegative = 1.0e-3
    backward_s_per_sample: NonNegative = 2.0e-3
    params_per_layer: Annotated[int, Field(ge=0)] = 10_000_000
    activation_bytes_per_sample: NonNegative = 4.0e6
    output_bytes_per_sample: NonNegative = 1.0e6


class TransformerModel(_Strict):
    """A GPT-style decoder: embedding, `layers` identical blocks, and an output head."""

    preset: Literal["transformer"] = "transformer"
    layers: PositiveInt = 24
    d_model: PositiveInt = 1024
    d_ff: PositiveInt = 4096
    heads: PositiveInt = 16
    seq_len: PositiveInt = 512
    vocab: PositiveInt = 32000

    @model_validator(mode="after")
    def _heads_divide(self) -> "TransformerModel":
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of heads ({self.heads})")
        return self


class AmoebaNetModel(_Strict):
    """An AmoebaNet-D-like image model: stem, normal and reduction cells, head (uneven layers)."""

    preset: Literal["amoebanet"] = "amoebanet"
    layers: PositiveInt = 18
    filters: PositiveInt = 256
    image_size: PositiveInt = 224
    num_classes: PositiveInt = 1000

    @field_validator("layers")
    @classmethod
    def _multiple_of_three(cls, value: int) -> int:
        if value % 3:
            raise ValueError("AmoebaNet-D's L (normal cells) must be a multiple of 3")
        return value


class MlpModel(_Strict):
    """A stack of Linear+ReLU blocks between an input projection and a classifier."""

    preset: Literal["mlp"] = "mlp"
    layers: PositiveInt = 8
    width: PositiveInt = 1024
    input_dim: PositiveInt = 1024
    num_classes: PositiveInt = 10


class ConvNetModel(_Strict):
    """A ResNet-like stack of residual conv blocks with downsampling stages (uneven layers)."""

    preset: Literal["convnet"] = "convnet"
    layers: PositiveInt = 8
    channels: PositiveInt = 32
    image_size: PositiveInt = 32
    num_classes: PositiveInt = 10


class TableModel(_Strict):
    """An explicit per-layer table, inline (`layers`) or in a YAML/JSON file (`path`)."""

    preset: Literal["table"] = "table"
    path: str | None = None
    layers: tuple[LayerSpec, ...] = ()
    input_bytes_per_sample: NonNegative | None = None

    @model_validator(mode="before")
    @classmethod
    def _load_path(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("path") and not data.get("layers"):
            loaded = load_layer_table_file(Path(data["path"]))
            return {**loaded, **{k: v for k, v in data.items() if k != "layers"}}
        return data

    @model_validator(mode="after")
    def _non_empty(self) -> "TableModel":
        if not self.layers:
            raise ValueError("a table model needs at least one layer (give `layers` or `path`)")
        return self


ModelSpec = Annotated[
    Union[UniformModel, TransformerModel, AmoebaNetModel, MlpModel, ConvNetModel, TableModel],
    Field(discriminator="preset"),
]
MODEL_PRESETS = ("uniform", "transformer", "amoebanet", "mlp", "convnet", "table")


def load_layer_table_file(path: Path) -> dict[str, Any]:
    """Read a per-layer table (YAML or JSON) as a dict with `layers` (a list of rows)."""
    try:
        data = read_data_file(path, "layer table")
    except ScenarioError as exc:
        raise ValueError(str(exc)) from None
    if isinstance(data, list):
        data = {"layers": data}
    if not isinstance(data, dict) or "layers" not in data:
        raise ValueError(f"layer table {str(path)!r} must be a list of layers or have a `layers` key")
    allowed = {"layers", "input_bytes_per_sample"}
    return {k: v for k, v in data.items() if k in allowed}


# ---------------------------------------------------------------------------------------------
# hardware


class Accelerator(_Strict):
    """One accelerator: compute, memory and per-kernel overhead."""

    name: str = "custom"
    peak_flops: dict[Literal["fp32", "bf16", "fp16"], Flops]
    efficiency: Annotated[float, Field(gt=0, le=1)] = 0.5
    memory_bytes: PositiveBytes = math.inf
    usable_memory_fraction: Annotated[float, Field(gt=0, le=1)] = 1.0  # the rest: runtime, fragmentation
    memory_bandwidth: Bandwidth = math.inf
    kernel_overhead_s: Seconds = 0.0

    @property
    def usable_memory_bytes(self) -> float:
        """The capacity a stage's memory is checked against."""
        return self.memory_bytes * self.usable_memory_fraction


class Link(_Strict):
    """A point-to-point link between two accelerators, per direction."""

    bandwidth: Bandwidth
    latency_s: Seconds = 0.0


class Host(_Strict):
    """Host time per pipeline action, spent on the stage's own timeline before it can go on.

    What a real runtime costs beyond the kernels and the wire: dispatching an action, issuing a
    send (before its transfer starts), completing a receive (after its data arrives). Zero on
    every preset; `gpipe-exec calibrate` measures them for the executor on this machine.
    """

    action_s: Seconds = 0.0  # per compute action (forward, recompute, backward, update)
    send_s: Seconds = 0.0  # per send, before the transfer leaves
    recv_s: Seconds = 0.0  # per receive, after the data has arrived
    copy_bandwidth: Bandwidth = math.inf  # plus bytes / copy_bandwidth at each end (host copies)
    # The host time runs on the device's own cores (a CPU "device"): a device shared by several
    # stages serves it as it serves compute, one stage at a time.
    on_device: bool = False


class Hardware(_Strict):
    """Accelerators, links and the stage-to-device map. A `preset` fills any field not given."""

    preset: str | None = None
    accelerator: Accelerator
    link: Link
    host: Host = Field(default_factory=Host)
    links: tuple[Link, ...] | None = None  # per consecutive stage pair (K-1), overriding `link`
    stage_to_device: tuple[Annotated[int, Field(ge=0)], ...] | None = None

    def link_between(self, stage: int) -> Link:
        """The link carrying transfers between stage `stage` and stage `stage + 1`."""
        return self.links[stage] if self.links is not None else self.link

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("preset") is None:
            return data
        from gpipe_sim.presets import hardware_preset

        base = hardware_preset(str(data["preset"]))
        merged = {k: v for k, v in base.items() if k in ("accelerator", "link", "host")}
        for key, value in data.items():
            if key in merged and isinstance(value, dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
        return merged


# ---------------------------------------------------------------------------------------------
# pipeline and training


class Pipeline(_Strict):
    """K stages, M micro-batches, the mini-batch, the schedule, re-materialization and partition."""

    stages: PositiveInt = 4
    micro_batches: PositiveInt = 8
    batch_size: PositiveInt = 64
    schedule: str = "gpipe"
    remat: Literal["none", "except_last", "always"] = "always"
    partition: Literal["uniform", "time", "memory"] | tuple[PositiveInt, ...] = "uniform"

    @field_validator("schedule")
    @classmethod
    def _known_schedule(cls, value: str) -> str:
        from gpipe_sim.schedule import SCHEDULES

        if value not in SCHEDULES:
            raise ValueError(f"unknown schedule {value!r} (choose from {', '.join(SCHEDULES)})")
        return value

    @property
    def effective_micro_batches(self) -> int:
        """The number of micro-batches actually run (`naive` runs the mini-batch whole)."""
        return 1 if self.schedule == "naive" else self.micro_batches


class Training(_Strict):
    """Optimizer and numeric type; they set bytes per parameter and activation element size."""

    optimizer: Literal["sgd", "momentum", "rmsprop", "adagrad", "adam"] = "adam"
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def bytes_per_param(self) -> int:
        """Weight + gradient in the training dtype, fp32 optimizer states, fp32 master copy if needed."""
        master = 0 if self.dtype == "fp32" else 4
        return 2 * self.dtype_bytes + 4 * OPTIMIZER_STATES[self.optimizer] + master

    @property
    def state_bytes_per_param(self) -> int:
        """Everything but the weight itself: gradient, optimizer states, master copy."""
        return self.bytes_per_param - self.dtype_bytes


def _default_hardware() -> Hardware:
    return Hardware.model_validate({"preset": "v100"})


class Scenario(_Strict):
    """A whole what-if question: which model, on which hardware, pipelined how."""

    model: ModelSpec = Field(default_factory=TransformerModel)
    hardware: Hardware = Field(default_factory=_default_hardware)
    pipeline: Pipeline = Field(default_factory=Pipeline)
    training: Training = Field(default_factory=Training)

    @model_validator(mode="after")
    def _consistent(self) -> "Scenario":
        from gpipe_sim.models import layer_count

        layers = layer_count(self.model)
        p = self.pipeline
        if p.stages > layers:
            raise ValueError(
                f"pipeline.stages: {p.stages} stages but the model has only {layers} layer{'s' if layers != 1 else ''}"
            )
        if p.micro_batches > p.batch_size:
            raise ValueError(
                f"pipeline.micro_batches: {p.micro_batches} micro-batches exceed "
                f"the mini-batch of {p.batch_size}"
            )
        if p.schedule == "naive" and p.micro_batches != 1:
            raise ValueError(
                "pipeline.micro_batches: the naive schedule runs the mini-batch whole; set it to 1"
            )
        if isinstance(p.partition, tuple):
            if len(p.partition) != p.stages:
                raise ValueError(
                    f"pipeline.partition: {len(p.partition)} entries for {p.stages} stages"
                )
            if sum(p.partition) != layers:
                raise ValueError(
                    f"pipeline.partition: layer counts sum to {sum(p.partition)}, "
                    f"the model has {layers} layers"
                )
        if self.hardware.links is not None and len(self.hardware.links) != p.stages - 1:
            raise ValueError(
                f"hardware.links: {len(self.hardware.links)} links for {p.stages} stages "
                f"(give one per consecutive pair: {p.stages - 1})"
            )
        device_map = self.hardware.stage_to_device
        if device_map is not None and len(device_map) != p.stages:
            raise ValueError(
                f"hardware.stage_to_device: {len(device_map)} entries for {p.stages} stages"
            )
        return self

    @property
    def device_map(self) -> tuple[int, ...]:
        """Which device runs each stage (identity unless `hardware.stage_to_device` says otherwise)."""
        if self.hardware.stage_to_device is not None:
            return self.hardware.stage_to_device
        return tuple(range(self.pipeline.stages))

    def to_dict(self) -> dict[str, Any]:
        """The scenario as plain data (YAML/JSON-ready), with presets resolved."""
        return self.model_dump(mode="json", exclude_none=True)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def with_updates(self, updates: dict[str, Any]) -> "Scenario":
        """A copy with dotted-name fields replaced, e.g. {"pipeline.stages": 8}; revalidated."""
        data = self.to_dict()
        # Preset switches first, so that fields given beside them override the new preset.
        for dotted, value in sorted(updates.items(), key=lambda kv: not kv[0].endswith(".preset")):
            set_dotted(data, dotted, value)
        return parse_scenario(data)


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `data["a"]["b"]` for the dotted name "a.b", creating levels as needed."""
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    if keys[-1] == "preset" and len(keys) == 2 and node.get("preset") != value:
        if keys[0] == "model":
            node.clear()  # the old preset's size fields mean nothing to the new one
        elif keys[0] == "hardware":
            for resolved in ("accelerator", "link", "links"):
                node.pop(resolved, None)  # resolved from the old preset
    node[keys[-1]] = value


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


_NAMES_FIELD = re.compile(r"^[a-z_]+(\.[a-z_0-9]+)+: ")


def _describe(error: dict[str, Any]) -> str:
    loc = [str(part) for part in error.get("loc", ())]
    if len(loc) > 1 and loc[0] == "model" and loc[1] in MODEL_PRESETS:
        del loc[1]  # the discriminated union puts the preset tag in the path
    where = ".".join(loc) or "scenario"
    kind = error.get("type", "")
    msg = error.get("msg", "invalid")
    if kind == "extra_forbidden":
        return f"{where}: unknown key"
    if kind == "union_tag_invalid":
        tag = error.get("ctx", {}).get("tag")
        return f"{where}.preset: unknown model preset {tag!r} (choose from {', '.join(MODEL_PRESETS)})"
    if kind == "missing":
        return f"{where}: required field is missing"
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix) :]
    if _NAMES_FIELD.match(msg):
        return msg
    return f"{where}: {msg}"


def parse_scenario(data: Any) -> Scenario:
    """Validate plain data as a Scenario; raise ScenarioError with one line naming the field."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError("scenario: expected a mapping with keys model, hardware, pipeline")
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise ScenarioError(_describe(errors[0])) from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML (or JSON) file; raise ScenarioError on any problem."""
    path = Path(path)
    data = read_data_file(path, "scenario")
    resolve_relative_paths(data, path.parent)
    return parse_scenario(data)


def resolve_relative_paths(data: Any, base: Path) -> None:
    """Make a table model's relative `path` relative to `base` (the scenario file's folder)."""
    model = data.get("model") if isinstance(data, dict) else None
    if isinstance(model, dict) and isinstance(model.get("path"), str):
        table = Path(model["path"])
        if not table.is_absolute() and not table.exists():
            model["path"] = str(base / table)
