"""Benchmark (not a test): this executor beside torch.distributed.pipelining (GPipe, 1F1B,
interleaved 1F1B and interleaved zero bubble with v chunks per rank, ZB-V and DualPipeV with two
chunks per rank in a V), torchgpipe and plain training, on the same model, K and M, in one run
(`python -m gpipe_exec.checks.executor_bench`); prints step-time ratios, ours / torch's."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Sequence

import torch
import torch.distributed as dist

from gpipe_exec.measure.allocator import cache_host_memory
from gpipe_exec.execute import check_runnable
from gpipe_exec.measure.steps import measured_result
from gpipe_exec.runtime.job import job_for
from gpipe_exec.launch.spawn import LaunchOptions, launch
from gpipe_exec.measure.meters import AlignedClock
from gpipe_exec.runtime.interpreter import run_job
from gpipe_exec.runtime.update import Update
from gpipe_exec.zoo import build_layers_range, build_model, loss_sum, make_batch
from gpipe_sim.schedule import schedule_family
from gpipe_sim.schedule.registry import rank_chunks
from gpipe_sim.scenario.scenario import Scenario, parse_scenario

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


def _torch_schedule(schedule: str) -> Any:
    """torch.distributed.pipelining's class for one of our schedule names."""
    from torch.distributed import pipelining

    return getattr(pipelining, TORCH_NAMES[schedule])


def _torch_pipelining(rank: int, device: torch.device, clock: AlignedClock, sc: Scenario,
                      bounds: list[tuple[int, int]], schedule: str, chunks: int, steps: int,
                      warmup: int) -> list[float]:
    """torch.distributed.pipelining on this rank: its PipelineStages, placed as our schedule family
    places its chunks (looped: r, r+K, ...; the V of ZB-V and DualPipeV: r and 2K-1-r, which torch's
    `generate_stage_to_rank_mapping(style="v")` gives too), under the torch schedule of that name."""
    from torch.distributed.pipelining import PipelineStage

    K, M, B = sc.pipeline.stages, sc.pipeline.micro_batches, sc.pipeline.batch_size
    C = K * chunks
    placement = schedule_family(schedule).placement(K, chunks)
    mine = rank_chunks(placement, K)[rank]
    modules, stages = [], []
    for c in mine:
        first, last = bounds[c]
        module = torch.nn.Sequential(*build_layers_range(sc.model, first, last, dropout=0.0)).to(device)
        modules.append(module)
        stages.append(PipelineStage(module, c, C, device))
    update = Update([p for m in modules for p in m.parameters()], sc)
    # Loss per micro-batch as a share of the mini-batch mean; scale_grads off so shares add up.
    loss = lambda out, y: loss_sum(out, y, B)  # noqa: E731
    cls = _torch_schedule(schedule)
    if schedule in MULTI_STAGE:
        pipe: Any = cls(stages, M, loss_fn=loss, scale_grads=False)
    else:
        pipe = cls(stages[0], M, loss_fn=loss, scale_grads=False)
    x, y = make_batch(sc.model, B)
    args = (x,) if 0 in mine else ()
    kwargs: dict[str, Any] = {"target": y, "losses": []} if C - 1 in mine else {}

    def step() -> None:
        update.zero_grad(set_to_none=True)
        pipe.step(*args, **kwargs)
        update.step()

    return _timed_steps(step, steps, warmup, clock)


def bench_order(jobs: int, schedules: int, rounds: int) -> list[tuple[str, int]]:
    """The order the contenders run in: per schedule, ours ("ours", job) then torch's ("torch",
    schedule), the next round in reverse (ABBA), so that a load that drifts during the launch
    weighs on both sides alike. With two jobs per schedule (with and without the device lock),
    job j belongs to schedule j % schedules."""
    once: list[tuple[str, int]] = []
    for i in range(schedules):
        once += [("ours", j) for j in range(i, jobs, schedules)] + [("torch", i)]
    return [step for r in range(rounds) for step in (once if r % 2 == 0 else once[::-1])]


