"""The model zoo: real `nn.Sequential` models whose layers match `gpipe_sim.model.layers.build_layers`."""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from gpipe_exec.context_parallel import SequenceShard, attend
from gpipe_exec.moe import ExpertGroup, MoeMlp
from gpipe_exec.runtime.checkpoint import checkpointed
from gpipe_sim.errors import ScenarioError
from gpipe_sim.model.layers import build_layers, layer_count
from gpipe_sim.model.model import ConvNetModel, MlpModel, ModelSpec, TransformerModel
from gpipe_sim.model.tensor_parallel import split_vocab

ZOO_PRESETS = ("mlp", "transformer", "convnet")
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT_DROPOUT = 0.1
RMS_EPS = 1e-5
ROPE_BASE = 10000.0
EXPERT_SEEDS = 1_009  # routed expert e of the layer seeded s is initialised from s x EXPERT_SEEDS + e


class Embedding(nn.Module):
    """Token embedding, plus a learned position table unless the blocks rotate (RoPE). The tokens
    are the sequence's first ones, or those at `position_ids` (a buffer set by context parallelism:
    runtime.context_parallel)."""

    def __init__(self, vocab: int, seq_len: int, d_model: int, dropout: float, positions: bool = True) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Parameter(torch.randn(seq_len, d_model) * 0.02) if positions else None
        self.drop = nn.Dropout(dropout)
        self.register_buffer("position_ids", None, persistent=False)  # a buffer: static, not an activation

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids)
        if self.positions is None:
            return self.drop(x)
        rows = self.positions[: ids.shape[1]] if self.position_ids is None else self.positions[self.position_ids]
        return self.drop(x + rows)


def norm_layer(model: TransformerModel) -> nn.Module:
    """The model's normalisation: torch's LayerNorm, or RMSNorm (a weight, eps 1e-5 as Llama's)."""
    if model.norm == "rmsnorm":
        return nn.RMSNorm(model.d_model, eps=RMS_EPS)
    return nn.LayerNorm(model.d_model)


