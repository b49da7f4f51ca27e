"""The model part of a scenario: presets by their size fields, or an explicit per-layer table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BeforeValidator, Field, field_validator, model_validator

from gpipe_sim.errors import ScenarioError
from gpipe_sim.model.architectures import ARCHITECTURES, expand_architecture
from gpipe_sim.model.hf_config import expand_hf_config
from gpipe_sim.schema.fields import (Amount, BatchSize, CapacityFactor, Dimension, DropoutRate, Duration, ExpertCount,
                                   ContextParallel, Kernels, LayerCount, LayerCountOrNone, Params, TensorParallel, _Strict)
from gpipe_sim.schema.limits import MAX_DIMENSION, MAX_LAYERS
from gpipe_sim.schema.files import read_data_file


# ---------------------------------------------------------------------------------------------
# model


class Timing(_Strict):
    """A measured time for one layer at one micro-batch size (the whole micro-batch, not per sample)."""

    micro_batch: BatchSize
    forward_s: Duration
    backward_s: Duration
    backward_input_s: Duration | None = None  # the backward split (zero-bubble's I and W passes)
    backward_weight_s: Duration | None = None
    # The host's seconds to issue the forward and the backward (GPU profiles): a chunk's pass takes
    # at least its layers' sum of these, however fast the device runs the kernels.
    forward_host_s: Duration | None = None
    backward_host_s: Duration | None = None


class LayerSpec(_Strict):
    """One layer of the sequential model: its cost and sizes. Per-sample figures scale with batch.

    Time comes from FLOPs on the hardware, from seconds per sample, or from `timings` measured at
    several micro-batch sizes (interpolated; preferred when present). This is also the row format
    that `gpipe-exec profile` writes.
    """

    name: Annotated[str, Field(max_length=1000)]
    params: Params = 0
    # Of `params`, those of routed experts (a mixture of experts' layer): their gradients are
    # reduced over the expert-data-parallel group, D x C / E (gpipe_sim.model.experts)
    expert_params: Params = 0
    # Parameters of its largest single tensor (an optimizer steps one tensor at a time: its
    # temporaries are that tensor's size); None: all of `params` in one tensor.
    largest_tensor_params: Params | None = None
    activation_bytes_per_sample: Amount = 0.0
    output_bytes_per_sample: Amount = 0.0
    # Bytes a pass of this layer allocates beyond what it saves and its output (attention scores not
    # kept, workspace, gradient buffers), freed by the end of that pass: the largest over its forward,
    # re-computation and backward passes: `samples x transient_bytes_per_sample` where activations
    # or their gradients are computed (forward, re-computation, full backward, input pass) plus the
    # fixed `transient_bytes` where weight gradients are (full backward, weight pass): what does not
    # grow with the micro-batch, a weight's gradient before it is added to the accumulated one.
    # Counted on top of the held activations while the pass runs.
    transient_bytes_per_sample: Amount = 0.0
    transient_bytes: Amount = 0.0
    # Bytes the input-gradient pass I keeps for the weight-gradient pass W when the backward is split
    # (the gradients where a parameter's branch meets the input's path), held from I to W's end.
    kept_for_weight_bytes_per_sample: Amount = 0.0
    # The most bytes the layer's input-gradient pass holds above what was live at its start, per
    # sample: its kept gradients, its input's gradient and its temporaries together (measured by
    # gpipe-exec profile); None: transient_bytes_per_sample + kept_for_weight_bytes_per_sample.
    input_pass_bytes_per_sample: Amount | None = None
    # Of its saved bytes, those only the input-gradient pass reads: freed when that pass ends, where
    # the runtime lets the graph go and keeps only what the weight pass needs (gpipe-exec does);
    # measured by gpipe-exec profile. 0: all are held to the weight pass's end.
    freed_after_input_pass_bytes_per_sample: Amount = 0.0
    # Of activation_bytes_per_sample, the bytes the previous layer saves too (the tensor between
    # them, kept by that layer as its output and by this one as its input): one allocation, which
    # gpipe_sim counts once where both layers are in one chunk.
    saved_with_previous_bytes_per_sample: Amount = 0.0
    # Bytes its backward re-makes before it runs, beyond what it keeps (per-layer recomputation,
    # `pipeline.remat: full | selective`: gpipe_sim.model.recompute): held on top of the saved bytes
    # while its backward (or input-gradient pass) runs, like a transient.
    recompute_bytes_per_sample: Amount = 0.0
    # Of its saved bytes, those its backward frees before the re-made ones are live (a block's
    # MLP, whose backward runs before its attention core is recomputed under `selective`).
    freed_before_recompute_bytes_per_sample: Amount = 0.0
    forward_flops_per_sample: Amount | None = None
    backward_flops_per_sample: Amount | None = None
    forward_s_per_sample: Duration | None = None
    backward_s_per_sample: Duration | None = None
    # The backward split into the input-gradient pass I and the weight-gradient pass W, which
    # zero-bubble schedules run apart (default: half of the backward each, or by FLOPs)
    backward_input_flops_per_sample: Amount | None = None
    backward_input_s_per_sample: Duration | None = None
    backward_weight_s_per_sample: Duration | None = None
    timings: tuple[Timing, ...] = Field((), max_length=1000)
    kernels: Kernels = 1
    update_s: Duration | None = None
    # The layer's kernels (gpipe_sim.model.kernels.LayerKernels), which a GPU preset's tables
    # price; set by the analytic presets, never read from or written to a table.
    ops: Any = Field(None, exclude=True, repr=False)

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
        if self.freed_after_input_pass_bytes_per_sample > self.activation_bytes_per_sample:
            raise ValueError(f"layer {self.name!r}: freed_after_input_pass_bytes_per_sample exceeds its "
                             f"activation_bytes_per_sample")
        if self.largest_tensor_params is not None and self.largest_tensor_params > self.params:
            raise ValueError(f"layer {self.name!r}: largest_tensor_params ({self.largest_tensor_params:,}) exceeds "
                             f"its params ({self.params:,})")
        return self


class UniformModel(_Strict):
    """Identical layers whose time scales linearly with the micro-batch size."""

    preset: Literal["uniform"] = "uniform"
    layers: LayerCount = 16
    forward_s_per_sample: Duration = 1.0e-3
    backward_s_per_sample: Duration = 2.0e-3
    backward_input_s_per_sample: Duration | None = None  # default: half of the backward
    backward_weight_s_per_sample: Duration | None = None  # default: half of the backward
    params_per_layer: Params = 10_000_000
    activation_bytes_per_sample: Amount = 4.0e6
    output_bytes_per_sample: Amount = 1.0e6


class TransformerModel(_Strict):
    """A GPT-style decoder: embedding, `layers` identical blocks, and an output head."""

    preset: Literal["transformer"] = "transformer"
    layers: LayerCount = 24
    d_model: Dimension = 1024
    d_ff: Dimension = 4096
    heads: Dimension = 16
    seq_len: Dimension = 512
    vocab: Dimension = 32000
    # The embedding and the output head are padded to a multiple of this many rows, as Megatron-LM's
    # --make-vocab-size-divisible-by (default 128) and nanoGPT's 50304 do; 1: no padding. The padded
    # rows are never targets: they size the tables, the logits and the head's GEMM (`padded_vocab`).
    vocab_multiple: Dimension = 128
    # standard: softmax(QK^T)V with the scores kept for backward; flash: a fused kernel
    # (torch's scaled_dot_product_attention) that keeps only its output and the log-sum-exp.
    # The zoo's flash blocks run attention without dropout (on CPU torch's fused kernel has none).
    attention: Literal["standard", "flash"] = "standard"
    dropout: DropoutRate = 0.1  # after the embedding, the attention probabilities and each residual branch
    # Key/value heads (grouped-query attention; 1: multi-query); None: `heads` (multi-head).
    kv_heads: Dimension | None = None
    # gelu: fc1 (d_model -> d_ff), GeLU, fc2; swiglu: silu(gate) x up, two d_model -> d_ff
    # matrices, then down (d_ff -> d_model): d_ff is the intermediate size either way.
    mlp: Literal["gelu", "swiglu"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"  # rmsnorm: a weight, no bias, no mean
    position: Literal["learned", "rope"] = "learned"  # rope: rotary, no parameters
    tied_embeddings: bool = False  # the output projection is the token table
    bias: bool = True  # biases on the linear layers (Megatron-LM's --disable-bias-linear: false)
    # Mixture of experts (gpipe_sim.model.experts), as Megatron-LM's MoE layer: `experts` routed
    # MLPs of `expert_d_ff` (None: d_ff) in place of the MLP of every `moe_every`-th block after
    # the first `first_dense_layers` (dense), each token sent to `top_k` of them by a linear router
    # beside `shared_experts` always used; `capacity_factor`: each expert's tokens padded to that
    # many times its even share (None: dropless, Megatron's default). 0 experts: a dense model.
    experts: ExpertCount = 0
    top_k: Dimension = 2
    expert_d_ff: Dimension | None = None
    shared_experts: ExpertCount = 0
    moe_every: Dimension = 1
    first_dense_layers: LayerCountOrNone = 0
    capacity_factor: CapacityFactor | None = None

    @model_validator(mode="after")
    def _heads_divide(self) -> "TransformerModel":
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of heads ({self.heads})")
        g = self.query_groups
        if g > self.heads:
            raise ValueError(f"model.kv_heads: {g:,} key/value heads exceed the {self.heads:,} query heads")
        if self.heads % g:
            raise ValueError(f"model.kv_heads: {self.heads:,} heads do not form groups of {g:,} key/value heads "
                             f"(give a divisor of {self.heads:,})")
        if self.experts and self.top_k > self.experts:
            raise ValueError(f"model.top_k: {self.top_k:,} experts a token, but the model has {self.experts:,}")
        if self.experts and self.first_dense_layers >= self.layers:
            raise ValueError(f"model.first_dense_layers: {self.first_dense_layers:,} dense blocks leave none of the "
                             f"{self.layers:,} for experts")
        if self.position == "rope" and (self.d_model // self.heads) % 2:
            raise ValueError(f"model.position: rope rotates pairs of a head's {self.d_model // self.heads} "
                             f"dimensions (d_model / heads must be even)")
        return self

    @property
    def moe_ffn(self) -> int:
        """One expert's intermediate size: `expert_d_ff`, else `d_ff`."""
        return self.d_ff if self.expert_d_ff is None else self.expert_d_ff

    def is_moe(self, block: int) -> bool:
        """Whether block `block` (0-based) has experts in place of its MLP: every `moe_every`-th
        after the first `first_dense_layers` (Megatron-LM's --moe-layer-freq; DeepSeek-V3's
        first_k_dense_replace)."""
        return bool(self.experts) and block >= self.first_dense_layers and \
            (block - self.first_dense_layers) % self.moe_every == 0

    @property
    def query_groups(self) -> int:
        """Key/value heads, each shared by heads / query_groups query heads (`kv_heads`, else `heads`)."""
        return self.heads if self.kv_heads is None else self.kv_heads

    @model_validator(mode="after")
    def _padded_vocab_bounded(self) -> "TransformerModel":
        if self.padded_vocab > MAX_DIMENSION:
            raise ValueError(f"vocab ({self.vocab:,}) padded to a multiple of vocab_multiple ({self.vocab_multiple:,}) "
                             f"is {self.padded_vocab:,}, beyond the limit of {MAX_DIMENSION:,}")
        return self

    @property
    def padded_vocab(self) -> int:
        """The vocabulary rounded up to a multiple of `vocab_multiple`: the rows of the embedding table
        and of the output head (the logits' width)."""
        return -(-self.vocab // self.vocab_multiple) * self.vocab_multiple


class AmoebaNetModel(_Strict):
    """An AmoebaNet-D-like image model: stem, normal and reduction cells, head (uneven layers)."""

    preset: Literal["amoebanet"] = "amoebanet"
    layers: LayerCount = 18
    filters: Dimension = 256
    image_size: Dimension = 224
    num_classes: Dimension = 1000

    @field_validator("layers")
    @classmethod
    def _multiple_of_three(cls, value: int) -> int:
        if value % 3:
            raise ValueError("AmoebaNet-D's L (normal cells) must be a multiple of 3")
        return value


class MlpModel(_Strict):
    """A stack of Linear+ReLU blocks between an input projection and a classifier."""

    preset: Literal["mlp"] = "mlp"
    layers: LayerCount = 8
    width: Dimension = 1024
    input_dim: Dimension = 1024
    num_classes: Dimension = 10


class ConvNetModel(_Strict):
    """A ResNet-like stack of residual conv blocks with downsampling stages (uneven layers)."""

    preset: Literal["convnet"] = "convnet"
    layers: LayerCount = 8
    channels: Dimension = 32
    image_size: Dimension = 32
    num_classes: Dimension = 10


class TableModel(_Strict):
    """An explicit per-layer table, inline (`layers`) or in a YAML/JSON file (`path`)."""

    preset: Literal["table"] = "table"
    path: Annotated[str, Field(max_length=4096)] | None = None
    layers: tuple[LayerSpec, ...] = ()
    input_bytes_per_sample: Amount | None = None
    # The tensor-parallel T it was profiled at (gpipe-exec profile with pipeline.tensor_parallel T):
    # each row is one device's share of a layer split over T devices, its times with the split's
    # collectives inside. A scenario runs it at that T only (spec.tensor_parallel_problem).
    tensor_parallel: TensorParallel = 1
    # Likewise the context-parallel C (each row one device's s/C tokens, the ring's exchanges
    # inside its times: gpipe_sim.model.context_parallel.context_parallel_problem) and the expert-
    # parallel E (each MoE row one device's experts / E routed experts, `expert_params` of them,
    # the dispatch and combine all-to-alls inside its times: expert_parallel_problem) it was profiled at.
    context_parallel: ContextParallel = 1
    expert_parallel: ContextParallel = 1
    # The whole model's parameters, forward + backward FLOPs per sample and tokens per sample
    # where the rows are one device's share (profiled at T, C or E > 1), as the step's figures
    # report them; None: the rows' sums (FLOPs), no tokens.
    parameters: Params | None = None
    flops_per_sample: Amount | None = None
    tokens_per_sample: Amount | None = None

    @field_validator("layers", mode="before")
    @classmethod
    def _not_too_many(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)) and len(value) > MAX_LAYERS:
            raise ValueError(f"{len(value):,} layers exceed the limit of {MAX_LAYERS:,} layers")
        return value

    @model_validator(mode="before")
    @classmethod
    def _load_path(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("path"), str) and data["path"] and not data.get("layers"):
            if "\0" in data["path"]:
                raise ValueError("model.path: a file name cannot contain a NUL character")
            loaded = load_layer_table_file(Path(data["path"]))
            return {**loaded, **{k: v for k, v in data.items() if k != "layers"}}
        return data

    @model_validator(mode="after")
    def _non_empty(self) -> "TableModel":
        if not self.layers:
            raise ValueError("a table model needs at least one layer (give `layers` or `path`)")
        return self