def _bench_task(rank: int, device: torch.device, clock: AlignedClock, payload: dict[str, Any]) -> Any:
    """On every rank: this executor's jobs and torch.distributed.pipelining's schedules, in
    `bench_order`; every run's results (ours) or step times (torch's), in that order."""
    sc = parse_scenario(payload["scenario"])
    out: list[Any] = []
    for side, i in payload["order"]:
        if side == "ours":
            out.append(run_job(payload["jobs"][i], rank, device, clock))
        else:
            schedule, chunks, bounds = payload["torch"][i]
            out.append(_torch_pipelining(rank, device, clock, sc, bounds, schedule, chunks,
                                         payload["steps"], payload["warmup"]))
    return out if rank == 0 else None


def _single_process(sc: Scenario, steps: int, warmup: int, threads: int) -> list[float]:
    torch.set_num_threads(threads)
    model = build_model(sc.model, dropout=0.0)
    update = Update(list(model.parameters()), sc)
    x, y = make_batch(sc.model, sc.pipeline.batch_size)
    times = []
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        update.zero_grad(set_to_none=True)
        loss_sum(model(x), y, sc.pipeline.batch_size).backward()
        update.step()
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
    update = Update(list(model.parameters()), sc)
    x, y = make_batch(sc.model, B)
    times = []
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        update.zero_grad(set_to_none=True)
        loss_sum(model(x), y, B).backward()
        update.step()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
    return times


# Our schedules beside torch's: (schedule, chunks per rank: 1, "asked" for --chunks, or a fixed count).
CONTENDERS: tuple[tuple[str, int | str], ...] = (
    ("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", "asked"),
    ("interleaved_zb", "asked"), ("zbv", 2), ("dualpipev", 2))
TORCH_NAMES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved_1f1b": "ScheduleInterleaved1F1B",
               "interleaved_zb": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble",
               "dualpipev": "ScheduleDualPipeV"}
MULTI_STAGE = {"interleaved_1f1b", "interleaved_zb", "zbv", "dualpipev"}  # torch takes a list of stages


def contender_cases(sc: Scenario, chunks: int = 2, schedules: Sequence[str] | None = None
                    ) -> tuple[list[tuple[str, int, Scenario, Any]], dict[str, str]]:
    """The contenders that can run (schedule, v, scenario as run, plan), each with the simulator's
    partition for its chunk count, and why the others cannot (by schedule)."""
    wanted = [c for c in CONTENDERS if schedules is None or c[0] in schedules]
    cases, skipped = [], {}
    for schedule, rule in wanted:
        v = chunks if rule == "asked" else int(rule)
        problem = schedule_family(schedule).problem(sc.pipeline.stages, sc.pipeline.micro_batches, v)
        if problem is not None:
            skipped[schedule] = problem
            continue
        variant = sc.with_updates({"pipeline.schedule": schedule, "pipeline.chunks": v, "pipeline.remat": "none"})
        plan = check_runnable(variant)
        variant = variant.with_updates({"pipeline.partition": plan.layer_counts})
        cases.append((schedule, v, variant, check_runnable(variant)))
    return cases, skipped


