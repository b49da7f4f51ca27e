"""The scenario schema: model, hardware, pipeline and training, validated and shared by every tool."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Sequence

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from gpipe_sim.errors import ScenarioError, one_line
from gpipe_sim.schedule import SCHEDULES
from gpipe_sim.spec import limits
from gpipe_sim.spec.fields import (
    BatchSize, ChunkCount, MicroBatchCount, PartCount, ReplicaCount, StageCount, _Strict, whole_number,
)
from gpipe_sim.spec.files import read_data_file
from gpipe_sim.spec.hardware import Hardware, megatron_placement
from gpipe_sim.spec.layers import layer_count
from gpipe_sim.spec.model import MODEL_PRESETS, ModelSpec, TransformerModel

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}
OPTIMIZER_STATES: dict[str, int] = {"sgd": 0, "momentum": 1, "rmsprop": 1, "adagrad": 1, "adam": 2}
REMAT_MODES = ("none", "except_last", "always")
PARTITION_METHODS = ("uniform", "time", "memory", "fit")


# ---------------------------------------------------------------------------------------------
# pipeline and training


class Pipeline(_Strict):
    """K ranks, v chunks per rank, M micro-batches, the mini-batch, the schedule, re-materialization
    and the partition of the layers into K*v chunks."""

    stages: StageCount = 4  # K: pipeline ranks (devices in the pipeline)
    chunks: ChunkCount = 1  # v: model chunks per rank (interleaved and V-shaped schedules)
    data_parallel: ReplicaCount = 1  # D: replicas of the K-rank pipeline, the global batch split over them
    micro_batches: MicroBatchCount = 8
    batch_size: BatchSize = 64
    schedule: str = "gpipe"
    remat: Literal["none", "except_last", "always"] = "always"
    partition: Literal["uniform", "time", "memory", "fit"] | tuple[PartCount, ...] = "uniform"

    @field_validator("schedule", mode="before")
    @classmethod
    def _known_schedule(cls, value: Any) -> str:
        from gpipe_sim.schedule import SCHEDULES

        if not isinstance(value, str) or value not in SCHEDULES:
            shown = _shown(value)
            raise ValueError(f"unknown schedule {shown} (choose from {', '.join(SCHEDULES)})")
        return value

    @field_validator("partition", mode="before")
    @classmethod
    def _partition_kind(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value not in PARTITION_METHODS:
                raise ValueError(
                    f"unknown partition {_shown(value)} (choose from {', '.join(PARTITION_METHODS)}, "
                    "or give a list of layer counts, one per chunk)"
                )
            return value
        if not isinstance(value, (list, tuple)):
            raise ValueError(
                f"expected one of {', '.join(PARTITION_METHODS)} or a list of layer counts, one per chunk"
            )
        if len(value) > limits.MAX_LAYERS:
            raise ValueError(f"{len(value):,} entries: more than the limit of {limits.MAX_LAYERS:,} layers")
        counts = []
        for i, entry in enumerate(value):
            try:
                counts.append(whole_number(entry, low=1, high=limits.MAX_LAYERS, what="layers"))
            except ValueError as exc:
                raise ValueError(f"entry {i}: {exc}") from None
        return tuple(counts)

    @property
    def num_chunks(self) -> int:
        """K*v: the pieces the model is cut into."""
        return self.stages * self.chunks


class Training(_Strict):
    """Optimizer and numeric type; they set bytes per parameter and activation element size."""

    optimizer: Literal["sgd", "momentum", "rmsprop", "adagrad", "adam"] = "adam"
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    zero: Literal[0, 1] = 0  # 1: ZeRO-1, optimizer states sharded over the D replicas

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
        layers = layer_count(self.model)
        p = self.pipeline
        if layers > limits.MAX_LAYERS:
            raise ValueError(
                f"model.layers: the model has {layers:,} layers, over the limit of {limits.MAX_LAYERS:,}"
            )
        passes = p.stages * p.chunks * p.micro_batches * p.data_parallel
        if passes > limits.MAX_PASSES:
            sizes = {"pipeline.micro_batches": p.micro_batches, "pipeline.stages": p.stages * p.chunks,
                     "pipeline.data_parallel": p.data_parallel}
            field = max(sizes, key=lambda name: sizes[name])
            replicas = f" x {p.data_parallel} replicas" if p.data_parallel > 1 else ""
            raise ValueError(
                f"{field}: {p.stages} stages x {p.chunks} chunks x {p.micro_batches} micro-batches{replicas} "
                f"is {passes:,} passes per step, over the limit of {limits.MAX_PASSES:,}"
            )
        if p.num_chunks > layers:
            field = "pipeline.stages" if p.chunks == 1 else "pipeline.chunks"
            cut = f"{p.stages} stages" if p.chunks == 1 else f"{p.stages} stages x {p.chunks} chunks"
            raise ValueError(
                f"{field}: {cut} but the model has only {layers} layer{'s' if layers != 1 else ''}"
            )
        D = p.data_parallel
        if p.batch_size % D:
            raise ValueError(f"pipeline.batch_size: the global batch of {p.batch_size} does not split evenly "
                             f"over {D} data-parallel replicas")
        if p.micro_batches > p.batch_size // D:
            share = "the mini-batch" if D == 1 else f"each replica's share ({p.batch_size // D} samples)"
            raise ValueError(
                f"pipeline.micro_batches: {p.micro_batches} micro-batches exceed {share}"
                + (f" of {p.batch_size}" if D == 1 else "")
            )
        problem = SCHEDULES[p.schedule].problem(p.stages, p.micro_batches, p.chunks)
        if problem:
            raise ValueError(problem)
        if isinstance(p.partition, tuple):
            if len(p.partition) != p.num_chunks:
                what = f"{p.stages} stages" if p.chunks == 1 else f"{p.num_chunks} chunks ({p.stages} stages x {p.chunks})"
                raise ValueError(f"pipeline.partition: {len(p.partition)} entries for {what}")
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
        placement = self.hardware.placement
        if placement is not None:
            if len(placement) != D or any(len(row) != p.stages for row in placement):
                raise ValueError(f"hardware.placement: give {D} rows (one per replica) of {p.stages} devices")
            if device_map is not None:
                raise ValueError("hardware.placement: give either placement or stage_to_device, not both")
        elif D > 1 and device_map is not None:
            raise ValueError("hardware.stage_to_device: with data_parallel > 1 give hardware.placement instead")
        return self

    @property
    def device_map(self) -> tuple[int, ...]:
        """Which device runs each global rank d*K + r (replica d, pipeline rank r): `hardware.placement`,
        else `stage_to_device` (one replica), else Megatron-LM's order (the identity for one replica)."""
        if self.hardware.placement is not None:
            return tuple(device for row in self.hardware.placement for device in row)
        if self.hardware.stage_to_device is not None:
            return self.hardware.stage_to_device
        return tuple(d for row in megatron_placement(self.pipeline.stages, self.pipeline.data_parallel) for d in row)

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


