"""A scenario written as Megatron-LM's launch line: `torchrun ... pretrain_gpt.py` and its flags.

Flag names as NVIDIA/Megatron-LM defines them: megatron/training/arguments.py and the dataclasses
it turns into flags (TransformerConfig, ModelParallelConfig, TrainingConfig, TokenizerConfig; read at
commit d98e8a6 of 2026-08); torchrun's as torch.distributed.run defines them. The layers of each
pipeline chunk are written as Megatron-LM's `--pipeline-model-parallel-layout` (E the embedding, t a
transformer layer, L the loss with the output layer; stages split by "|", stage i on rank i mod K).
"""

from __future__ import annotations

import math
import re
import shlex
from typing import Any

from gpipe_sim.errors import ScenarioError
from gpipe_sim.frameworks.common import Written, chunk_sizes, micro_batch_size, transformer
from gpipe_sim.model.model import TransformerModel
from gpipe_sim.scenario.scenario import Scenario

SCRIPT = "pretrain_gpt.py"
# Megatron-LM's schedules: 1F1B with one model chunk per rank, interleaved 1F1B with several
# (megatron/core/pipeline_parallel/schedules.py); one stage runs micro-batches back to back.
MEGATRON_SCHEDULES = {1: "1f1b", 2: "interleaved_1f1b"}  # by v == 1 / v > 1
DTYPE_FLAGS = {"bf16": "--bf16", "fp16": "--fp16", "fp8": "--bf16"}  # fp32: neither; fp8: bf16 with FP8 GEMMs
# Megatron-LM's FP8 recipe through Transformer Engine: E4M3 in forward, E5M2 for gradients ("hybrid")
FP8_FORMAT = "hybrid"
SGD_MOMENTUM = 0.9  # Megatron-LM's default --sgd-momentum, written for the `momentum` optimizer


def layout_text(sizes: tuple[int, ...]) -> str:
    """Chunk sizes (the embedding, the blocks, the head as layers) as a pipeline layout string:
    "Et*5|t*6|t*6|t*5L"."""
    stages = []
    for i, size in enumerate(sizes):
        first, last = i == 0, i == len(sizes) - 1
        blocks = size - first - last
        body = f"t*{blocks}" if blocks > 1 else "t" * blocks
        stages.append(("E" if first else "") + body + ("L" if last else ""))
    return "|".join(stages)


def layout_sizes(text: str, flag: str = "--pipeline-model-parallel-layout") -> tuple[int, ...]:
    """A layout string back to chunk sizes, unrolled as Megatron-LM's PipelineParallelLayerLayout
    parses it; ScenarioError naming the flag when it is not an embedding, transformer layers and
    the loss, each stage holding at least one."""
    flat = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        flat = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), flat)
    stages = flat.split("|")
    odd = sorted(set(flat) - set("EtL|"))
    if odd:
        raise ScenarioError(f"{flag}: layer type {odd[0]!r} is not one a GPT scenario has (E, t, L)")
    if not flat.startswith("E") or not flat.endswith("L") or flat.count("E") != 1 or flat.count("L") != 1:
        raise ScenarioError(f"{flag}: the embedding E must open the first stage and the loss L close the last")
    if any(not stage for stage in stages):
        raise ScenarioError(f"{flag}: an empty stage (every chunk of a scenario holds at least one layer)")
    return tuple(len(stage) for stage in stages)


def launch_counts(scenario: Scenario, notes: list[str]) -> tuple[int, int]:
    """(nodes, processes per node) for torchrun: the T x K x D devices in nodes of
    `hardware.devices_per_node` (one node when not given or when they fit one)."""
    n = scenario.mesh.num_processes
    per_node = scenario.hardware.devices_per_node
    if per_node is None and n > 1:
        notes.append(f"hardware.devices_per_node not given: written as one node of {n} processes; set torchrun's "
                     "--nnodes and --nproc-per-node to your nodes (their product stays the world size)")
    if per_node is None or n <= per_node:
        return 1, n
    if n % per_node:
        notes.append(f"hardware.devices_per_node: {n} devices do not fill nodes of {per_node}; written as one node")
        return 1, n
    return n // per_node, per_node


def write_megatron(scenario: Scenario) -> Written:
    """The scenario as a Megatron-LM launch line, one flag a line, ready to paste into a shell."""
    notes: list[str] = []
    nodes, per_node = launch_counts(scenario, notes)
    flags = parallel_flags(scenario, notes) + model_flags(scenario, notes) + training_flags(scenario, notes)
    lines = [f"torchrun --nnodes {nodes} --nproc-per-node {per_node} {SCRIPT}"]
    lines += [f"    {name}" + ("" if value is None else f" {shlex.quote(str(value))}") for name, value in flags]
    return Written(" \\\n".join(lines), notes)


