"""Benchmark (not a test): this executor beside torch.distributed.pipelining, torchgpipe and plain
training, on the same model, K and M, in one run (`python -m gpipe_exec.studies.bench`); prints step-time ratios."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Sequence

import torch
import torch.distributed as dist

from gpipe_exec.measure.allocator import cache_host_memory
from gpipe_exec.execute import check_runnable, job_for, measured_result
from gpipe_exec.launch.spawn import LaunchOptions, launch
from gpipe_exec.measure.meters import AlignedClock
from gpipe_exec.runtime.interpreter import run_job, stage_bounds
from gpipe_exec.runtime.chunk import make_optimizer
from gpipe_exec.zoo import build_layers_range, build_model, loss_sum, make_batch
from gpipe_sim.spec.scenario import Scenario, parse_scenario

DEFAULT_MODEL = {"preset": "transformer", "layers": 6, "d_model": 128, "d_ff": 512, "heads": 4,
                 "seq_len": 64, "vocab": 512}


def _timed_steps(step: Any, steps: int, warmup: int, clock: AlignedClock) -> list[float]:
    """Step times on the aligned clock: from the latest barrier exit to the last rank's end."""
    times = []
    for s in range(warmup + steps):
        dist.barrier()
        start = clock()
        step()
        end = clock()
        spans = [None] * dist.get_world_size()
        dist.all_gather_object(spans, (start, end))
        if s >= warmup:
            times.append(max(e for _, e in spans) - min(b for b, _ in spans))
    return times


def _torch_pipelining(rank: int, device: torch.device, clock: AlignedClock, sc: Scenario,
                      partition: list[int], schedule: str, steps: int, warmup: int) -> list[float]:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    K, M, B = sc.pipeline.stages, sc.pipeline.micro_batches, sc.pipeline.batch_size
    first, last = stage_bounds(partition, rank)
    module = torch.nn.Sequential(*build_layers_range(sc.model, first, last, dropout=0.0)).to(device)
    optimizer = make_optimizer(list(module.parameters()), sc.training.optimizer)
    stage = PipelineStage(module, rank, K, device)
    cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    # Loss per micro-batch as a share of the mini-batch mean; scale_grads off so shares add up.
    pipe = cls(stage, M, loss_fn=lambda out, y: loss_sum(out, y, B), scale_grads=False)
    x, y = make_batch(sc.model, B)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        if rank == 0 and rank == K - 1:
            pipe.step(x, target=y)
        elif rank == 0:
            pipe.step(x)
        elif rank == K - 1:
            pipe.step(target=y, losses=[])
        else:
            pipe.step()
        optimizer.step()

    return _timed_steps(step, steps, warmup, clock)


def _bench_task(rank: int, device: torch.device, clock: AlignedClock, payload: dict[str, Any]) -> Any:
    """On every rank: this executor's jobs, then torch.distributed.pipelining with both schedules."""
    out: dict[str, Any] = {"ours": [run_job(job, rank, device, clock) for job in payload["jobs"]]}
    sc = parse_scenario(payload["scenario"])
    for schedule in ("gpipe", "1f1b"):
        out[f"torch_{schedule}"] = _torch_pipelining(rank, device, clock, sc, payload["partition"],
                                                     schedule, payload["steps"], payload["warmup"])
    return out if rank == 0 else None


