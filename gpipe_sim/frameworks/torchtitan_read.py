"""A torchtitan job TOML file read into a scenario: its parallelism, batches, precision, optimizer and
activation checkpointing, on the base scenario's model and hardware; a note for every key not taken."""

from __future__ import annotations

import tomllib
from typing import Any

from gpipe_sim.errors import ScenarioError
from gpipe_sim.frameworks.common import Read, scenario_from, whole
from gpipe_sim.frameworks.torchtitan import EMBEDDING, FLAVORS, HEAD, OPTIMIZERS, PRECISION, SCHEDULE_NAMES
from gpipe_sim.model.architectures import expand_architecture
from gpipe_sim.model.model import TransformerModel
from gpipe_sim.schedule import SCHEDULES
from gpipe_sim.scenario.scenario import Scenario

SOURCE = "torchtitan TOML"
SCHEDULES_BY_NAME = {name: family for family, name in SCHEDULE_NAMES.items()}
# The keys taken, by section; every other key of the file gets a note.
TAKEN = {
    "training": {"local_batch_size", "global_batch_size", "seq_len", "mixed_precision_param", "dtype", "steps"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
                    "pipeline_parallel_degree", "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                    "module_fqns_per_model_part", "context_parallel_degree", "expert_parallel_degree"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
    "optimizer": {"name"},
}
# JobConfig's defaults for the keys taken (torchtitan/config/job_config.py)
DEFAULTS = {"local_batch_size": 8, "global_batch_size": -1, "mixed_precision_param": "bfloat16",
            "data_parallel_replicate_degree": 1, "data_parallel_shard_degree": -1, "tensor_parallel_degree": 1,
            "pipeline_parallel_degree": 1, "pipeline_parallel_schedule": "1F1B",
            "pipeline_parallel_microbatch_size": 1, "mode": "selective", "name": "AdamW",
            "context_parallel_degree": 1, "expert_parallel_degree": 1}


def read_torchtitan(text: str, base: Scenario) -> Read:
    """The scenario a torchtitan job TOML describes, on the base scenario's model and hardware
    (its sequence length from the file's)."""
    try:
        job = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{SOURCE}: not TOML: {exc}") from None
    notes = _ignored(job)
    got = {k: v for section in TAKEN for k, v in job.get(section, {}).items() if k in TAKEN[section]}
    cfg = {**DEFAULTS, **got}
    data = base.to_dict()
    data["model"] = _model(job.get("model", {}), data["model"], notes)
    if "seq_len" in cfg and "seq_len" in data["model"]:
        data["model"]["seq_len"] = whole(SOURCE, "training.seq_len", cfg["seq_len"])
    data["pipeline"] = _pipeline(cfg, data, notes)
    data["training"] = _training(cfg, data, notes)
    return Read(scenario_from(data, SOURCE), notes)


def _model(model: dict[str, Any], base: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The architecture [model] name and flavor name (FLAVORS), else the base scenario's model."""
    named = (model.get("name"), model.get("flavor"))
    for preset, flavor in FLAVORS.items():
        if flavor == named:
            return TransformerModel.model_validate(expand_architecture({"preset": preset})).model_dump(
                mode="json", exclude_none=True)
    if model:
        notes.append(f"[model] {named[0]} {named[1]}: not a flavor gpipe-sim has the sizes of; the model is the "
                     "base scenario's")
    for key in set(model) - {"name", "flavor"}:
        notes.append(f"ignored [model] {key}")
    return base


def _ignored(job: dict[str, Any]) -> list[str]:
    """One note per key not taken, as [section] key = value."""
    notes = []
    for section, keys in job.items():
        if not isinstance(keys, dict):
            notes.append(f"ignored {section} (outside any section)")
            continue
        for key, value in keys.items():
            if key not in TAKEN.get(section, set()) and section != "model":
                shown = repr(value) if not isinstance(value, dict) else "{...}"
                notes.append(f"ignored [{section}] {key} = {shown[:60]}")
    return notes


def _pipeline(cfg: dict[str, Any], data: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    pipe = dict(data["pipeline"])
    replicate = whole(SOURCE, "parallelism.data_parallel_replicate_degree", cfg["data_parallel_replicate_degree"])
    shard = int(cfg["data_parallel_shard_degree"])
    if shard == -1:
        notes.append("parallelism.data_parallel_shard_degree -1 (the ranks left over): the file holds no world "
                     "size; taken as 1")
        shard = 1
    shard = whole(SOURCE, "parallelism.data_parallel_shard_degree", shard)
    if shard > 1 and replicate > 1:  # HSDP (_training reads the degrees again)
        notes.append(f"parallelism.data_parallel_shard_degree {shard}: hybrid sharding is simulated with the "
                     "replicas sharing a node as the shard group (training.shard_within_node)")
    D, T = replicate * shard, whole(SOURCE, "parallelism.tensor_parallel_degree", cfg["tensor_parallel_degree"])
    K = whole(SOURCE, "parallelism.pipeline_parallel_degree", cfg["pipeline_parallel_degree"])
    name = str(cfg["pipeline_parallel_schedule"])
    if name not in SCHEDULES_BY_NAME:
        raise ScenarioError(f"{SOURCE}: parallelism.pipeline_parallel_schedule: {name!r} is not a schedule "
                            f"gpipe-sim runs (one of {', '.join(SCHEDULES_BY_NAME)})")
    schedule = SCHEDULES_BY_NAME[name] if K > 1 else "1f1b"
    sizes = _parts(cfg.get("module_fqns_per_model_part"), data["model"].get("layers")) if K > 1 else None
    v = len(sizes) // K if sizes else SCHEDULES[schedule].default_chunks
    if sizes and len(sizes) % K:
        raise ScenarioError(f"{SOURCE}: parallelism.module_fqns_per_model_part: {len(sizes)} parts for "
                            f"pipeline_parallel_degree {K}")
    if K > 1 and not sizes:
        notes.append("parallelism.module_fqns_per_model_part not given: torchtitan's own split; taken as uniform")
    local = whole(SOURCE, "training.local_batch_size", cfg["local_batch_size"])
    batch = local * D if int(cfg["global_batch_size"]) == -1 else \
        whole(SOURCE, "training.global_batch_size", cfg["global_batch_size"])
    if batch % (local * D):
        raise ScenarioError(f"{SOURCE}: training.global_batch_size {batch} is not a multiple of local_batch_size "
                            f"{local} x data-parallel degree {D}")
    accumulation = batch // (local * D)
    mbs = whole(SOURCE, "parallelism.pipeline_parallel_microbatch_size", cfg["pipeline_parallel_microbatch_size"])
    if K > 1 and local % mbs:
        raise ScenarioError(f"{SOURCE}: parallelism.pipeline_parallel_microbatch_size {mbs} does not divide "
                            f"local_batch_size {local}")
    if K > 1 and accumulation > 1:
        notes.append(f"{accumulation} accumulated steps of the pipeline: taken as one schedule of all their micro-batches")
    pipe.update(context_parallel=whole(SOURCE, "parallelism.context_parallel_degree", cfg["context_parallel_degree"]),
                expert_parallel=whole(SOURCE, "parallelism.expert_parallel_degree", cfg["expert_parallel_degree"]))
    pipe.update(stages=K, chunks=v, data_parallel=D, tensor_parallel=T, sequence_parallel=T > 1, batch_size=batch,
                micro_batches=accumulation * (local // mbs if K > 1 else 1), schedule=schedule,
                partition=list(sizes) if sizes else "uniform", remat=_remat(str(cfg["mode"]), notes))
    return pipe


def _parts(parts: Any, blocks: Any) -> tuple[int, ...] | None:
    """Chunk sizes from module FQNs per model part: the embedding, each `layers.<i>` in order, and
    the head's norm and output together; ScenarioError where they are not the model's modules in order."""
    if parts is None:
        return None
    where = f"{SOURCE}: parallelism.module_fqns_per_model_part"
    expected = EMBEDDING + [f"layers.{i}" for i in range(int(blocks or 0))] + HEAD
    flat = [name for part in parts for name in part] if isinstance(parts, list) and all(
        isinstance(part, list) for part in parts) else None
    if flat != expected:
        raise ScenarioError(f"{where}: expected the modules {expected[0]}, layers.0 ... layers.{int(blocks or 0) - 1}, "
                            "norm, output in order, split into parts")
    if any(not part or part[-1] == HEAD[0] for part in parts):
        raise ScenarioError(f"{where}: norm and output must share a part, and no part may be empty")
    return tuple(len(part) - (HEAD[-1] in part) for part in parts)


def _remat(mode: str, notes: list[str]) -> str:
    """full: each block from its own input; selective: gpipe-sim's attention-core re-computation
    (torchtitan's op policy is its own, noted); memory_budget: none, noted."""
    if mode == "selective":
        notes.append("activation_checkpoint.mode selective: torchtitan's op policy; taken as re-computing the "
                     "attention core (selective)")
    elif mode not in ("full", "none"):
        notes.append(f"activation_checkpoint.mode {mode}: not a checkpointing gpipe-sim models; taken as none")
        return "none"
    return mode


def _training(cfg: dict[str, Any], data: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    training = dict(data["training"])
    precision = str(cfg["mixed_precision_param"])
    training["dtype"] = next((d for d, name in PRECISION.items() if name == precision), "fp32")
    if cfg.get("dtype") == "bfloat16":
        notes.append("training.dtype bfloat16: parameters and optimizer states in bfloat16, no fp32 master copy; "
                     "taken as bf16 mixed precision")
        training["dtype"] = "bf16"
    name = str(cfg["name"])
    optimizer = next((ours for ours, theirs in OPTIMIZERS.items() if theirs == name), None)
    if optimizer is None:
        notes.append(f"optimizer.name {name}: not an optimizer gpipe-sim models; kept {training.get('optimizer')}")
    else:
        training["optimizer"] = optimizer
    # FSDP2 (ZeRO-3) where data_parallel_shard_degree > 1; HSDP where replicated across shard groups too
    sharded = int(cfg["data_parallel_shard_degree"]) > 1 and int(data["pipeline"]["data_parallel"]) > 1
    training["zero"] = 3 if sharded else 0
    training["shard_within_node"] = sharded and int(cfg["data_parallel_replicate_degree"]) > 1
    if "steps" in cfg and "seq_len" in data["model"]:
        training["tokens"] = whole(SOURCE, "training.steps", cfg["steps"]) * data["pipeline"]["batch_size"] \
            * data["model"]["seq_len"]
    return training
