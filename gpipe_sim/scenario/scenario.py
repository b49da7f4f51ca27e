"""The scenario schema: model, hardware, pipeline and training, validated and shared by every tool."""

from __future__ import annotations

import copy
import os
import stat
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from gpipe_sim.errors import ScenarioError, ScheduleError, one_line
from gpipe_sim.schedule import SCHEDULES
from gpipe_sim.schedule.torch_csv import MAX_CSV_BYTES, TorchSchedule, parse_torch_csv
from gpipe_sim.schema import limits
from gpipe_sim.schema.fields import (
    BatchSize, ChunkCount, MicroBatchCount, PartCount, PositiveBytes, ReplicaCount, StageCount, TensorParallel,
    ContextParallel,
    _Strict, whole_number,
)
from gpipe_sim.schema.files import read_data_file, read_text_file, shown_path
from gpipe_sim.schema.field_errors import describe_error, did_you_mean, error_location, user_key, valid_keys
from gpipe_sim.hardware.hardware import Hardware
from gpipe_sim.model.layers import describe_layer_count, layer_count
from gpipe_sim.scenario.overrides import SECTIONS, blame, parse_overrides
from gpipe_sim.model.tensor_parallel import tensor_parallel_problem
from gpipe_sim.model.context_parallel import context_parallel_problem
from gpipe_sim.model.experts import expert_parallel_problem
from gpipe_sim.mesh import Mesh, device_lists_problem, layout_problem
from gpipe_sim.model.recompute import remat_problem
from gpipe_sim.model.model import MODEL_PRESETS, ModelSpec, TransformerModel
from gpipe_sim.scenario.training_run import Goodput, TokenCount, tokens_per_sample

DEFAULT_SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "default.yaml"  # package data
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2}  # fp8: bf16 storage (gpipe_sim.costs.fp8)
OPTIMIZER_STATES: dict[str, int] = {"sgd": 0, "momentum": 1, "rmsprop": 1, "adagrad": 1, "adam": 2, "adamw": 2}
# How an optimizer's step runs (torch.optim's implementations): one tensor at a time ("for_loop",
# torch's default on CPU), on lists of all its tensors at once ("foreach", torch's default on CUDA),
# or one fused kernel ("fused"). torch has no fused RMSprop.
OPTIMIZER_STEPS = ("for_loop", "foreach", "fused")
FUSED_OPTIMIZERS = ("sgd", "momentum", "adagrad", "adam", "adamw")
# The fp32 temporaries a step makes and frees, in multiples of what it steps at once: the largest
# tensor for "for_loop" (Adam: the square root and its scaling; RMSprop and Adagrad: the square
# root), all of the optimizer's parameters for "foreach" (Adam and RMSprop: the list of square roots;
# Adagrad: those and the scaled gradients); SGD with or without momentum steps in place, and a fused
# step makes none. Measured with gpipe_exec's tensor tracker on torch 2.13
# (tests/test_exec_memory.py checks every entry against torch).
OPTIMIZER_SCRATCH: dict[str, dict[str, int]] = {
    "for_loop": {"sgd": 0, "momentum": 0, "rmsprop": 1, "adagrad": 1, "adam": 2, "adamw": 2},
    "foreach": {"sgd": 0, "momentum": 0, "rmsprop": 1, "adagrad": 2, "adam": 1, "adamw": 1},
    "fused": {"sgd": 0, "momentum": 0, "rmsprop": 0, "adagrad": 0, "adam": 0, "adamw": 0},
}
# Whole chunks re-computed (torchgpipe's modes: none, except_last, always) or blocks checkpointed
# one by one (Megatron-LM's and torchtitan's: full, selective; gpipe_sim.model.recompute)
REMAT_MODES = ("none", "except_last", "always", "full", "selective")
ZERO_STAGES = (0, 1, 2, 3)  # training.zero (gpipe_sim.plan.sharding)
PARTITION_METHODS = ("uniform", "time", "memory", "fit")


# ---------------------------------------------------------------------------------------------
# pipeline and training


class CsvSchedule(_Strict):
    """A schedule read from a CSV file in torch.distributed.pipelining's format (one row per rank)."""

    csv: Annotated[str, Field(min_length=1, max_length=4096)]


