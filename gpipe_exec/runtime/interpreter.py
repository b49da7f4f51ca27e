"""The pipeline runtime: one process per rank runs its program from gpipe_sim.schedule, action by action.

A rank holds every model chunk the schedule places on it (one module each) and one optimizer over
all of them. The interpreter dispatches each action to the handler of its kind. Between chunks of
one rank the hand-over is local (a forward's output is the next chunk's input, a backward's input
gradient the previous chunk's output gradient); between ranks it is a transfer, asynchronous
(`isend`/`irecv`): receives are posted ahead (by default every receive of the step, at its start),
sends complete in the background, so communication overlaps compute wherever the schedule allows.
Every action is recorded as it ran: its kind, chunk, micro-batch and message, and its start and
end on the aligned clock.

Data parallelism (`pipeline.data_parallel` = D): global rank g = d*K + r runs pipeline rank r's
program for replica d on its share of the global batch, each chunk's gradients all-reduced among
its D replicas (`allreduce` starts it after the chunk's last backward pass, or with
overlap_grad_reduce arms runtime.grad_buckets before it; the REDUCED `recv` waits). ZeRO-1: each
bucket is reduce-scattered, each replica updating its part of each bucket, then the replicas all-gather
the parts (runtime.zero_shards, as Megatron-LM's distributed optimizer).
ZeRO-2/3: FSDP2 reduce-scatters in the backward (runtime.sharded; under pipelining or ZeRO-2 steered
before each backward pass by its BackwardSharding); the update steps shards.
"""

from __future__ import annotations

import os
import signal
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist

from gpipe_exec.context_parallel import SequenceShard
from gpipe_exec.errors import ExecutionError
from gpipe_exec.measure.memory import (INPUTS, RECEIVE_BUFFERS, AllocatorPeak, StorageTracker, live_cuda_bytes,
                                       gradients_as_gradients, module_state)
from gpipe_exec.measure.gpu_spans import GpuSpans
from gpipe_exec.measure.meters import AlignedClock, SavedBytesMeter, cuda_peak_bytes, tensor_bytes
from gpipe_exec.runtime.chunk import Chunk
from gpipe_exec.runtime.comm import Comm, data_parallel_groups, stages_through_host
from gpipe_exec.runtime.context_parallel import (context_groups, context_loss, shard_batch, split_sequence,
                                                 sum_losses)
from gpipe_exec.runtime.device_lock import device_lock, holding
from gpipe_exec.runtime.experts import expert_groups, expert_mask, flat, global_names, reduction_buckets, unflat
from gpipe_exec.measure.records import StepRecord
from gpipe_exec.runtime.grad_buckets import bucket_groups, chunk_buckets
from gpipe_sim.plan.buckets import reduction_size
from gpipe_exec.runtime.job import Job
from gpipe_exec.runtime.tensor_parallel import (LocalShards, device_mesh, full_parameters, sequence_shards,
                                                split_chunk, vocab_parallel_loss)
from gpipe_exec.runtime.update import Update
from gpipe_exec.runtime.zero_shards import ShardGroup, ZeroShardUpdate
from gpipe_exec.runtime.recompute import apply_recompute
from gpipe_exec.runtime.sharded import BackwardSharding, shard_chunks, whole
from gpipe_exec.zoo import TORCH_DTYPES, build_layers_range, loss_sum, make_batch
from gpipe_sim.schedule import ACTION_KINDS, COMPUTE_KINDS, Action, Kind, Tensor
from gpipe_sim.schedule.global_program import process_program
from gpipe_sim.model.model import ModelSpec

# Actions whose time is the host's (transfers and the start of a reduction): on CUDA the others
# are timed on the GPU by events (measure.gpu_spans), since the host only queues their kernels.
HOST_KINDS = frozenset({Kind.SEND, Kind.RECV, Kind.ALLREDUCE})


