"""A scenario written as a torchtitan job TOML file.

Keys as torchtitan's JobConfig defines them (torchtitan/config/job_config.py, the TOML format it
read until commit 9810191 of 2026-02 moved its configurations to Python; the same fields live on
in its ParallelismConfig, TrainingConfig and ActivationCheckpointConfig). Schedule names are
torch.distributed.pipelining's (`get_schedule_class`). Each model chunk is a `module_fqns_per_model_part`
entry: `tok_embeddings`, `layers.<i>`, and `norm` with `output` (the head).
"""

from __future__ import annotations

import json
import math
from typing import Any

from gpipe_sim.frameworks.common import Written, chunk_sizes, micro_batch_size, transformer
from gpipe_sim.plan.sharding import shard_degree
from gpipe_sim.model.architectures import ARCHITECTURES
from gpipe_sim.model.model import TransformerModel
from gpipe_sim.scenario.scenario import Scenario

# gpipe-sim's schedule families as torch.distributed.pipelining names them
SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B",
                  "looped_bfs": "LoopedBFS", "interleaved_zb": "InterleavedZeroBubble",
                  "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}
PRECISION = {"bf16": "bfloat16", "fp32": "float32"}  # training.mixed_precision_param's choices
OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW"}  # torchtitan's build_optimizers names
# gpipe-sim's architectures that are torchtitan's registered models: [model] name and flavor
# (torchtitan/models/llama3/__init__.py: llama3_configs; FFN from ffn_dim_multiplier and multiple_of)
FLAVORS = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"), "llama3-405b": ("llama3", "405B")}
FLAVOR_FIELDS = ("layers", "d_model", "heads", "kv_heads", "d_ff", "vocab", "mlp", "norm", "position",
                 "tied_embeddings", "bias")
EMBEDDING, HEAD = ["tok_embeddings"], ["norm", "output"]


def module_parts(sizes: tuple[int, ...]) -> list[list[str]]:
    """Chunk sizes (the embedding, the blocks, the head as layers) as torchtitan's module FQNs per model part."""
    parts, layer = [], 0
    total = sum(sizes)
    for size in sizes:
        names: list[str] = []
        for index in range(layer, layer + size):
            names += EMBEDDING if index == 0 else HEAD if index == total - 1 else [f"layers.{index - 1}"]
        parts.append(names)
        layer += size
    return parts


def toml_value(value: Any) -> str:
    """A TOML value: strings, numbers, booleans and lists of them (JSON writes each as TOML does)."""
    return json.dumps(value)


def write_torchtitan(scenario: Scenario) -> Written:
    """The scenario as a torchtitan job TOML file, its sections in JobConfig's order."""
    notes: list[str] = []
    sections = {"model": model_keys(scenario, notes), "optimizer": optimizer_keys(scenario, notes),
                "training": training_keys(scenario, notes), "parallelism": parallelism_keys(scenario, notes),
                "activation_checkpoint": checkpoint_keys(scenario, notes)}
    lines: list[str] = []
    for name, keys in sections.items():
        if keys:
            lines += ([""] if lines else []) + [f"[{name}]"] + [f"{k} = {toml_value(v)}" for k, v in keys.items()]
    return Written("\n".join(lines), notes)


def flavor_of(m: TransformerModel) -> str | None:
    """The gpipe-sim architecture whose torchtitan flavor this model is (its sizes and block kinds
    equal), or None."""
    for name in FLAVORS:
        if all(getattr(m, key) == value for key, value in ARCHITECTURES[name].items() if key in FLAVOR_FIELDS):
            return name
    return None


def model_keys(scenario: Scenario, notes: list[str]) -> dict[str, Any]:
    """[model] name and flavor where the model is one of torchtitan's registered configurations;
    else none, with a note giving the sizes to choose one by."""
    m = transformer(scenario, "torchtitan", notes)
    if m is None:
        return {}
    name = flavor_of(m)
    if name is None:
        notes.append(f"[model]: torchtitan builds a registered model by name and flavor, not by sizes: choose the "
                     f"flavor with {m.layers} layers, dim {m.d_model}, {m.heads} heads ({m.query_groups} key/value), "
                     f"FFN {m.d_ff} ({m.mlp}), vocabulary {m.vocab}, {m.norm}, {m.position} positions")
        return {}
    if m.dropout or m.attention != "flash":
        notes.append("model: torchtitan's Llama 3 runs fused attention without dropout")
    return dict(zip(("name", "flavor"), FLAVORS[name]))


def optimizer_keys(scenario: Scenario, notes: list[str]) -> dict[str, Any]:
    t = scenario.training
    if t.optimizer not in OPTIMIZERS:
        notes.append(f"training.optimizer: torchtitan builds Adam or AdamW, not {t.optimizer}; [optimizer] left out")
        return {}
    if t.optimizer_step not in ("default", "fused"):
        notes.append(f"training.optimizer_step: torchtitan chooses torch's step itself, not {t.optimizer_step}")
    return {"name": OPTIMIZERS[t.optimizer]}