def parallel_flags(scenario: Scenario, notes: list[str]) -> list[tuple[str, Any]]:
    """T, K, the chunks' layers, sequence parallelism, the batches and the schedule's notes."""
    p = scenario.pipeline
    flags: list[tuple[str, Any]] = [("--tensor-model-parallel-size", p.tensor_parallel),
                                    ("--pipeline-model-parallel-size", p.stages)]
    if p.num_chunks > 1 and isinstance(scenario.model, TransformerModel):
        flags.append(("--pipeline-model-parallel-layout", layout_text(chunk_sizes(scenario))))
    elif p.num_chunks > 1:
        notes.append(f"pipeline.partition: Megatron-LM's layout places transformer layers; the chunks of a "
                     f"{scenario.model.preset} model are not expressible")
    if p.sequence_parallel and p.tensor_parallel > 1:
        flags.append(("--sequence-parallel", None))
    if p.context_parallel > 1:
        flags.append(("--context-parallel-size", p.context_parallel))
    if p.expert_parallel > 1:
        flags.append(("--expert-model-parallel-size", p.expert_parallel))
    mbs = micro_batch_size(p)
    if mbs is None:
        notes.append(f"pipeline.micro_batches: {p.micro_batches} micro-batches do not divide the "
                     f"{p.batch_size // p.data_parallel} samples of a replica; Megatron-LM runs equal micro-batches "
                     "(--micro-batch-size left out)")
    else:
        flags.append(("--micro-batch-size", mbs))
    flags.append(("--global-batch-size", p.batch_size))
    expected = MEGATRON_SCHEDULES[min(p.chunks, 2)]
    if p.stages > 1 and p.schedule_name != expected:
        notes.append(f"pipeline.schedule: Megatron-LM runs {expected} with v={p.chunks}, not {p.schedule_name}; "
                     f"these arguments run {expected}")
    if scenario.hardware.placement is not None or scenario.hardware.stage_to_device is not None:
        notes.append("hardware.placement: Megatron-LM places the ranks in its own order (tensor, data, "
                     "pipeline); the scenario's placement is not an argument")
    return flags


def model_flags(scenario: Scenario, notes: list[str]) -> list[tuple[str, Any]]:
    """The transformer's sizes, dropout and attention kernel (none for another model)."""
    m = transformer(scenario, "Megatron-LM", notes)
    if m is None:
        return []
    flags: list[tuple[str, Any]] = [
        ("--num-layers", m.layers), ("--hidden-size", m.d_model), ("--ffn-hidden-size", m.d_ff),
        ("--num-attention-heads", m.heads), ("--seq-length", m.seq_len), ("--max-position-embeddings", m.seq_len),
        ("--vocab-size", m.vocab), ("--make-vocab-size-divisible-by", m.vocab_multiple),
    ]
    if m.kv_heads is not None:
        flags += [("--group-query-attention", None), ("--num-query-groups", m.kv_heads)]
    flags += [(flag, value) for wanted, flag, value in (
        (m.mlp == "swiglu", "--swiglu", None), (m.norm == "rmsnorm", "--normalization", "RMSNorm"),
        (m.position == "rope", "--position-embedding-type", "rope"),
        (not m.tied_embeddings, "--untie-embeddings-and-output-weights", None),
        (not m.bias, "--disable-bias-linear", None)) if wanted]
    flags += [("--hidden-dropout", m.dropout), ("--attention-dropout", m.dropout),
              ("--attention-backend", "flash" if m.attention == "flash" else "unfused")]
    return flags + expert_flags(m)


def expert_flags(m: TransformerModel) -> list[tuple[str, Any]]:
    """A mixture of experts as Megatron-LM's MoE arguments (none for a dense model): the experts,
    top-k, one expert's size, the shared experts' summed size, which layers are MoE (a pattern
    where not every one is) and the capacity factor (dropless without)."""
    if not m.experts:
        return []
    flags: list[tuple[str, Any]] = [("--num-experts", m.experts), ("--moe-router-topk", m.top_k),
                                    ("--moe-ffn-hidden-size", m.moe_ffn)]
    if m.shared_experts:
        flags.append(("--moe-shared-expert-intermediate-size", m.shared_experts * m.moe_ffn))
    pattern = [int(m.is_moe(i)) for i in range(m.layers)]
    if not all(pattern):
        flags.append(("--moe-layer-freq", "[" + ",".join(map(str, pattern)) + "]"))
    if m.capacity_factor is not None:
        flags.append(("--moe-expert-capacity-factor", m.capacity_factor))
    return flags


