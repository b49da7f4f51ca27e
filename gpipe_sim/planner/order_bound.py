"""A step-time lower bound from a schedule's pass orders, before compiling: the passes run in each rank's order, each after the passes it depends on."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from gpipe_sim.hardware.hardware import Host
from gpipe_sim.kept import Kept
from gpipe_sim.plan.balance import micro_batch_sizes
from gpipe_sim.planner.bounds import CostTable
from gpipe_sim.planner.chunk_arrays import partition_edges
from gpipe_sim.planner.segments import SLACK
from gpipe_sim.planner.space import Candidate
from gpipe_sim.schedule.actions import Kind
from gpipe_sim.schedule.lower import saves_activations
from gpipe_sim.schedule.registry import generated_orders, schedule_family

_F, _B, _W = int(Kind.FORWARD), int(Kind.BACKWARD), int(Kind.BACKWARD_WEIGHT)
_UNSET = -1.0

Orders = list[list[list[int]]]
_ORDERS: Kept[Orders] = Kept(16)  # (family, K, M, v) -> `generated_orders` as lists, a few in turn


def pass_orders(name: str, K: int, M: int, v: int) -> Orders:
    """Every rank's passes [kind, chunk, micro-batch] in its order, as the family generates them
    (`generated_orders`; the lowering keeps them in that order, adding transfers, re-computations
    and the update), as lists; kept for the next calls."""
    return _ORDERS.get((schedule_family(name), K, M, v),
                       lambda: [order.tolist() for order in generated_orders(name, K, M, v)])


def order_step(orders: Sequence[Sequence[Sequence[int]]], times: np.ndarray, hops: np.ndarray, saved: Sequence[bool],
               host: np.ndarray | None = None) -> float:
    """The last pass's end when every rank runs its passes in its order, one at a time, each
    starting after the rank's previous one and after what it depends on: a forward of chunk c > 0
    after the forward of chunk c - 1 of its micro-batch plus `hops[c - 1, m]`; a first backward
    pass (full or input-gradient) of chunk c < C - 1 after that of chunk c + 1 plus `hops[c, m]`,
    of the last chunk after its forward; before it, a forward that did not keep its activations
    (`saved`, per micro-batch) is re-run on the rank, without waiting. `times[c, m]`: chunk c's
    forward, full backward, input-gradient and weight passes' seconds on micro-batch m.
    `host[c, m]` (0 where None): the host seconds on the rank's own timeline of the forward's
    receive (before it: the pass starts at least that after the rank is free) and send (after
    it), then the first backward's receive and send. With durations, hops and host times at most
    the simulator's, this is at most its step (it starts each action at the latest of the same
    events, and more); 0 where the orders cannot all run (a schedule the lowering would refuse)."""
    C, M = times.shape[:2]
    if host is None:
        host = np.zeros((C, M, 4))
    # every figure of (chunk c, micro-batch m) at c * M + m
    forward, full, input_, weight = (times[:, :, j].ravel().tolist() for j in range(4))
    f_recv, f_send, b_recv, b_send = (host[:, :, j].ravel().tolist() for j in range(4))
    hop = np.concatenate((hops, np.zeros((1, M)))).ravel().tolist()  # boundary c -> c + 1 at c * M + m
    redo = [0.0 if kept else 1.0 for kept in saved]
    end_f = [_UNSET] * (C * M)
    end_b = [_UNSET] * (C * M)
    at, clock = [0] * len(orders), [0.0] * len(orders)
    last = C - 1
    moved = True
    while moved:
        moved = False
        for r, order in enumerate(orders):
            i, t, n = at[r], clock[r], len(order)
            while i < n:
                kind, c, m = order[i]
                x = c * M + m
                if kind == _F:
                    if c:
                        ready = end_f[x - M]
                        if ready == _UNSET:
                            break
                        ready += hop[x - M]
                        t += f_recv[x]
                        if ready > t:
                            t = ready
                    t += forward[x]
                    end_f[x] = t
                    t += f_send[x]
                elif kind == _W:
                    t += weight[x]
                else:  # the first backward pass: full or input-gradient
                    ready = end_f[x] if c == last else end_b[x + M]
                    if ready == _UNSET:
                        break
                    ready += hop[x]
                    t += redo[m] * forward[x] + b_recv[x]  # the re-computation, before the gradient arrives
                    if ready > t:
                        t = ready
                    t += full[x] if kind == _B else input_[x]
                    end_b[x] = t
                    t += b_send[x]
                i += 1
            if i != at[r]:
                at[r], clock[r], moved = i, t, True
    if any(i != len(order) for i, order in zip(at, orders)):
        return 0.0
    return max(clock, default=0.0)


class OrderBounds:
    """`order_step` of a candidate with its layer counts, times SLACK: each chunk's passes timed
    for each micro-batch's size (`CostTable.times`, the full backward as the lesser of it and the
    split passes' sum, as `CostTable.pass_terms` bounds it; the host's `action_s` added), the cost
    table's hops and host transfer times at that size; made once per (cost table, M, remat,
    schedule, K, v, counts, layout) of a search."""

    def __init__(self, costs: CostTable) -> None:
        self.costs = costs
        self.kept: dict[tuple[Any, ...], float] = {}

    def __call__(self, cand: Candidate, counts: Sequence[int], placement: Sequence[int]) -> float:
        """The bound (seconds) of candidate `cand` split by `counts` over `placement`."""
        table = self.costs.of(cand)
        M = cand.micro_batches
        key = (id(table), M, cand.remat, cand.schedule, cand.stages, cand.chunks, tuple(counts),
               cand.data_parallel, cand.tensor_parallel, cand.context_parallel, cand.expert_parallel, cand.cleared)
        got = self.kept.get(key)
        if got is None:
            hw = table.base.hardware
            sizes = micro_batch_sizes(table.base.pipeline.batch_size // cand.data_parallel, M)
            distinct, size_of = np.unique(sizes, return_inverse=True)
            edges = partition_edges(tuple(counts))
            times, hops, host = [], [], []
            for b in distinct.tolist():
                tt = np.array(table.times(b), dtype=float)
                tt[:, 1] = np.minimum(tt[:, 1], tt[:, 2] + tt[:, 3])
                cum = np.concatenate((np.zeros((1, 4)), np.cumsum(tt, axis=0)))
                times.append(cum[edges[1:]] - cum[edges[:-1]] + hw.host.action_s)  # each pass an action
                hops.append(table.hops(cand, b, placement))
                host.append(_host(hops[-1], table.least_output_bytes * b, hw.host))
            saved = [saves_activations(cand.remat, m, M) for m in range(M)]  # type: ignore[arg-type]
            orders = pass_orders(cand.schedule, cand.stages, M, cand.chunks)
            # [chunk, micro-batch, ...]: each micro-batch's size's figures
            got = self.kept[key] = SLACK * order_step(
                orders, np.stack(times, axis=1)[:, size_of], np.stack(hops, axis=1)[:, size_of], saved,
                np.stack(host, axis=1)[:, size_of])
        return got


def _host(hops: np.ndarray, least_bytes: float, host: Host) -> np.ndarray:
    """Per chunk: the host seconds of its forward's receive and send and its first backward's
    receive and send (`order_step`), at the least bytes a boundary carries, where `hops` has a
    transfer (a boundary between two ranks' chunks; none where `CostTable.hops` counts none)."""
    C = len(hops) + 1
    crossed = np.asarray(hops) > 0  # boundary j: chunk j -> j + 1
    before, after = np.zeros(C, dtype=bool), np.zeros(C, dtype=bool)
    before[1:], after[:-1] = crossed, crossed
    send, recv = float(host.send_seconds(least_bytes)), float(host.recv_seconds(least_bytes))
    return np.stack([before * recv, after * send, after * recv, before * send], axis=1)