class Pipeline(_Strict):
    """K ranks, v chunks per rank, M micro-batches, the mini-batch, the schedule, re-materialization
    and the partition of the layers into K*v chunks.

    `schedule` is a registered schedule's name, or `{csv: PATH}`: per-rank pass orders written in
    torch.distributed.pipelining's CSV format (a relative PATH is read from the scenario's folder).
    """

    stages: StageCount = 4  # K: pipeline ranks (devices in the pipeline)
    chunks: ChunkCount = 1  # v: model chunks per rank (interleaved and V-shaped schedules)
    data_parallel: ReplicaCount = 1  # D: replicas of the K-rank pipeline, the global batch split over them
    # T: each rank's layers split over T devices the Megatron way (gpipe_sim.model.tensor_parallel);
    # sequence_parallel: the replicated activations (layernorms, residuals) sharded over them too.
    tensor_parallel: TensorParallel = 1
    sequence_parallel: bool = False
    # C: each sample's sequence split over C devices (Megatron-LM's --context-parallel-size; keys and
    # values passed around them: gpipe_sim.model.context_parallel); the gradients reduced over D x C.
    context_parallel: ContextParallel = 1
    # E: a mixture of experts' experts spread over E devices of the data-parallel group (Megatron-LM's
    # --expert-model-parallel-size), tokens exchanged by all-to-all (gpipe_sim.model.experts)
    expert_parallel: ContextParallel = 1
    micro_batches: MicroBatchCount = 8
    batch_size: BatchSize = 64
    schedule: str | CsvSchedule = "gpipe"
    remat: Literal["none", "except_last", "always", "full", "selective"] = "always"
    partition: Literal["uniform", "time", "memory", "fit"] | tuple[PartCount, ...] = "uniform"

    @field_validator("schedule", mode="before")
    @classmethod
    def _known_schedule(cls, value: Any) -> str | CsvSchedule:
        from gpipe_sim.schedule import SCHEDULES

        if isinstance(value, CsvSchedule):
            return value
        if isinstance(value, dict):
            extra = sorted((user_key(k) for k in value if k != "csv"), key=str)
            if extra:
                raise ValueError(f"pipeline.schedule.{extra[0]}: unknown key (a CSV schedule is {{csv: PATH}})")
            path = value.get("csv")
            if not isinstance(path, str) or not path:
                raise ValueError("pipeline.schedule.csv: give the path of a schedule CSV (torch's format)")
            if "\0" in path:
                raise ValueError("pipeline.schedule.csv: a file name cannot contain a NUL character")
            return CsvSchedule(csv=path)
        if not isinstance(value, str) or value not in SCHEDULES:
            shown = _shown(value)
            raise ValueError(f"unknown schedule {shown} (choose from {', '.join(SCHEDULES)}, "
                             "or give {csv: PATH} for a schedule in torch's CSV format)")
        return value

    @field_validator("tensor_parallel")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError(f"{value} is not a power of two (1, 2, 4, 8, ...)")
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

    @property
    def schedule_name(self) -> str:
        """The registered schedule's name, or "csv:PATH" for a schedule read from a CSV file."""
        return self.schedule if isinstance(self.schedule, str) else f"csv:{self.schedule.csv}"

    @property
    def schedule_csv(self) -> str | None:
        """The path of the schedule's CSV file, or None for a registered schedule."""
        return None if isinstance(self.schedule, str) else self.schedule.csv


