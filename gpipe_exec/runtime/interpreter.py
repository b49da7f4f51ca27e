"""The pipeline runtime: one rank runs its stage's action list from gpipe_sim.schedule, step by step.

Transfers are asynchronous (`isend`/`irecv`): receives are posted ahead (by default every
receive of the step, at its start), sends complete in the background, so communication overlaps
compute wherever the schedule allows. Every action's start and end is recorded on the aligned clock.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from gpipe_exec.runtime.device_lock import device_lock, holding
from gpipe_exec.errors import PeerError
from gpipe_exec.measure.meters import AlignedClock, cuda_peak_bytes
from gpipe_exec.runtime.chunk import Stage, make_optimizer
from gpipe_exec.zoo import TORCH_DTYPES, build_layers_range, loss_sum, make_batch
from gpipe_sim.plan.partition import micro_batch_sizes
from gpipe_sim.spec.scenario import Scenario, parse_scenario
from gpipe_sim.schedule import ACTION_KINDS, COMPUTE_KINDS, Action, Schedule, build_schedule



@dataclass
class Job:
    """One configuration to run: the scenario (with an explicit partition) and how to run it."""

    scenario: Scenario | dict[str, Any]
    partition: list[int]
    schedule: Schedule | None = None  # the parent's action lists (else built from the scenario)
    steps: int = 1
    warmup: int = 0
    seed: int = 0
    dropout: float | None = None
    return_params: bool = False
    device_lock: bool = True  # serialize the compute of stages sharing a device (CPU)
    # Receives posted ahead of the action that needs them: n, 0 (each at its own action), or None:
    # on CPU all of the step's, before it starts; on CUDA each at its action (NCCL runs a pair's
    # sends and receives in order on one stream, so a receive posted ahead would hold back the
    # sends queued behind it). On gloo a receive posted before its send lets the data move as soon
    # as it is sent; posted late, the rendezvous waits for the sender's next wait (measured on the
    # accuracy study's convnet, K=2, M=16: 62-115 ms steps with two ahead, 55-70 ms with all).
    # The price: a buffer per receive, held all step (M boundary tensors per stage and direction).
    recv_window: int | None = None
    # Activations and gradients in process groups of their own (see _Comm); None: on CUDA.
    split_directions: bool | None = None
    fault: dict[str, Any] | None = None  # {"rank", "kind": raise|kill, "step", "action"} (tests)
    tag: str = ""


@dataclass
class StepRecord:
    """One rank's record of one step: per action (kind, micro-batch, start, end) and memory."""

    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    step_start: float = 0.0
    held: list[float] = field(default_factory=list)  # activation bytes held after each action
    peak_activation_bytes: float = 0.0
    cuda_peak_bytes: float | None = None
    loss: float = 0.0


def stage_bounds(partition: list[int], k: int) -> tuple[int, int]:
    """(first, last) layer of stage k for per-stage layer counts."""
    first = sum(partition[:k])
    return first, first + partition[k] - 1


def boundary_shape(scenario: Scenario, layer: int, seed: int, dropout: float | None) -> tuple[int, ...]:
    """Shape (without the batch dimension) of layer `layer`'s output, found on the meta device."""
    model = scenario.model
    x, _ = make_batch(model, 1, seed=seed, dtype=scenario.training.dtype)
    with torch.device("meta"):
        layers = build_layers_range(model, 0, layer, seed=seed, dropout=dropout,
                                    dtype=scenario.training.dtype)
        h = x.to("meta")
        for module in layers:
            h = module(h)
    return tuple(h.shape[1:])


_DIRECTION_GROUPS: tuple[Any, dict[str, Any]] | None = None  # (default group, its two groups)


def direction_groups() -> dict[str, Any]:
    """One process group for activations and one for gradients, made once per default group
    (collective: every rank builds its runner, so every rank gets here in the same order)."""
    global _DIRECTION_GROUPS
    default = dist.distributed_c10d._get_default_group()
    if _DIRECTION_GROUPS is None or _DIRECTION_GROUPS[0] is not default:
        ranks = list(range(dist.get_world_size()))
        _DIRECTION_GROUPS = (default, {"activation": dist.new_group(ranks), "gradient": dist.new_group(ranks)})
    return _DIRECTION_GROUPS[1]


