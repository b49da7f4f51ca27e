"""Model presets turned into the per-layer table (FLOPs, parameters, activation bytes) the simulator runs."""

from __future__ import annotations

import math
from typing import Any, Callable

from gpipe_sim.spec.model import (
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


def build_layers(model: ModelSpec, dtype_bytes: int = 4) -> list[LayerSpec]:
    """The model's ordered layer list; sizes in bytes use `dtype_bytes` per element."""
    return _BUILDERS[model.preset](model, dtype_bytes)


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
def _uniform(model: UniformModel, dtype_bytes: int) -> list[LayerSpec]:
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
def _table(model: TableModel, dtype_bytes: int) -> list[LayerSpec]:
    return list(model.layers)


@_builder("transformer")
def _transformer(model: TransformerModel, p: int) -> list[LayerSpec]:
    d, f, s, a, v = model.d_model, model.d_ff, model.seq_len, model.heads, model.vocab
    # Embedding: token and learned position tables; saves the token ids; emits s x d.
    embed = _layer(
        name="embedding",
        params=v * d + s * d,
        activation_bytes_per_sample=8.0 * s,
        output_bytes_per_sample=float(s * d * p),
        forward_flops_per_sample=float(s * d),
        backward_flops_per_sample=float(2 * s * d),
        backward_input_flops_per_sample=0.0,  # token ids have no gradient: all of it is the tables'
        kernels=3,
    )
    # Block: attention (QKV, scores, context, projection) and MLP, pre-LayerNorm.
    block_params = 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d
    matmul_flops = 2.0 * s * (4 * d * d + 2 * d * f) + 4.0 * s * s * d
    # Bytes saved for backward (Korthikanti et al. 2022, generalised to element size p; masks 1 B):
    # attention 5 s*d tensors + dropout mask + scores/softmax/dropout a*s*s; MLP input, fc1 out,
    # GeLU out, mask; two LayerNorm inputs.
    block_act = s * (d * (5 * p + 1) + a * s * (2 * p + 1) + (d + 2 * f) * p + d + 2 * d * p)
    block = dict(
        params=block_params,
        activation_bytes_per_sample=float(block_act),
        output_bytes_per_sample=float(s * d * p),
        forward_flops_per_sample=matmul_flops,
        backward_flops_per_sample=2.0 * matmul_flops,
        # a weight matmul's input and weight gradients each cost its forward; the attention
        # scores and context (4 s^2 d) have no weights: both their gradients are the input's
        backward_input_flops_per_sample=2.0 * s * (4 * d * d + 2 * d * f) + 8.0 * s * s * d,
        kernels=14,
    )
    blocks = [_layer(name=f"block{i}", **block) for i in range(model.layers)]
    head = _layer(
        name="head",
        params=d * v + 2 * d,
        activation_bytes_per_sample=float(s * d * p + s * v * p),
        output_bytes_per_sample=4.0,
        forward_flops_per_sample=2.0 * s * d * v,
        backward_flops_per_sample=4.0 * s * d * v,
        kernels=5,
    )
    return [embed, *blocks, head]


@_builder("mlp")
def _mlp(model: MlpModel, p: int) -> list[LayerSpec]:
    def linear(name: str, n_in: int, n_out: int, relu: bool) -> LayerSpec:
        flops = 2.0 * n_in * n_out
        return _layer(
            name=name,
            params=n_in * n_out + n_out,
            activation_bytes_per_sample=float((n_in + (n_out if relu else 0)) * p),
            output_bytes_per_sample=float(n_out * p),
            forward_flops_per_sample=flops,
            backward_flops_per_sample=2.0 * flops,
            kernels=2 if relu else 1,
        )

    w = model.width
    layers = [linear("input", model.input_dim, w, True)]
    layers += [linear(f"block{i}", w, w, True) for i in range(model.layers)]
    layers.append(linear("head", w, model.num_classes, False))
    return layers


def _conv_layer(name: str, params: int, flops: float, act: float, out: float, kernels: int) -> LayerSpec:
    return _layer(
        name=name,
        params=params,
        activation_bytes_per_sample=act,
        output_bytes_per_sample=out,
        forward_flops_per_sample=flops,
        backward_flops_per_sample=2.0 * flops,
        kernels=kernels,
    )


@_builder("convnet")
def _convnet(model: ConvNetModel, p: int) -> list[LayerSpec]:
    c, size, n = model.channels, model.image_size, model.layers
    layers = [
        _conv_layer("stem", 27 * c + 2 * c, 2.0 * 27 * c * size * size,
                    float((3 + 3 * c) * size * size * p), float(c * size * size * p), 3)
    ]
    for i in range(n):
        group = min(2, 3 * i // n)
        c_out, s_out = c * 2**group, max(1, size // 2**group)
        c_in = c_out if (i == 0 or 3 * (i - 1) // n == group) else c_out // 2
        down = c_in != c_out
        params = 9 * c_in * c_out + 9 * c_out * c_out + 4 * c_out + (c_in * c_out if down else 0)
        flops = 2.0 * (params - 4 * c_out) * s_out * s_out
        act = float((c_in + 6 * c_out) * s_out * s_out * p)
        layers.append(
            _conv_layer(f"block{i}", params, flops, act, float(c_out * s_out * s_out * p), 7)
        )
    c_last = c * 2 ** min(2, 3 * (n - 1) // n)
    s_last = max(1, size // 2 ** min(2, 3 * (n - 1) // n))
    layers.append(
        _conv_layer("head", c_last * model.num_classes + model.num_classes,
                    2.0 * c_last * model.num_classes + c_last * s_last * s_last,
                    float(c_last * s_last * s_last * p + c_last * p), 4.0, 3)
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
def _amoebanet(model: AmoebaNetModel, p: int) -> list[LayerSpec]:
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
                    float(2 * d * s * s * p), _CELL_KERNELS)
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
                            _CELL_KERNELS)
            )
        for i in range(n_per_group):
            params = int(_NORMAL_PARAMS * filters * filters)
            layers.append(
                _conv_layer(f"normal{group}_{i}", params, 2.0 * params * s * s,
                            float(_CELL_ACT * filters * s * s * p), float(2 * filters * s * s * p),
                            _CELL_KERNELS)
            )
    layers.append(
        _conv_layer("head", 2 * filters * model.num_classes, 2.0 * 2 * filters * model.num_classes,
                    float(2 * filters * s * s * p), 4.0, 3)
    )
    return layers
