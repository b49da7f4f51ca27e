"""Per-layer recomputation in the executor (`pipeline.remat: full | selective`): which blocks, and when.

`full` runs each transformer block (`zoo.Block`) under `runtime.checkpoint.checkpointed`,
`selective` the attention core inside it (Q K^T, mask, softmax, dropout, the product with V;
flash's fused kernel), as Megatron-LM's full and selective recompute do.
"""

from __future__ import annotations

from torch import nn

from gpipe_exec.zoo import Block
from gpipe_sim.errors import ScenarioError
from gpipe_sim.model.recompute import per_layer
from gpipe_sim.scenario.scenario import Scenario


def apply_recompute(module: nn.Module, remat: str) -> None:
    """Set every transformer block of `module` to recompute as `remat` says (a whole-chunk mode
    leaves them as they are: the chunk re-runs them)."""
    if not per_layer(remat):
        return
    for layer in module.modules():
        if isinstance(layer, Block):
            layer.recompute = remat


def check_recompute(scenario: Scenario) -> None:
    """ScenarioError (one line) where the executor cannot run the scenario's per-layer remat: with
    tensor parallelism (its split blocks run DTensor collectives the checkpoint would re-run
    outside the hooks that issue them)."""
    p = scenario.pipeline
    if per_layer(p.remat) and p.tensor_parallel > 1:
        raise ScenarioError(f"pipeline.remat: the executor runs {p.remat} at tensor_parallel 1 only "
                            f"(pipeline.tensor_parallel is {p.tensor_parallel}); gpipe-sim predicts it at any T")


__all__ = ["apply_recompute", "check_recompute"]