def run_benchmark(sc: Scenario, steps: int = 7, warmup: int = 2, chunks: int = 2,
                  schedules: Sequence[str] | None = None, extras: bool = True,
                  rounds: int = 1) -> dict[str, float | str]:
    """Median step seconds of every contender (a string where one could not run). Every contender
    runs with the same malloc settings (`allocator.cache_host_memory`): the ranks set them, and
    this process, which runs torchgpipe and plain training, sets them here. Each schedule runs
    with the simulator's partition for its chunk count, the same for ours and torch's.
    `schedules`: only these of CONTENDERS; `extras`: torchgpipe and plain training too; `rounds`:
    passes over the contenders (`bench_order`), the median taken over every round's steps."""
    cache_host_memory()
    cases, skipped = contender_cases(sc, chunks, schedules)
    if not cases:
        raise ValueError("no contender can run: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    device_map = cases[0][3].mesh.process_devices()
    shared = len(set(device_map)) < len(device_map)
    variants = [(case, lock) for lock in ((True, False) if shared else (True,)) for case in cases]
    jobs = [job_for(plan, steps=steps, warmup=warmup, dropout=0.0, device_lock=lock)
            for (_, _, variant, plan), lock in variants]
    order = bench_order(len(jobs), len(cases), max(1, rounds))
    payload = {"jobs": jobs, "scenario": sc.to_dict(), "steps": steps, "warmup": warmup, "order": order,
               "torch": [(schedule, v, list(plan.layout.chunk_layers)) for schedule, v, _, plan in cases]}
    out = launch(payload, device_map, LaunchOptions(comm_timeout_s=120), task=_bench_task)
    ours_times: dict[int, list[float]] = {}
    torch_times: dict[int, list[float]] = {}
    for (side, i), got in zip(order, out):
        if side == "ours":
            ours_times.setdefault(i, []).extend(measured_result(variants[i][0][3], got).step_times_s)
        else:
            torch_times.setdefault(i, []).extend(got)
    results: dict[str, float | str] = {}
    for j, ((schedule, v, _, plan), lock) in enumerate(variants):
        name = _ours(schedule, v) + ("" if lock else " (no device lock: OS time-slicing)")
        results[name] = statistics.median(ours_times[j])
    for i, (schedule, v, _, _) in enumerate(cases):
        results[_theirs(schedule, v)] = statistics.median(torch_times[i])
    for schedule, problem in skipped.items():
        results[_ours(schedule, 1)] = f"not run: {problem}"
    if not extras:
        return results
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
             f"devices {list(sc.mesh.rank_devices)}",
             f"{'contender':64s} {'step (ms)':>10s} {'vs gpipe_exec gpipe':>20s}"]
    base = results.get("gpipe_exec gpipe")
    if not isinstance(base, float):
        base = None
    for name, value in results.items():
        if isinstance(value, str):
            lines.append(f"{name:64s} {value}")
        else:
            ratio = f"{value / base:20.3f}" if base else f"{'-':>20s}"
            lines.append(f"{name:64s} {value * 1e3:10.1f} {ratio}")
    for name, value in results.items():  # ours beside torch's, same schedule and chunks, same run
        if not name.startswith("gpipe_exec ") or "no device lock" in name or isinstance(value, str):
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
    parser = argparse.ArgumentParser(prog="python -m gpipe_exec.checks.executor_bench", description=__doc__)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--model", default="transformer", choices=("transformer", "convnet", "mlp"))
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--chunks", type=int, default=2,
                        help="chunks per rank for interleaved_1f1b and interleaved_zb, ours and torch's "
                             "(default 2; zbv and dualpipev always run 2)")
    parser.add_argument("--schedules", default=",".join(name for name, _ in CONTENDERS),
                        help="which of ours beside torch's, comma-separated (default: all; dualpipev "
                             "needs M >= 2K)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="passes over the contenders, each schedule's ours and torch's back to back, "
                             "every other pass in reverse order (default 2)")
    parser.add_argument("--no-extras", action="store_true",
                        help="leave out torchgpipe and plain single-process training")
    args = parser.parse_args(argv)
    schedules = [s.strip() for s in args.schedules.split(",") if s.strip()]
    unknown = sorted(set(schedules) - set(TORCH_NAMES))
    if unknown:
        parser.error(f"--schedules: unknown {', '.join(unknown)} (choose from {', '.join(TORCH_NAMES)})")
    model = DEFAULT_MODEL if args.model == "transformer" else {"preset": args.model}
    K = args.stages
    sc = parse_scenario({
        "model": model,
        "hardware": {"preset": "cpu", "stage_to_device": [k * 2 // K for k in range(K)] if K > 2 else list(range(K))},
        "pipeline": {"stages": K, "micro_batches": args.micro_batches, "batch_size": args.batch_size,
                     "remat": "none", "partition": "uniform"},
        "training": {"optimizer": "momentum"},
    })
    t0 = time.monotonic()
    results = run_benchmark(sc, args.steps, args.warmup, args.chunks, schedules, extras=not args.no_extras,
                            rounds=args.rounds)
    sys.stdout.write(report(sc, results) + "\n")
    sys.stdout.write(f"(1-minute load average after the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
                     f"cores; {time.monotonic() - t0:.0f} s)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
