"""A scenario written as a DeepSpeed JSON configuration file.

Keys as microsoft/DeepSpeed defines them (deepspeed/runtime/constants.py, runtime/config.py,
runtime/zero/config.py; the `pipeline` section's activation_checkpoint_interval as
runtime/pipe/engine.py reads it). DeepSpeed takes the pipeline's stages and the tensor-parallel
split from the model's code (PipelineModule(num_stages=K), the model's mpu), not from this file:
the notes say so.
"""

from __future__ import annotations

import json
from typing import Any

from gpipe_sim.frameworks.common import Written, chunk_sizes, micro_batch_size
from gpipe_sim.scenario.scenario import Scenario

OPTIMIZER_TYPES = {"adam": "Adam", "adamw": "AdamW", "adagrad": "Adagrad"}  # of DeepSpeed's DEEPSPEED_OPTIMIZERS

# The one schedule DeepSpeed's PipelineEngine runs (deepspeed/runtime/pipe/schedule.py TrainSchedule), by our name.
PIPELINE_ENGINE_SCHEDULE = "1f1b"


def write_deepspeed(scenario: Scenario) -> Written:
    """The scenario as a DeepSpeed config (JSON), with notes for what belongs in the model's code."""
    p, t = scenario.pipeline, scenario.training
    notes: list[str] = []
    config: dict[str, Any] = {"train_batch_size": p.batch_size}
    mbs = micro_batch_size(p)
    if mbs is None:
        notes.append(f"pipeline.micro_batches: {p.micro_batches} micro-batches do not divide the "
                     f"{p.batch_size // p.data_parallel} samples of a replica; DeepSpeed runs equal micro-batches")
    else:
        config["train_micro_batch_size_per_gpu"] = mbs
    config["gradient_accumulation_steps"] = p.micro_batches
    if t.optimizer in OPTIMIZER_TYPES:
        config["optimizer"] = {"type": OPTIMIZER_TYPES[t.optimizer]}
    else:
        notes.append(f"training.optimizer: DeepSpeed builds no {t.optimizer} by name; pass a torch optimizer to "
                     "deepspeed.initialize")
    if t.dtype in ("bf16", "fp16"):
        config[t.dtype] = {"enabled": True}
    elif t.dtype == "fp8":
        config["bf16"] = {"enabled": True}
        notes.append("training.dtype: fp8 GEMMs are the model code's (Transformer Engine), not a DeepSpeed config "
                     "key; written as bf16")
    config["zero_optimization"] = {"stage": t.zero, **reduction_keys(scenario, notes)}
    if t.zero >= 2 and p.stages > 1:
        notes.append(f"training.zero: DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 only; stage {t.zero} "
                     "written, which it refuses")
    if t.shard_within_node:
        notes.append("training.shard_within_node: DeepSpeed has no hybrid sharding of all states (ZeRO++'s hpZ "
                     "shards a secondary weight copy only); left out")
    # PipelineModule checkpoints groups of this many layers: one group per chunk (always), one per layer (full)
    interval = {"always": max(chunk_sizes(scenario)), "full": 1}.get(p.remat)
    if interval is not None and p.stages > 1:
        config["pipeline"] = {"activation_checkpoint_interval": interval}
    elif p.remat != "none":
        notes.append(f"pipeline.remat: {p.remat} re-computation is the model code's (deepspeed.checkpointing), "
                     "not a config key")
    if p.context_parallel > 1 or p.expert_parallel > 1:
        notes.append(f"pipeline.context_parallel {p.context_parallel}, expert_parallel {p.expert_parallel}: DeepSpeed's "
                     "sequence and expert parallelism (Ulysses, deepspeed.moe) are the model code's; not in the config")
    notes += layout_notes(scenario)
    return Written(json.dumps(config, indent=2), notes)


def reduction_keys(scenario: Scenario, notes: list[str]) -> dict[str, Any]:
    """ZeRO's overlap_comm and reduce_bucket_size (in elements) for an overlapped reduction."""
    t = scenario.training
    if not t.overlap_grad_reduce:
        return {}
    if t.zero == 0:
        notes.append("training.overlap_grad_reduce: DeepSpeed overlaps the reduction under ZeRO (overlap_comm); "
                     "not at stage 0")
        return {}
    keys: dict[str, Any] = {"overlap_comm": True}
    if t.bucket_bytes is not None:
        keys["reduce_bucket_size"] = max(1, round(t.bucket_bytes / t.dtype_bytes))
    if t.overlap_param_gather:
        notes.append("training.overlap_param_gather: DeepSpeed's ZeRO-1 gathers the parameters after the step; "
                     "no overlap setting")
    return keys


def layout_notes(scenario: Scenario) -> list[str]:
    """What DeepSpeed takes from the model's code and the launcher: devices, K, T, the schedule
    and the chunks' layers."""
    p = scenario.pipeline
    notes = [f"launch on T x K x D = {scenario.mesh.num_processes} GPUs: DeepSpeed's data parallelism is what the pipeline and "
             "tensor parallelism leave of them"]
    if p.stages > 1:
        notes.append(f"pipeline.stages: give PipelineModule(num_stages={p.stages}) the layers "
                     f"{list(chunk_sizes(scenario))} per stage (partition_method); it runs its own 1F1B")
        if p.chunks > 1 or p.schedule_name != PIPELINE_ENGINE_SCHEDULE:
            notes.append(f"pipeline.schedule: DeepSpeed's pipeline engine runs 1F1B with one chunk per rank, "
                         f"not {p.schedule_name} with v={p.chunks}")
    if p.tensor_parallel > 1:
        notes.append(f"pipeline.tensor_parallel: T={p.tensor_parallel} comes from the model's tensor-parallel code "
                     "(Megatron-style mpu), not from this file")
    for given, name in ((scenario.hardware.price_per_device_hour, "hardware.price_per_device_hour"),
                        (scenario.training.goodput, "training.goodput"), (scenario.training.tokens, "training.tokens")):
        if given is not None:
            notes.append(f"{name}: not a DeepSpeed setting; left out")
    return notes
