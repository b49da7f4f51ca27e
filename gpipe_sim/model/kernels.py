"""The kernels each preset layer runs, forward and backward, as shapes a GPU model prices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Union

from gpipe_sim.model.block_shape import BlockShape


@dataclass(frozen=True)
class Gemm:
    """A matrix product (m x k) @ (k x n), `batch` of them; `per_sample` names the figure that
    grows with the micro-batch (`m` or `k`: tokens or pixels; `batch`: one product per sample)."""

    name: str
    m: int
    n: int
    k: int
    batch: int = 1
    per_sample: Literal["m", "k", "batch"] = "m"

    def shape(self, samples: int) -> tuple[int, int, int, int]:
        """(batch, m, n, k) for a micro-batch of `samples` (at least one)."""
        return self.shape_of(max(1, samples))

    def shape_of(self, s: Any) -> tuple[Any, Any, Any, Any]:
        """`shape` for `s` >= 1 samples: an int, or an integer array of them (each figure then
        an int or that array's shape)."""
        if self.per_sample == "m":
            return self.batch, self.m * s, self.n, self.k
        if self.per_sample == "k":
            return self.batch, self.m, self.n, self.k * s
        return self.batch * s, self.m, self.n, self.k


@dataclass(frozen=True)
class MemOp:
    """A memory-bound kernel (layernorm, gelu, dropout, residual add, softmax, a copy): bytes read
    plus written, per sample and fixed."""

    name: str
    bytes_per_sample: float
    bytes_fixed: float = 0.0


@dataclass(frozen=True)
class Flash:
    """Fused attention (torch's scaled_dot_product_attention, flash): `heads` per sample."""

    heads: int
    seq: int
    head_dim: int
    causal: bool = True
    backward: bool = False
    # Context parallelism's ring (gpipe_sim.model.context_parallel): the kernel runs once per step,
    # each step `seq` queries against `seq` keys, half of them masked as in causal attention.
    steps: int = 1

    def flops(self, samples: int) -> float:
        """Forward FLOPs (QK^T and PV) of the micro-batch, one step; causal attention does half."""
        full = 4.0 * self.heads * samples * self.seq * self.seq * self.head_dim
        return full / 2 if self.causal else full

    def with_steps(self, steps: int) -> "Flash":
        """This kernel run as `steps` ring steps."""
        return Flash(self.heads, self.seq, self.head_dim, self.causal, self.backward, steps)


# Bytes per score element of Megatron-LM's unfused softmax (FusedScaleMaskSoftmax.forward_torch_softmax
# and autograd's backward of it), 16-bit scores: forward the cast to fp32 (2 + 4), the scale (4 + 4),
# masked_fill_ (4 + 4 + the 1-byte mask), softmax (4 + 4), the cast back (4 + 2); backward the
# gradient's cast (2 + 4), softmax's backward (4 + 4 + 4), the mask's (4 + 4 + 1), the scale's
# (4 + 4) and the cast back (4 + 2): five kernels each way where the fused kernel is one.
UNFUSED_SOFTMAX_BYTES = ((6.0, 8.0, 9.0, 8.0, 6.0), (6.0, 12.0, 9.0, 8.0, 6.0))
# Megatron's fused softmax kernels take samples x heads in blocks of 4 (is_kernel_available:
# "attn_batches % 4 == 0", the warps a thread block gives one row each).
FUSED_SOFTMAX_BATCHES = 4


@dataclass(frozen=True)
class Softmax:
    """Attention's scale + causal mask + softmax (its backward with `backward`) over one device's
    `heads` s x s score matrices a sample, as Megatron-LM runs it: one fused kernel
    (scaled_upper_triang_masked_softmax) when the micro-batch's samples x heads is a multiple of
    FUSED_SOFTMAX_BATCHES, else torch's fallback, five fp32 kernels (UNFUSED_SOFTMAX_BYTES). Whole
    heads (T = 1, or heads / T a multiple of 4) are always fused; 16 heads over T = 8 at micro-batch
    1 are not. Priced so for the tensor-parallel split (Megatron-LM's layers) only: at T = 1 a
    block is the zoo's, torch's own softmax, one kernel."""

    heads: int
    seq: int
    p: int
    mask: int = 1
    backward: bool = False

    def fused(self, samples: int) -> bool:
        return self.fused_of(max(1, samples))

    def fused_of(self, s: Any) -> Any:
        """`fused` for `s` >= 1 samples: an int, or an integer array of them (then a bool array)."""
        return (s * self.heads) % FUSED_SOFTMAX_BATCHES == 0

    def launches(self, samples: int) -> int:
        """Kernels the host issues for it on a micro-batch of `samples`."""
        return 1 if self.fused(samples) else len(self.unfused_bytes)

    def score_elements(self, s: Any) -> Any:
        """Score elements of `s` >= 1 samples (an int, or an integer array of them)."""
        return self.heads * self.seq * self.seq * s

    @property
    def fused_bytes(self) -> int:
        """Bytes the fused kernel reads and writes per score element."""
        return 3 * self.p if self.backward else 2 * self.p + self.mask

    @property
    def unfused_bytes(self) -> tuple[float, ...]:
        """Bytes each of the fallback's kernels reads and writes per score element."""
        return UNFUSED_SOFTMAX_BYTES[self.backward]

    def kernel_bytes(self, samples: int) -> tuple[float, ...]:
        """Bytes each of its kernels reads and writes on a micro-batch of `samples`."""
        elements = float(self.score_elements(max(1, samples)))
        if self.fused(samples):
            return (elements * self.fused_bytes,)
        return tuple(elements * b for b in self.unfused_bytes)


Kernel = Union[Gemm, MemOp, Flash, Softmax]


@dataclass(frozen=True)
class LayerKernels:
    """A layer's kernels: its forward, its backward (both gradients), how many parameter tensors
    its optimizer step walks (one kernel list per tensor in a for-loop step), and the backward
    kernels its backward collectives run beside (`beside_collectives`: Megatron-LM's
    column-parallel linears all-reduce their input's gradient asynchronously while they compute
    their weight's, so that much of the collective is hidden)."""

    forward: tuple[Kernel, ...]
    backward: tuple[Kernel, ...]
    tensors: int = 0
    beside_collectives: tuple[str, ...] = ()

    def __hash__(self) -> int:
        """The fields' hash, computed once (a block has dozens of kernels; the cost tables key on it)."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.forward, self.backward, self.tensors, self.beside_collectives))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict:
        """Pickled without the cached hash (strings hash differently in another process)."""
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


def linear(name: str, rows: int, n_in: int, n_out: int, input_grad: bool = True) -> tuple[Gemm, tuple[Gemm, ...]]:
    """A Linear on `rows` rows a sample: the forward GEMM and its backward ones (the input's
    gradient unless `input_grad` is False; the weight's, whose inner size is the rows)."""
    forward = Gemm(name, rows, n_out, n_in)
    wgrad = Gemm(name + ".wgrad", n_in, n_out, rows, per_sample="k")
    if not input_grad:
        return forward, (wgrad,)
    return forward, (Gemm(name + ".dgrad", rows, n_in, n_out), wgrad)


def _elementwise(name: str, elements: float, p: int, reads: int = 1, writes: int = 1, extra: float = 0.0) -> MemOp:
    return MemOp(name, elements * p * (reads + writes) + extra * elements)


def transformer_block(d: int, f: int, s: int, heads: int, attention: str, dropout: bool, p: int, mask: int,
                      tp: int = 1, sequence_parallel: bool = False, *, shape: BlockShape | None = None,
                      rope: bool = False, mlp: tuple[list[Kernel], list[Kernel]] | None = None) -> LayerKernels:
    """A pre-norm decoder block as torch runs it (the zoo's Block) on one device's share: norm,
    QKV, (RoPE on the queries and keys), attention (standard attention repeats each key/value
    head for its group's query heads), output projection, dropout + residual, norm, the MLP (fc1,
    GeLU, fc2; or gate and up, silu(gate) x up, fc2), dropout + residual. On one of T devices
    (Megatron-LM's split): QKV and the d -> d_ff GEMMs column-parallel (n / T), the projection and
    fc2 row-parallel (k / T), heads / T; norms, dropouts and residual adds on whole tokens unless
    `sequence_parallel` (then on s / T of them). `shape`: the device's sizes where the block is not
    a GPT block of these sizes (grouped keys and values, SwiGLU, no biases, RMSNorm). `mlp`: the
    (forward, backward) kernels in place of the MLP's (a mixture of experts: gpipe_sim.model.experts)."""
    b = shape or BlockShape(d=d, f=f, s=s, head_dim=d // heads, heads=heads // tp, kv_heads=heads // tp,
                            mlp_matrices=2, bias=True, norm_params=2 * d, tp=tp)
    hd, a = b.head_dim, b.heads
    fwd: list[Kernel] = []
    bwd: list[Kernel] = []
    full = float(s * d)
    tok = full / tp if sequence_parallel else full
    qkv, qkv_b = linear("qkv", s, d, b.qkv)
    proj, proj_b = linear("proj", s, b.q, d)
    drop = (lambda name, n: [_elementwise(name, n, p, 1, 1, mask)]) if dropout else (lambda name, n: [])
    fwd += [_elementwise("ln1", tok, p), qkv]
    bwd_attn: list[Kernel]
    if attention == "flash":
        fwd += [Flash(a, s, hd)]
        bwd_attn = [Flash(a, s, hd, backward=True)]
    else:
        scores = float(a * s * s)
        # split over T (Megatron-LM's layers), its fused softmax and that kernel's fallback
        softmax = Softmax(a, s, p) if tp > 1 else _elementwise("mask+softmax", scores, p, 1, 1, 1)
        softmax_bwd = Softmax(a, s, p, backward=True) if tp > 1 else _elementwise("softmax.bwd", scores, p, 2, 1)
        fwd += [Gemm("scores", s, s, hd, a, "batch"), softmax,
                *drop("attn.dropout", scores), Gemm("context", s, hd, s, a, "batch")]
        bwd_attn = [Gemm("context.dgrad_p", s, s, hd, a, "batch"), Gemm("context.dgrad_v", s, hd, s, a, "batch"),
                    *drop("attn.dropout.bwd", scores), softmax_bwd,
                    Gemm("scores.dgrad_q", s, hd, s, a, "batch"), Gemm("scores.dgrad_k", s, hd, s, a, "batch")]
        if b.kv != b.q:  # keys and values repeated per query head; their gradients summed back
            fwd.insert(2, MemOp("kv.repeat", 2.0 * s * (b.kv + b.q) * p))
            bwd_attn.append(MemOp("kv.repeat.bwd", 2.0 * s * (b.q + b.kv) * p))
    if rope:  # x cos + rotate_half(x) sin on the queries and keys, and its transpose backward
        rotated = float(s * (b.q + b.kv))
        fwd.insert(2, _elementwise("rope", rotated, p, 1, 1, 2 * p))
        bwd_attn.append(_elementwise("rope.bwd", rotated, p, 1, 1, 2 * p))
    heads_copy = float(s * b.qkv)
    fwd += [_elementwise("heads.copy", heads_copy, p), proj, *drop("dropout1", tok),
            _elementwise("residual1", tok, p, 2, 1), _elementwise("ln2", tok, p)]
    mlp_fwd, mlp_bwd = mlp_kernels(b, p) if mlp is None else mlp
    fwd += [*mlp_fwd, *drop("dropout2", tok), _elementwise("residual2", tok, p, 2, 1)]
    bwd += [*drop("dropout2.bwd", tok), *mlp_bwd,
            _elementwise("ln2.bwd", tok, p, 3, 1), _elementwise("grad.add", tok, p, 2, 1), *drop("dropout1.bwd", tok),
            *proj_b, _elementwise("heads.copy.bwd", heads_copy, p), *bwd_attn, *qkv_b,
            _elementwise("ln1.bwd", tok, p, 3, 1), _elementwise("grad.add", tok, p, 2, 1)]
    # Megatron-LM's column-parallel backward all-reduces (reduce-scatters) its input's gradient
    # beside its weight-gradient GEMM; under sequence parallelism it also all-gathers its input
    # again beside its input-gradient GEMM
    # (SwiGLU's gate and up GEMMs are Megatron-LM's one fused fc1: both run beside)
    column = ("qkv", "fc1", "up") if b.mlp_matrices == 3 else ("qkv", "fc1")
    beside = tuple(f"{g}.wgrad" for g in column) + (tuple(f"{g}.dgrad" for g in column) if sequence_parallel else ())
    # the norms' tensors (LayerNorm: weight and bias; RMSNorm: weight) and the GEMMs' weights and biases
    tensors = 2 * (b.norm_params // d) + (2 + b.mlp_matrices) * (2 if b.bias else 1)
    return LayerKernels(tuple(fwd), tuple(bwd), tensors=tensors, beside_collectives=beside)


def mlp_kernels(b: BlockShape, p: int) -> tuple[list[Kernel], list[Kernel]]:
    """The MLP's forward and backward kernels after its norm: fc1, GeLU, fc2; or SwiGLU's gate and
    up GEMMs, silu(gate) x up (reading both, writing one), fc2."""
    s, d, f = b.s, b.d, b.f_share
    fc1, fc1_b = linear("fc1", s, d, f)
    fc2, fc2_b = linear("fc2", s, f, d)
    act = float(s * f)
    if b.mlp_matrices == 2:
        return ([fc1, _elementwise("gelu", act, p), fc2],
                [*fc2_b, _elementwise("gelu.bwd", act, p, 2, 1), *fc1_b])
    up, up_b = linear("up", s, d, f)
    return ([fc1, up, _elementwise("swiglu", act, p, 2, 1), fc2],
            [*fc2_b, _elementwise("swiglu.bwd", act, p, 3, 2), *up_b, *fc1_b])


def embedding(v: int, d: int, s: int, dropout: bool, p: int, mask: int, positions: bool = True) -> LayerKernels:
    """Token lookup, the learned positions' add (`positions`) and dropout; backward: the token
    table's dense gradient (a zeroed vocab x d table, then an index add) and the positions' sum
    over the batch. `v`: the padded vocabulary (TransformerModel.padded_vocab), the table's rows."""
    tok = float(s * d)
    fwd = [_elementwise("lookup", tok, p)]
    bwd = [MemOp("table.grad.zero", 0.0, float(v * d * p)), _elementwise("table.grad.add", tok, p, 2, 1)]
    if positions:
        fwd.append(_elementwise("positions", tok, p, 2, 1))
        bwd.append(_elementwise("positions.grad", tok, p))
    if dropout:
        fwd.append(_elementwise("dropout", tok, p, 1, 1, mask))
        bwd.insert(0, _elementwise("dropout.bwd", tok, p, 1, 1, mask))
    return LayerKernels(tuple(fwd), tuple(bwd), tensors=2 if positions else 1)


# Bytes per logit a cross-entropy moves forward and backward (the logits upcast to fp32, the
# log-softmax, its gradient and the cast back): 56 bytes in all on torch 2.11, from the measured
# cross-entropy rows of shared/reference/h100/membound.jsonl (16384 x 50257 tokens x vocab in
# 15.5 ms at the fitted 2.9 TB/s).
CROSS_ENTROPY_FORWARD_BYTES = 20.0
CROSS_ENTROPY_BACKWARD_BYTES = 36.0


def lm_head(d: int, v: int, s: int, p: int, norm_share: int = 1, norm_tensors: int = 2) -> LayerKernels:
    """Final LayerNorm, the vocabulary projection and the cross-entropy loss. `v`: the padded
    vocabulary (TransformerModel.padded_vocab): the GEMM's n and the logits' width, as Megatron-LM
    and nanoGPT run them (an odd n such as GPT-2's 50257 runs far below a GEMM's usual efficiency);
    split over tensor parallelism, one device's share of it. `norm_share`: the LayerNorm runs on
    1 / norm_share of the tokens (sequence parallelism). `norm_tensors`: the norm's parameter
    tensors its optimizer step walks (LayerNorm 2, RMSNorm 1)."""
    out, out_b = linear("logits", s, d, v)
    logits = float(s * v)
    norm = float(s * d) / norm_share if norm_share > 1 else float(s * d)
    fwd = (_elementwise("ln", norm, p), out, MemOp("cross_entropy", logits * CROSS_ENTROPY_FORWARD_BYTES))
    bwd = (MemOp("cross_entropy.bwd", logits * CROSS_ENTROPY_BACKWARD_BYTES), *out_b,
           _elementwise("ln.bwd", norm, p, 3, 1))
    beside = ("logits.wgrad",) + (("logits.dgrad",) if norm_share > 1 else ())  # as a block's column-parallel GEMMs
    return LayerKernels(fwd, bwd, tensors=norm_tensors + 1, beside_collectives=beside)


def mlp_linear(n_in: int, n_out: int, relu: bool, first: bool, p: int) -> LayerKernels:
    """A Linear (+ ReLU) of the mlp preset; the head adds the cross-entropy over its classes."""
    out, back = linear("linear", 1, n_in, n_out, input_grad=not first)
    fwd: list[Kernel] = [out]
    bwd: list[Kernel] = list(back)
    if relu:
        fwd.append(_elementwise("relu", float(n_out), p))
        bwd.insert(0, _elementwise("relu.bwd", float(n_out), p, 2, 1))
    else:
        fwd.append(MemOp("cross_entropy", n_out * CROSS_ENTROPY_FORWARD_BYTES))
        bwd.insert(0, MemOp("cross_entropy.bwd", n_out * CROSS_ENTROPY_BACKWARD_BYTES))
    return LayerKernels(tuple(fwd), tuple(bwd), tensors=2)


def conv(name: str, pixels: int, c_in: int, c_out: int, window: int, input_grad: bool = True) -> tuple[Gemm, tuple[Gemm, ...]]:
    """A convolution as the implicit GEMM cuDNN runs: output pixels x c_out, inner window x c_in."""
    return linear(name, pixels, window * c_in, c_out, input_grad)


def conv_block(c_in: int, c_out: int, s_out: int, p: int) -> LayerKernels:
    """The zoo's residual block: conv, GroupNorm, ReLU, conv, GroupNorm, (projection), add, ReLU."""
    pix = s_out * s_out
    fmap = float(pix * c_out)
    c1, c1_b = conv("conv1", pix, c_in, c_out, 9)
    c2, c2_b = conv("conv2", pix, c_out, c_out, 9)
    fwd: list[Kernel] = [c1, _elementwise("norm1", fmap, p, 2, 1), _elementwise("relu1", fmap, p), c2,
                         _elementwise("norm2", fmap, p, 2, 1)]
    bwd: list[Kernel] = [_elementwise("relu2.bwd", fmap, p, 2, 1), _elementwise("norm2.bwd", fmap, p, 3, 1), *c2_b,
                         _elementwise("relu1.bwd", fmap, p, 2, 1), _elementwise("norm1.bwd", fmap, p, 3, 1), *c1_b]
    if c_in != c_out:
        sc, sc_b = conv("shortcut", pix, c_in, c_out, 1)
        fwd.append(sc)
        bwd += list(sc_b)
    fwd += [_elementwise("add", fmap, p, 2, 1), _elementwise("relu2", fmap, p)]
    return LayerKernels(tuple(fwd), tuple(bwd), tensors=6)


def conv_stem(c: int, size: int, p: int) -> LayerKernels:
    """The convnet's stem: a 3x3 convolution of the image, GroupNorm, ReLU (no input gradient)."""
    pix = size * size
    fmap = float(pix * c)
    c1, c1_b = conv("stem", pix, 3, c, 9, input_grad=False)
    fwd = (c1, _elementwise("norm", fmap, p, 2, 1), _elementwise("relu", fmap, p))
    bwd = (_elementwise("relu.bwd", fmap, p, 2, 1), _elementwise("norm.bwd", fmap, p, 3, 1), *c1_b)
    return LayerKernels(fwd, bwd, tensors=3)


def conv_head(c: int, pixels: int, classes: int, p: int) -> LayerKernels:
    """Global average pooling, the classifier and the loss."""
    out, out_b = linear("fc", 1, c, classes)
    fwd = (MemOp("pool", float(c * pixels * p + c * p)), out, MemOp("cross_entropy", classes * CROSS_ENTROPY_FORWARD_BYTES))
    bwd = (MemOp("cross_entropy.bwd", classes * CROSS_ENTROPY_BACKWARD_BYTES), *out_b,
           MemOp("pool.bwd", float(c * pixels * p + c * p)))
    return LayerKernels(fwd, bwd, tensors=2)


def amoeba_cell(params: int, filters: int, side: int, p: int, kernels: int) -> LayerKernels:
    """An AmoebaNet cell as `kernels` / 4 equal convolution branches holding its parameters
    (1x1 and separable convolutions: implicit GEMMs with filters outputs), each with a
    normalisation and an activation over the cell's feature map."""
    branches = max(1, kernels // 4)
    pix = max(1, side * side)
    inner = max(1, params // max(1, branches * filters))
    fmap = float(pix * filters)
    fwd: list[Kernel] = []
    bwd: list[Kernel] = []
    for i in range(branches):
        g, g_b = conv(f"branch{i}", pix, inner, filters, 1)
        fwd += [g, _elementwise(f"norm{i}", fmap, p, 2, 1), _elementwise(f"act{i}", fmap, p)]
        bwd += [_elementwise(f"act{i}.bwd", fmap, p, 2, 1), _elementwise(f"norm{i}.bwd", fmap, p, 3, 1), *g_b]
    return LayerKernels(tuple(fwd), tuple(bwd), tensors=3 * branches)
