"""Per-layer recomputation in the executor (`pipeline.remat: full | selective`): which blocks, and when.

`full` runs each transformer block (`zoo.Block`) under `runtime.checkpoint.checkpointed`,
`selective` the attention core inside it (Q K^T, mask, softmax, dropout, the product with V;
flash's fused kernel), as Megatron-LM's full and selective recompute do. With tensor parallelism
the checkpointed code is the split block: its re-run forward calls the same parallel modules, whose
hooks issue the collectives again (Megatron-LM re-runs the tensor-parallel all-reduces in a full
recompute too).
"""

from __future__ import annotations

from torch import nn

from gpipe_exec.zoo import Block
from gpipe_sim.model.recompute import per_layer


def apply_recompute(module: nn.Module, remat: str) -> None:
    """Set every transformer block of `module` to recompute as `remat` says (a whole-chunk mode
    leaves them as they are: the chunk re-runs them)."""
    if not per_layer(remat):
        return
    for layer in module.modules():
        if isinstance(layer, Block):
            layer.recompute = remat


__all__ = ["apply_recompute"]