def training_keys(scenario: Scenario, notes: list[str]) -> dict[str, Any]:
    """Batches (per data-parallel rank and global), sequence length, precision and steps."""
    p, t, m = scenario.pipeline, scenario.training, scenario.model
    keys: dict[str, Any] = {}
    mbs = micro_batch_size(p)
    if mbs is None:
        notes.append(f"pipeline.micro_batches: {p.micro_batches} micro-batches do not divide the "
                     f"{p.batch_size // p.data_parallel} samples of a replica; torchtitan runs equal micro-batches")
    # K > 1: each rank's batch is pipelined in micro-batches; K = 1: micro-batches are accumulated
    # gradient steps (global_batch_size / local_batch_size / data-parallel degree of them)
    keys["local_batch_size"] = p.batch_size // p.data_parallel if p.stages > 1 or mbs is None else mbs
    keys["global_batch_size"] = p.batch_size
    seq = getattr(m, "seq_len", None)
    if seq is not None:
        keys["seq_len"] = seq
    if t.dtype in PRECISION:
        keys["mixed_precision_param"] = PRECISION[t.dtype]
    elif t.dtype == "fp8":
        keys["mixed_precision_param"] = PRECISION["bf16"]
        notes.append("training.dtype: fp8 is torchtitan's float8 converter ([model] converters = [\"float8\"]), "
                     "not written; written as bfloat16")
    else:
        notes.append(f"training.dtype: torchtitan trains in bfloat16 or float32, not {t.dtype}; left out")
    if t.tokens is not None and seq is not None:
        steps = math.ceil(t.tokens / (p.batch_size * seq))
        if steps * p.batch_size * seq != t.tokens:
            notes.append(f"training.tokens: {t.tokens:,.0f} tokens are not whole steps of {p.batch_size * seq:,}; "
                         f"written as {steps:,} steps")
        keys["steps"] = steps
    for given, name in ((scenario.hardware.price_per_device_hour, "hardware.price_per_device_hour"),
                        (t.goodput, "training.goodput")):
        if given is not None:
            notes.append(f"{name}: not a job setting; left out")
    return keys


def parallelism_keys(scenario: Scenario, notes: list[str]) -> dict[str, Any]:
    """Degrees, the schedule, the micro-batch size and each model part's modules."""
    p, t = scenario.pipeline, scenario.training
    keys: dict[str, Any] = {"data_parallel_replicate_degree": p.data_parallel, "data_parallel_shard_degree": 1,
                            "tensor_parallel_degree": p.tensor_parallel, "pipeline_parallel_degree": p.stages}
    if p.context_parallel > 1:
        keys["context_parallel_degree"] = p.context_parallel
    if p.expert_parallel > 1:
        keys["expert_parallel_degree"] = p.expert_parallel
    if t.overlap_grad_reduce or t.overlap_param_gather:
        notes.append("training.overlap_grad_reduce: torchtitan's data parallelism schedules its own reduction "
                     "and gathers; not a job setting")
    if t.zero == 3 and p.data_parallel > 1:  # FSDP2 over the shard group, replicated across groups (HSDP)
        shard = shard_degree(scenario)
        keys["data_parallel_replicate_degree"], keys["data_parallel_shard_degree"] = p.data_parallel // shard, shard
    elif t.zero == 3:
        notes.append("training.zero: one replica has nothing to shard; written as data_parallel_shard_degree 1")
    elif t.zero:
        notes.append(f"training.zero: torchtitan shards with FSDP (ZeRO-3: data_parallel_shard_degree), "
                     f"not ZeRO-{t.zero}; written as replicas")
    if p.tensor_parallel > 1 and not p.sequence_parallel:
        notes.append("pipeline.sequence_parallel: torchtitan's tensor parallelism always shards the norms' "
                     "activations (sequence parallel)")
    if p.stages > 1:
        name = SCHEDULE_NAMES.get(p.schedule_name)
        if name is None:
            notes.append(f"pipeline.schedule: torch.distributed.pipelining has no {p.schedule_name} schedule by name "
                         "(its CSV: gpipe-sim schedule --csv, then pipeline_parallel_schedule_csv); left out")
        else:
            keys["pipeline_parallel_schedule"] = name
        mbs = micro_batch_size(p)
        if mbs is not None:
            keys["pipeline_parallel_microbatch_size"] = mbs
        if isinstance(scenario.model, TransformerModel):
            keys["module_fqns_per_model_part"] = module_parts(chunk_sizes(scenario))
    return keys


def checkpoint_keys(scenario: Scenario, notes: list[str]) -> dict[str, Any]:
    """Activation checkpointing: full where every chunk is re-computed, none where none is."""
    remat = scenario.pipeline.remat
    if remat in ("full", "none"):
        return {"mode": remat}
    if remat == "selective":
        notes.append("pipeline.remat: selective re-computes the attention core; torchtitan's selective mode "
                     "saves the outputs its op policy picks (selective_ac_option)")
        return {"mode": "selective", "selective_ac_option": "op"}
    if remat == "always":
        notes.append("pipeline.remat: always keeps each chunk's input only; torchtitan's nearest is full, which "
                     "keeps every block's input (written)")
        return {"mode": "full"}
    notes.append(f"pipeline.remat: torchtitan has no {remat} checkpointing (full, selective, none); left out")
    return {}