def _shown(value: Any) -> str:
    """A value the user wrote, for a message: a short repr on one line."""
    if isinstance(value, str):
        return one_line(repr(value if len(value) <= 40 else value[:37] + "..."))
    if isinstance(value, (dict, list, tuple)):
        return "a mapping" if isinstance(value, dict) else "a list"
    if isinstance(value, int) and not isinstance(value, bool):
        return limits.count(value)
    return one_line(repr(value))[:60]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


_NAMES_FIELD = re.compile(r"^[a-z_]+(\.[a-z_0-9]+)+: ")
# Path segments pydantic adds for its own validators (union members, dict keys, wrappers):
# "literal['uniform','time','memory']", "function-after[...]", "tuple[int, ...]", "[key]", "str".
_INTERNAL_SEGMENT = re.compile(r"[\[\]'\"(),]")
_INTERNAL_NAMES = {"str", "int", "float", "bool", "bytes", "none", "dict", "list", "tuple"}
_USER_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")


def user_key(key: Any) -> str:
    """A key the user wrote, shown as it is when it is a plain name, else quoted (one line, short)."""
    text = str(key) if isinstance(key, (str, int)) and not isinstance(key, bool) else repr(key)
    if _USER_KEY.match(text) or (isinstance(key, int) and not isinstance(key, bool) and abs(key) < 10**20):
        return text
    if len(text) > 40:
        text = text[:37] + "..."
    return repr(text)


