"""Ring collectives' seconds as NCCL's ring runs them: the one formula every all-reduce,
reduce-scatter and all-gather of the cost model is priced by (tensor-parallel, data-parallel, ZeRO)."""

from __future__ import annotations

import math


def collective_seconds(ops: tuple[tuple[float, float], ...], samples: float, members: int, bandwidth: float,
                       latency_s: float) -> float:
    """Ring collectives among `members` devices, each op (share of an all-reduce, bytes a sample)
    on `samples` samples: an all-reduce of B bytes takes 2(n-1)/n x B / bandwidth + 2(n-1) x
    latency, a reduce-scatter or all-gather (share 0.5) half that; 0 for one member."""
    if members <= 1 or not ops:
        return 0.0
    steps = 2 * (members - 1)
    return math.fsum(share * (steps / members * nbytes * samples / bandwidth + steps * latency_s)
                     for share, nbytes in ops)