def training_flags(scenario: Scenario, notes: list[str]) -> list[tuple[str, Any]]:
    """Re-computation, the dtype, the optimizer, ZeRO-1 and the token budget."""
    p, t = scenario.pipeline, scenario.training
    flags: list[tuple[str, Any]] = []
    if p.remat == "always":
        sizes = chunk_sizes(scenario)
        blocks = max(1, max(n - (i == 0) - (i == len(sizes) - 1) for i, n in enumerate(sizes)))
        flags += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                  ("--recompute-num-layers", blocks)]  # one group per chunk: only its input is kept
    elif p.remat == "full":  # each block from its own input
        flags += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                  ("--recompute-num-layers", 1)]
    elif p.remat == "selective":
        flags.append(("--recompute-granularity", "selective"))
    elif p.remat != "none":
        notes.append(f"pipeline.remat: Megatron-LM has no {p.remat} re-computation (whole chunks, blocks, the "
                     "attention core, or none); left out")
    if t.dtype in DTYPE_FLAGS:
        flags.append((DTYPE_FLAGS[t.dtype], None))
    if t.dtype == "fp8":
        flags.append(("--fp8-format", FP8_FORMAT))
    if t.optimizer in ("adam", "adamw"):  # Megatron-LM's adam decouples weight decay: AdamW
        flags.append(("--optimizer", "adam"))
        if t.optimizer == "adam":
            notes.append("training.optimizer: Megatron-LM's adam is AdamW (OptimizerConfig.decoupled_weight_decay); "
                         "the same states")
    elif t.optimizer in ("sgd", "momentum"):
        flags += [("--optimizer", "sgd"), ("--sgd-momentum", SGD_MOMENTUM if t.optimizer == "momentum" else 0)]
    else:
        notes.append(f"training.optimizer: Megatron-LM has adam (AdamW) and sgd, not {t.optimizer}; left out")
    flags += reduction_flags(scenario, notes)
    if t.zero == 1:
        flags.append(("--use-distributed-optimizer", None))
    elif t.zero:
        notes.append(f"training.zero: Megatron-LM's distributed optimizer is ZeRO-1, not ZeRO-{t.zero}; left out")
    if t.optimizer_step not in ("default", "fused"):
        notes.append(f"training.optimizer_step: Megatron-LM steps with a fused optimizer, not {t.optimizer_step}")
    flags += token_flags(scenario, notes)
    return flags


def reduction_flags(scenario: Scenario, notes: list[str]) -> list[tuple[str, Any]]:
    """--overlap-grad-reduce, --ddp-bucket-size in parameters (bucket_bytes / the dtype's bytes) and
    --overlap-param-gather."""
    t = scenario.training
    if not t.overlap_grad_reduce:
        return []
    flags: list[tuple[str, Any]] = [("--overlap-grad-reduce", None)]
    if t.bucket_bytes is not None:
        params = max(1, round(t.bucket_bytes / t.dtype_bytes))
        if params * t.dtype_bytes != t.bucket_bytes:
            notes.append(f"training.bucket_bytes: {t.bucket_bytes:,.0f} B is not whole {t.dtype} gradients; "
                         f"written as {params:,} parameters")
        flags.append(("--ddp-bucket-size", params))
    if t.overlap_param_gather:
        flags.append(("--overlap-param-gather", None))
    return flags


def token_flags(scenario: Scenario, notes: list[str]) -> list[tuple[str, Any]]:
    """--train-samples for `training.tokens` (samples of seq_len tokens), and notes for the run's
    other figures, which are not launch arguments."""
    t, m = scenario.training, scenario.model
    flags: list[tuple[str, Any]] = []
    if t.tokens is not None and hasattr(m, "seq_len"):
        samples = math.ceil(t.tokens / m.seq_len)
        if samples * m.seq_len != t.tokens:
            notes.append(f"training.tokens: {t.tokens:,.0f} tokens are not whole samples of {m.seq_len}; "
                         f"written as {samples:,} samples")
        flags.append(("--train-samples", samples))
    for given, name in ((scenario.hardware.price_per_device_hour, "hardware.price_per_device_hour"),
                        (t.goodput, "training.goodput")):
        if given is not None:
            notes.append(f"{name}: not a launch argument; left out")
    return flags
