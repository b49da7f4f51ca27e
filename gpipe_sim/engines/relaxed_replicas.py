"""Whether replica 0 of a contention-relaxed program stands for every replica: their programs alike to the bit."""

from __future__ import annotations

import numpy as np

from gpipe_sim.plan.costed_program import Program


def _alike(column: np.ndarray, replicas: int) -> bool:
    """True when the D equal slices of `column` (one per replica, in order) are equal to the bit."""
    rows = column.reshape(replicas, -1)
    return bool((rows == rows[0]).all())


def replica_zero_stands_for_all(prog: Program, link: np.ndarray, pipeline_ranks: int) -> bool:
    """True when every replica of `prog`, with the relaxed `link` column (each sending rank's own
    links: no link is shared between ranks), is timed exactly as replica 0.

    Replica d holds global ranks d*K .. d*K+K-1 and runs replica 0's programs with its message ids
    shifted (`gpipe_sim.schedule.global_program`). Its times equal replica 0's to the bit where its
    ranks' actions, chunks, seconds, transfer keys and groups are replica 0's and each of its sends shares
    a link with the same earlier sends of its rank as in replica 0: the per-transfer pass then does
    the same arithmetic on the same values for every replica, and an all-reduce group's start, the
    latest of D equal member starts, is replica 0's member start."""
    D = prog.group_size
    if D == 1:
        return True
    G = D * pipeline_ranks
    lengths = np.diff(prog.offsets[: G + 1])
    if len(prog.offsets) != G + 1 or not _alike(lengths, D):
        return False
    gp = prog.global_program
    columns = (prog.kind, prog.chunk, prog.duration, prog.serialization, prog.latency, prog.collective, gp.keys,
               link >= 0)
    if not all(_alike(col, D) for col in columns):
        return False
    sends = np.flatnonzero(link >= 0)  # the same positions in every replica (checked above)
    if len(sends) == 0:
        return True
    _, first, inverse = np.unique(link[sends], return_index=True, return_inverse=True)
    n = len(prog.kind) // D
    first_row = sends[first][inverse] - sends // n * n  # the first send on each send's link, in its replica
    return _alike(first_row, D)
