"""Memory over the step: activation bytes held per rank (over all its chunks), per chunk and per device.

A forward that keeps its activations allocates its chunk's saved bytes for that micro-batch at
its start; under re-materialization it keeps only the chunk input, and the re-computation
allocates the rest of the saved bytes (the chunk's first layer saves that very input, so it is
not counted twice: max(saved - input, 0)). The micro-batch's bytes are freed at the end of its
last backward pass: the full backward, or the weight-gradient pass when the backward is split
(the input-gradient pass frees nothing here; in the memory in all it frees what it alone reads,
`freed_after_input_deltas`: the runtime lets the graph go and keeps what the weight pass needs).
Parameters, gradients and optimizer states are static.

Memory in all (`peak_memory_bytes`, the device peaks) adds to those held activations:
the rank's static bytes (parameters, plus gradients, optimizer states and master weights:
`RankPlan.state_bytes`; pipelined ZeRO-3's accumulated gradients from a chunk's first backward
pass on: gpipe_sim.plan.accumulated_gradients), what a split backward's input-gradient pass keeps
for its weight-gradient pass (`ChunkPlan.kept_for_weight_bytes`, from I's end to W's end), and the
transient bytes of the compute pass running at the time (allocated at the pass's start on top of the held level, freed at
its end: `ChunkPlan.transient_bytes` for a forward or re-computation, `input_pass_transient_bytes`
for an input pass (the gradients it keeps for the weight pass build up while it runs),
`backward_transient_bytes` for a full backward, `weight_pass_transient_bytes` for a weight pass;
for an update, the optimizer's temporaries: `RankPlan.update_scratch_bytes`). With
`hardware.host.step_buffers` it also counts the runtime's buffers held all step (`step_buffer_bytes`),
every sent tensor from its send to the step's end (`sent_bytes`) and every re-computation's output
to its backward's end (`recomputed_output_deltas`).
With neither, the memory in all is the static bytes plus the held activations exactly.

A gradient reduction (its group D x C > 1: data or context parallelism) under
`hardware.host.step_buffers` adds what a runtime like gpipe-exec holds for it (`data_parallel_bytes`):
chunk c's all-reduce bucket, one flat copy of its gradients (`ChunkPlan.param_bytes`), from its
`allreduce` action's start to the end of the `recv` of the reduced tensor that copies it back (as
torch DDP's default buckets, `gradient_as_bucket_view=False`, are a second copy of the gradients;
Megatron-LM's contiguous grad buffer is the gradients themselves, so without step_buffers none).

With `training.zero: 1`, ZeRO-1 works as Megatron-LM's distributed optimizer (gpipe_exec.runtime.zero_shards): each of a chunk's buckets
(one, or with `overlap_grad_reduce` those of `bucket_bytes`: `plan.zero_shards`) of n elements is
padded to N parts of s = ceil(n / N) (N = D x C) and reduce-scattered, so from the `allreduce` to
the wait the chunk holds each bucket's padded copy and its received part ((N + 1) s elements a
bucket, in place of the flat copy); the replica's master shard (its parts, at most s elements a
bucket) is static where the state bytes count no master copy (fp32 training; for bf16/fp16 the
sharded master weights are in the state bytes already); the update allocates the shard's gradient
(fp32, as the master shard, held to the step's end) and, while it runs, one bucket's all-gather
buffers at a time (its part and the whole: (N + 1) s elements of the training dtype, the largest
bucket's), above an optimizer's temporaries on one flat shard (so `RankPlan.update_scratch_bytes`
is 0 there). The shard's gradient and the all-gather's buffers are in the breakdown
(`zero_shard_gradient`, `zero_gather`), as are the buckets (`allreduce_buckets`) and the master
shard (`zero_master_shard`). With expert parallelism each bucket's routed experts' parameters are
sharded apart over N_e = D x C / E (`gpipe_sim.plan.zero_shards`), held whole where N_e is 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from gpipe_sim.plan.accumulated_gradients import first_backward_transients, gradient_deltas
from gpipe_sim.plan.compile import Plan
from gpipe_sim.plan.zero_shards import sharded_buckets
from gpipe_sim.schedule import Kind, Tensor

# a chunk's compute passes
PASSES = (Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT, Kind.RECOMPUTE)


@dataclass(frozen=True)
class MemoryProfile:
    """Activation memory per rank: the step function over time and its peak; per chunk and device peaks."""

    times: tuple[np.ndarray, ...]  # per pipeline rank (replica 0): event times (allocations at starts, frees at ends)
    activation_bytes: tuple[np.ndarray, ...]  # per pipeline rank: bytes held from that time on
    peak_activation_bytes: np.ndarray  # per pipeline rank
    chunk_peak_activation_bytes: np.ndarray  # per chunk, on its own
    device_peak_bytes: dict[int, float]  # per device (all replicas): static + peak of activations and transients
    # per pipeline rank: static + the peak of held activations plus the running pass's transient
    peak_memory_bytes: np.ndarray | None = None
    # per pipeline rank, what `peak_memory_bytes` is made of at its (first) peak moment
    breakdown: tuple[dict[str, float], ...] = ()


def activation_deltas(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(bytes allocated at each action's start, bytes freed at its end), in program order."""
    prog = plan.program
    alloc = np.zeros(len(prog.kind))
    free = np.zeros(len(prog.kind))
    act = np.array([c.activation_bytes for c in plan.chunks])  # [chunk, micro_batch]
    inp = np.array([c.input_bytes for c in plan.chunks])
    ch, mb, kind, save = prog.chunk, prog.micro_batch, prog.kind, prog.save
    fwd = kind == Kind.FORWARD
    alloc[fwd & save] = act[ch[fwd & save], mb[fwd & save]]
    alloc[fwd & ~save] = inp[ch[fwd & ~save], mb[fwd & ~save]]
    beyond_input = np.maximum(act - inp, 0.0)
    rec = kind == Kind.RECOMPUTE
    alloc[rec] = beyond_input[ch[rec], mb[rec]]
    last = (kind == Kind.BACKWARD) | (kind == Kind.BACKWARD_WEIGHT)
    kept = save[last]
    free[last] = np.where(
        kept, act[ch[last], mb[last]], inp[ch[last], mb[last]] + beyond_input[ch[last], mb[last]]
    )
    return alloc, free


