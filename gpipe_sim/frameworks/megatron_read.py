"""Megatron-LM arguments read into a scenario: a launch line (`torchrun ... pretrain_gpt.py --flags`)
or an arguments file (the flags alone, any layout, `#` comments). The hardware comes from a base
scenario; every flag taken is one `write_megatron` writes, and every other one gets a note."""

from __future__ import annotations

import shlex
from typing import Any

from gpipe_sim.errors import ScenarioError
from gpipe_sim.frameworks.common import Read, scenario_from, whole
from gpipe_sim.frameworks.megatron import MEGATRON_SCHEDULES, layout_sizes
from gpipe_sim.scenario.scenario import DTYPE_BYTES, Scenario

VALUE_FLAGS = (
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--pipeline-model-parallel-layout",
    "--num-virtual-stages-per-pipeline-rank", "--num-layers-per-virtual-pipeline-stage",
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--seq-length",
    "--max-position-embeddings", "--vocab-size", "--make-vocab-size-divisible-by", "--hidden-dropout",
    "--attention-dropout", "--attention-backend", "--micro-batch-size", "--global-batch-size",
    "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--optimizer", "--sgd-momentum",
    "--train-samples", "--train-iters", "--num-query-groups", "--normalization", "--position-embedding-type",
    "--ddp-bucket-size", "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--fp8-format", "--context-parallel-size", "--expert-model-parallel-size", "--num-experts", "--moe-router-topk",
    "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size", "--moe-layer-freq",
    "--moe-expert-capacity-factor",
)
BOOL_FLAGS = ("--sequence-parallel", "--bf16", "--fp16", "--use-distributed-optimizer",
              "--untie-embeddings-and-output-weights", "--use-flash-attn", "--group-query-attention", "--swiglu",
              "--disable-bias-linear", "--overlap-grad-reduce", "--overlap-param-gather", "--recompute-activations",
              "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")
NORMS = {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}  # --normalization's choices
POSITIONS = {"learned_absolute": "learned", "rope": "rope"}  # of --position-embedding-type's
LAUNCHERS = ("torchrun", "torch.distributed.run")  # `torchrun` or `python -m torch.distributed.run`
PYTHONS = ("python", "python3")
LAUNCHER_FLAGS = {"--nnodes": "nnodes", "--nproc-per-node": "nproc", "--nproc_per_node": "nproc"}
MEGATRON_DEFAULT_VOCAB_MULTIPLE = 128  # --make-vocab-size-divisible-by's default
MEGATRON_DEFAULT_DROPOUT = 0.1  # --hidden-dropout's and --attention-dropout's defaults
SOURCE = "Megatron-LM arguments"


def split_launch(text: str) -> tuple[list[str], list[str], list[str]]:
    """(what precedes the launcher, the launcher's tokens, the training script's arguments): a line
    with a `*.py` script splits there; a file of flags alone is all arguments."""
    try:
        tokens = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise ScenarioError(f"{SOURCE}: cannot split into arguments: {exc}") from None
    script = next((i for i, tok in enumerate(tokens) if tok.endswith(".py")), None)
    if script is None:
        return [], [], tokens
    head = tokens[:script]
    launcher = next((i for i, tok in enumerate(head) if tok in LAUNCHERS), None)
    if launcher is None:
        return [tok for tok in head if tok not in PYTHONS], [], tokens[script + 1:]
    before = [tok for tok in head[:launcher] if tok not in PYTHONS and tok != "-m"]
    return before, head[launcher + 1:], tokens[script + 1:]


