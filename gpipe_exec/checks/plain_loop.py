"""An independent reference for the executor's measured step: the same model and mini-batch trained
by a plain PyTorch loop in one process, timed with CUDA events (or the wall clock on a CPU)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from gpipe_exec.launch.devices import configure_cuda_math
from gpipe_exec.runtime.update import Update
from gpipe_exec.zoo import build_model, loss_sum, make_batch
from gpipe_sim.scenario.scenario import Scenario
from gpipe_sim.schedule.lower import saves_activations


@dataclass(frozen=True)
class PlainLoop:
    """Median and every timed step of the plain loop, in seconds."""

    step_s: float
    step_times_s: tuple[float, ...]
    device: str


def same_work(scenario: Scenario) -> bool:
    """Whether the executor runs exactly the plain loop's work for this scenario: one stage on one
    process (K = 1, no tensor or data parallelism), so nothing is sent between stages and no
    collective runs. Where it is false the executor adds hand-overs the loop lacks."""
    p = scenario.pipeline
    return p.stages == 1 and p.chunks == 1 and p.tensor_parallel == 1 and p.data_parallel == 1


def plain_step_times(scenario: Scenario, *, steps: int = 5, warmup: int = 2, device: str = "cuda",
                     threads: int = 1) -> PlainLoop:
    """Train `scenario`'s model on its mini-batch for `warmup + steps` steps in this process and time
    the last `steps`: each step zeroes the gradients, runs the M micro-batches (split as the executor
    splits them, `torch.tensor_split`) forward and backward with gradient accumulation, each one
    re-materialized by `torch.utils.checkpoint` where the scenario's remat mode says so, then steps
    the scenario's optimizer (fp32 master weights in mixed precision, as the executor keeps them).

    On CUDA every step is timed between two CUDA events recorded on the current stream (the GPU's
    own time for the step, host issue included where the host is the bottleneck), after the warm-up
    steps have built the kernels, the allocator's cache and cuBLAS's workspaces; TF32 is off, as the
    executor runs fp32. On a CPU the loop runs on `threads` torch threads, as a rank does, and is
    timed by the wall clock."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        configure_cuda_math()
        torch.cuda.set_device(dev)
    else:
        torch.set_num_threads(threads)
    dtype = scenario.training.dtype
    model = build_model(scenario.model, dtype=dtype).to(dev)
    model.train()
    update = Update(list(model.parameters()), scenario)
    x, y = make_batch(scenario.model, scenario.pipeline.batch_size, dtype=dtype)
    M, B = scenario.pipeline.micro_batches, scenario.pipeline.batch_size
    inputs = [t.to(dev) for t in torch.tensor_split(x, M)]
    targets = [t.to(dev) for t in torch.tensor_split(y, M)]

    def step() -> None:
        update.zero_grad(set_to_none=True)
        for m, (xm, ym) in enumerate(zip(inputs, targets)):
            kept = saves_activations(scenario.pipeline.remat, m, M)  # else re-made, as the schedule says
            out = model(xm) if kept else checkpoint(model, xm, use_reentrant=False)
            loss_sum(out, ym, B).backward()
        update.step()

    times: list[float] = []
    for s in range(warmup + steps):
        if dev.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(dev)
            begin.record()
            step()
            end.record()
            torch.cuda.synchronize(dev)
            elapsed = begin.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            step()
            elapsed = time.perf_counter() - t0
        if s >= warmup:
            times.append(elapsed)
    del model, update, inputs, targets
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return PlainLoop(statistics.median(times), tuple(times), dev.type)
