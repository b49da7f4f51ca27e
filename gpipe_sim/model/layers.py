"""Model presets turned into the per-layer table (FLOPs, parameters, activation bytes) the simulator runs."""

from __future__ import annotations

import math
from typing import Any, Callable

from gpipe_sim.model import kernels as K
from gpipe_sim.model.block_shape import BlockShape, norm_parameters
from gpipe_sim.model.experts import moe_block
from gpipe_sim.model.recompute import attention_core_bytes_per_token
from gpipe_sim.model.tensor_parallel import split_vocab
from gpipe_sim.model.model import (
    AmoebaNetModel,
    ConvNetModel,
    LayerSpec,
    MlpModel,
    ModelSpec,
    TableModel,
    TransformerModel,
    UniformModel,
)

ModelBuilder = Callable[..., list[LayerSpec]]


def _layer(**fields: Any) -> LayerSpec:
    """A preset's layer, built without re-validation: its figures come from validated sizes (and
    may exceed what a hand-written table row may hold, e.g. FLOPs of a huge convolution)."""
    return LayerSpec.model_construct(**fields)

_BUILDERS: dict[str, ModelBuilder] = {}


def _builder(preset: str) -> Callable[[ModelBuilder], ModelBuilder]:
    def register(fn: ModelBuilder) -> ModelBuilder:
        _BUILDERS[preset] = fn
        return fn

    return register


def build_layers(model: ModelSpec, dtype_bytes: int = 4, mask_bytes: int = 1, tensor_parallel: int = 1,
                 sequence_parallel: bool = False, expert_parallel: int = 1) -> list[LayerSpec]:
    """The model's ordered layer list; sizes in bytes use `dtype_bytes` per element of an
    activation and `mask_bytes` per element of a dropout mask (`Accelerator.dropout_mask_bytes`).
    With `tensor_parallel` T > 1, each layer as one of its T devices holds and runs it: the
    transformer preset's split here, a layer table's rows as they are (profiled at that T, as
    `tensor_parallel_problem` requires; the other presets are refused there). A mixture of
    experts' blocks hold `experts / expert_parallel` of its experts (gpipe_sim.model.experts)."""
    if isinstance(model, TransformerModel) and (tensor_parallel > 1 or model.experts):
        return _transformer(model, dtype_bytes, mask_bytes, tensor_parallel, sequence_parallel, expert_parallel)
    return _BUILDERS[model.preset](model, dtype_bytes, mask_bytes)


def layer_count(model: ModelSpec) -> int:
    """Number of entries in the layer list (cheap: does not build analytic tables)."""
    if isinstance(model, UniformModel):
        return model.layers
    if isinstance(model, TableModel):
        return len(model.layers)
    if isinstance(model, AmoebaNetModel):
        return model.layers + 4  # stem, L normal cells, 2 reduction cells, head
    return model.layers + 2  # input layer, blocks, head


# What each preset adds around its `layers` repeated units: (unit name, the layers added).
_AROUND: dict[type, tuple[str, tuple[str, ...]]] = {
    TransformerModel: ("block", ("embedding", "head")),
    MlpModel: ("block", ("input", "head")),
    ConvNetModel: ("block", ("stem", "head")),
    AmoebaNetModel: ("normal cell", ("2 reduction cells", "stem", "head")),
}


def describe_layer_count(model: ModelSpec) -> str:
    """The model's layer count in the user's words: "26 layers (24 blocks + embedding + head)" for a
    preset that adds layers around its `layers` units, "16 layers" for a uniform or table model
    (whose layers are exactly the ones given)."""
    total = layer_count(model)
    counted = f"{total:,} layer{'s' if total != 1 else ''}"
    around = _AROUND.get(type(model))
    if around is None:
        return counted
    unit, extra = around
    units = f"{model.layers:,} {unit}{'s' if model.layers != 1 else ''}"
    return f"{counted} ({units} + {' + '.join(extra)})"