def _single_process(sc: Scenario, steps: int, warmup: int, threads: int) -> list[float]:
    torch.set_num_threads(threads)
    model = build_model(sc.model, dropout=0.0)
    optimizer = make_optimizer(list(model.parameters()), sc.training.optimizer)
    x, y = make_batch(sc.model, sc.pipeline.batch_size)
    times = []
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss_sum(model(x), y, sc.pipeline.batch_size).backward()
        optimizer.step()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def _torchgpipe(sc: Scenario, partition: list[int], steps: int, warmup: int, threads: int) -> list[float] | str:
    try:
        from torchgpipe import GPipe
    except ImportError as exc:  # an optional extra: pip install -e '.[bench]'
        return f"not available ({exc})"
    torch.set_num_threads(threads)
    K, M, B = sc.pipeline.stages, sc.pipeline.micro_batches, sc.pipeline.batch_size
    model = GPipe(build_model(sc.model, dropout=0.0), balance=partition, devices=["cpu"] * K, chunks=M,
                  checkpoint="never")
    optimizer = make_optimizer(list(model.parameters()), sc.training.optimizer)
    x, y = make_batch(sc.model, B)
    times = []
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss_sum(model(x), y, B).backward()
        optimizer.step()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def run_benchmark(sc: Scenario, steps: int = 7, warmup: int = 2) -> dict[str, float | str]:
    """Median step seconds of every contender (a string where one could not run). Every contender
    runs with the same malloc settings (`allocator.cache_host_memory`): the ranks set them, and
    this process, which runs torchgpipe and plain training, sets them here."""
    cache_host_memory()
    plan = check_runnable(sc)
    partition = [s.last_layer - s.first_layer + 1 for s in plan.stages]
    shared = len(set(plan.device_map)) < len(plan.device_map)
    variants = [(schedule, lock) for lock in ((True, False) if shared else (True,))
                for schedule in ("gpipe", "1f1b")]
    jobs = [job_for(sc.with_updates({"pipeline.schedule": schedule, "pipeline.remat": "none",
                                     "pipeline.partition": partition}),
                    plan, steps=steps, warmup=warmup, dropout=0.0, device_lock=lock)
            for schedule, lock in variants]
    payload = {"jobs": jobs, "scenario": sc.to_dict(), "partition": partition, "steps": steps, "warmup": warmup}
    out = launch(payload, plan.device_map, LaunchOptions(comm_timeout_s=120), task=_bench_task)
    results: dict[str, float | str] = {}
    for (schedule, lock), ours in zip(variants, out["ours"]):
        name = f"gpipe_exec {schedule}" + ("" if lock else " (no device lock: OS time-slicing)")
        results[name] = statistics.median(measured_result(plan, ours).step_times_s)
    for schedule in ("gpipe", "1f1b"):
        results[f"torch.distributed.pipelining {schedule}"] = statistics.median(out[f"torch_{schedule}"])
    cores = len(set(plan.device_map))
    tg = _torchgpipe(sc, partition, steps, warmup, threads=1)
    results["torchgpipe 0.0.7 gpipe"] = tg if isinstance(tg, str) else statistics.median(tg)
    results["single process, 1 thread"] = statistics.median(_single_process(sc, steps, warmup, 1))
    results[f"single process, {cores} threads"] = statistics.median(_single_process(sc, steps, warmup, cores))
    return results


def report(sc: Scenario, results: dict[str, float | str]) -> str:
    p = sc.pipeline
    lines = [f"model {sc.model.preset}, K={p.stages}, M={p.micro_batches}, batch {p.batch_size}, remat none, "
             f"devices {list(sc.device_map)}",
             f"{'contender':58s} {'step (ms)':>10s} {'vs gpipe_exec gpipe':>20s}"]
    base = results["gpipe_exec gpipe"]
    for name, value in results.items():
        if isinstance(value, str):
            lines.append(f"{name:58s} {value}")
        else:
            lines.append(f"{name:58s} {value * 1e3:10.1f} {value / float(base):20.3f}")
    for schedule in ("gpipe", "1f1b"):
        ours, theirs = results[f"gpipe_exec {schedule}"], results[f"torch.distributed.pipelining {schedule}"]
        lines.append(f"{schedule}: gpipe_exec / torch.distributed.pipelining = {float(ours) / float(theirs):.3f}")
        unlocked = results.get(f"gpipe_exec {schedule} (no device lock: OS time-slicing)")
        if unlocked is not None:
            lines.append(f"{schedule}: gpipe_exec without device lock / torch.distributed.pipelining = "
                         f"{float(unlocked) / float(theirs):.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpipe_exec.studies.bench", description=__doc__)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--model", default="transformer", choices=("transformer", "convnet", "mlp"))
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    model = DEFAULT_MODEL if args.model == "transformer" else {"preset": args.model}
    K = args.stages
    sc = parse_scenario({
        "model": model,
        "hardware": {"preset": "cpu", "stage_to_device": [k * 2 // K for k in range(K)] if K > 2 else list(range(K))},
        "pipeline": {"stages": K, "micro_batches": args.micro_batches, "batch_size": args.batch_size,
                     "remat": "none", "partition": "uniform"},
        "training": {"optimizer": "momentum"},
    })
    sys.stdout.write(report(sc, run_benchmark(sc, args.steps, args.warmup)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
