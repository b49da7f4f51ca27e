"""Memory accounting: activation bytes held per rank (over all its chunks), per chunk and per device.

A forward that keeps its activations allocates its chunk's saved bytes for that micro-batch at
its start; under re-materialization it keeps only the chunk input, and the re-computation
allocates the rest of the saved bytes (the chunk's first layer saves that very input, so it is
not counted twice: max(saved - input, 0)). The micro-batch's bytes are freed at the end of its
last backward pass: the full backward, or the weight-gradient pass when the backward is split
(the input-gradient pass frees nothing). Parameters, gradients and optimizer states are static.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from gpipe_sim.plan.compile import BACKWARD, BACKWARD_WEIGHT, FORWARD, RECOMPUTE, Plan


@dataclass(frozen=True)
class MemoryProfile:
    """Activation memory per rank: the step function over time and its peak; per chunk and device peaks."""

    times: tuple[np.ndarray, ...]  # per pipeline rank (replica 0): event times (allocations at starts, frees at ends)
    activation_bytes: tuple[np.ndarray, ...]  # per pipeline rank: bytes held from that time on
    peak_activation_bytes: np.ndarray  # per pipeline rank
    chunk_peak_activation_bytes: np.ndarray  # per chunk, on its own
    device_peak_bytes: dict[int, float]  # per device (all replicas): static bytes of its ranks + activation peak


def activation_deltas(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(bytes allocated at each action's start, bytes freed at its end), in program order."""
    prog = plan.program
    alloc = np.zeros(len(prog.kind))
    free = np.zeros(len(prog.kind))
    act = np.array([c.activation_bytes for c in plan.chunks])  # [chunk, micro_batch]
    inp = np.array([c.input_bytes for c in plan.chunks])
    ch, mb, kind, save = prog.chunk, prog.micro_batch, prog.kind, prog.save
    fwd = kind == FORWARD
    alloc[fwd & save] = act[ch[fwd & save], mb[fwd & save]]
    alloc[fwd & ~save] = inp[ch[fwd & ~save], mb[fwd & ~save]]
    beyond_input = np.maximum(act - inp, 0.0)
    rec = kind == RECOMPUTE
    alloc[rec] = beyond_input[ch[rec], mb[rec]]
    last = (kind == BACKWARD) | (kind == BACKWARD_WEIGHT)
    kept = save[last]
    free[last] = np.where(
        kept, act[ch[last], mb[last]], inp[ch[last], mb[last]] + beyond_input[ch[last], mb[last]]
    )
    return alloc, free


def memory_profile(plan: Plan, start: np.ndarray, end: np.ndarray) -> MemoryProfile:
    """Activation memory over time from the engine's action times."""
    alloc, free = activation_deltas(plan)
    prog = plan.program
    offsets = prog.offsets
    times, held, peaks = [], [], []
    chunk_peaks = np.zeros(len(plan.chunks))
    K = len(plan.ranks)
    for g in range(plan.num_ranks):  # every replica's ranks: devices may hold several
        lo, hi = int(offsets[g]), int(offsets[g + 1])
        t = np.empty(2 * (hi - lo))
        t[0::2], t[1::2] = start[lo:hi], end[lo:hi]
        delta = np.empty_like(t)
        delta[0::2], delta[1::2] = alloc[lo:hi], -free[lo:hi]
        level = np.cumsum(delta)
        times.append(t)
        held.append(level)
        peaks.append(float(level.max(initial=0.0)))
        if g < K:
            chunk = np.repeat(prog.chunk[lo:hi], 2)
            for c in plan.ranks[g].chunks:
                chunk_peaks[c] = float(np.cumsum(delta[chunk == c]).max(initial=0.0))
    static = [plan.ranks[g % K].param_bytes + plan.ranks[g % K].state_bytes for g in range(plan.num_ranks)]
    device_peak = device_peaks(plan.device_map, static, times, held)
    return MemoryProfile(tuple(times[:K]), tuple(held[:K]), np.asarray(peaks[:K]), chunk_peaks, device_peak)


def levels_from_totals(start: np.ndarray, end: np.ndarray, totals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One rank's activation curve from the bytes held after each of its actions (a measurement):
    a rise is placed at its action's start and a fall at its end, as `memory_profile` places them."""
    delta = np.diff(np.asarray(totals, dtype=float), prepend=0.0)
    times = np.empty(2 * len(delta))
    times[0::2], times[1::2] = start, end
    steps = np.zeros(2 * len(delta))
    steps[0::2] = np.maximum(delta, 0.0)
    steps[1::2] = np.minimum(delta, 0.0)
    return times, np.cumsum(steps)


def device_peaks(
    device_map: Sequence[int],
    static_bytes: Sequence[float],
    times: Sequence[np.ndarray],
    levels: Sequence[np.ndarray],
) -> dict[int, float]:
    """Per device: the static bytes of its ranks plus the peak of their activation curves merged
    in time (at equal times, frees before allocations). One definition for prediction and measurement."""
    peaks: dict[int, float] = {}
    for device in sorted(set(device_map)):
        members = [k for k, d in enumerate(device_map) if d == device]
        static = float(sum(static_bytes[k] for k in members))
        if len(members) == 1:
            peaks[device] = static + float(np.max(levels[members[0]], initial=0.0))
            continue
        t = np.concatenate([times[k] for k in members])
        d = np.concatenate([np.diff(levels[k], prepend=0.0) for k in members])
        order = np.lexsort((d, t))
        peaks[device] = static + float(np.cumsum(d[order]).max(initial=0.0))
    return peaks