def input_bytes_per_sample(model: ModelSpec, dtype_bytes: int = 4) -> float:
    """Bytes of one sample of the model's input (kept for stage 0 under re-materialization)."""
    if isinstance(model, UniformModel):
        return model.output_bytes_per_sample
    if isinstance(model, TableModel):
        if model.input_bytes_per_sample is not None:
            return model.input_bytes_per_sample
        return model.layers[0].output_bytes_per_sample
    if isinstance(model, TransformerModel):
        return 8.0 * model.seq_len  # int64 token ids
    if isinstance(model, MlpModel):
        return float(model.input_dim * dtype_bytes)
    size = model.image_size
    return float(3 * size * size * dtype_bytes)


def total_params(layers: list[LayerSpec]) -> int:
    return sum(layer.params for layer in layers)


@_builder("uniform")
def _uniform(model: UniformModel, dtype_bytes: int, mask_bytes: int) -> list[LayerSpec]:
    return [
        _layer(
            name=f"layer{i}",
            params=model.params_per_layer,
            activation_bytes_per_sample=model.activation_bytes_per_sample,
            output_bytes_per_sample=model.output_bytes_per_sample,
            forward_s_per_sample=model.forward_s_per_sample,
            backward_s_per_sample=model.backward_s_per_sample,
            backward_input_s_per_sample=model.backward_input_s_per_sample,
            backward_weight_s_per_sample=model.backward_weight_s_per_sample,
            kernels=0,
        )
        for i in range(model.layers)
    ]


@_builder("table")
def _table(model: TableModel, dtype_bytes: int, mask_bytes: int) -> list[LayerSpec]:
    return list(model.layers)


# Bytes per token of a LayerNorm's statistics (mean and 1/std, fp32 whatever the activations' type).
_NORM_STATS = 8


def _norm_saved(model: TransformerModel, p: int) -> int:
    """Bytes per token one norm saves for backward, its output (the next GEMM's input) included.
    LayerNorm: its input, output and statistics. RMSNorm as torch's composite rms_norm keeps it
    (torch.nn.RMSNorm on CPU): its input, the input upcast to fp32 where narrower, the fp32
    1/rms, the normalised input (for the weight's gradient) and the output; CUDA's fused kernel
    keeps only the input and 1/rms."""
    d = model.d_model
    if model.norm == "layernorm":
        return 2 * d * p + _NORM_STATS
    return 3 * d * p + 4 + (4 * d if p < 4 else 0)


def _share(amount: int, parts: int) -> float:
    """One of `parts` equal shares of `amount` (exactly `amount` for one part)."""
    return amount // parts if amount % parts == 0 else amount / parts


@_builder("transformer")
def _transformer(model: TransformerModel, p: int, m: int, tp: int = 1, sequence_parallel: bool = False,
                 ep: int = 1) -> list[LayerSpec]:
    """Saved bytes as torch's autograd keeps them for the zoo's modules (pre-norm decoder block;
    Korthikanti et al. 2022's 34sbh + 5as^2b with 1-byte masks at p = 2, plus LayerNorm statistics),
    with masks of `m` bytes an element where the model has dropout. With `tp` > 1, one device's
    share under Megatron-LM's tensor parallelism: what the split divides over T (the GEMMs'
    weights, heads, the vocabulary, the activations inside attention and the MLP), the rest whole
    (norms, biases of row-parallel GEMMs, the activations at block boundaries) unless
    `sequence_parallel`, which shards those activations too (Korthikanti et al.'s 34sbh/t)."""
    r = tp if sequence_parallel and tp > 1 else 1  # the share of the replicated activations
    # The vocabulary as the tables, the logits and the head's GEMM have it: padded (`vocab_multiple`,
    # times T when split, as Megatron-LM pads), one device's rows.
    v = split_vocab(model, tp) // tp  # T = 1: padded_vocab
    mask = m if model.dropout > 0 else 0
    head = _head(model, v, p, r)
    blocks = [moe_block(block, model, p, mask, tp, r, ep) if model.is_moe(i) else block
              for i, block in enumerate(_blocks(model, p, mask, tp, r))]
    return [_embedding(model, p, mask, v, r), *blocks, head]


