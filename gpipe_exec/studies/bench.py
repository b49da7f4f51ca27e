"""Benchmark (not a test): this executor beside torch.distributed.pipelining (GPipe, 1F1B and
interleaved 1F1B with v chunks per rank), torchgpipe and plain training, on the same model, K and M,
in one run (`python -m gpipe_exec.studies.bench`); prints step-time ratios."""

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
from gpipe_exec.runtime.interpreter import chunk_bounds, run_job
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
                      partition: list[int], schedule: str, chunks: int, steps: int, warmup: int) -> list[float]:
    """torch.distributed.pipelining on this rank: its PipelineStages (chunks r, r+K, ... as torch's
    looped schedules place them) under ScheduleGPipe, Schedule1F1B or ScheduleInterleaved1F1B."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    K, M, B = sc.pipeline.stages, sc.pipeline.micro_batches, sc.pipeline.batch_size
    C = K * chunks
    mine = [rank + i * K for i in range(chunks)]
    modules, stages = [], []
    for c in mine:
        first, last = chunk_bounds(partition, c)
        module = torch.nn.Sequential(*build_layers_range(sc.model, first, last, dropout=0.0)).to(device)
        modules.append(module)
        stages.append(PipelineStage(module, c, C, device))
    optimizer = make_optimizer([p for m in modules for p in m.parameters()], sc.training.optimizer)
    # Loss per micro-batch as a share of the mini-batch mean; scale_grads off so shares add up.
    loss = lambda out, y: loss_sum(out, y, B)  # noqa: E731
    if schedule == "interleaved_1f1b":
        pipe: Any = ScheduleInterleaved1F1B(stages, M, loss_fn=loss, scale_grads=False)
    else:
        cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
        pipe = cls(stages[0], M, loss_fn=loss, scale_grads=False)
    x, y = make_batch(sc.model, B)
    args = (x,) if 0 in mine else ()
    kwargs: dict[str, Any] = {"target": y, "losses": []} if C - 1 in mine else {}

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        pipe.step(*args, **kwargs)
        optimizer.step()

    return _timed_steps(step, steps, warmup, clock)


def _bench_task(rank: int, device: torch.device, clock: AlignedClock, payload: dict[str, Any]) -> Any:
    """On every rank: this executor's jobs, then torch.distributed.pipelining's schedules."""
    out: dict[str, Any] = {"ours": [run_job(job, rank, device, clock) for job in payload["jobs"]]}
    sc = parse_scenario(payload["scenario"])
    for schedule, chunks, partition in payload["torch"]:
        out[f"torch_{schedule}"] = _torch_pipelining(rank, device, clock, sc, partition, schedule, chunks,
                                                     payload["steps"], payload["warmup"])
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


# Our schedules beside torch's: (schedule, whether it runs the --chunks asked for or one chunk per rank).
CONTENDERS = (("gpipe", False), ("1f1b", False), ("interleaved_1f1b", True))
TORCH_NAMES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved_1f1b": "ScheduleInterleaved1F1B"}


def run_benchmark(sc: Scenario, steps: int = 7, warmup: int = 2, chunks: int = 2) -> dict[str, float | str]:
    """Median step seconds of every contender (a string where one could not run). Every contender
    runs with the same malloc settings (`allocator.cache_host_memory`): the ranks set them, and
    this process, which runs torchgpipe and plain training, sets them here. Each schedule runs
    with the simulator's partition for its chunk count, the same for ours and torch's."""
    cache_host_memory()
    cases = []  # (schedule, v, scenario as run, plan)
    for schedule, several in CONTENDERS:
        v = chunks if several else 1
        variant = sc.with_updates({"pipeline.schedule": schedule, "pipeline.chunks": v, "pipeline.remat": "none"})
        plan = check_runnable(variant)
        variant = variant.with_updates({"pipeline.partition": plan.layer_counts})
        cases.append((schedule, v, variant, check_runnable(variant)))
    device_map = cases[0][3].device_map
    shared = len(set(device_map)) < len(device_map)
    variants = [(case, lock) for lock in ((True, False) if shared else (True,)) for case in cases]
    jobs = [job_for(variant, plan, steps=steps, warmup=warmup, dropout=0.0, device_lock=lock)
            for (_, _, variant, plan), lock in variants]
    payload = {"jobs": jobs, "scenario": sc.to_dict(), "steps": steps, "warmup": warmup,
               "torch": [(schedule, v, list(plan.layer_counts)) for schedule, v, _, plan in cases]}
    out = launch(payload, device_map, LaunchOptions(comm_timeout_s=120), task=_bench_task)
    results: dict[str, float | str] = {}
    for ((schedule, v, _, plan), lock), ours in zip(variants, out["ours"]):
        name = _ours(schedule, v) + ("" if lock else " (no device lock: OS time-slicing)")
        results[name] = statistics.median(measured_result(plan, ours).step_times_s)
    for schedule, v, _, _ in cases:
        results[_theirs(schedule, v)] = statistics.median(out[f"torch_{schedule}"])
    cores = len(set(device_map))
    partition = list(cases[0][3].layer_counts)
    tg = _torchgpipe(sc, partition, steps, warmup, threads=1)
    results["torchgpipe 0.0.7 gpipe"] = tg if isinstance(tg, str) else statistics.median(tg)
    results["single process, 1 thread"] = statistics.median(_single_process(sc, steps, warmup, 1))
    results[f"single process, {cores} threads"] = statistics.median(_single_process(sc, steps, warmup, cores))
    return results


def _ours(schedule: str, v: int) -> str:
    return f"gpipe_exec {schedule}" + (f" (v={v})" if v > 1 else "")


def _theirs(schedule: str, v: int) -> str:
    return f"torch.distributed.pipelining {TORCH_NAMES[schedule]}" + (f" (v={v})" if v > 1 else "")


def report(sc: Scenario, results: dict[str, float | str]) -> str:
    p = sc.pipeline
    lines = [f"model {sc.model.preset}, K={p.stages}, M={p.micro_batches}, batch {p.batch_size}, remat none, "
             f"devices {list(sc.device_map)}",
             f"{'contender':64s} {'step (ms)':>10s} {'vs gpipe_exec gpipe':>20s}"]
    base = results["gpipe_exec gpipe"]
    for name, value in results.items():
        if isinstance(value, str):
            lines.append(f"{name:64s} {value}")
        else:
            lines.append(f"{name:64s} {value * 1e3:10.1f} {value / float(base):20.3f}")
    for name, value in results.items():  # ours beside torch's, same schedule and chunks, same run
        if not name.startswith("gpipe_exec ") or "no device lock" in name:
            continue
        label = name[len("gpipe_exec "):]
        schedule, _, v = label.partition(" (v=")
        theirs = results[_theirs(schedule, int(v.rstrip(")")) if v else 1)]
        lines.append(f"{label}: gpipe_exec / torch.distributed.pipelining {TORCH_NAMES[schedule]} = "
                     f"{float(value) / float(theirs):.3f}")
        unlocked = results.get(f"{name} (no device lock: OS time-slicing)")
        if unlocked is not None:
            lines.append(f"{label}: gpipe_exec without device lock / torch.distributed.pipelining = "
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
    parser.add_argument("--chunks", type=int, default=2,
                        help="chunks per rank for interleaved_1f1b, ours and torch's (default 2)")
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
    sys.stdout.write(report(sc, run_benchmark(sc, args.steps, args.warmup, args.chunks)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