def parse_flags(tokens: list[str], values: tuple[str, ...], bools: tuple[str, ...],
                notes: list[str], what: str) -> dict[str, Any]:
    """Flags to their values (True for a switch; the last of a repeated flag, as argparse);
    a note for each other token, with the value it carries."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        name, eq, inline = tok.partition("=")
        if name in values:
            if not eq:
                if i + 1 >= len(tokens):
                    raise ScenarioError(f"{SOURCE}: {name}: expected a value")
                inline, i = tokens[i + 1], i + 1
            out[name] = inline
        elif name in bools and not eq:
            out[name] = True
        else:
            carried = not eq and tok.startswith("-") and i + 1 < len(tokens) and not tokens[i + 1].startswith("--")
            shown = f"{tok} {tokens[i + 1]}" if carried else tok
            notes.append(f"ignored {what} {shown}: not a figure of the step gpipe-sim models")
            i += carried
        i += 1
    return out


def read_megatron(text: str, base: Scenario) -> Read:
    """The scenario Megatron-LM arguments describe, on the base scenario's hardware; a note for
    each flag ignored and each figure taken from the base or from Megatron-LM's defaults."""
    notes: list[str] = []
    before, launcher, rest = split_launch(text)
    for tok in before:
        notes.append(f"ignored {tok!r} before the launcher")
    launch = {LAUNCHER_FLAGS[k]: v for k, v in
              parse_flags(launcher, tuple(LAUNCHER_FLAGS), (), notes, "launcher option").items()}
    args = parse_flags(rest, VALUE_FLAGS, BOOL_FLAGS, notes, "flag")
    data = base.to_dict()
    data["model"] = model_data(args, data["model"], notes)
    data["pipeline"] = pipeline_data(args, launch, data, notes)
    data["training"] = training_data(args, data, notes)
    return Read(scenario_from(data, SOURCE), notes)


def _int(args: dict[str, Any], flag: str, default: int | None = None, low: int = 1) -> int | None:
    return default if flag not in args else whole(SOURCE, flag, args[flag], low)


def _float(args: dict[str, Any], flag: str, default: float) -> float:
    if flag not in args:
        return default
    try:
        return float(args[flag])
    except ValueError:
        raise ScenarioError(f"{SOURCE}: {flag}: expected a number, got {str(args[flag])[:40]!r}") from None