def freed_after_input_deltas(plan: Plan) -> np.ndarray:
    """Per action, at its end: of the saved bytes `activation_deltas` holds to the weight pass's
    end, those only the input pass reads (`ChunkPlan.freed_after_input_bytes`) go at the input
    pass's end instead (negative there, positive again at the weight pass's end, where
    `activation_deltas` frees them). The memory in all counts this; the held activations (the
    schedule's accounting, which the executor checks by its saved-tensor hooks) do not."""
    prog = plan.program
    out = np.zeros(len(prog.kind))
    M = len(plan.micro_batch_sizes)
    early = np.array([np.zeros(M) if c.freed_after_input_bytes is None else c.freed_after_input_bytes
                      for c in plan.chunks])
    if not early.any():
        return out
    act = np.array([c.activation_bytes for c in plan.chunks])
    inp = np.array([c.input_bytes for c in plan.chunks])
    early = np.minimum(early, np.maximum(act - inp, 0.0))  # never the chunk's input, which stays
    ch, mb = prog.chunk, prog.micro_batch
    for kind, sign in ((Kind.BACKWARD_INPUT, -1.0), (Kind.BACKWARD_WEIGHT, 1.0)):
        at = prog.kind == kind
        out[at] = sign * early[ch[at], mb[at]]
    return out


