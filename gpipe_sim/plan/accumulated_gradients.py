"""Pipelined ZeRO-3's unsharded gradients: held from a chunk's first backward pass of the step to its last.

Under pipelining torch.distributed.pipelining runs every backward pass of a stage but its last
without FSDP2's gradient reduction (`set_requires_gradient_sync(False)`), so each layer's gradient
accumulates unsharded from the stage's first backward pass, and the reduce-scatter at its last
frees it, leaving the replica's shard (torchtitan's optimizer then clears the gradients,
`zero_grad()`: none are held from step to step). Per chunk c of P_c parameters, g bytes each
in the training dtype, over a shard group of S:

- its first full backward pass holds, while layer j runs, the gradients of the layers after j
  beside j's own temporaries (`chunk_transient_bytes` with `kept = g`);
- from that pass's end (a split backward's first weight pass: from its start) to the end of its
  last: g P_c; from then to the step's end its reduced shard, g P_c / S.

Nothing of this is static (`gpipe_sim.plan.sharding.bytes_per_param` leaves it out).
"""

from __future__ import annotations

import numpy as np

from gpipe_sim.plan.compile import Plan, chunk_transient_bytes, shard_members
from gpipe_sim.plan.sharding import accumulated_bytes_per_param
from gpipe_sim.schedule import Kind

PASSES_WITH_GRADIENTS = (Kind.BACKWARD, Kind.BACKWARD_WEIGHT)


def _first_and_last(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Per action in program order: whether it is its rank's first, and whether its last, pass of
    its chunk that makes weight gradients (a full backward or a weight pass)."""
    prog = plan.program
    first, last = np.zeros(len(prog.kind), dtype=bool), np.zeros(len(prog.kind), dtype=bool)
    passes = np.flatnonzero(np.isin(prog.kind, PASSES_WITH_GRADIENTS))  # in program order, rank by rank
    key = prog.rank[passes].astype(np.int64) * len(plan.chunks) + prog.chunk[passes]
    first[passes[np.unique(key, return_index=True)[1]]] = True
    last[passes[::-1][np.unique(key[::-1], return_index=True)[1]]] = True
    return first, last


def first_backward_transients(plan: Plan, transient: np.ndarray) -> np.ndarray:
    """`transient` (per action, `memory_timeline.transient_bytes`) with each chunk's first full
    backward pass holding its later layers' gradients as they accumulate (module docstring)."""
    g = accumulated_bytes_per_param(plan.scenario)
    if not g:
        return transient
    prog, out = plan.program, transient.copy()
    first, _ = _first_and_last(plan)
    for i in np.flatnonzero(first & (prog.kind == Kind.BACKWARD)):
        ch = plan.chunks[int(prog.chunk[i])]
        samples = np.array([plan.micro_batch_sizes[int(prog.micro_batch[i])]], dtype=float)
        layers = plan.layers[ch.first_layer:ch.last_layer + 1]
        out[i] = float(chunk_transient_bytes(layers, samples, recomputed=True, kept=g)[0])
    return out


def gradient_deltas(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(bytes at each action's start, bytes at its end), in program order, of the chunks'
    accumulated gradients (module docstring): summed over time, the bytes held."""
    prog = plan.program
    at_start, at_end = np.zeros(len(prog.kind)), np.zeros(len(prog.kind))
    g = accumulated_bytes_per_param(plan.scenario)
    if not g:
        return at_start, at_end
    grads = np.array([c.params * g for c in plan.chunks])
    first, last = _first_and_last(plan)
    opens = first & (prog.kind == Kind.BACKWARD)
    at_end[opens] += grads[prog.chunk[opens]]
    opens = first & (prog.kind == Kind.BACKWARD_WEIGHT)
    at_start[opens] += grads[prog.chunk[opens]]
    at_end[last] -= grads[prog.chunk[last]] * (1 - 1 / shard_members(plan.scenario))
    return at_start, at_end


__all__ = ["first_backward_transients", "gradient_deltas"]