class _Comm:
    """Point-to-point transfers with tags per (tensor, micro-batch) and clear errors on peer failure.

    With `split`, activations and gradients travel in two process groups of their own. NCCL runs a
    pair of ranks' sends and receives in order on one stream per communicator, and a send may
    wait for its receive: in 1F1B a stage's next activation send queued before its gradient
    receive, while its peer's gradient send is queued before that activation's receive, would
    wait on each other forever. Each direction in its own group flows in one order on both ends.
    """

    def __init__(self, rank: int, device: torch.device, split: bool = False) -> None:
        self.rank = rank
        self.device = device
        self.groups: dict[str, Any] = direction_groups() if split else {}

    @staticmethod
    def tag(action: Action) -> int:
        return 2 * action.micro_batch + (0 if action.tensor == "activation" else 1)

    def _guard(self, peer: int, what: str, fn: Any) -> Any:
        try:
            return fn()
        except (RuntimeError, dist.DistError) as exc:
            line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise PeerError(f"rank {self.rank}: {what} rank {peer} failed ({line})") from None

    def isend(self, tensor: torch.Tensor, action: Action) -> Any:
        group = self.groups.get(action.tensor or "")
        return self._guard(action.peer, "send to", lambda: dist.isend(tensor.contiguous(), action.peer,
                                                                    group=group, tag=self.tag(action)))

    def irecv(self, buffer: torch.Tensor, action: Action) -> Any:
        group = self.groups.get(action.tensor or "")
        return self._guard(action.peer, "receive from",
                           lambda: dist.irecv(buffer, action.peer, group=group, tag=self.tag(action)))

    def wait(self, work: Any, action: Action) -> None:
        what = "send to" if action.kind == "send" else "receive from"
        self._guard(action.peer, what, work.wait)


