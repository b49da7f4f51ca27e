"""The planner's step-time bounds read from a compiled plan: its programs pass by pass, and its step with contention relaxed."""

from __future__ import annotations

import numpy as np

from gpipe_sim.engines.fast import contention_free
from gpipe_sim.engines.relaxed import relaxed_step
from gpipe_sim.plan.compile import Plan
from gpipe_sim.planner.bounds import CostTable
from gpipe_sim.planner.segments import SLACK, cumulative
from gpipe_sim.planner.space import Candidate
from gpipe_sim.schedule import COMPUTE_KINDS, Kind

# program column codes (`Plan.program.kind`) the bounds read
_BACKWARD, _BACKWARD_INPUT = int(Kind.BACKWARD), int(Kind.BACKWARD_INPUT)
_BACKWARD_WEIGHT, _UPDATE = int(Kind.BACKWARD_WEIGHT), int(Kind.UPDATE)
_COMPUTE_CODES = np.array(sorted(int(k) for k in COMPUTE_KINDS))
_TRANSFER_CODES = np.array([int(Kind.SEND), int(Kind.RECV)])


def program_step_bound(costs: CostTable, cand: Candidate, plan_: Plan) -> float:
    """`step_lower_bound` from the compiled programs, for any placement: rank r starts no earlier
    than one micro-batch's forward chain (and transfers) through the chunks before its lowest c*,
    runs its compute passes (and, after the first, its transfers' host time) one at a time in
    program order, and after c*'s last input-gradient
    (or full backward) pass one micro-batch still goes backward through those chunks while the
    rank runs what follows in its program. With D > 1, the all-reduce of the chunk of the rank's
    last backward pass (under ZeRO-2 its all-gather) starts after it, and the update waits for it."""
    costs = costs.of(cand)
    prog = plan_.program
    K, C = len(plan_.ranks), len(plan_.chunks)
    compute, transfer = np.isin(prog.kind, _COMPUTE_CODES), np.isin(prog.kind, _TRANSFER_CODES)
    fwd = np.stack([c.forward_s for c in plan_.chunks])  # [chunk, micro-batch]
    back = np.minimum(np.stack([c.backward_s for c in plan_.chunks]),
                      np.stack([c.backward_input_s for c in plan_.chunks]))
    f_pref = np.concatenate(([0.0], np.cumsum(fwd, axis=0).min(axis=1)))[:C]  # chain before chunk c
    b_pref = np.concatenate(([0.0], np.cumsum(back, axis=0).min(axis=1)))[:C]
    placement = [c.rank for c in plan_.chunks]
    h_cum = cumulative(costs.hops(cand, min(plan_.micro_batch_sizes), placement))
    per_param, fixed = costs.allreduce(cand)
    D = cand.data_parallel
    bound = 0.0
    for r in range(K):
        lo, hi = int(prog.offsets[r]), int(prog.offsets[r + 1])
        kind, chunk = prog.kind[lo:hi], prog.chunk[lo:hi]
        passes = compute[lo:hi]
        if not passes.any():
            continue
        counted = passes | (transfer[lo:hi] & (np.arange(hi - lo) > int(np.argmax(passes))))  # + host time after
        dur = np.where(counted, prog.duration[lo:hi], 0.0)
        done = np.cumsum(dur)
        low = min(plan_.ranks[r].chunks)
        start = f_pref[low] + h_cum[low]
        bound = max(bound, start + float(done[-1]))
        last = np.flatnonzero((chunk == low) & ((kind == _BACKWARD) | (kind == _BACKWARD_INPUT)))
        if len(last) and low > 0:
            after = float(done[-1] - done[last[-1]])
            bound = max(bound, start + float(done[last[-1]]) + max(b_pref[low] + h_cum[low], after))
        if D > 1:
            final = np.flatnonzero((kind == _BACKWARD) | (kind == _BACKWARD_WEIGHT))
            if len(final):
                j = int(final[-1])
                c = plan_.chunks[int(chunk[j])]
                update = float(dur[kind == _UPDATE].sum())
                ring = fixed[r] + per_param[r] * c.params
                # ZeRO-2's passes hold its reduce-scatters (gpipe_sim.plan.pass_collectives): the all-gather is left
                bound = max(bound, start + float(done[j]) + (ring / 2 if cand.zero == 2 else ring) + update)
    return bound * SLACK


def relaxed_step_bound(plan_: Plan) -> float:
    """Below the simulated step of a plan the SimPy engine times (links or devices shared): its
    step with the contention relaxed (`gpipe_sim.engines.relaxed`); 0 for a contention-free plan,
    whose simulation is as cheap as this bound."""
    if contention_free(plan_):
        return 0.0
    return relaxed_step(plan_) * SLACK