def _embedding(model: TransformerModel, p: int, mask: int, v: int, r: int) -> LayerSpec:
    """Token table (its `v` rows of one device) and, for learned positions, the position table;
    saves the token ids and its dropout's mask."""
    d, s = model.d_model, model.seq_len
    learned = model.position == "learned"
    return _layer(
        name="embedding",
        params=v * d + (s * d if learned else 0),
        largest_tensor_params=max(v, s if learned else 0) * d,  # the token table or the positions
        activation_bytes_per_sample=8.0 * s + _share(s * d * mask, r),
        output_bytes_per_sample=float(_share(s * d * p, r)),
        # the token lookup before the position add; the token table's gradient before accumulation
        transient_bytes_per_sample=float(s * d * p),
        transient_bytes=float(v * d * p),
        forward_flops_per_sample=float(s * d),
        backward_flops_per_sample=float(2 * s * d),
        backward_input_flops_per_sample=0.0,  # token ids have no gradient: all of it is the tables'
        kernels=3 if learned else 2,
        ops=K.embedding(v, d, s, model.dropout > 0, p, mask, learned),
    )


def _blocks(model: TransformerModel, p: int, mask: int, tp: int, r: int) -> list[LayerSpec]:
    """The `layers` identical blocks: attention (QKV, scores, context, projection) and MLP,
    pre-norm; on one of `tp` devices (`BlockShape`), replicated activations shared over `r` of them."""
    b = BlockShape.of(model, tp)
    s, d = b.s, b.d
    # Saved for backward, every block: both norms' (`_norm_saved`) and the masks of the two residual
    # branches' dropouts (replicated); the attention's inputs (Q and, for standard attention, K and V
    # repeated for each query head; flash keeps K and V as they are), its output (the projection's
    # input), the MLP's (gelu: fc1's output and GeLU's; swiglu: gate's and up's outputs, silu's and
    # the product) (split). Standard attention also keeps the softmax output (a*s*s) and, with
    # dropout, its mask and the dropped-out probabilities; flash keeps the log-sum-exp (fp32, a*s).
    flash = model.attention == "flash"
    core = attention_core_bytes_per_token(model, p, mask) / tp
    qkv_saved = b.qkv if flash else 3 * b.q
    mlp_saved = 2 * (b.mlp_matrices - 1) * b.f_share
    per_token = (_share(2 * _norm_saved(model, p) + 2 * d * mask, r)
                 + (qkv_saved + b.q + mlp_saved) * p + core)
    # Transient: standard attention's scores before the softmax (the product and its masked copy),
    # and in backward the gradients of the probabilities and the scores; flash's fused kernels
    # need about the gradient of Q, K and V beside the gradient flowing in. Fixed: the largest
    # weight's gradient before it is added to the accumulated one.
    transient = 2.0 * b.heads * s * s * p if not flash else 4.0 * s * b.q * p
    if r > 1:  # sequence parallel: a column-parallel backward's gathered input and its input's gradient
        transient = max(transient, 2.0 * s * d * p)
    # a weight matmul's input and weight gradients each cost its forward; the attention scores and
    # context (4 s^2 q) have no weights: both their gradients are the input's
    attention = 4.0 * s * s * b.q
    block = dict(
        transient_bytes_per_sample=transient,
        transient_bytes=float(b.largest_tensor * p),
        params=b.params,
        largest_tensor_params=b.largest_tensor,
        activation_bytes_per_sample=float(s * per_token),
        output_bytes_per_sample=float(_share(s * d * p, r)),
        # Gradients the input pass keeps for the weight pass: at the outputs of QKV and the MLP's
        # d -> d_ff matrices (split), of the projection, the down matrix and both norms (replicated).
        kept_for_weight_bytes_per_sample=float(s * p * (b.qkv + (b.mlp_matrices - 1) * b.f_share + _share(4 * d, r))),
        forward_flops_per_sample=b.matmul_flops,
        backward_flops_per_sample=2.0 * b.matmul_flops,
        backward_input_flops_per_sample=b.matmul_flops + attention,
        # flash fuses the scores, scaling, mask, softmax, dropout and context product into one
        kernels=_block_kernel_count(model),
        ops=K.transformer_block(d, b.f, s, model.heads, model.attention, model.dropout > 0, p, mask, tp, r > 1,
                                shape=b, rope=model.position == "rope"),
    )
    return [_layer(name=f"block{i}", **block) for i in range(model.layers)]