def model_data(args: dict[str, Any], base: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The transformer's fields from the model flags (the base model when none is given)."""
    if "--num-layers" not in args and "--hidden-size" not in args:
        notes.append("model: no --num-layers or --hidden-size; kept the base scenario's model")
        return base
    model = dict(base) if base.get("preset") == "transformer" else {"preset": "transformer"}
    hidden = _int(args, "--hidden-size", model.get("d_model"))
    swiglu = bool(args.get("--swiglu"))
    # Megatron-LM's default FFN: 4 h, or 2/3 of it rounded down to a multiple of 64 for SwiGLU
    ffn = None if hidden is None else int(4 * hidden * 2 / 3 / 64) * 64 if swiglu else 4 * hidden
    sizes = {"layers": _int(args, "--num-layers", model.get("layers")), "d_model": hidden,
             "d_ff": _int(args, "--ffn-hidden-size", ffn),
             "heads": _int(args, "--num-attention-heads", model.get("heads")),
             "seq_len": _int(args, "--seq-length", model.get("seq_len")),
             "vocab_multiple": _int(args, "--make-vocab-size-divisible-by", MEGATRON_DEFAULT_VOCAB_MULTIPLE)}
    model.update({k: v for k, v in sizes.items() if v is not None})
    if "--vocab-size" in args:
        model["vocab"] = _int(args, "--vocab-size")
    else:
        notes.append(f"model.vocab: no --vocab-size (the tokenizer sets it); kept {model.get('vocab', 'the default')}")
    hidden_p = _float(args, "--hidden-dropout", MEGATRON_DEFAULT_DROPOUT)
    if _float(args, "--attention-dropout", MEGATRON_DEFAULT_DROPOUT) != hidden_p:
        notes.append("--attention-dropout: the transformer preset has one dropout rate; took --hidden-dropout's")
    model["dropout"] = hidden_p
    backend = args.get("--attention-backend", "flash" if args.get("--use-flash-attn") else "auto")
    model["attention"] = "standard" if backend == "unfused" else "flash"
    if backend not in ("flash", "unfused"):
        notes.append(f"--attention-backend {backend}: a fused kernel that keeps no scores; taken as flash")
    model.update(block_data(args, notes))
    model.update(expert_data(args, model, notes))
    positions = _int(args, "--max-position-embeddings", model.get("seq_len"))
    if positions != model.get("seq_len") and model.get("position") == "learned":
        notes.append(f"--max-position-embeddings {positions}: the preset's position table has seq_len rows")
    return model


def block_data(args: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """Key/value heads, the MLP, the norm, positions, tied embeddings and biases (Megatron-LM's
    defaults where a flag is absent: multi-head, GeLU, LayerNorm, learned, tied, biases)."""
    norm = str(args.get("--normalization", "LayerNorm"))
    position = str(args.get("--position-embedding-type", "learned_absolute"))
    for value, known, flag in ((norm, NORMS, "--normalization"), (position, POSITIONS, "--position-embedding-type")):
        if value not in known:
            notes.append(f"{flag} {value}: not one the transformer preset has; taken as Megatron-LM's default")
    out = {"mlp": "swiglu" if args.get("--swiglu") else "gelu", "norm": NORMS.get(norm, "layernorm"),
           "position": POSITIONS.get(position, "learned"),
           "tied_embeddings": not args.get("--untie-embeddings-and-output-weights"),
           "bias": not args.get("--disable-bias-linear"), "kv_heads": None}
    if args.get("--group-query-attention"):
        out["kv_heads"] = _int(args, "--num-query-groups", 1)  # its default: 1
    elif "--num-query-groups" in args:
        notes.append("--num-query-groups without --group-query-attention: Megatron-LM runs multi-head attention")
    return out


def expert_data(args: dict[str, Any], model: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """A mixture of experts from --num-experts and the --moe-* flags (none without it): top-k
    (Megatron-LM's default 2), one expert's size (default --ffn-hidden-size), the shared experts
    (their summed size over one expert's), which blocks are MoE (--moe-layer-freq: every N-th, or
    a 0/1 pattern read as dense blocks first, then every N-th) and the capacity factor."""
    if "--num-experts" not in args:
        return {"experts": 0}
    ffn = _int(args, "--moe-ffn-hidden-size", model.get("d_ff"))
    out: dict[str, Any] = {"experts": _int(args, "--num-experts"), "top_k": _int(args, "--moe-router-topk", 2),
                           "expert_d_ff": ffn, "shared_experts": 0, "first_dense_layers": 0, "moe_every": 1}
    shared = _int(args, "--moe-shared-expert-intermediate-size", 0, low=0) or 0
    if shared and ffn and shared % ffn == 0:
        out["shared_experts"] = shared // ffn
    elif shared:
        notes.append(f"--moe-shared-expert-intermediate-size {shared}: not a whole number of experts of {ffn}; left out")
    freq = str(args.get("--moe-layer-freq", "1")).strip()
    if freq.startswith("["):
        pattern = [whole(SOURCE, "--moe-layer-freq", x.strip(), 0) for x in freq.strip("[]").split(",") if x.strip()]
        first = next((i for i, x in enumerate(pattern) if x), len(pattern))
        every = next((i - first for i in range(first + 1, len(pattern)) if pattern[i]), 1)
        out.update(first_dense_layers=first, moe_every=every)
        if [int(i >= first and (i - first) % every == 0) for i in range(len(pattern))] != pattern:
            notes.append(f"--moe-layer-freq {freq}: read as {first} dense blocks, then every {every}-th MoE")
    else:
        out["moe_every"] = whole(SOURCE, "--moe-layer-freq", freq)
    if "--moe-expert-capacity-factor" in args:
        out["capacity_factor"] = _float(args, "--moe-expert-capacity-factor", 1.0)
    return out


def pipeline_data(args: dict[str, Any], launch: dict[str, Any], data: dict[str, Any],
                  notes: list[str]) -> dict[str, Any]:
    """K, v, D, T, sequence parallelism, the batch, M, the schedule, the partition and remat."""
    pipe = dict(data["pipeline"])
    T = _int(args, "--tensor-model-parallel-size", 1)
    K = _int(args, "--pipeline-model-parallel-size", 1)
    C = _int(args, "--context-parallel-size", 1)
    sizes = layout_sizes(args["--pipeline-model-parallel-layout"]) if "--pipeline-model-parallel-layout" in args \
        else None
    v = len(sizes) // K if sizes is not None else _virtual_stages(args, data["model"], K)
    layers = int(data["model"].get("layers", 0))
    if sizes is not None and data["model"].get("preset") == "transformer" and sum(sizes) != layers + 2:
        raise ScenarioError(f"{SOURCE}: --pipeline-model-parallel-layout: {sum(sizes) - 2} transformer layers, "
                            f"--num-layers {layers}")
    if sizes is not None and len(sizes) % K:
        raise ScenarioError(f"{SOURCE}: --pipeline-model-parallel-layout: {len(sizes)} stages for "
                            f"--pipeline-model-parallel-size {K}")
    D = _data_parallel(launch, T * C * K, pipe.get("data_parallel", 1), notes)
    mbs = _int(args, "--micro-batch-size", 1)
    batch = _int(args, "--global-batch-size", mbs * D)
    if batch % (mbs * D):
        raise ScenarioError(f"{SOURCE}: --global-batch-size {batch} is not a multiple of --micro-batch-size {mbs} "
                            f"x {D} data-parallel replicas")
    pipe.update(stages=K, chunks=v, data_parallel=D, tensor_parallel=T, context_parallel=C,
                expert_parallel=_int(args, "--expert-model-parallel-size", 1), batch_size=batch,
                micro_batches=batch // (mbs * D), sequence_parallel=bool(args.get("--sequence-parallel")) and T > 1,
                schedule=MEGATRON_SCHEDULES[min(v, 2)],
                partition=list(sizes) if sizes is not None else megatron_split(args, data["model"], K, v, notes))
    pipe["remat"] = _remat(args, notes)
    return pipe


def _remat(args: dict[str, Any], notes: list[str]) -> str:
    """selective: the attention core; full with groups of one block: `full`; with larger groups
    (one per chunk as `write_megatron` writes them): whole chunks, `always`."""
    granularity = args.get("--recompute-granularity", "selective" if args.get("--recompute-activations") else None)
    if granularity in (None, "selective"):
        return "none" if granularity is None else "selective"
    if granularity != "full":
        notes.append(f"--recompute-granularity {granularity}: not a re-computation gpipe-sim models; taken as none")
        return "none"
    method, group = args.get("--recompute-method"), _int(args, "--recompute-num-layers", 1)
    if method != "uniform":
        notes.append(f"--recompute-method {method}: re-computes some blocks of a stage; taken as every block (full)")
        return "full"
    return "full" if group == 1 else "always"


def _virtual_stages(args: dict[str, Any], model: dict[str, Any], K: int) -> int:
    if "--num-virtual-stages-per-pipeline-rank" in args:
        return _int(args, "--num-virtual-stages-per-pipeline-rank") or 1
    per_stage = _int(args, "--num-layers-per-virtual-pipeline-stage")
    if per_stage is None:
        return 1
    layers = int(model.get("layers", 0))
    if layers % (per_stage * K):
        raise ScenarioError(f"{SOURCE}: --num-layers-per-virtual-pipeline-stage {per_stage}: {layers} layers do "
                            f"not split into {K} ranks of such stages")
    return layers // (per_stage * K)


def _data_parallel(launch: dict[str, Any], model_parallel: int, base_d: int, notes: list[str]) -> int:
    """D = world size / (T x K), the world size torchrun's --nnodes x --nproc-per-node."""
    if "nproc" not in launch:
        notes.append(f"pipeline.data_parallel: no torchrun --nproc-per-node to give the world size; kept D={base_d}")
        return base_d
    world = whole(SOURCE, "--nnodes", launch.get("nnodes", 1)) * whole(SOURCE, "--nproc-per-node", launch["nproc"])
    if world % model_parallel:
        raise ScenarioError(f"{SOURCE}: {world} processes do not split into tensor x pipeline groups of {model_parallel}")
    return world // model_parallel


def megatron_split(args: dict[str, Any], model: dict[str, Any], K: int, v: int, notes: list[str]) -> Any:
    """Chunk sizes as Megatron-LM splits the transformer layers without a layout
    (transformer_block.get_num_layers_to_build): --decoder-first/last-pipeline-num-layers on the
    first and last stage and the rest evenly, or evenly with the embedding and the loss counted as
    layers where --account-for-embedding/loss-in-pipeline-split says so, else evenly; the embedding
    on the first chunk and the output layer on the last."""
    layers = int(model.get("layers", 0))
    if K * v == 1:
        return "uniform"
    first, last = (_int(args, f"--decoder-{end}-pipeline-num-layers", low=0) for end in ("first", "last"))
    embedding, loss = (bool(args.get(f"--account-for-{what}-in-pipeline-split")) for what in ("embedding", "loss"))
    if model.get("preset") != "transformer" or (v > 1 and (first, last, embedding, loss) != (None, None, False, False)):
        notes.append("partition: not a split of transformer layers gpipe-sim reads here; taken as uniform")
        return "uniform"
    if first is not None or last is not None:
        ends = [n for n in (first, last) if n is not None]
        middle = K - len(ends)
        rest = layers - sum(ends)
        if rest < 0 or (middle and rest % middle) or (not middle and rest):
            raise ScenarioError(f"{SOURCE}: --decoder-first/last-pipeline-num-layers: {layers} layers do not leave "
                                f"an even share for the other {middle} stages")
        blocks = [rest // middle if middle else 0] * K
        blocks[0] = first if first is not None else blocks[0]
        blocks[-1] = last if last is not None else blocks[-1]
    else:
        total = layers + embedding + loss
        if total % (K * v):
            notes.append(f"partition: {total} layers do not split evenly into {K * v} chunks as Megatron-LM "
                         "requires without a layout; taken as uniform")
            return "uniform"
        blocks = [total // (K * v)] * (K * v)
        blocks[0] -= embedding
        blocks[-1] -= loss
    sizes = list(blocks)
    sizes[0] += 1
    sizes[-1] += 1
    return sizes


def training_data(args: dict[str, Any], data: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The dtype, the optimizer, ZeRO-1 and the token budget."""
    training = dict(data["training"])
    training["dtype"] = "bf16" if args.get("--bf16") else "fp16" if args.get("--fp16") else "fp32"
    if args.get("--fp8-format") and training["dtype"] == "bf16":  # FP8 GEMMs (Transformer Engine), bf16 elsewhere
        training["dtype"] = "fp8"
    optimizer = args.get("--optimizer", "adam")
    if optimizer == "sgd":
        training["optimizer"] = "momentum" if _float(args, "--sgd-momentum", 0.9) > 0 else "sgd"
    elif optimizer == "adam":  # decoupled weight decay (OptimizerConfig.decoupled_weight_decay)
        training["optimizer"] = "adamw"
    else:
        notes.append(f"--optimizer {optimizer}: not one gpipe-sim models; kept {training.get('optimizer', 'adam')}")
    training["zero"] = 1 if args.get("--use-distributed-optimizer") else 0
    training["overlap_grad_reduce"] = bool(args.get("--overlap-grad-reduce"))
    training["overlap_param_gather"] = bool(args.get("--overlap-param-gather"))
    bytes_each = DTYPE_BYTES[training["dtype"]]  # a gradient in the training dtype
    training["bucket_bytes"] = None
    if "--ddp-bucket-size" in args and training["overlap_grad_reduce"]:
        training["bucket_bytes"] = _int(args, "--ddp-bucket-size") * bytes_each
    elif "--ddp-bucket-size" in args:
        notes.append("--ddp-bucket-size without --overlap-grad-reduce: each chunk's gradients are one reduction")
    seq = data["model"].get("seq_len")
    if seq and "--train-samples" in args:
        training["tokens"] = _int(args, "--train-samples") * seq
    elif seq and "--train-iters" in args:
        training["tokens"] = _int(args, "--train-iters") * data["pipeline"]["batch_size"] * seq
    return training