class Training(_Strict):
    """Optimizer and numeric type; they set bytes per parameter and activation element size."""

    # adamw: Adam with decoupled weight decay (torch.optim.AdamW): the same states and temporaries
    optimizer: Literal["sgd", "momentum", "rmsprop", "adagrad", "adam", "adamw"] = "adam"
    dtype: Literal["fp32", "bf16", "fp16", "fp8"] = "fp32"
    # ZeRO stage (gpipe_sim.plan.sharding): 1 optimizer states and master weights sharded over the D
    # replicas (Megatron-LM's distributed optimizer), 2 gradients too (DeepSpeed ZeRO-2), 3 parameters
    # too, gathered per layer (PyTorch FSDP2 `fully_shard`, torchtitan's default); with
    # `shard_within_node` ZeRO-3 shards over a node's replicas only and replicates across nodes (HSDP)
    zero: Literal[0, 1, 2, 3] = 0
    shard_within_node: bool = False
    # How the optimizer's step runs (OPTIMIZER_STEPS); "default": the accelerator's framework default
    # (`hardware.accelerator.optimizer_step`). It sets the update's temporary memory.
    optimizer_step: Literal["default", "for_loop", "foreach", "fused"] = "default"
    # The data-parallel gradient reduction (Megatron-LM's DistributedDataParallelConfig): each
    # chunk's gradients reduced after its last backward pass (False: Megatron's default), or, with
    # `overlap_grad_reduce` (--overlap-grad-reduce), in buckets of `bucket_bytes` of gradients, each
    # reduced as soon as that pass has made it (gpipe_sim.plan.buckets). None: Megatron's default
    # bucket, max(40M, 1M x D) parameters' gradients.
    overlap_grad_reduce: bool = False
    bucket_bytes: PositiveBytes | None = None
    # ZeRO-1's all-gather of the updated parameters, bucket by bucket, overlapping the next step's
    # first forward passes (--overlap-param-gather; Megatron's default False; it needs the
    # distributed optimizer and --overlap-grad-reduce, as Megatron-LM asserts)
    overlap_param_gather: bool = False
    # The run a step is part of (gpipe_sim.results.run_cost): the tokens it trains on ("15T", "300B"),
    # and what failures and checkpoints cost it. None: no run figures.
    tokens: TokenCount | None = None
    goodput: Goodput | None = None

    @model_validator(mode="after")
    def _step_exists(self) -> "Training":
        if self.shard_within_node and self.zero != 3:
            raise ValueError("training.shard_within_node: hybrid sharding (FSDP2's HSDP) shards parameters, "
                             "gradients and optimizer states within a node: it needs training.zero: 3")
        if self.zero == 3 and self.overlap_grad_reduce:
            raise ValueError("training.overlap_grad_reduce: under training.zero: 3 (FSDP2) each layer's gradients "
                             "are reduce-scattered as its backward ends, always; leave it out")
        if self.overlap_param_gather and not (self.zero == 1 and self.overlap_grad_reduce):
            raise ValueError("training.overlap_param_gather: gathers ZeRO-1's parameter shards (training.zero: 1) "
                             "in the buckets of training.overlap_grad_reduce: true, as Megatron-LM requires")
        if self.bucket_bytes is not None and not self.overlap_grad_reduce:
            raise ValueError("training.bucket_bytes: buckets are reduced apart only with "
                             "training.overlap_grad_reduce: true (else each chunk's gradients are one reduction)")
        if self.optimizer_step == "fused" and self.optimizer not in FUSED_OPTIMIZERS:
            raise ValueError(f"training.optimizer_step: torch has no fused {self.optimizer} step "
                             f"(fused: {', '.join(FUSED_OPTIMIZERS)}); use for_loop or foreach")
        return self

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

    @property
    def optimizer_step(self) -> str:
        """How the optimizer's step runs (OPTIMIZER_STEPS): the training section's choice, else the
        accelerator's default (its `unfused_optimizer_step` where that is fused and this optimizer
        has no fused step)."""
        step = self.training.optimizer_step
        if step == "default":
            accel = self.hardware.accelerator
            step = accel.optimizer_step
            if step == "fused" and self.training.optimizer not in FUSED_OPTIMIZERS:
                step = accel.unfused_optimizer_step
        return step

    @model_validator(mode="after")
    def _consistent(self) -> "Scenario":
        layers = layer_count(self.model)
        p = self.pipeline
        if layers > limits.MAX_LAYERS:
            raise ValueError(
                f"model.layers: the model has {describe_layer_count(self.model)}, "
                f"over the limit of {limits.MAX_LAYERS:,}"
            )
        passes = p.stages * p.chunks * p.micro_batches  # one replica's
        if passes > limits.MAX_PASSES:
            sizes = {"pipeline.micro_batches": p.micro_batches, "pipeline.stages": p.stages * p.chunks}
            field = max(sizes, key=lambda name: sizes[name])
            raise ValueError(
                f"{field}: {p.stages} stages x {p.chunks} chunks x {p.micro_batches} micro-batches "
                f"is {passes:,} passes per replica, over the limit of {limits.MAX_PASSES:,}"
            )
        if p.num_chunks > layers:
            field = "pipeline.stages" if p.chunks == 1 else "pipeline.chunks"
            cut = f"{p.stages} stages" if p.chunks == 1 else f"{p.stages} stages x {p.chunks} chunks"
            raise ValueError(f"{field}: {cut} but the model has only {describe_layer_count(self.model)}")
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
        if isinstance(p.schedule, str):
            problem = SCHEDULES[p.schedule].problem(p.stages, p.micro_batches, p.chunks)
        else:
            problem = csv_schedule_problem(p)
        if problem:
            raise ValueError(problem)
        if isinstance(p.partition, tuple):
            if len(p.partition) != p.num_chunks:
                what = f"{p.stages} stages" if p.chunks == 1 else f"{p.num_chunks} chunks ({p.stages} stages x {p.chunks})"
                raise ValueError(f"pipeline.partition: {len(p.partition)} entries for {what}")
            if sum(p.partition) != layers:
                raise ValueError(
                    f"pipeline.partition: layer counts sum to {sum(p.partition)}, "
                    f"the model has {describe_layer_count(self.model)}"
                )
        if self.hardware.links is not None and len(self.hardware.links) != p.stages - 1:
            raise ValueError(
                f"hardware.links: {len(self.hardware.links)} links for {p.stages} stages "
                f"(give one per consecutive pair: {p.stages - 1})"
            )
        problem = device_lists_problem(p, self.hardware)
        if problem:
            raise ValueError(problem)
        problem = (tensor_parallel_problem(self.model, p.tensor_parallel)
                   or context_parallel_problem(self.model, p.context_parallel)
                   or layout_problem(p, self.hardware)
                   or expert_parallel_problem(self.model, p.expert_parallel, p.tensor_parallel, p.data_parallel,
                                              p.sequence_parallel)
                   or remat_problem(self.model, p.remat))
        if problem:
            raise ValueError(problem)
        if self.training.tokens is not None and tokens_per_sample(self.model) is None:
            raise ValueError(f"training.tokens: a {self.model.preset} model has no tokens (give a transformer, "
                             "or a layer table with tokens_per_sample)")
        return self

    @property
    def mesh(self) -> Mesh:
        """The parallel sizes and the rank -> process -> device -> node map (gpipe_sim.mesh)."""
        return Mesh.of(self)

    def to_dict(self) -> dict[str, Any]:
        """The scenario as plain data (YAML/JSON-ready), with presets resolved."""
        return self.model_dump(mode="json", exclude_none=True)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def with_overrides(self, overrides: Sequence[str] | None) -> "Scenario":
        """A copy with command-line `--set KEY=VALUE` items applied (see gpipe_sim.scenario.overrides)."""
        return parse_scenario_with_overrides(self.to_dict(), overrides) if overrides else self

    def with_updates(self, updates: dict[str, Any]) -> "Scenario":
        """A copy with dotted-name fields replaced, e.g. {"pipeline.stages": 8}; revalidated: the
        sections they name as data, the others as they are (valid already), then the whole."""
        named = {dotted.split(".", 1)[0] for dotted in updates}
        sections = type(self).model_fields
        if named <= sections.keys() and not any(dotted.endswith(".preset") for dotted in updates):
            data: dict[str, Any] = {name: getattr(self, name) for name in sections}
            data.update({name: getattr(self, name).model_dump(mode="json", exclude_none=True) for name in named})
        else:  # a preset switch clears fields of its section; an unknown name is refused
            data = self.to_dict()
        apply_updates(data, updates)
        return parse_scenario(data)


