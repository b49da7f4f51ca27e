"""gpipe-sim's ZeRO-1 step buffers with expert parallelism: each bucket's routed experts' parameters
sharded apart over the expert-data-parallel group (D x C / E), as Megatron-LM's distributed optimizer
and gpipe-exec shard them."""

from __future__ import annotations

import math

from gpipe_sim.api import simulate
from gpipe_sim.model.layers import build_layers
from gpipe_sim.scenario.scenario import parse_scenario

MOE = dict(preset="transformer", layers=4, d_model=16, d_ff=32, heads=2, seq_len=6, vocab=23, experts=4,
           top_k=2, expert_d_ff=24, shared_experts=1, moe_every=2, first_dense_layers=1)


def _scenario(D: int, E: int):
    return parse_scenario({"model": MOE, "hardware": {"preset": "cpu", "host": {"step_buffers": True}},
                           "pipeline": {"stages": 1, "micro_batches": 2, "batch_size": 8, "schedule": "1f1b",
                                        "data_parallel": D, "expert_parallel": E},
                           "training": {"optimizer": "momentum", "zero": 1}})


def test_master_shard_holds_a_dense_part_of_d_and_an_expert_part_of_d_over_e() -> None:
    """Replica 0's fp32 master shard: ceil(n_dense / D) + ceil(n_experts / (D / E)) elements of the
    layer table's parameters (the experts whole where D = E); at E = 1 every parameter over D."""
    for D, E in ((4, 2), (2, 2), (4, 1)):
        sc = _scenario(D, E)
        table = build_layers(sc.model, expert_parallel=E)
        experts = sum(layer.expert_params for layer in table) if E > 1 else 0
        dense = sum(layer.params for layer in table) - experts
        want = (math.ceil(dense / D) + math.ceil(experts / (D // E))) * 4
        got = simulate(sc).stages[0].memory_breakdown["zero_master_shard"]
        assert got == want, (D, E, got, want)
