"""A transformer block's sizes on one of T tensor-parallel devices: heads, key/value heads, GEMM widths, parameters."""

from __future__ import annotations

from dataclasses import dataclass

from gpipe_sim.model.model import TransformerModel


def kv_heads_per_device(kv_heads: int, tp: int) -> int:
    """Key/value heads one of `tp` devices holds: kv_heads / T where T divides them (Megatron-LM's
    split of the query groups), else one, replicated on T / kv_heads devices (T a multiple of
    kv_heads: vLLM's QKVParallelLinear; Megatron-LM itself requires T to divide them)."""
    return kv_heads // tp if kv_heads % tp == 0 else 1


def kv_heads_problem(kv_heads: int, tp: int) -> str | None:
    """One line naming `model.kv_heads` where `tp` devices can neither split nor replicate them."""
    if kv_heads % tp == 0 or tp % kv_heads == 0:
        return None
    return (f"model.kv_heads: {kv_heads:,} key/value heads neither split over nor replicate across "
            f"pipeline.tensor_parallel {tp} (give a multiple or a divisor of {tp})")


@dataclass(frozen=True)
class BlockShape:
    """One device's share of a block of `model` split over `tp` devices (the whole block at T = 1):
    query heads / T, key/value heads per `kv_heads_per_device`, d_ff / T per MLP matrix."""

    d: int  # d_model
    f: int  # d_ff (the intermediate size)
    s: int  # seq_len
    head_dim: int
    heads: int  # this device's query heads
    kv_heads: int  # this device's key/value heads
    mlp_matrices: int  # 2 (gelu: fc1, fc2) or 3 (swiglu: gate, up, down)
    bias: bool
    norm_params: int  # one norm's parameters (LayerNorm: weight and bias; RMSNorm: weight)
    tp: int

    @classmethod
    def of(cls, model: TransformerModel, tp: int = 1) -> "BlockShape":
        d = model.d_model
        return cls(d=d, f=model.d_ff, s=model.seq_len, head_dim=d // model.heads, heads=model.heads // tp,
                   kv_heads=kv_heads_per_device(model.query_groups, tp),
                   mlp_matrices=3 if model.mlp == "swiglu" else 2, bias=model.bias,
                   norm_params=norm_parameters(model), tp=tp)

    @property
    def q(self) -> int:
        """The queries' width (and the attention output's, the projection's input): heads x head_dim."""
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        """The keys' width (and the values'): kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def qkv(self) -> int:
        """The fused QKV GEMM's output width."""
        return self.q + 2 * self.kv

    @property
    def f_share(self) -> int:
        """One MLP matrix's intermediate width on this device."""
        return self.f // self.tp

    @property
    def params(self) -> int:
        """The block's parameters on this device: QKV and the MLP's d -> d_ff matrices column-parallel
        (with their biases), the projection and the down matrix row-parallel (their biases whole),
        both norms whole."""
        d, up = self.d, self.mlp_matrices - 1
        weights = d * self.qkv + self.q * d + self.mlp_matrices * d * self.f_share
        biases = (self.qkv + d + up * self.f_share + d) if self.bias else 0
        return weights + biases + 2 * self.norm_params

    @property
    def largest_tensor(self) -> int:
        """Parameters of its largest tensor: the QKV weight or one MLP matrix."""
        return max(self.d * self.qkv, self.d * self.f_share)

    @property
    def matmul_flops(self) -> float:
        """Forward FLOPs per sample on this device: the GEMMs (2 per multiply-add) and the attention's
        two s x s products over its query heads in full (the work the layer table prices)."""
        s, d = self.s, self.d
        gemms = d * self.qkv + self.q * d + self.mlp_matrices * d * self.f_share
        return 2.0 * s * gemms + 4.0 * s * s * self.q


def norm_parameters(model: TransformerModel) -> int:
    """One LayerNorm's (weight and bias) or RMSNorm's (weight) parameters."""
    return (2 if model.norm == "layernorm" else 1) * model.d_model
