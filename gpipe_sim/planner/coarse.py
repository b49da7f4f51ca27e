"""The coarse bounds of every configuration of the space at once, as two arrays computed block by block."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpipe_sim.planner.bounds import CostTable
from gpipe_sim.planner.segments import SLACK
from gpipe_sim.planner.space_index import CandidateSpace
from gpipe_sim.planner.work_rows import WorkCache


def coarse_arrays(costs: CostTable, space: CandidateSpace, works: WorkCache) -> tuple[np.ndarray, np.ndarray]:
    """(memory, step time) of every configuration of `space`, below `memory_lower_bound` and
    `step_lower_bound` for any partition and schedule: they depend on T, C, E, D, M, remat, ZeRO,
    K and v only. Memory: a rank's share of the static bytes and of one micro-batch's activations
    per chunk, (static + act x largest micro-batch / v) / K, the first term of
    `memory_lower_bound` without counts. Step: the largest of the mean busy time of a rank
    (`Work.total` / K), one micro-batch's forward and backward chain (`Work.chain`) and ZeRO-3's
    collectives without pipelining (`CostTable.fsdp_collectives`)."""
    memory, step = np.empty(len(space)), np.empty(len(space))
    firsts = [(block, [[block.candidate(0)._replace(remat=remat, zero=zero) for zero in block.zeros]
                       for remat in block.remats]) for block in space.blocks]
    works.build(cand for _, grid in firsts for row in grid for cand in row)  # every cost table priced once
    by_m: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = {}  # over every M, per the rest of the key
    for block, grid in firsts:
        Ms = np.array(block.micro_batches) - 1
        shape = (len(Ms), len(block.remats), len(block.partitions), len(block.zeros))
        mem, stp = np.empty((shape[0], shape[1], 1, shape[3])), np.empty((shape[0], shape[1], 1, shape[3]))
        for r, row in enumerate(grid):
            for z, cand in enumerate(row):
                key = (block.tensor_parallel, block.context_parallel, block.expert_parallel, block.data_parallel,
                       cand.remat, cand.zero, block.stages, block.chunks, block.cleared)
                got = by_m.get(key)
                if got is None:
                    got = by_m[key] = _over_m(costs, works, cand)
                mem[:, r, 0, z], stp[:, r, 0, z] = got[0][Ms], got[1][Ms]
        end = block.start + block.size
        memory[block.start:end] = np.broadcast_to(mem, shape).ravel()
        step[block.start:end] = np.broadcast_to(stp, shape).ravel()
    return memory, step


def _over_m(costs: CostTable, works: WorkCache, cand: Any) -> tuple[np.ndarray, np.ndarray]:
    """`coarse_arrays`' two bounds for the candidate with every M (row M - 1)."""
    table = costs.of(cand)
    rows = works.of(cand)
    D, K, v = cand.data_parallel, cand.stages, cand.chunks
    static = table.params_sum * table.static_per_param(D * cand.context_parallel, cand.zero)
    memory = (static + table.act_sum * rows.largest / v) / K
    Ms = np.arange(1, len(rows.total) + 1)
    step = np.maximum(np.maximum(rows.total / K, rows.chain), table.fsdp_collectives(cand, Ms))
    return memory * SLACK, step * SLACK