def transient_bytes(plan: Plan) -> np.ndarray:
    """Per action, in program order: the bytes its compute pass holds only while it runs, the
    chunk's figure for its kind of pass (ChunkPlan); for an update, the optimizer's temporaries
    (`RankPlan.update_scratch_bytes`); 0 for transfers."""
    prog = plan.program
    out = np.zeros(len(prog.kind))
    M = len(plan.micro_batch_sizes)
    tr = np.array([np.zeros(M) if c.transient_bytes is None else c.transient_bytes for c in plan.chunks])
    backward = np.array([tr[c.index] if c.backward_transient_bytes is None else c.backward_transient_bytes
                         for c in plan.chunks])
    weight = np.array([np.zeros(M) if c.weight_pass_transient_bytes is None else c.weight_pass_transient_bytes
                       for c in plan.chunks])
    ok = (prog.chunk >= 0) & (prog.micro_batch >= 0)
    inputs = np.array([tr[c.index] if c.input_pass_transient_bytes is None else c.input_pass_transient_bytes
                       for c in plan.chunks])
    for table, kinds in ((tr, (Kind.FORWARD, Kind.RECOMPUTE)), (inputs, (Kind.BACKWARD_INPUT,)), (backward, (Kind.BACKWARD,)),
                         (weight, (Kind.BACKWARD_WEIGHT,))):
        running = np.isin(prog.kind, kinds) & ok
        out[running] = table[prog.chunk[running], prog.micro_batch[running]]
    at = prog.kind == Kind.UPDATE  # the optimizer's temporaries while a rank's update runs
    scratch = np.array([r.update_scratch_bytes for r in plan.ranks])
    out[at] = scratch[prog.rank[at] % len(plan.ranks)]
    return out


def _message_bytes(plan: Plan, kind: int, receiving: bool) -> np.ndarray:
    """Per action: the bytes of the tensor a send (or receive) of `kind` carries, 0 elsewhere. An
    activation is the sending chunk's output (the receiving chunk's input); a gradient the sending
    chunk's input gradient (the receiving chunk's output's)."""
    prog = plan.program
    inp = np.array([c.input_bytes for c in plan.chunks])  # [chunk, micro_batch]
    outp = np.array([c.output_bytes for c in plan.chunks])
    ch, mb = prog.chunk, prog.micro_batch
    out = np.zeros(len(prog.kind))
    for tensor, table in ((Tensor.ACTIVATION, inp if receiving else outp), (Tensor.GRADIENT, outp if receiving else inp)):
        at = (prog.kind == kind) & (prog.tensor == int(tensor)) & (ch >= 0) & (mb >= 0)
        out[at] = table[ch[at], mb[at]]
    return out


def sent_bytes(plan: Plan) -> np.ndarray:
    """Per action: under `hardware.host.step_buffers`, the bytes a send keeps from its start to the
    step's end (the runtime holds every sent tensor until it waits for the sends, at the step's
    end); zeros without."""
    if not plan.scenario.hardware.host.step_buffers:
        return np.zeros(len(plan.program.kind))
    return _message_bytes(plan, Kind.SEND, receiving=False)