def boundary_shapes(model: ModelSpec, dtype: str, seed: int, dropout: float | None, last: int | None = None
                    ) -> list[tuple[int, ...]]:
    """Shape (without the batch dimension) of every layer's output up to `last` (default: all),
    found in one pass on the meta device."""
    from gpipe_sim.model.layers import layer_count

    last = layer_count(model) - 1 if last is None else last
    x, _ = make_batch(model, 1, seed=seed, dtype=dtype)
    shapes = []
    with torch.device("meta"):
        layers = build_layers_range(model, 0, last, seed=seed, dropout=dropout, dtype=dtype)
        h = x.to("meta")
        for module in layers:
            h = module(h)
            shapes.append(tuple(h.shape[1:]))
    return shapes


@dataclass
class _StepState:
    """What flows between one step's actions on a rank."""

    inputs: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)  # (chunk, mb): its input
    grads: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)  # (chunk, mb): its output's grad
    outbox: dict[tuple[Tensor, int, int], torch.Tensor] = field(default_factory=dict)  # to send
    posted: dict[int, tuple[Any, torch.Tensor]] = field(default_factory=dict)  # action -> (work, buffer)
    sends: list[tuple[int, int, Any]] = field(default_factory=list)  # (record index, action, work)
    next_post: int = 0
    reductions: dict[int, list[tuple[list[bool], Any, torch.Tensor]]] = field(default_factory=dict)  # per bucket