ModelSpec = Annotated[
    Annotated[Union[UniformModel, TransformerModel, AmoebaNetModel, MlpModel, ConvNetModel, TableModel],
              Field(discriminator="preset")],
    # `preset: llama3-8b` or `hf_config: PATH`: the transformer preset's fields
    BeforeValidator(lambda data: expand_architecture(expand_hf_config(data))),
]
MODEL_PRESETS = ("uniform", "transformer", "amoebanet", "mlp", "convnet", "table", *ARCHITECTURES)


# Every field a profile writes (gpipe_exec.profiling.table.profile_model): the rows, the input's bytes,
# the T, C and E it was profiled at, and the whole model's figures where its rows are one device's share.
TABLE_FILE_FIELDS = ("layers", "input_bytes_per_sample", "tensor_parallel", "context_parallel", "expert_parallel",
                     "parameters", "flops_per_sample", "tokens_per_sample")


def load_layer_table_file(path: Path) -> dict[str, Any]:
    """Read a per-layer table (YAML or JSON) as a dict with `layers` (a list of rows); ValueError
    naming the file where it is not one, or holds a field other than TABLE_FILE_FIELDS."""
    try:
        data = read_data_file(path, "layer table")
    except ScenarioError as exc:
        raise ValueError(str(exc)) from None
    if isinstance(data, list):
        data = {"layers": data}
    if not isinstance(data, dict) or "layers" not in data:
        raise ValueError(f"layer table {str(path)!r} must be a list of layers or have a `layers` key")
    unknown = sorted(str(k) for k in data if k not in TABLE_FILE_FIELDS)
    if unknown:  # nothing the file says is dropped unread
        raise ValueError(f"layer table {str(path)!r}: unknown field {unknown[0]!r} (a table file holds "
                         f"{', '.join(TABLE_FILE_FIELDS)})")
    return dict(data)