class StageRunner:
    """Runs one rank's stage for a job: builds the layers, data, buffers, and interprets actions."""

    def __init__(self, job: Job, rank: int, device: torch.device, clock: AlignedClock) -> None:
        self.job = job
        self.scenario = job.scenario if isinstance(job.scenario, Scenario) else parse_scenario(job.scenario)
        sc, p = self.scenario, self.scenario.pipeline
        self.rank, self.device, self.clock = rank, device, clock
        self.K = p.stages
        self.schedule = job.schedule or build_schedule(self.K, p.micro_batches, p.schedule, p.remat)
        self.M = self.schedule.micro_batches
        self.actions = self.schedule.actions[rank]
        first, last = stage_bounds(job.partition, rank)
        self.first, self.last = first, last
        dtype = sc.training.dtype
        layers = build_layers_range(sc.model, first, last, seed=job.seed, dropout=job.dropout, dtype=dtype)
        module = torch.nn.Sequential(*layers).to(device)
        self.stage = Stage(rank, self.K, module, device, loss_sum, p.batch_size,
                           make_optimizer(list(module.parameters()), sc.training.optimizer))
        self.sizes = micro_batch_sizes(p.batch_size, self.M)
        x, y = make_batch(sc.model, p.batch_size, seed=job.seed, dtype=dtype)
        self.inputs = [t.to(device) for t in torch.tensor_split(x, self.M)] if rank == 0 else []
        self.targets = [t.to(device) for t in torch.tensor_split(y, self.M)] if rank == self.K - 1 else []
        self.float_dtype = TORCH_DTYPES[dtype]
        self.in_shape = boundary_shape(sc, first - 1, job.seed, job.dropout) if rank > 0 else ()
        self.out_shape = boundary_shape(sc, last, job.seed, job.dropout) if rank < self.K - 1 else ()
        split = job.split_directions if job.split_directions is not None else device.type == "cuda"
        self.comm = _Comm(rank, device, split)
        self._buffers: dict[int, torch.Tensor] = {}
        self.lock = device_lock(rank, sc.device_map) if device.type == "cpu" and job.device_lock else None

    def _buffer(self, index: int) -> torch.Tensor:
        """The receive buffer of action `index`, allocated once and reused every step (nothing of a
        step outlives it), so posting a receive allocates nothing."""
        buf = self._buffers.get(index)
        if buf is None:
            action = self.actions[index]
            shape = self.in_shape if action.tensor == "activation" else self.out_shape
            buf = torch.empty((self.sizes[action.micro_batch], *shape), dtype=self.float_dtype,
                              device=self.device)
            self._buffers[index] = buf
        return buf

    def _fault(self, step: int, index: int) -> None:
        f = self.job.fault
        if f and f.get("rank") == self.rank and f.get("step", 0) == step and f.get("action", 0) == index:
            if f.get("kind") == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected fault at action {index} ({self.actions[index]})")

    def step(self, step: int) -> StepRecord:
        """Run one training step (all actions, ending with the optimizer update)."""
        st, comm, acts, clock = self.stage, self.comm, self.actions, self.clock
        st.zero_grad()
        # Dropout draws from a per-(job seed, step, rank) stream: runs are reproducible.
        torch.manual_seed(1_000_003 * self.job.seed + 1009 * step + self.rank)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        rec = StepRecord(starts=[0.0] * len(acts), ends=[0.0] * len(acts), held=[0.0] * len(acts))
        recv_at = [i for i, a in enumerate(acts) if a.kind == "recv"]
        posted: dict[int, tuple[Any, torch.Tensor]] = {}
        next_post = 0
        window = self.job.recv_window
        if window is None:
            window = 0 if self.device.type == "cuda" else len(recv_at)
        sends: list[tuple[int, Any]] = []
        arrived: dict[tuple[str | None, int], torch.Tensor] = {}
        target = None

        def post_ahead() -> None:
            nonlocal next_post
            while next_post < len(recv_at) and len(posted) < window:
                j = recv_at[next_post]
                buf = self._buffer(j)
                posted[j] = (comm.irecv(buf, acts[j]), buf)
                next_post += 1

        # The step's first receives are posted before the step starts, as a training loop posts
        # the next step's while it finishes this one (posting stalled for up to 5 ms at times here).
        post_ahead()
        dist.barrier()
        rec.step_start = clock()
        for i, a in enumerate(acts):
            post_ahead()
            self._fault(step, i)
            m = a.micro_batch
            if st.is_last and m >= 0:
                target = self.targets[m]
            # Stages sharing a device compute one at a time; the action starts once it has the device.
            with holding(self.lock if a.kind in COMPUTE_KINDS else None):
                rec.starts[i] = clock()
                if a.kind == "recv":
                    if i not in posted:  # not posted ahead: post it now
                        next_post += 1
                        buf = self._buffer(i)
                        posted[i] = (comm.irecv(buf, a), buf)
                    work, buf = posted.pop(i)
                    comm.wait(work, a)
                    arrived[(a.tensor, m)] = buf
                elif a.kind == "forward":
                    x = self.inputs[m] if st.is_first else arrived.pop(("activation", m))
                    out = st.forward(m, x, target, a.save)
                    arrived[("output", m)] = out
                elif a.kind == "recompute":
                    st.recompute(m, target)
                elif a.kind == "backward":
                    grad = st.backward(m, None if st.is_last else arrived.pop(("gradient", m)))
                    if grad is not None:
                        arrived[("input_grad", m)] = grad
                elif a.kind == "send":
                    key = ("output", m) if a.tensor == "activation" else ("input_grad", m)
                    sends.append((i, comm.isend(arrived.pop(key), a)))
                elif a.kind == "update":
                    st.update()
                now = clock()
            if a.kind != "send":
                rec.ends[i] = now
            rec.held[i] = float(st.meter.total)
            still = []
            for j, work in sends:
                if work.is_completed():
                    rec.ends[j] = now
                else:
                    still.append((j, work))
            sends = still
        for j, work in sends:
            comm.wait(work, acts[j])
            rec.ends[j] = clock()
        rec.peak_activation_bytes = float(st.meter.peak)
        rec.cuda_peak_bytes = cuda_peak_bytes(self.device)
        rec.loss = sum(st.losses.values())
        return rec

    def params(self) -> dict[str, Any]:
        """This stage's parameters and gradients, keyed by their name in the whole model."""
        out: dict[str, Any] = {}
        for name, p in self.stage.module.named_parameters():
            idx, rest = name.split(".", 1)
            key = f"{self.first + int(idx)}.{rest}"
            out[key] = (p.detach().cpu().clone(), None if p.grad is None else p.grad.detach().cpu().clone())
        return out


def run_job(job: Job, rank: int, device: torch.device, clock: AlignedClock) -> dict[str, Any]:
    """Run a job's warm-up and measured steps on this rank; rank 0 returns everyone's records."""
    runner = StageRunner(job, rank, device, clock)
    records = [runner.step(s) for s in range(job.warmup + job.steps)]
    mine = {
        "records": records[job.warmup:],
        "params": runner.params() if job.return_params else None,
        "param_count": sum(p.numel() for p in runner.stage.module.parameters()),
        "param_bytes": sum(tensor_nbytes(p) for p in runner.stage.module.parameters()),
    }
    world = dist.get_world_size()
    gathered: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object(mine, gathered if rank == 0 else None, dst=0)
    if rank != 0:
        return {}
    return {"tag": job.tag, "ranks": gathered, "kinds": list(ACTION_KINDS)}


def tensor_nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