class RankRunner:
    """Runs one rank's program for a job: builds its chunks, data, buffers, and interprets actions."""

    def __init__(self, job: Job, rank: int, device: torch.device, clock: AlignedClock) -> None:
        # On CUDA the memory step reads the caching allocator, which sees every live block of the
        # process: what was live before this rank built anything (a profile taken in the same
        # process, its garbage collected first) is not the rank's and is left out.
        self.allocator_baseline = live_cuda_bytes(device)
        self.job, plan = job, job.plan
        self.scenario = sc = plan.scenario
        self.model = model = job.model or sc.model  # the zoo model built (the plan's may be a table)
        self.rank, self.device, self.clock = rank, device, clock
        self.K, self.M, self.C, self.D = len(plan.ranks), plan.schedule.micro_batches, len(plan.chunks), plan.replicas
        self.T, self.CP = sc.pipeline.tensor_parallel, sc.pipeline.context_parallel
        self.sequence_parallel = self.T > 1 and sc.pipeline.sequence_parallel
        # Process g*T*C + c*T + t runs program rank g = d*K + r (pipeline rank r's program for
        # replica d) on its context-parallel rank c and tensor-parallel rank t (gpipe_sim.mesh's
        # order); its transfers go to the same (c, t) of the peer rank.
        self.width = plan.mesh.devices_per_rank
        self.program_rank, self.cp_rank, self.tp_rank = plan.mesh.coordinates(rank)
        self.replica, self.pipeline_rank = plan.mesh.replica(self.program_rank), plan.mesh.pipeline_rank(self.program_rank)
        if self.replica >= self.D:
            raise ExecutionError(f"global rank {rank} is outside {self.D} replicas of {self.K} ranks x {self.width}")
        mine = process_program(plan.global_program, rank, self.width)
        self.actions, self.tags = mine.actions, mine.message
        dtype = sc.training.dtype
        self.mesh = device_mesh(device.type, plan.mesh) if self.T > 1 else None
        self.meter = SavedBytesMeter()  # the rank's activation bytes, over all its chunks
        self.experts, self.expert_dp_group = expert_groups(plan.mesh, rank)
        self.sequence: SequenceShard | None = None  # this device's share of each sequence (C > 1)
        if self.CP > 1:
            cp_group, self.grad_group = context_groups(plan.mesh, rank)
            seq_len: int = model.seq_len  # type: ignore[attr-defined]
            self.sequence = SequenceShard.of(seq_len, self.CP, self.cp_rank, cp_group, device)
        self.chunks = self._build_chunks(model)
        # ZeRO-2/3: FSDP2 reduces in the backward itself (runtime.sharded); allreduce actions do nothing
        self.sharded = shard_chunks([ch.module for ch in self.chunks.values()], sc, device.type, self.mesh,
                                    self.expert_dp_group)
        self.fsdp = BackwardSharding.of({c: ch.module for c, ch in self.chunks.items()}, sc, self.actions)
        # what the optimizer, the reductions and the memory meter step: each DTensor's local shard
        self.shards = {c: LocalShards(list(ch.module.parameters())) for c, ch in self.chunks.items()}
        self.dp_group = (self.grad_group if self.sequence is not None else None if self.D == 1 else
                         self.mesh["dp"].get_group() if self.mesh is not None
                         else data_parallel_groups(plan.mesh)[self.pipeline_rank])
        split = job.split_directions if job.split_directions is not None else device.type == "cuda"
        self.comm = Comm(rank, split, staged=stages_through_host(device.type, dist.get_backend()))
        reducers = plan.mesh.gradient_group  # D x C: the processes each gradient is summed over
        self.update, self.zero = self._make_update(reducers)
        self.sizes = plan.micro_batch_sizes
        self.inputs, self.targets = self._batch(model)
        self.float_dtype = TORCH_DTYPES[dtype]
        # the program's point-to-point receives (not the waits for all-reduces), in order
        self.recv_at = [i for i, a in enumerate(self.actions) if a.kind == Kind.RECV and a.tensor != Tensor.REDUCED]
        self.shapes = boundary_shapes(model, dtype, job.seed, job.dropout) if self.recv_at else []
        if self.sequence_parallel or self.sequence is not None:  # a stage sends and receives its device's tokens
            self.shapes = sequence_shards(self.shapes, (self.T if self.sequence_parallel else 1) * self.CP)
        self.grad_buckets = chunk_buckets({c: ch.module for c, ch in self.chunks.items()}, sc, reducers,
                                          self.sharded, self.comm, self.dp_group, clock, self.zero)
        for c, reduction in self.grad_buckets.items():  # a split backward's weight passes count in too
            self.chunks[c].accumulated = reduction.accumulated
        self._buffers: dict[int, torch.Tensor] = {}
        # (With T or C > 1 a pass's collectives wait for the rank's other devices: a device lock shared
        # with another rank could hold one of them back while it holds the lock, so none is taken.)
        self.lock = (device_lock(rank, plan.device_map) if device.type == "cpu" and job.device_lock and self.width == 1
                     else None)
        # One handler per kind: each runs its action and says what it ran (kind, chunk, micro-batch).
        self.handlers: dict[Kind, Callable[[int, Action], tuple[Kind, int, int]]] = {
            Kind.FORWARD: self._forward,
            Kind.BACKWARD: self._backward,
            Kind.BACKWARD_INPUT: self._backward_input,
            Kind.BACKWARD_WEIGHT: self._backward_weight,
            Kind.RECOMPUTE: self._recompute,
            Kind.SEND: self._send,
            Kind.RECV: self._recv,
            Kind.UPDATE: self._update,
            Kind.ALLREDUCE: self._allreduce,
        }
        self._state = _StepState()
        self._record = StepRecord()

    def _make_update(self, reducers: int) -> tuple[Update | ZeroShardUpdate, ZeroShardUpdate | None]:
        """(the rank's update, ZeRO-1's where it shards): under `training.zero` 1 with more than
        one process summing each gradient (`reducers`, D x C), sharded over the gradient group
        bucket by bucket (runtime.zero_shards: the chunks' reduction buckets, `bucket_groups`), with
        expert parallelism the routed experts' part of each bucket apart, over the D x C / E processes
        holding the same experts (Megatron-LM's expert-data-parallel buffers); else the plain update
        of every local parameter."""
        sc = self.scenario
        if reducers == 1 or sc.training.zero != 1:
            return Update([q for shards in self.shards.values() for q in shards.local], sc), None
        size, buckets, own = reduction_size(sc), {}, {}
        for c, ch in self.chunks.items():
            local = dict(zip(map(id, self.shards[c].params), self.shards[c].local))
            routed = set() if self.experts is None else {  # E > 1: sharded apart (over D x C / E)
                id(p) for p, routed_expert in zip(ch.module.parameters(), expert_mask(ch.module)) if routed_expert}
            groups = bucket_groups(list(ch.module), size)
            buckets[c] = [[local[id(p)] for p in group if id(p) not in routed] for group in groups]
            own[c] = [[local[id(p)] for p in group if id(p) in routed] for group in groups]
        experts = None  # the routed experts' buckets' group: their expert-data-parallel one (or this process)
        if self.experts is not None:
            group = self.expert_dp_group
            experts = ShardGroup(group, 1, 0) if group is None else ShardGroup(group, group.size(), group.rank())
        zero = ZeroShardUpdate(buckets, sc, self.replica * self.CP + self.cp_rank, reducers, self.dp_group, self.comm,
                               own, experts)
        return zero, zero

    def _batch(self, model: ModelSpec) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(inputs, targets) per micro-batch, where this rank's chunks need them: this replica's
        share of the global batch (each loss still divides by the global batch size, so the
        replicas' summed gradients are those of the global batch's mean loss) and, with context
        parallelism, this device's tokens of each sequence."""
        sc, share = self.scenario, self.scenario.pipeline.batch_size // self.D
        x, y = make_batch(model, sc.pipeline.batch_size, seed=self.job.seed, dtype=sc.training.dtype)
        # a copy of the share: a view would keep the whole global batch alive on every replica
        # (a data-parallel loader gives each replica only its own samples)
        x, y = (t[self.replica * share:(self.replica + 1) * share].clone() if self.D > 1 else t for t in (x, y))
        if self.sequence is not None:
            x, y = (shard_batch(t, self.sequence) for t in (x, y))
        inputs = [t.to(self.device) for t in torch.tensor_split(x, self.M)] if 0 in self.chunks else []
        targets = [t.to(self.device) for t in torch.tensor_split(y, self.M)] if self.C - 1 in self.chunks else []
        return inputs, targets

    def _build_chunks(self, model: ModelSpec) -> dict[int, Chunk]:
        """This rank's chunks, each layer built whole from its seed, then split over the rank's T
        devices (runtime.tensor_parallel), its last chunk's loss the vocabulary-parallel one."""
        plan, job, sc = self.job.plan, self.job, self.scenario
        loss = loss_sum if self.mesh is None else vocab_parallel_loss(self.mesh["tp"])
        loss = loss if self.sequence is None else context_loss(loss, self.CP)
        chunks: dict[int, Chunk] = {}
        for index in plan.ranks[self.pipeline_rank].chunks:
            first, last = plan.chunks[index].first_layer, plan.chunks[index].last_layer
            layers = build_layers_range(model, first, last, seed=job.seed, dropout=job.dropout,
                                        dtype=sc.training.dtype, tensor_parallel=self.T, experts=self.experts)
            module = torch.nn.Sequential(*layers).to(self.device)
            apply_recompute(module, sc.pipeline.remat)
            if self.mesh is not None:
                split_chunk(module, self.mesh["tp"], self.sequence_parallel)
            if self.sequence is not None:
                split_sequence(module, self.sequence)
            chunks[index] = Chunk(index, self.C, first, module, self.device, loss, sc.pipeline.batch_size,
                                  parent_meter=self.meter, weight_pass=job.weight_pass)
        return chunks

    # -- buffers and receives ------------------------------------------------------------------

    def _buffer(self, index: int) -> torch.Tensor:
        """The receive buffer of action `index`, allocated once and reused every step (nothing of a
        step outlives it), so posting a receive allocates nothing."""
        buf = self._buffers.get(index)
        if buf is None:
            action = self.actions[index]
            chunk = self.job.plan.chunks[action.chunk]
            first, last = chunk.first_layer, chunk.last_layer
            # an activation is the chunk's input (the previous layer's output); a gradient its output's
            shape = self.shapes[first - 1] if action.tensor == Tensor.ACTIVATION else self.shapes[last]
            where = "cpu" if self.comm.staged else self.device  # gloo lands it in host memory
            buf = torch.empty((self.sizes[action.micro_batch], *shape), dtype=self.float_dtype, device=where)
            self._buffers[index] = buf
        return buf

    def _post(self, index: int) -> None:
        buf = self._buffer(index)
        self._state.posted[index] = (self.comm.irecv(buf, self.actions[index], self.tags[index]), buf)

    # -- hand-overs ----------------------------------------------------------------------------

    def _hand_forward(self, c: int, m: int, out: torch.Tensor) -> None:
        """Chunk c's output: the next chunk's input here, or a message for the next chunk's rank."""
        if c + 1 == self.C:
            return  # the loss
        if c + 1 in self.chunks:
            self._state.inputs[(c + 1, m)] = out
        else:
            self._state.outbox[(Tensor.ACTIVATION, c, m)] = out

    def _hand_backward(self, c: int, m: int, grad: torch.Tensor | None) -> None:
        """Chunk c's input gradient: the previous chunk's output gradient here, or a message."""
        if c == 0:
            return
        assert grad is not None, f"chunk {c}: no input gradient for micro-batch {m}"
        if c - 1 in self.chunks:
            self._state.grads[(c - 1, m)] = grad
        else:
            self._state.outbox[(Tensor.GRADIENT, c, m)] = grad

    def _target(self, ch: Chunk, m: int) -> torch.Tensor | None:
        return self.targets[m] if ch.is_last else None

    def _output_grad(self, ch: Chunk, m: int) -> torch.Tensor | None:
        return None if ch.is_last else self._state.grads.pop((ch.index, m))

    # -- handlers, one per kind ----------------------------------------------------------------

    def _forward(self, i: int, a: Action) -> tuple[Kind, int, int]:
        ch, m = self.chunks[a.chunk], a.micro_batch
        x = self.inputs[m] if ch.is_first else self._state.inputs.pop((ch.index, m))
        self._hand_forward(ch.index, m, ch.forward(m, x, self._target(ch, m), a.save))
        return Kind.FORWARD, ch.index, m

    def _recompute(self, i: int, a: Action) -> tuple[Kind, int, int]:
        ch, m = self.chunks[a.chunk], a.micro_batch
        ch.recompute(m, self._target(ch, m))
        return Kind.RECOMPUTE, ch.index, m

    def _backward(self, i: int, a: Action) -> tuple[Kind, int, int]:
        ch, m = self.chunks[a.chunk], a.micro_batch
        if self.fsdp is not None:
            self.fsdp.before_backward(i, ch.index)
        self._hand_backward(ch.index, m, ch.backward(m, self._output_grad(ch, m)))
        return Kind.BACKWARD, ch.index, m

    def _backward_input(self, i: int, a: Action) -> tuple[Kind, int, int]:
        ch, m = self.chunks[a.chunk], a.micro_batch
        self._hand_backward(ch.index, m, ch.backward_input(m, self._output_grad(ch, m)))
        return Kind.BACKWARD_INPUT, ch.index, m

    def _backward_weight(self, i: int, a: Action) -> tuple[Kind, int, int]:
        ch, m = self.chunks[a.chunk], a.micro_batch
        ch.backward_weight(m)
        return Kind.BACKWARD_WEIGHT, ch.index, m

    def _send(self, i: int, a: Action) -> tuple[Kind, int, int]:
        tensor = self._state.outbox.pop((a.tensor, a.chunk, a.micro_batch))
        work = self.comm.isend(tensor, a, self.tags[i])
        self._state.sends.append((len(self._record), i, work))
        return Kind.SEND, a.chunk, a.micro_batch

    def _chunk_grads(self, c: int) -> list[torch.Tensor]:
        """Chunk c's gradients as this process holds them (a DTensor's: its local shard), made
        zeros where a parameter has none yet."""
        return self.shards[c].grads()

    def _allreduce(self, i: int, a: Action) -> tuple[Kind, int, int]:
        """Start the sum of chunk a.chunk's gradients over its replicas (`reduction_buckets`; not under FSDP2)."""
        if a.chunk in self.grad_buckets:  # overlap_grad_reduce: the coming last backward pass starts them
            self.grad_buckets[a.chunk].arm()
        if self.sharded or a.chunk in self.grad_buckets:  # FSDP2 reduced them in the backward
            return Kind.ALLREDUCE, a.chunk, -1
        grads, self._state.reductions[a.chunk] = self._chunk_grads(a.chunk), []
        if self.zero is not None:  # ZeRO-1: each bucket reduce-scattered (the REDUCED recv waits)
            for b in range(len(self.zero.of_chunk[a.chunk])):
                self.zero.start(a.chunk, b)
            return Kind.ALLREDUCE, a.chunk, -1
        for mask, group in reduction_buckets(self.chunks[a.chunk].module, self.experts is not None,
                                             self.dp_group, self.expert_dp_group):
            bucket = flat(grads, mask, self.float_dtype, self.device)
            self._state.reductions[a.chunk].append((mask, self.comm.allreduce(bucket, group, a.chunk), bucket))
        return Kind.ALLREDUCE, a.chunk, -1

    def _reduced(self, i: int, a: Action) -> tuple[Kind, int, int]:
        """Wait for chunk a.chunk's reduction and put the summed gradients back in `.grad`."""
        if a.chunk in self.grad_buckets:
            self._record.bucket_starts[a.chunk] = self.grad_buckets[a.chunk].finish()
        if self.sharded or a.chunk in self.grad_buckets:
            return Kind.RECV, a.chunk, -1
        if self.zero is not None:
            del self._state.reductions[a.chunk]
            for b in range(len(self.zero.of_chunk[a.chunk])):
                self.zero.finish(a.chunk, b)
            return Kind.RECV, a.chunk, -1
        grads = self._chunk_grads(a.chunk)
        for mask, work, bucket in self._state.reductions.pop(a.chunk):
            self.comm.wait_collective(work, a.chunk)
            unflat(bucket, grads, mask)
        return Kind.RECV, a.chunk, -1

    def _recv(self, i: int, a: Action) -> tuple[Kind, int, int]:
        if a.tensor == Tensor.REDUCED:
            return self._reduced(i, a)
        st = self._state
        if i not in st.posted:  # not posted ahead: post it now
            st.next_post += 1
            self._post(i)
        work, buf = st.posted.pop(i)
        self.comm.wait(work, a)
        if self.comm.staged:
            buf = buf.to(self.device)
        if a.tensor == Tensor.ACTIVATION:
            st.inputs[(a.chunk, a.micro_batch)] = buf
        else:
            st.grads[(a.chunk, a.micro_batch)] = buf
        return Kind.RECV, a.chunk, a.micro_batch

    def _update(self, i: int, a: Action) -> tuple[Kind, int, int]:
        for shards in self.shards.values():
            shards.sync()
        self.update.step()  # ZeRO-1's all-gather follows, out of the device lock (`step`)
        return Kind.UPDATE, -1, -1

    # -- the step ------------------------------------------------------------------------------

    def _fault(self, step: int, index: int) -> None:
        f = self.job.fault
        if f and f.get("rank") == self.rank and f.get("step", 0) == step and f.get("action", 0) == index:
            if f.get("kind") in ("kill", "crash"):  # crash: a native fault (faulthandler reports it)
                os.kill(os.getpid(), signal.SIGKILL if f["kind"] == "kill" else signal.SIGSEGV)
            raise RuntimeError(f"injected fault at action {index} ({self.actions[index]})")

    def _memory_meter(self) -> StorageTracker | AllocatorPeak:
        """The memory step's meter, with the state that outlives a step registered (CPU)."""
        if self.device.type == "cuda":
            return AllocatorPeak(self.device, self.allocator_baseline)
        tracker = StorageTracker(resized=self.sharded)
        module_state(tracker, [ch.module for ch in self.chunks.values()], [self.update.optimizer])
        tracker.track(self.update.masters, "optimizer_states")  # fp32 master copies (or ZeRO-1's shard)
        tracker.track([*self.inputs, *self.targets], INPUTS)
        tracker.track(self._buffers.values(), RECEIVE_BUFFERS)
        return tracker

    def step(self, step: int, memory: bool = False) -> StepRecord:
        """Run one training step (the whole program, ending with the optimizer update).

        With `memory`, measure the rank's real tensor memory over the step (measure.memory: on CPU a
        StorageTracker counting every live storage -- parameters, gradients, optimizer states, data,
        receive buffers, and whatever each action allocates, temporaries included; on CUDA the
        caching allocator's active bytes). Run it after a warm-up step: the optimizer's states and
        the receive buffers are allocated during the first step. The step's timings carry the
        tracker's overhead: they are for this record's memory only."""
        # The gradients stay allocated from step to step, zeroed in place (as gpipe_sim counts them:
        # static, like a framework's persistent gradient buffers); ZeRO-1's shard gradient is new each
        # step, as are pipelined ZeRO-3's (runtime.sharded: torchtitan's zero_grad sets them to None).
        accumulated = self.fsdp is not None and self.fsdp.zero == 3
        self.update.optimizer.zero_grad(set_to_none=self.zero is not None or accumulated)
        for ch in self.chunks.values():
            ch.module.zero_grad(set_to_none=accumulated)
            ch.reset()
        self.meter.reset()
        # Dropout draws from a per-(job seed, step, rank) stream: runs are reproducible. Per program
        # rank: a rank's T devices draw the same masks for the activations they all hold; with
        # sequence or context parallelism they hold none in common (each its shard or its heads),
        # so each device draws its own, as Megatron-LM's RNG tracker does.
        stream = self.rank if self.sequence_parallel or self.sequence is not None else self.program_rank
        torch.manual_seed(1_000_003 * self.job.seed + 1009 * step + stream)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        with ExitStack() as stack:
            meter = self._memory_meter() if memory else None
            if isinstance(meter, StorageTracker):
                stack.enter_context(meter)
                params = [q for ch in self.chunks.values() for q in ch.module.parameters()]
                stack.enter_context(gradients_as_gradients(meter, params))
            if meter is not None:
                meter.reset_peak()
            rec = self._run_program(step, meter)
        if meter is not None:
            rec.memory_peak_bytes = float(max(rec.memory_action_peaks, default=meter.total))
            if isinstance(meter, StorageTracker):
                rec.memory_breakdown = {k: float(v) for k, v in meter.peak_breakdown.items()}
        return rec

    def _run_program(self, step: int, meter: StorageTracker | AllocatorPeak | None) -> StepRecord:
        """The step's actions, in program order, each recorded as it ran (with `meter`, its memory)."""
        acts, clock = self.actions, self.clock
        tracker = meter if isinstance(meter, StorageTracker) else None
        rec = self._record = StepRecord()
        st = self._state = _StepState()
        recv_at = self.recv_at
        window = self.job.recv_window
        if window is None:
            window = 0 if self.device.type == "cuda" else len(recv_at)

        def post_ahead() -> None:
            while st.next_post < len(recv_at) and len(st.posted) < window:
                self._post(recv_at[st.next_post])
                st.next_post += 1

        # The step's first receives are posted before the step starts, as a training loop posts
        # the next step's while it finishes this one (posting stalled for up to 5 ms at times here).
        post_ahead()
        spans = GpuSpans(self.device) if self.device.type == "cuda" else None
        # ZeRO-1's update ends with a host-side all-gather: it keeps its host times
        on_host = HOST_KINDS | ({Kind.UPDATE} if self.zero is not None else set())
        if spans is not None:
            torch.cuda.synchronize(self.device)
        dist.barrier()
        rec.step_start = clock() if spans is None else spans.begin(clock)
        for i, a in enumerate(acts):
            post_ahead()
            self._fault(step, i)
            # Ranks sharing a device compute one at a time; the action starts once it has the device.
            with holding(self.lock if a.kind in COMPUTE_KINDS else None):
                if meter is not None:
                    meter.mark()
                start = clock()
                on_gpu = spans.start() if spans is not None and a.kind not in on_host else None
                with tracker.during(a.kind.name.lower()) if tracker is not None else nullcontext():
                    kind, chunk, micro_batch = self.handlers[a.kind](i, a)
                if on_gpu is not None:
                    spans.end(len(rec.starts), on_gpu)  # type: ignore[union-attr]
                now = clock()
            if self.zero is not None and a.kind == Kind.UPDATE:
                self.comm._guarded("ZeRO-1 all-gather of the updated parameters with the replicas",
                                   self.zero.gather)
                now = clock()
            if meter is not None:
                rec.memory_action_peaks.append(float(meter.interval_peak))
                rec.memory_levels.append(float(meter.total))
            rec.kind.append(int(kind))
            rec.chunk.append(chunk)
            rec.micro_batch.append(micro_batch)
            rec.message.append(self.tags[i] if kind in (Kind.SEND, Kind.RECV) else -1)
            rec.starts.append(start)
            rec.ends.append(now)  # a send's end is set when it completes
            rec.held.append(float(self.meter.total))
            still = []
            for j, index, work in st.sends:
                if work.is_completed():
                    rec.ends[j] = now
                else:
                    still.append((j, index, work))
            st.sends = still
        for j, index, work in st.sends:
            self.comm.wait(work, acts[index])
            rec.ends[j] = clock()
        if spans is not None:  # the step ends when its last kernel has run, not when it was queued
            spans.resolve(rec.starts, rec.ends)
        leftover = [k for k, v in (("inputs", st.inputs), ("gradients", st.grads), ("unsent", st.outbox),
                                   ("unawaited reductions", st.reductions)) if v]
        if leftover or any(ch.micro for ch in self.chunks.values()):
            raise ExecutionError(f"rank {self.rank}: the program left {', '.join(leftover) or 'micro-batches'} "
                                 "behind (an action it needed was not in the program)")
        rec.peak_activation_bytes = float(self.meter.peak)
        rec.chunk_peak_activation_bytes = {c: float(ch.meter.peak) for c, ch in self.chunks.items()}
        rec.cuda_peak_bytes = cuda_peak_bytes(self.device)
        rec.loss = sum(sum(ch.losses.values()) for ch in self.chunks.values())
        return rec

    def params(self) -> dict[str, Any]:
        """This rank's parameters and gradients, keyed by their name in the whole model."""
        out: dict[str, Any] = {}
        if self.zero is not None:  # the replicas' summed parts of each bucket, whole (a collective)
            self.zero.gather_gradients()
        for ch in self.chunks.values():
            if self.mesh is not None:  # gathered whole from the rank's T devices (a collective)
                out.update(full_parameters(ch.named_parameters(), self.model.heads))  # type: ignore[attr-defined]
            else:  # as they are, or FSDP2's shards gathered whole from the D replicas (a collective)
                out.update(whole(ch.named_parameters()))
        return global_names(out, self.experts, getattr(self.model, "experts", 0))