def shared_with_buffers(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Under `hardware.host.step_buffers`, per action, (counted twice from its start, once again
    from its end): bytes that both the held activations and the runtime's buffers count.
    - The input of a chunk that arrives by a receive, or the model's first chunk's (the data), from
      the chunk's forward to its last backward pass: the held activations count it (the chunk's
      first layer saves its input, or re-materialization keeps it), and so does the receive or data
      buffer (`step_buffer_bytes`).
    - A sent output that the chunk's last layer saves too (`ChunkPlan.output_saved_bytes`), from
      its send to the chunk's last backward pass: the sent tensors count it (`sent_bytes`).
    Zeros without `step_buffers`."""
    prog = plan.program
    alloc, free = np.zeros(len(prog.kind)), np.zeros(len(prog.kind))
    if not plan.scenario.hardware.host.step_buffers:
        return alloc, free
    place = plan.schedule.placement
    C = len(plan.chunks)
    buffered = np.array([c == 0 or place[c] != place[c - 1] for c in range(C)])
    sent = _sends_output(plan)
    inp = np.array([c.input_bytes for c in plan.chunks])
    M = len(plan.micro_batch_sizes)
    out = np.array([np.zeros(M) if c.output_saved_bytes is None else c.output_saved_bytes for c in plan.chunks])
    ch, mb, kind = prog.chunk, prog.micro_batch, prog.kind
    ok = (ch >= 0) & (mb >= 0)
    chk = np.where(ok, ch, 0)
    mbk = np.where(ok, mb, 0)
    fwd = ok & (kind == Kind.FORWARD) & buffered[chk]
    alloc[fwd] += inp[ch[fwd], mb[fwd]]
    send = ok & (kind == Kind.SEND) & (prog.tensor == Tensor.ACTIVATION) & sent[chk]
    alloc[send] += out[ch[send], mb[send]]
    last = ok & ((kind == Kind.BACKWARD) | (kind == Kind.BACKWARD_WEIGHT))
    free[last] = np.where(buffered[chk[last]], inp[chk[last], mbk[last]], 0.0) + np.where(
        sent[chk[last]], out[chk[last], mbk[last]], 0.0)
    return alloc, free


def step_buffer_bytes(plan: Plan) -> np.ndarray:
    """Per global rank, the bytes a runtime with `hardware.host.step_buffers` holds all step: a
    buffer per receive of its program (an activation: the receiving chunk's input; a gradient: its
    output's), and on the rank of the model's first chunk the model input of its micro-batches
    (the targets are left out). Zeros without `step_buffers`."""
    prog = plan.program
    out = np.zeros(plan.num_ranks)
    if not plan.scenario.hardware.host.step_buffers:
        return out
    out += np.bincount(prog.rank, weights=_message_bytes(plan, Kind.RECV, receiving=True), minlength=plan.num_ranks)
    inp = np.array([c.input_bytes for c in plan.chunks])
    for g in range(plan.num_ranks):
        if 0 in plan.ranks[plan.mesh.pipeline_rank(g)].chunks:
            out[g] += float(inp[0].sum())
    return out


def recomputed_output_deltas(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Under `hardware.host.step_buffers`, per action, (allocated at its start, freed at its end):
    a re-computation's output, a new tensor the runtime holds as the root of the backward graph,
    from the re-computation's start to the end of the micro-batch's backward (or input) pass. What
    the chunk's last layer saves of it (`ChunkPlan.output_saved_bytes`) is in the saved bytes
    already, unless the chunk sends its output: the forward's sent tensor stands for that part
    then (`shared_with_buffers`), and the re-computed one is another. None on the model's last
    chunk (its output is the loss). Zeros without `step_buffers`."""
    prog = plan.program
    alloc, free = np.zeros(len(prog.kind)), np.zeros(len(prog.kind))
    if not plan.scenario.hardware.host.step_buffers or not np.any(prog.kind == Kind.RECOMPUTE):
        return alloc, free
    C, M = len(plan.chunks), len(plan.micro_batch_sizes)
    sent = _sends_output(plan)
    extra = np.array([np.zeros(M) if c.index == C - 1 else np.maximum(c.output_bytes - (
        0.0 if c.output_saved_bytes is None or sent[c.index] else c.output_saved_bytes), 0.0) for c in plan.chunks])
    ch, mb = prog.chunk, prog.micro_batch
    at = prog.kind == Kind.RECOMPUTE
    alloc[at] = extra[ch[at], mb[at]]
    # the micro-batch's first backward pass; `save` is False there where it was re-computed
    at = ((prog.kind == Kind.BACKWARD) | (prog.kind == Kind.BACKWARD_INPUT)) & ~prog.save
    free[at] = extra[ch[at], mb[at]]
    return alloc, free


def _sends_output(plan: Plan) -> np.ndarray:
    """Per chunk: whether it sends its output to another rank (not the last, not a local hand-over)."""
    place, C = plan.schedule.placement, len(plan.chunks)
    return np.array([c + 1 < C and place[c + 1] != place[c] for c in range(C)], dtype=bool)


def kept_for_weight_deltas(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(allocated at end, freed at end) per action: what an input-gradient pass keeps for its
    micro-batch's weight-gradient pass (`ChunkPlan.kept_for_weight_bytes`), from I's end to W's."""
    prog = plan.program
    alloc, free = np.zeros(len(prog.kind)), np.zeros(len(prog.kind))
    M = len(plan.micro_batch_sizes)
    kept = np.array([np.zeros(M) if c.kept_for_weight_bytes is None else c.kept_for_weight_bytes
                     for c in plan.chunks])
    ok = (prog.chunk >= 0) & (prog.micro_batch >= 0)
    for kind, out in ((Kind.BACKWARD_INPUT, alloc), (Kind.BACKWARD_WEIGHT, free)):
        at = ok & (prog.kind == kind)
        out[at] = kept[prog.chunk[at], prog.micro_batch[at]]
    return alloc, free


@dataclass(frozen=True)
class DataParallelBytes:
    """What a runtime with `hardware.host.step_buffers` holds for data parallelism (module
    docstring), per action in program order unless said; zeros where no gradient is reduced
    (D x C = 1) or without step_buffers."""

    bucket_alloc: np.ndarray  # an allreduce: its chunk's flat gradient copy, from its start
    bucket_free: np.ndarray  # the recv of a REDUCED tensor: its chunk's bucket, at its end
    shard_gradient: np.ndarray  # ZeRO-1's update: the shard's gradient, from its start to the step's end
    gather: np.ndarray  # ZeRO-1's update: the all-gather's buffers while it runs
    master_shard: np.ndarray  # per global rank, static: ZeRO-1's master shard where state bytes have none


def data_parallel_bytes(plan: Plan) -> DataParallelBytes:
    """The all-reduce buckets and ZeRO-1's flat copies (module docstring) of every global rank."""
    prog = plan.program
    n, G = len(prog.kind), plan.num_ranks
    out = DataParallelBytes(np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(G))
    reduced = plan.mesh.gradient_group > 1  # D x C: context parallelism reduces even one replica's gradients
    if not reduced or not plan.scenario.hardware.host.step_buffers or plan.scenario.training.zero >= 2:
        return out  # ZeRO-2/3 (FSDP2): no flat bucket; the gathered units are the passes' transients
    grads = np.array([c.param_bytes for c in plan.chunks])
    at = prog.kind == Kind.ALLREDUCE
    out.bucket_alloc[at] = grads[prog.chunk[at]]
    at = (prog.kind == Kind.RECV) & (prog.tensor == Tensor.REDUCED)
    out.bucket_free[at] = grads[prog.chunk[at]]
    training = plan.scenario.training
    if not training.zero:
        return out
    element = training.dtype_bytes
    # Megatron-LM's distributed optimizer (gpipe_exec.runtime.zero_shards): per bucket of n
    # elements, N parts of s = ceil(n / N); replica i owns [i s, (i + 1) s) clipped to n
    shards = sharded_buckets(plan)
    at = prog.kind == Kind.ALLREDUCE
    out.bucket_alloc[at] = shards.copies[prog.chunk[at]] * element
    at = (prog.kind == Kind.RECV) & (prog.tensor == Tensor.REDUCED)
    out.bucket_free[at] = shards.copies[prog.chunk[at]] * element
    if training.dtype == "fp32":  # Training.state_bytes_per_param counts a master copy otherwise
        out.master_shard[:] = shards.owned * element
    at = prog.kind == Kind.UPDATE
    out.shard_gradient[at] = shards.owned[prog.rank[at]] * 4.0  # the fp32 master shard's gradient
    out.gather[at] = shards.gather[plan.mesh.pipeline_rank(prog.rank[at])] * element  # one bucket at a time
    return out


def memory_profile(plan: Plan, start: np.ndarray, end: np.ndarray) -> MemoryProfile:
    """Activation memory over time from the engine's action times; memory in all with transients."""
    alloc, free = activation_deltas(plan)
    transient = first_backward_transients(plan, transient_bytes(plan))
    sent = sent_bytes(plan)
    in_buffers = shared_with_buffers(plan)
    for_weight = kept_for_weight_deltas(plan)
    freed_early = freed_after_input_deltas(plan)
    recomputed = recomputed_output_deltas(plan)
    dp = data_parallel_bytes(plan)
    prog = plan.program
    offsets = prog.offsets
    times, held, peaks, in_all, breakdown = [], [], [], [], []
    chunk_peaks = np.zeros(len(plan.chunks))
    K = len(plan.ranks)
    # Beside the held activations, per series: (bytes at each action's start, at its end, summed
    # over time); a series that is zero everywhere is left out.
    level_terms = {  # changes of the held level
        "shared": (-in_buffers[0], in_buffers[1], True),  # counted in the buffers or sent tensors already
        "kept_for_weight": (None, for_weight[0] - for_weight[1], True),  # both at the passes' ends
        "freed_after_input": (None, freed_early, True),  # at the input and weight passes' ends
    }
    extras = {  # named in the breakdown
        "sent": (sent, None, True),  # sent tensors, from their send's start to the step's end
        "recomputed_outputs": (recomputed[0], -recomputed[1], True),  # to their backward's end
        "allreduce_buckets": (dp.bucket_alloc, -dp.bucket_free, True),  # allreduce's start to the wait's end
        "zero_shard_gradient": (dp.shard_gradient, None, True),  # from the update's start to the step's end
        "zero_gather": (dp.gather, None, False),  # while the update runs
        "accumulated_gradients": (*gradient_deltas(plan), True),  # pipelined ZeRO-3's, first to last backward
    }
    level_terms = {k: v for k, v in level_terms.items() if any(a is not None and a.any() for a in v[:2])}
    extras = {k: v for k, v in extras.items() if any(a is not None and a.any() for a in v[:2])}
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
        running = _events(t, transient[lo:hi], None, False)  # on top of the level from a pass's start to its end
        for at_start, at_end, summed in level_terms.values():
            level = level + _events(t, _part(at_start, lo, hi), _part(at_end, lo, hi), summed)
        series = {name: _events(t, _part(at_start, lo, hi), _part(at_end, lo, hi), summed)
                  for name, (at_start, at_end, summed) in extras.items()}
        total = level + running + sum(series.values(), np.zeros_like(t))
        in_all.append(total)
        at = int(np.argmax(total)) if len(total) else 0
        breakdown.append({"activations": float(level[at]) if len(level) else 0.0,
                          "transient": float(running[at]) if len(running) else 0.0,
                          **{name: float(v[at]) for name, v in series.items() if len(v) and v.any()}})
        if g < K:
            chunk = np.repeat(prog.chunk[lo:hi], 2)
            for c in plan.ranks[g].chunks:
                chunk_peaks[c] = float(np.cumsum(delta[chunk == c]).max(initial=0.0))
    buffers = step_buffer_bytes(plan)
    rank_of = plan.mesh.pipeline_rank
    static = [plan.ranks[rank_of(g)].param_bytes + plan.ranks[rank_of(g)].state_bytes + buffers[g]
              + dp.master_shard[g] for g in range(plan.num_ranks)]
    device_peak = device_peaks(plan.device_map[:plan.num_ranks], static, times, in_all)
    if plan.num_ranks < len(plan.device_map):  # replica 0 timed for all: each replica's devices hold as much
        mirror = dict(zip(plan.device_map, (plan.device_map[rank_of(g)] for g in range(len(plan.device_map)))))
        device_peak = {device: device_peak[mirror[device]] for device in sorted(mirror)}
    peak_memory = np.array([static[k] + float(in_all[k].max(initial=0.0)) for k in range(K)])
    for k in range(K):
        breakdown[k] = {"parameters": plan.ranks[k].param_bytes,
                        "gradients_and_optimizer_states": plan.ranks[k].state_bytes,
                        **({"zero_master_shard": float(dp.master_shard[k])} if dp.master_shard[k] else {}),
                        **({"step_buffers": float(buffers[k])} if buffers[k] else {}), **breakdown[k]}
    return MemoryProfile(tuple(times[:K]), tuple(held[:K]), np.asarray(peaks[:K]), chunk_peaks, device_peak,
                         peak_memory, tuple(breakdown[:K]))


def _part(values: np.ndarray | None, lo: int, hi: int) -> np.ndarray | None:
    return None if values is None else values[lo:hi]


def _events(t: np.ndarray, at_start: np.ndarray | None, at_end: np.ndarray | None, summed: bool) -> np.ndarray:
    """One rank's series over its event times `t` (each action's start, then its end): the bytes
    at starts and at ends, summed over time (held until released) or not (only at that event)."""
    out = np.zeros_like(t)
    if at_start is not None:
        out[0::2] = at_start
    if at_end is not None:
        out[1::2] = at_end
    return np.cumsum(out) if summed else out


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