def error_location(loc: Sequence[Any], kind: str = "") -> str:
    """Pydantic's error location in the user's words: the scenario path of the field, without
    pydantic's internal segments; a key the user wrote is quoted if it is not a plain name."""
    parts: list[str] = []
    last = len(loc) - 1
    for i, part in enumerate(loc):
        if isinstance(part, int) and not isinstance(part, bool):
            parts.append(str(part))
            continue
        text = str(part)
        user_written = (kind == "extra_forbidden" and i == last) or (i + 1 <= last and loc[i + 1] == "[key]")
        if user_written:
            parts.append(user_key(part))
        elif text == "[key]" or text in _INTERNAL_NAMES or _INTERNAL_SEGMENT.search(text):
            continue
        else:
            parts.append(text)
    return ".".join(parts)


def clean_message(msg: str) -> str:
    """A pydantic message without its "Value error, " prefix, on one line."""
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix) :]
    return one_line(msg)


def _describe(error: dict[str, Any]) -> str:
    raw = list(error.get("loc", ()))
    if len(raw) > 1 and raw[0] == "model" and raw[1] in MODEL_PRESETS:
        del raw[1]  # the discriminated union puts the preset tag in the path
    kind = error.get("type", "")
    where = error_location(raw, kind) or "scenario"
    msg = str(error.get("msg", "invalid"))
    if kind == "extra_forbidden":
        return f"{where}: unknown key"
    if raw and raw[-1] == "[key]":
        return f"{where}: unknown key ({clean_message(msg).replace('Input should be', 'should be', 1)})"
    if kind == "union_tag_invalid":
        tag = str(error.get("ctx", {}).get("tag"))
        shown = repr(tag if len(tag) <= 40 else tag[:37] + "...")
        return one_line(
            f"{where}.preset: unknown model preset {shown} (choose from {', '.join(MODEL_PRESETS)})"
        )
    if kind == "union_tag_not_found":
        return f"{where}.preset: required field is missing (choose from {', '.join(MODEL_PRESETS)})"
    if kind == "missing":
        return f"{where}: required field is missing"
    msg = clean_message(msg)
    if _NAMES_FIELD.match(msg):
        return msg
    return f"{where}: {msg}"


def parse_scenario(data: Any) -> Scenario:
    """Validate plain data as a Scenario; raise ScenarioError with one line naming the field."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError("scenario: expected a mapping with keys model, hardware, pipeline")
    problem = limits.data_shape(data)
    if problem:
        raise ScenarioError(f"scenario: {problem}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise ScenarioError(_describe(errors[0])) from None
    except RecursionError:
        raise ScenarioError(f"scenario: nested more than {limits.MAX_DEPTH} levels deep (the limit)") from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML (or JSON) file; raise ScenarioError on any problem."""
    path = Path(path)
    data = read_data_file(path, "scenario")
    resolve_relative_paths(data, path.parent)
    return parse_scenario(data)


def resolve_relative_paths(data: Any, base: Path) -> None:
    """Make a table model's relative `path` relative to `base` (the scenario file's folder)."""
    model = data.get("model") if isinstance(data, dict) else None
    if isinstance(model, dict) and isinstance(model.get("path"), str) and "\0" not in model["path"]:
        table = Path(model["path"])
        try:
            if not table.is_absolute() and not table.exists():
                model["path"] = str(base / table)
        except (OSError, ValueError):
            pass  # reading it says what is wrong