def selective_bytes_per_token(model: TransformerModel, p: int, mask: int, tp: int = 1,
                              sequence_parallel: bool = False) -> tuple[float, float]:
    """Per token of a block on one of `tp` devices, under selective recompute (the attention core
    checkpointed: gpipe_sim.model.recompute): (what the block no longer keeps: the core's own
    saved bytes, and for standard attention with grouped heads the key/value copies repeated for
    the query heads inside the core, whose inputs K and V it keeps instead; what it keeps for the
    part of its backward that runs before the core's: the second norm, both residual dropouts'
    masks, the projection's input and the MLP's tensors), as `_blocks` counts them."""
    b = BlockShape.of(model, tp)
    r = tp if sequence_parallel and tp > 1 else 1
    repeated = 0 if model.attention == "flash" else (3 * b.q - b.qkv) * p
    dropped = attention_core_bytes_per_token(model, p, mask) / tp + repeated
    after = _share(_norm_saved(model, p) + 2 * b.d * mask, r) + (b.q + 2 * (b.mlp_matrices - 1) * b.f_share) * p
    return dropped, float(after)


def _block_kernel_count(model: TransformerModel) -> int:
    """Kernels a block launches forward (the uniform presets' host-issue count): 14 for today's
    GPT block with standard attention, 9 with flash; SwiGLU adds its up GEMM and the product,
    RoPE its two rotations, standard grouped attention its two repeats."""
    count = 9 if model.attention == "flash" else 14
    count += 2 if model.mlp == "swiglu" else 0
    count += 2 if model.position == "rope" else 0
    count += 2 if model.attention == "standard" and model.query_groups != model.heads else 0
    return count