def run_job(job: Job, rank: int, device: torch.device, clock: AlignedClock) -> dict[str, Any]:
    """Run a job's warm-up and measured steps on this rank; rank 0 returns everyone's records."""
    runner = RankRunner(job, rank, device, clock)
    records = [runner.step(s) for s in range(job.warmup + job.steps)]
    if runner.sequence is not None:  # each device's loss is its tokens' share: the group's sum is the step's
        sum_losses(records, runner.sequence.ring.group, device)
    params = runner.params() if job.return_params else None
    # after the timed steps, so that steady state (gradients, optimizer states, buffers) is measured
    memory = runner.step(job.warmup + job.steps, memory=True) if job.memory_step else None
    # A rank's timeline and memory are its c = t = 0 device's (its T x C devices run the same program,
    # and `params` gathered every parameter whole on each): the others send rank 0 nothing to pickle.
    mine = None if rank % runner.width else {
        "records": records[job.warmup:],
        "memory": memory,
        "params": params,
        # this device's (a DTensor's local shard)
        "chunks": {c: {"param_count": sum(q.numel() for q in shards.local),
                       "param_bytes": sum(tensor_bytes(q) for q in shards.local)}
                   for c, shards in runner.shards.items()},
    }
    world = dist.get_world_size()
    gathered: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object(mine, gathered if rank == 0 else None, dst=0)
    if rank != 0:
        return {}
    mesh = job.plan.mesh  # each program rank's (c, t) = (0, 0) process
    return {"tag": job.tag, "ranks": [gathered[mesh.process(g)] for g in range(mesh.num_ranks)],
            "kinds": list(ACTION_KINDS)}