def apply_updates(data: dict[str, Any], updates: dict[str, Any]) -> None:
    """Replace dotted-name fields of scenario data in place (what `Scenario.with_updates` does)."""
    # Preset switches first, so that fields given beside them override the new preset.
    for dotted, value in sorted(updates.items(), key=lambda kv: not kv[0].endswith(".preset")):
        set_dotted(data, dotted, value)


# ---------------------------------------------------------------------------------------------
# schedules read from torch's CSV

_CSV_CACHE: dict[tuple[str, int, int, int], TorchSchedule] = {}
_CSV_CACHE_SIZE = 8


def read_schedule_csv(path: str | Path) -> TorchSchedule:
    """The per-rank pass orders of a schedule CSV (torch's format); ScheduleError with one line
    starting "pipeline.schedule.csv:" if it cannot be read. Kept while the file is unchanged, so a
    sweep reads it once."""
    name = shown_path(path)
    where = "pipeline.schedule.csv"
    try:
        info = os.stat(path)
    except OSError as exc:
        raise ScheduleError(f"{where}: cannot read {name}: {exc.strerror or type(exc).__name__}") from None
    except ValueError as exc:  # a NUL in the name
        raise ScheduleError(f"{where}: cannot read {name}: {exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ScheduleError(f"{where}: {name} is not a regular file")
    key = (str(path), info.st_mtime_ns, info.st_size, info.st_ino)
    cached = _CSV_CACHE.get(key)
    if cached is not None:
        return cached
    text = read_text_file(path, ScheduleError, MAX_CSV_BYTES, prefix=f"{where}: ")
    try:
        parsed = parse_torch_csv(text)
    except ScheduleError as exc:
        message = str(exc)
        if message.startswith(where + ": "):
            message = message[len(where) + 2:]
        raise ScheduleError(f"{where}: {name}: {one_line(message)}") from None
    if len(_CSV_CACHE) >= _CSV_CACHE_SIZE:
        _CSV_CACHE.pop(next(iter(_CSV_CACHE)))
    _CSV_CACHE[key] = parsed
    return parsed


def csv_schedule_problem(p: Pipeline) -> str | None:
    """Why the pipeline's schedule CSV does not fit its K, v and M (one line naming the field)."""
    path = p.schedule_csv
    assert path is not None
    try:
        read = read_schedule_csv(path)
    except ScheduleError as exc:
        return str(exc)
    name = shown_path(path)
    if read.ranks != p.stages:
        return (f"pipeline.stages: {p.stages} stages, but the schedule CSV {name} has {read.ranks} "
                f"row{'s' if read.ranks != 1 else ''} (one per rank)")
    if read.chunks != p.chunks:
        return (f"pipeline.chunks: {p.chunks} chunk{'s' if p.chunks != 1 else ''} per rank, but the schedule "
                f"CSV {name} runs {read.chunks} per rank")
    if read.micro_batches != p.micro_batches:
        return (f"pipeline.micro_batches: {p.micro_batches} micro-batches, but the schedule CSV {name} "
                f"runs {read.micro_batches}")
    passes = sum(len(order) for order in read.orders)
    if passes > 3 * p.num_chunks * p.micro_batches:  # F, I and W of every chunk and micro-batch at most
        return (f"pipeline.schedule.csv: {name} has {passes:,} passes, more than the "
                f"{3 * p.num_chunks * p.micro_batches:,} of {p.num_chunks} chunks x {p.micro_batches} "
                "micro-batches (forward, backward_input, backward_weight each)")
    return None


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


def _describe(error: dict[str, Any]) -> str:
    """A scenario's validation error as one line naming the field (the model's preset union told apart)."""
    raw = list(error.get("loc", ()))
    kind = error.get("type", "")
    # an unknown key: the closest valid one among the fields at its place (the preset's own, for a model)
    hint = did_you_mean(raw[-1], valid_keys(Scenario, raw)) if kind == "extra_forbidden" and raw else ""
    if len(raw) > 1 and raw[0] == "model" and raw[1] in MODEL_PRESETS:
        del raw[1]  # the discriminated union puts the preset tag in the path
        error = {**error, "loc": tuple(raw)}
    where = error_location(raw, kind) or "scenario"
    if kind == "union_tag_invalid":
        tag = str(error.get("ctx", {}).get("tag"))
        shown = repr(tag if len(tag) <= 40 else tag[:37] + "...")
        return one_line(
            f"{where}.preset: unknown model preset {shown} (choose from {', '.join(MODEL_PRESETS)})"
        )
    if kind == "union_tag_not_found":
        return f"{where}.preset: required field is missing (choose from {', '.join(MODEL_PRESETS)})"
    return describe_error(error, "scenario") + hint


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


def load_scenario(path: str | Path, overrides: Sequence[str] | None = None) -> Scenario:
    """Read and validate a scenario YAML (or JSON) file; raise ScenarioError on any problem.

    `overrides` are command-line `--set KEY=VALUE` items, applied before validation (so they may
    also mend a file that is invalid on its own); see `gpipe_sim.scenario.overrides`."""
    data = read_scenario_data(path)
    return parse_scenario_with_overrides(data, overrides) if overrides else parse_scenario(data)


def parse_scenario_with_overrides(data: Any, overrides: Sequence[str] | None) -> Scenario:
    """Validate plain scenario data (modified in place) with `--set KEY=VALUE` items applied first,
    as `Scenario.with_updates` applies updates. A problem is one line naming the item whose field it
    names; or, when the data is valid without the items, the only item (or "with the --set items");
    else it is the data's own problem, as `parse_scenario` says it."""
    updates = parse_overrides(overrides)
    if not updates or not isinstance(data, dict):
        return parse_scenario(data)
    original = copy.deepcopy(data)
    apply_updates(data, updates)
    try:
        return parse_scenario(data)
    except ScenarioError as exc:
        message = str(exc)

        def valid_without() -> bool:
            try:
                parse_scenario(original)
            except ScenarioError:
                return False
            return True

        prefix = blame(message, list(overrides or ()), valid_without)
        if prefix is None:
            raise
        raise ScenarioError(f"{prefix}: {message}") from None


def read_scenario_data(path: str | Path) -> Any:
    """A scenario file's plain data, its relative file names made relative to its folder and the
    sections it leaves out the default scenario's (`with_default_sections`; unvalidated)."""
    path = Path(path)
    data = with_default_sections(read_data_file(path, "scenario"))
    resolve_relative_paths(data, path.parent)
    return data


def with_default_sections(data: Any) -> Any:
    """Scenario file data (None for an empty file) with each section it leaves out (model,
    hardware, pipeline, training) taken whole from the default scenario, DEFAULT_SCENARIO: an empty
    file runs the default scenario, as no file does. A section the file gives is as it wrote it
    (its missing fields at the schema's defaults); data that is not a mapping is returned as it is
    (validation names the problem)."""
    if data is None:
        data = {}
    if not isinstance(data, dict) or all(name in data for name in SECTIONS):
        return data
    default = _default_sections()
    return {**{name: copy.deepcopy(default[name]) for name in SECTIONS if name not in data}, **data}


_DEFAULT_DATA: dict[str, Any] = {}


def _default_sections() -> dict[str, Any]:
    if not _DEFAULT_DATA:
        data = read_data_file(DEFAULT_SCENARIO, "scenario")
        _DEFAULT_DATA.update({name: data.get(name, {}) for name in SECTIONS})
    return _DEFAULT_DATA


def resolve_relative_paths(data: Any, base: Path) -> None:
    """Make a table model's relative `path`, a model's relative `hf_config`, and a schedule CSV's
    relative `csv`, relative to `base` (the scenario file's folder)."""
    model = data.get("model") if isinstance(data, dict) else None
    _resolve(model, "path", base)
    _resolve(model, "hf_config", base)
    pipeline = data.get("pipeline") if isinstance(data, dict) else None
    _resolve(pipeline.get("schedule") if isinstance(pipeline, dict) else None, "csv", base)


def _resolve(node: Any, key: str, base: Path) -> None:
    if isinstance(node, dict) and isinstance(node.get(key), str) and node[key] and "\0" not in node[key]:
        given = Path(node[key])
        try:
            if not given.is_absolute() and not given.exists():
                node[key] = str(base / given)
        except (OSError, ValueError):
            pass  # reading it says what is wrong