def _head(model: TransformerModel, v: int, p: int, r: int) -> LayerSpec:
    """The final norm (whole unless shared over `r`) and the projection on one device's `v`
    vocabulary rows, with the loss's fp32 log-softmax and target ids. Tied embeddings: its weight
    is a copy of the token table, held here as Megatron-LM's last pipeline stage holds it (counted
    once in the model's parameters: `model_parameters`)."""
    d, s = model.d_model, model.seq_len
    norm = _share(_norm_saved(model, p), r)  # its output is the projection's input
    return _layer(
        name="head",
        params=d * v + norm_parameters(model),
        largest_tensor_params=d * v,
        activation_bytes_per_sample=float(s * (norm + 4 * v + 8)),
        output_bytes_per_sample=4.0,
        kept_for_weight_bytes_per_sample=float(s * p * (v + _share(d, r))),
        freed_after_input_pass_bytes_per_sample=4.0 * s * v,  # the log-softmax: the input pass's alone
        # the logits (and their fp32 copy for the loss when narrower), in backward the gradients
        # of the log-softmax's input and of the logits; the projection's weight gradient
        transient_bytes_per_sample=float(s * v * (4 + p)),
        transient_bytes=float(d * v * p),
        forward_flops_per_sample=2.0 * s * d * v,
        backward_flops_per_sample=4.0 * s * d * v,
        kernels=5,
        ops=K.lm_head(d, v, s, p, r, norm_parameters(model) // d),
    )


def _loss_bytes(classes: int) -> float:
    """What the loss saves per sample (or token): its fp32 log-softmax and the int64 target."""
    return 4.0 * classes + 8.0


@_builder("mlp")
def _mlp(model: MlpModel, p: int, m: int) -> list[LayerSpec]:
    def linear(name: str, n_in: int, n_out: int, relu: bool, first: bool) -> LayerSpec:
        flops = 2.0 * n_in * n_out
        # a Linear saves its input, a ReLU its output; the head's loss its log-softmax and target
        saved = (n_in + (n_out if relu else 0)) * p + (0.0 if relu else _loss_bytes(n_out))
        return _layer(
            name=name,
            params=n_in * n_out + n_out,
            largest_tensor_params=n_in * n_out,
            activation_bytes_per_sample=float(saved),
            output_bytes_per_sample=float(n_out * p),
            saved_with_previous_bytes_per_sample=0.0 if first else float(n_in * p),
            kept_for_weight_bytes_per_sample=0.0 if first else float(n_out * p),
            # the head's log-softmax is read by the input pass alone
            freed_after_input_pass_bytes_per_sample=0.0 if relu else 4.0 * n_out,
            # forward: the Linear's output before the ReLU; backward: the gradients of the output
            # and of the input (the loss's in fp32 on the head); the weight's gradient
            transient_bytes_per_sample=float((n_out if relu else 0) * p + (0 if first else n_in * p)
                                             + (0 if relu else 8 * n_out)),
            transient_bytes=float(n_in * n_out * p),
            forward_flops_per_sample=flops,
            backward_flops_per_sample=2.0 * flops,
            kernels=2 if relu else 1,
            ops=K.mlp_linear(n_in, n_out, relu, first, p),
        )

    w = model.width
    layers = [linear("input", model.input_dim, w, True, True)]
    layers += [linear(f"block{i}", w, w, True, False) for i in range(model.layers)]
    layers.append(linear("head", w, model.num_classes, False, False))
    return layers


def _conv_layer(name: str, params: int, flops: float, act: float, out: float, kernels: int,
                **extra: Any) -> LayerSpec:
    return _layer(
        name=name,
        params=params,
        activation_bytes_per_sample=act,
        output_bytes_per_sample=out,
        forward_flops_per_sample=flops,
        backward_flops_per_sample=2.0 * flops,
        kernels=kernels,
        **extra,
    )


def _group_norm_stats(channels: int) -> float:
    """Bytes per sample of a GroupNorm's statistics (fp32 mean and 1/std per group; the zoo's
    groups: gcd(channels, 8))."""
    return 8.0 * math.gcd(channels, 8)


def _halved(size: int, times: int) -> int:
    """A feature map's side after `times` stride-2 3x3 convolutions padded by 1: ceil(size / 2) each."""
    for _ in range(times):
        size = (size + 1) // 2
    return size


@_builder("convnet")
def _convnet(model: ConvNetModel, p: int, m: int) -> list[LayerSpec]:
    """Saved bytes as autograd keeps them for the zoo's modules: a convolution saves its input, a
    GroupNorm its input and statistics, a ReLU its output; the residual sum saves nothing."""
    c, size, n = model.channels, model.image_size, model.layers
    layers = [
        _conv_layer("stem", 27 * c + 2 * c, 2.0 * 27 * c * size * size,
                    float((3 + 2 * c) * size * size * p) + _group_norm_stats(c), float(c * size * size * p), 3,
                    transient_bytes_per_sample=float(2 * c * size * size * p), transient_bytes=float(27 * c * p),
                    largest_tensor_params=27 * c, ops=K.conv_stem(c, size, p))
    ]
    s_in = size
    for i in range(n):
        group = min(2, 3 * i // n)
        c_out, s_out = c * 2**group, _halved(size, group)
        c_in = c_out if (i == 0 or 3 * (i - 1) // n == group) else c_out // 2
        down = c_in != c_out
        params = 9 * c_in * c_out + 9 * c_out * c_out + 4 * c_out + (c_in * c_out if down else 0)
        flops = 2.0 * (params - 4 * c_out) * s_out * s_out
        block_in = float(c_in * s_in * s_in * p)  # the previous layer's ReLU output: saved by both
        # conv1's input (and the projection's, the same tensor); n1's input, the ReLU's output
        # (conv2's input), n2's input and the final ReLU's output; both GroupNorms' statistics
        act = block_in + 4.0 * c_out * s_out * s_out * p + 2 * _group_norm_stats(c_out)
        # gradients kept for the weight pass: at both convolutions' and both norms' outputs (the
        # projection's output takes the second norm's: the residual sum's one gradient)
        kept = 4 * c_out * s_out * s_out * p
        # transient: about two feature maps of the larger side (a convolution's output before
        # its norm; in backward the gradient flowing in and the one flowing out); the largest
        # kernel's gradient
        layers.append(
            _conv_layer(f"block{i}", params, flops, act, float(c_out * s_out * s_out * p), 7,
                        saved_with_previous_bytes_per_sample=block_in,
                        kept_for_weight_bytes_per_sample=float(kept),
                        transient_bytes_per_sample=2.0 * max(block_in, c_out * s_out * s_out * p),
                        transient_bytes=float(9 * c_out * c_out * p), largest_tensor_params=9 * c_out * c_out,
                        ops=K.conv_block(c_in, c_out, s_out, p))
        )
        s_in = s_out
    c_last = c * 2 ** min(2, 3 * (n - 1) // n)
    s_last = _halved(size, min(2, 3 * (n - 1) // n))
    # Head: the mean over the image saves nothing; the classifier its pooled input; the loss.
    layers.append(
        _conv_layer("head", c_last * model.num_classes + model.num_classes,
                    2.0 * c_last * model.num_classes + c_last * s_last * s_last,
                    float(c_last * p) + _loss_bytes(model.num_classes), 4.0, 3,
                    kept_for_weight_bytes_per_sample=float(model.num_classes * p),
                    freed_after_input_pass_bytes_per_sample=4.0 * model.num_classes,  # the log-softmax
                    # backward: the gradient of the pooling's input, spread over the image
                    transient_bytes_per_sample=float(c_last * s_last * s_last * p),
                    transient_bytes=float(c_last * model.num_classes * p),
                    largest_tensor_params=c_last * model.num_classes,
                    ops=K.conv_head(c_last, s_last * s_last, model.num_classes, p))
    )
    return layers


# AmoebaNet-D cell constants: parameters of a normal cell are about _NORMAL_PARAMS * F^2 for F
# filters (separable and pooling branches of the five pairwise combinations, 1x1 projections),
# a reduction cell about _REDUCTION_PARAMS * F^2; saved activations about _CELL_ACT tensors of
# F x H x W per cell. _CELL_ACT = 5 reproduces the GPipe paper's measured activations (Table 1:
# 6.26 GB for AmoebaNet-D (18, 208) at batch 128 without re-materialization; 6.5 GB here) and its
# largest-model sizes; XLA on TPU fuses most intermediate tensors away.
_NORMAL_PARAMS = 13.0
_REDUCTION_PARAMS = 20.0
_CELL_ACT = 5
_CELL_KERNELS = 40


@_builder("amoebanet")
def _amoebanet(model: AmoebaNetModel, p: int, m: int) -> list[LayerSpec]:
    n_per_group = model.layers // 3
    d, size = model.filters, model.image_size
    # Stem: conv 3x3 stride 2 then two stride-2 reduction cells: spatial size / 8, d // 4 filters.
    s = max(1, math.ceil(size / 8))
    stem_f = max(1, d // 4)
    stem_params = int(27 * stem_f + 2 * _REDUCTION_PARAMS * stem_f * stem_f)
    stem_flops = 2.0 * 27 * stem_f * (size / 2) ** 2 + 2.0 * _REDUCTION_PARAMS * stem_f**2 * (size / 4) ** 2
    layers = [
        _conv_layer("stem", stem_params, stem_flops,
                    float((3 * size * size + _CELL_ACT * stem_f * (size / 2) ** 2) * p),
                    float(2 * d * s * s * p), _CELL_KERNELS,
                    ops=K.amoeba_cell(stem_params, stem_f, math.ceil(size / 4), p, _CELL_KERNELS))
    ]
    filters = d
    for group in range(3):
        if group:
            params = int(_REDUCTION_PARAMS * filters * filters * 2)
            s = max(1, math.ceil(s / 2))
            filters *= 2
            layers.append(
                _conv_layer(f"reduction{group}", params, 2.0 * params * s * s,
                            float(_CELL_ACT * filters * s * s * p), float(2 * filters * s * s * p),
                            _CELL_KERNELS, ops=K.amoeba_cell(params, filters, s, p, _CELL_KERNELS))
            )
        for i in range(n_per_group):
            params = int(_NORMAL_PARAMS * filters * filters)
            layers.append(
                _conv_layer(f"normal{group}_{i}", params, 2.0 * params * s * s,
                            float(_CELL_ACT * filters * s * s * p), float(2 * filters * s * s * p),
                            _CELL_KERNELS, ops=K.amoeba_cell(params, filters, s, p, _CELL_KERNELS))
            )
    layers.append(
        _conv_layer("head", 2 * filters * model.num_classes, 2.0 * 2 * filters * model.num_classes,
                    float(2 * filters * s * s * p), 4.0, 3,
                    ops=K.conv_head(2 * filters, s * s, model.num_classes, p))
    )
    return layers