def rotary_tables(seq_len: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's cos and sin (seq_len x head_dim), the halves' frequencies repeated (rotate-half
    layout, as Megatron-LM's and Hugging Face's Llama), base ROPE_BASE."""
    inv = 1.0 / ROPE_BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().float(), angles.sin().float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (batch, heads, seq, head_dim) rotated by position: x cos + rotate_half(x) sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Block(nn.Module):
    """A pre-norm decoder block: causal self-attention and an MLP, each with a residual.

    QKV is one GEMM whose rows are the queries of every head, then the keys, then the values of
    every key/value head (`kv_heads` of them, each shared by heads / kv_heads query heads; a
    tensor-parallel device holds its own heads' rows in the same order). `attention` "standard"
    computes softmax(QK^T)V step by step (autograd keeps the scores; keys and values repeated for
    each query head of their group, as Megatron-LM's unfused attention does); "flash" calls torch's
    fused `scaled_dot_product_attention` (grouped: `enable_gqa`) without attention dropout (the
    residual branches keep theirs), which keeps only its output and log-sum-exp for backward. The
    MLP is fc1, GeLU, fc2, or SwiGLU's silu(fc1) x up, then fc2 (torchtitan's w1, w3, w2).
    `recompute` (set by runtime.recompute): "full" runs the block under a checkpoint, "selective"
    its attention core (`_core`: Megatron-LM's DotProductAttention, the key/value repeat for the
    query heads included; gpipe_sim.model.recompute); "none" neither. Block `block` (0-based) of a
    mixture of experts (`model.is_moe`) runs `moe` (gpipe_exec.moe, its experts `experts`' share)
    in place of the MLP. With `context` (set by runtime.context_parallel) the block holds that
    share of the sequence, its rotary tables those tokens' rows, and its attention is the
    context-parallel group's (gpipe_exec.context_parallel.attend)."""

    def __init__(self, model: TransformerModel, dropout: float, block: int = 0,
                 experts: ExpertGroup | None = None) -> None:
        super().__init__()
        d, hd = model.d_model, model.d_model // model.heads
        self.heads, self.kv_heads = model.heads, model.query_groups  # this device's, once split
        self.flash = model.attention == "flash"
        self.recompute = "none"
        self.context: SequenceShard | None = None
        self.ln1 = norm_layer(model)
        self.qkv = nn.Linear(d, d + 2 * self.kv_heads * hd, bias=model.bias)
        self.proj = nn.Linear(d, d, bias=model.bias)
        self.ln2 = norm_layer(model)
        self.moe = MoeMlp(model, seed=torch.initial_seed() * EXPERT_SEEDS, group=experts) \
            if model.is_moe(block) else None
        if self.moe is None:
            self.fc1 = nn.Linear(d, model.d_ff, bias=model.bias)
            self.up = nn.Linear(d, model.d_ff, bias=model.bias) if model.mlp == "swiglu" else None
            self.fc2 = nn.Linear(model.d_ff, d, bias=model.bias)
        self.drop = nn.Dropout(dropout)
        self.attn_drop = nn.Dropout(dropout)
        # Buffers, so the saved-bytes meter (which skips parameters and buffers) does not count them;
        # flash attention (and the context-parallel ring) needs no mask, so holds none.
        causal = None if self.flash else torch.ones(model.seq_len, model.seq_len, dtype=torch.bool).triu(1)
        self.register_buffer("causal", causal, persistent=False)
        self.rotary = model.position == "rope"
        if self.rotary:
            cos, sin = rotary_tables(model.seq_len, hd)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute == "full":
            return checkpointed(self._block, x)
        return self._block(x)

    def _block(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(self.ln1(x))
        b, s, width = qkv.shape  # the whole sequence (`x` holds 1/T of it under sequence parallelism)
        hd = width // (self.heads + 2 * self.kv_heads)
        q, k, v = qkv.split((self.heads * hd, self.kv_heads * hd, self.kv_heads * hd), dim=-1)
        q, k, v = (t.view(b, s, -1, hd).transpose(1, 2) for t in (q, k, v))
        if self.rotary:
            q, k = rotate(q, self.cos[:s], self.sin[:s]), rotate(k, self.cos[:s], self.sin[:s])
        context = checkpointed(self._core, q, k, v) if self.recompute == "selective" else self._core(q, k, v)
        x = x + self.drop(self.proj(context.transpose(1, 2).reshape(b, s, self.heads * hd)))
        n = self.ln2(x)
        if self.moe is not None:
            return x + self.drop(self.moe(n))
        h = F.gelu(self.fc1(n)) if self.up is None else F.silu(self.fc1(n)) * self.up(n)
        return x + self.drop(self.fc2(h))

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attention core: (batch, heads, seq, head_dim) queries and (batch, kv_heads, seq,
        head_dim) keys and values to the context."""
        grouped = self.kv_heads != self.heads
        if self.context is not None:
            return attend(self.context, q, k, v)
        if self.flash:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=grouped)
        if grouped:
            k, v = (t.repeat_interleave(self.heads // self.kv_heads, dim=1) for t in (k, v))
        return self._attention(q, k, v, q.shape[2])

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: int) -> torch.Tensor:
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        mask = self.causal[:s, :s]
        attn = self.attn_drop(scores.masked_fill(mask, float("-inf")).softmax(-1))
        return attn @ v


class Head(nn.Module):
    """Final norm and the vocabulary projection (logits); with tied embeddings `build_model` makes
    its weight the token table."""

    def __init__(self, model: TransformerModel, vocab: int) -> None:
        super().__init__()
        self.ln = norm_layer(model)
        self.out = nn.Linear(model.d_model, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def _norm(channels: int) -> nn.GroupNorm:
    # GroupNorm, not BatchNorm: per-sample statistics make micro-batching exact.
    return nn.GroupNorm(math.gcd(channels, 8), channels)


class ResBlock(nn.Module):
    """Two 3x3 convolutions with GroupNorm and a residual; stride 2 and a 1x1 projection to downsample."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        stride = 1 if c_in == c_out else 2
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.n1 = _norm(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.n2 = _norm(c_out)
        self.shortcut = (
            nn.Identity() if c_in == c_out else nn.Conv2d(c_in, c_out, 1, stride, 0, bias=False)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.n1(self.conv1(x)))
        return F.relu(self.n2(self.conv2(y)) + self.shortcut(x))


class ConvHead(nn.Module):
    """Global average pooling and a linear classifier."""

    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean(dim=(2, 3)))


def _transformer_layer(m: TransformerModel, i: int, dropout: float, tp: int = 1,
                       experts: ExpertGroup | None = None) -> nn.Module:
    # the vocabulary padded as T devices split it (gpipe_sim.model.tensor_parallel.split_vocab)
    if i == 0:
        return Embedding(split_vocab(m, tp), m.seq_len, m.d_model, dropout, positions=m.position == "learned")
    if i == m.layers + 1:
        return Head(m, split_vocab(m, tp))
    return Block(m, dropout, i - 1, experts)


def _mlp_layer(m: MlpModel, i: int, dropout: float) -> nn.Module:
    if i == 0:
        return nn.Sequential(nn.Linear(m.input_dim, m.width), nn.ReLU())
    if i == m.layers + 1:
        return nn.Linear(m.width, m.num_classes)
    return nn.Sequential(nn.Linear(m.width, m.width), nn.ReLU())


def _conv_channels(m: ConvNetModel, i: int) -> tuple[int, int]:
    """(c_in, c_out) of block i, as gpipe_sim.model.layers._convnet lays them out."""
    n, c = m.layers, m.channels
    group = min(2, 3 * i // n)
    c_out = c * 2**group
    c_in = c_out if (i == 0 or 3 * (i - 1) // n == group) else c_out // 2
    return c_in, c_out


def _convnet_layer(m: ConvNetModel, i: int, dropout: float) -> nn.Module:
    if i == 0:
        c = m.channels
        return nn.Sequential(nn.Conv2d(3, c, 3, 1, 1, bias=False), _norm(c), nn.ReLU())
    if i == m.layers + 1:
        return ConvHead(_conv_channels(m, m.layers - 1)[1], m.num_classes)
    return ResBlock(*_conv_channels(m, i - 1))


_LAYER_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "transformer": _transformer_layer,
    "mlp": _mlp_layer,
    "convnet": _convnet_layer,
}


def check_buildable(model: ModelSpec) -> None:
    """Raise ScenarioError (one line) if the executor has no real module for this model."""
    if model.preset not in _LAYER_BUILDERS:
        raise ScenarioError(
            f"model.preset: the executor builds {', '.join(ZOO_PRESETS)} models, not {model.preset!r}"
        )
    if isinstance(model, ConvNetModel) and model.image_size < 4:
        raise ScenarioError("model.image_size: the convnet needs images of at least 4x4 pixels")


def build_layer(model: ModelSpec, index: int, *, seed: int = 0, dropout: float | None = None,
                dtype: str = "fp32", tensor_parallel: int = 1, experts: ExpertGroup | None = None) -> nn.Module:
    """Layer `index` of the model, initialised from `seed + index` (the same in every process).
    `dropout` overrides the model's own rate (`model.dropout`, where it has one); `tensor_parallel`
    T pads a transformer's vocabulary as T devices split it (the layer is still whole); `experts`
    the expert-parallel group whose share of a MoE block's routed experts it holds (None: all)."""
    check_buildable(model)
    p = getattr(model, "dropout", DEFAULT_DROPOUT) if dropout is None else dropout
    extra: dict[str, object] = {"tp": tensor_parallel} if tensor_parallel > 1 else {}
    if experts is not None:
        extra["experts"] = experts
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed * 100_003 + index)
        layer = _LAYER_BUILDERS[model.preset](model, index, p, **extra)
    return layer.to(TORCH_DTYPES[dtype])


def build_layers_range(model: ModelSpec, first: int, last: int, **kwargs: object) -> list[nn.Module]:
    """Layers `first..last` (inclusive), e.g. one model chunk; with tied embeddings, where the range
    holds both the embedding and the head, the head's projection is the token table itself."""
    layers = [build_layer(model, i, **kwargs) for i in range(first, last + 1)]  # type: ignore[arg-type]
    if isinstance(model, TransformerModel) and model.tied_embeddings and first == 0 and last == model.layers + 1:
        layers[-1].out.weight = layers[0].tokens.weight
    return layers


def build_model(model: ModelSpec, **kwargs: object) -> nn.Sequential:
    """The whole model as an `nn.Sequential`; its layers match gpipe_sim's layer list one for one."""
    check_buildable(model)
    return nn.Sequential(*build_layers_range(model, 0, layer_count(model) - 1, **kwargs))


def layer_names(model: ModelSpec) -> list[str]:
    """The simulator's names for the layers (embedding, block0, ..., head)."""
    return [layer.name for layer in build_layers(model)]


def make_batch(model: ModelSpec, batch_size: int, *, seed: int = 0,
               dtype: str = "fp32") -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic synthetic mini-batch (inputs, targets) for the model."""
    g = torch.Generator().manual_seed(seed + 7919)
    if isinstance(model, TransformerModel):
        # ids and targets in [0, vocab): the padded rows (`padded_vocab`) are never used, as in Megatron
        ids = torch.randint(0, model.vocab, (batch_size, model.seq_len), generator=g)
        return ids, torch.randint(0, model.vocab, (batch_size, model.seq_len), generator=g)
    float_dtype = TORCH_DTYPES[dtype]
    if isinstance(model, MlpModel):
        x = torch.randn(batch_size, model.input_dim, generator=g).to(float_dtype)
    elif isinstance(model, ConvNetModel):
        size = model.image_size
        x = torch.randn(batch_size, 3, size, size, generator=g).to(float_dtype)
    else:
        check_buildable(model)
        raise AssertionError("unreachable")
    return x, torch.randint(0, model.num_classes, (batch_size,), generator=g)


def loss_sum(output: torch.Tensor, target: torch.Tensor, batch_size: int) -> torch.Tensor:
    """This micro-batch's share of the mini-batch mean cross-entropy (so shares add up exactly)."""
    per_sample = output.shape[1] if output.dim() == 3 else 1
    logits = output.reshape(-1, output.shape[-1]).float()
    return F.cross_entropy(logits, target.reshape(-1), reduction="sum") / (batch_size * per_sample)
