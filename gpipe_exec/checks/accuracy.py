"""Accuracy study: predicted versus measured over a grid of scenarios on this machine (`python -m
gpipe_exec.checks.accuracy`), or over cases drawn at random (`--random N --seed S`); prints the
table with the median and worst errors."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from typing import Any, Sequence

from rich.progress import Progress

from gpipe_exec.calibration.runtime import calibrate_runtime
from gpipe_exec.checks.shared_devices import calibrate_shared
from gpipe_exec.launch.spawn import LaunchOptions, launch
from gpipe_exec.profile import CLOCKS, ProfileOptions
from gpipe_exec.checks.plan_check import DEFAULT_SCHEDULES
from gpipe_exec.checks.random_cases import DEVICE_MAPS, case_text, draw_cases
from gpipe_exec.checks.rounds import Round, compare_rounds
from gpipe_exec.checks.validate import calibration_text, combine_rounds, relative_errors
from gpipe_sim.schedule import schedule_family
from gpipe_sim.model.layers import layer_count
from gpipe_sim.scenario.scenario import Scenario, parse_scenario

MODELS: dict[str, dict[str, Any]] = {
    "transformer": {"preset": "transformer", "layers": 6, "d_model": 128, "d_ff": 512, "heads": 4,
                    "seq_len": 64, "vocab": 512},
    "convnet": {"preset": "convnet", "layers": 6, "channels": 16, "image_size": 32, "num_classes": 10},
}


def base_scenario(model: str, K: int, batch: int) -> Scenario:
    return parse_scenario({
        "model": MODELS[model],
        "hardware": {"preset": "cpu", "stage_to_device": DEVICE_MAPS[K]},
        "pipeline": {"stages": K, "micro_batches": 1, "batch_size": batch, "schedule": "gpipe",
                     "remat": "none", "partition": "time"},
        "training": {"optimizer": "momentum"},
    })


def _row(sc: Scenario, done: list[Round]) -> dict[str, Any]:
    """One case's row from its rounds, compared as `gpipe-exec validate --rounds` compares them
    (`combine_rounds`: the median prediction beside the median measured step)."""
    v = combine_rounds(done, None)
    predicted = [r.predicted for r in done]
    measured = [r.measured.result for r in done]
    per_round = [m.step_time_s for m in measured]
    predicted_round = [p.step_time_s for p in predicted]
    # per stage: predicted peak memory against the tracker's measurement (not the accounting check)
    memory = [err for r in done for name, err in relative_errors(r.predicted, r.measured.result).items()
              if name.startswith("stage") and name.endswith(".peak_memory_bytes")]
    return {
        "model": sc.model.preset, "K": sc.pipeline.stages, "M": sc.pipeline.micro_batches,
        "schedule": sc.pipeline.schedule_name, "v": sc.pipeline.chunks, "remat": sc.pipeline.remat,
        "predicted_step_s": v.predicted.step_time_s, "measured_step_s": v.measured.result.step_time_s,
        "step_time_error": v.relative_error["step_time_s"],
        "predicted_round_s": [p.step_time_s for p in predicted], "measured_round_s": per_round,
        # How far the case's own measurements disagree: the noise floor of its error.
        "measured_spread": (max(per_round) - min(per_round)) / v.measured.result.step_time_s,
        # How far the case's own predictions disagree (each round's profile): the profile's noise.
        "predicted_spread": (max(predicted_round) - min(predicted_round)) / v.predicted.step_time_s,
        "case": case_text(done[0].scenario), "batch": sc.pipeline.batch_size,
        "bubble_predicted": v.predicted.bubble_fraction, "bubble_measured": v.measured.result.bubble_fraction,
        "memory_error": max(memory), "load_average": os.getloadavg()[0],
    }


def grid(base: Scenario, Ms: Sequence[int], schedules: Sequence[str], chunks: Sequence[int],
         remats: Sequence[str]) -> list[Scenario]:
    """Every (M, schedule, chunks per rank, remat) that the schedule's family accepts for this K
    (gpipe, 1f1b and zb_h1 run one chunk per rank; interleaved_1f1b several when M is a multiple
    of K; zbv exactly two, dualpipev two with M >= 2K)."""
    K = base.pipeline.stages
    return [base.with_updates({"pipeline.micro_batches": M, "pipeline.schedule": schedule,
                               "pipeline.chunks": v, "pipeline.remat": remat})
            for M, schedule, v, remat in itertools.product(Ms, schedules, chunks, remats)
            if schedule_family(schedule).problem(K, M, v) is None and M <= base.pipeline.batch_size
            and K * v <= layer_count(base.model)]


def run_group(model: str, K: int, Ms: Sequence[int], schedules: Sequence[str], remats: Sequence[str],
              batch: int, steps: int, warmup: int, options: LaunchOptions, calibration: Any,
              repeats: int = ProfileOptions.repeats, concurrent: bool = True, rounds: int = 3,
              chunks: Sequence[int] = (1,), clock: str = ProfileOptions.clock) -> list[dict[str, Any]]:
    """Every (M, schedule, chunks, remat) for this model and K, in one process group (`compare_rounds`)."""
    cases = grid(base_scenario(model, K, batch), Ms, schedules, chunks, remats)
    return run_cases(cases, steps, warmup, options, calibration, ProfileOptions(repeats=repeats, clock=clock),
                     concurrent=concurrent, rounds=rounds)


def run_cases(cases: Sequence[Scenario], steps: int, warmup: int, options: LaunchOptions, calibration: Any,
              profile: ProfileOptions = ProfileOptions(), concurrent: bool = True,
              rounds: int = 3) -> list[dict[str, Any]]:
    """Rows of `cases` (all on one device map), compared in one process group (`compare_rounds`)."""
    payload = {"cases": list(cases), "calibration": calibration, "steps": steps, "warmup": warmup,
               "rounds": rounds, "profile": profile, "alone": not concurrent}
    done = launch(payload, cases[0].mesh.process_devices(), options, task=compare_rounds)
    return [_row(sc, rounds_of_case) for sc, rounds_of_case in zip(cases, done)]


def random_markdown(rows: list[dict[str, Any]]) -> str:
    """One line per drawn case (predicted and measured step, error, both spreads over the rounds,
    the worst stage's peak-memory error), then the median and worst errors and how many cases fall
    within their measured spread."""
    lines = ["| # | case | predicted | measured | error | measured spread | predicted spread | error within spread "
             "| peak memory error (worst stage) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows):
        signed = (r["predicted_step_s"] - r["measured_step_s"]) / r["measured_step_s"]
        lines.append(f"| {i} | {r['case']} | {1e3 * r['predicted_step_s']:.1f} ms | {1e3 * r['measured_step_s']:.1f} ms "
                     f"| {100 * signed:+.1f}% | {100 * r['measured_spread']:.1f}% | {100 * r['predicted_spread']:.1f}% "
                     f"| {'yes' if r['step_time_error'] <= r['measured_spread'] else 'no'} "
                     f"| {100 * r['memory_error']:.2f}% |")
    step = [r["step_time_error"] for r in rows]
    within = sum(r["step_time_error"] <= r["measured_spread"] for r in rows)
    steadier = sum(r["predicted_spread"] <= r["measured_spread"] for r in rows)
    lines.append("")
    lines.append(f"{len(rows)} cases. Step time: median error {100 * statistics.median(step):.1f}%, worst "
                 f"{100 * max(step):.1f}%; {within}/{len(rows)} within their measured spread. Spread over the "
                 f"rounds, (max-min)/median: measured median {100 * statistics.median(r['measured_spread'] for r in rows):.1f}%, "
                 f"predicted median {100 * statistics.median(r['predicted_spread'] for r in rows):.1f}%; "
                 f"{steadier}/{len(rows)} cases predicted no more spread than measured. Peak memory per "
                 f"stage, measured by the tracker (worst stage of each case): median "
                 f"{100 * statistics.median(r['memory_error'] for r in rows):.2f}%, worst "
                 f"{100 * max(r['memory_error'] for r in rows):.2f}%.")
    return "\n".join(lines)


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table: one line per (model, K, schedule, remat) with the errors over M, then a summary."""
    lines = ["| model | K | schedule | v | remat | step-time error per M (M) "
             "| measured spread over rounds per M | peak memory error (worst stage) |",
             "|---|---|---|---|---|---|---|---|"]
    key = lambda r: (r["model"], r["K"], r["schedule"], r.get("v", 1), r["remat"])  # noqa: E731
    for group, items in itertools.groupby(sorted(rows, key=key), key=key):
        items = sorted(items, key=lambda r: r["M"])
        errs = " / ".join(f"{100 * r['step_time_error']:.1f}% ({r['M']})" for r in items)
        spreads = " / ".join(f"{100 * r['measured_spread']:.1f}%" for r in items)
        mem = max(r["memory_error"] for r in items)
        lines.append(f"| {group[0]} | {group[1]} | {group[2]} | {group[3]} | {group[4]} | {errs} | {spreads} "
                     f"| {100 * mem:.2f}% |")
    step = [r["step_time_error"] for r in rows]
    mem = [r["memory_error"] for r in rows]
    spread = [r["measured_spread"] for r in rows]
    within = sum(e <= 0.05 for e in step)
    signed = statistics.median((r["predicted_step_s"] - r["measured_step_s"]) / r["measured_step_s"] for r in rows)
    lines.append("")
    lines.append(f"{len(rows)} runs. Step time: median error {100 * statistics.median(step):.1f}%, "
                 f"worst {100 * max(step):.1f}%, {within}/{len(rows)} within 5%, signed median "
                 f"{100 * signed:+.1f}% (+: predicted longer). Peak memory per stage (worst stage of each case, "
                 f"measured by the tracker): median {100 * statistics.median(mem):.2f}%, worst "
                 f"{100 * max(mem):.2f}%. "
                 f"Measured step of a case, spread over its rounds (max-min)/median: median "
                 f"{100 * statistics.median(spread):.1f}%, worst {100 * max(spread):.1f}%.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpipe_exec.checks.accuracy", description=__doc__)
    parser.add_argument("--random", type=int, metavar="N",
                        help="draw N cases at random (model family, sizes, batch, M, schedule, chunks, "
                             "remat; random_cases.py) instead of the fixed grid; needs --seed")
    parser.add_argument("--seed", type=int, help="with --random: the seed the cases are drawn from")
    parser.add_argument("--k", type=int, default=2, choices=sorted(DEVICE_MAPS),
                        help="with --random: stages (4 shares the two cores; default 2)")
    parser.add_argument("--models", default="transformer,convnet")
    parser.add_argument("--stages", default="2,4")
    parser.add_argument("--micro-batches", default="1,2,4,8,16")
    parser.add_argument("--schedules", default=",".join(DEFAULT_SCHEDULES),
                        help=f"comma-separated schedule families (default {','.join(DEFAULT_SCHEDULES)}); "
                             f"each runs the cases its family accepts")
    parser.add_argument("--chunks", default="1,2",
                        help="chunks per rank; each schedule runs those its family accepts (default 1,2)")
    parser.add_argument("--remat", default="none,always")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5, help="measured steps per case and round")
    parser.add_argument("--rounds", type=int, default=3,
                        help="passes over the grid; each case is profiled, predicted and run once per pass")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", metavar="FILE", help="also write every row as JSON")
    parser.add_argument("--profile-clock", choices=CLOCKS, default=ProfileOptions.clock,
                        help="what the profile times on CPU: the thread's CPU time (default; the work, "
                             "steady on a shared machine) or wall time (the core's share included)")
    parser.add_argument("--profile-alone", action="store_true",
                        help="profile on rank 0 while the other devices idle (default: every device "
                             "profiles at once, as in the pipeline's steady state)")
    args = parser.parse_args(argv)
    for name in args.schedules.split(","):
        try:
            schedule_family(name)
        except ValueError as exc:  # ScheduleError names the choices
            parser.error(f"--schedules: {exc}")
    if args.random is not None and (args.random < 1 or args.random > 1000):
        parser.error(f"--random: draw between 1 and 1000 cases, got {args.random}")
    if args.random is not None and args.seed is None:
        parser.error("--seed: --random needs a seed (choose it after the code is frozen)")
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps: at least 1")
    options = LaunchOptions(comm_timeout_s=120, run_timeout_s=3600)
    if args.random is not None:
        return random_study(args, options)
    Ms = [int(v) for v in args.micro_batches.split(",")]
    groups = [(m, int(k)) for m in args.models.split(",") for k in args.stages.split(",")]
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with Progress() as bar:
        task = bar.add_task("calibrating the runtime", total=len(groups) + 1)
        calibration = calibrate_runtime((0, 1), options=options)
        bar.advance(task)
        shared: dict[int, Any] = {}
        for model, K in groups:
            if len(set(DEVICE_MAPS[K])) < K and K not in shared:
                bar.update(task, description=f"K={K}: calibrating the shared devices")
                shared[K] = calibrate_shared(calibration, DEVICE_MAPS[K], options=options)
            bar.update(task, description=f"{model} K={K}: profile and run")
            rows += run_group(model, K, Ms, args.schedules.split(","), args.remat.split(","),
                              args.batch_size, args.steps, args.warmup, options, shared.get(K, calibration),
                              concurrent=not args.profile_alone, rounds=args.rounds,
                              chunks=[int(v) for v in args.chunks.split(",")], clock=args.profile_clock)
            bar.advance(task)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"calibration": calibration.to_dict(),
                       "shared": {str(K): fit.to_dict() for K, fit in shared.items()}, "rows": rows}, f, indent=1)
    sys.stdout.write(markdown(rows) + "\n")
    loads = [r["load_average"] for r in rows]
    sys.stdout.write(f"(1-minute load average during the runs: {min(loads):.1f} to {max(loads):.1f} on "
                     f"{os.cpu_count()} cores)\n")
    for K, fit in sorted(shared.items()):
        sys.stdout.write(f"(K={K}, shared devices: host times x{fit.shared_scale:.2f})\n")
    sys.stdout.write(f"({calibration_text(calibration)}; {time.monotonic() - t0:.0f} s)\n")
    return 0


def random_study(args: argparse.Namespace, options: LaunchOptions) -> int:
    """`--random N --seed S`: draw the cases, calibrate (and for shared cores the shared scale),
    run them all in one process group, print the per-case table and write the JSON."""
    cases = draw_cases(args.random, args.seed, args.k)
    t0, load0 = time.monotonic(), os.getloadavg()
    calibration = calibrate_runtime((0, 1), options=options)
    fit = calibration
    if len(set(DEVICE_MAPS[args.k])) < args.k:
        fit = calibrate_shared(calibration, DEVICE_MAPS[args.k], options=options)
    rows = run_cases(cases, args.steps, args.warmup, options, fit, ProfileOptions(clock=args.profile_clock),
                     concurrent=not args.profile_alone, rounds=args.rounds)
    load1 = os.getloadavg()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": args.seed, "k": args.k, "rounds": args.rounds, "steps": args.steps,
                       "profile_clock": args.profile_clock,
                       "load_average_start": load0, "load_average_end": load1,
                       "calibration": fit.to_dict(), "rows": rows}, f, indent=1)
    sys.stdout.write(random_markdown(rows) + "\n")
    sys.stdout.write(f"(seed {args.seed}, K={args.k}, profile clock {args.profile_clock}; load average (1, 5, 15 min) {load0[0]:.1f}/{load0[1]:.1f}/"
                     f"{load0[2]:.1f} at the start, {load1[0]:.1f}/{load1[1]:.1f}/{load1[2]:.1f} at the end, on "
                     f"{os.cpu_count()} cores; {calibration_text(fit)}; {time.monotonic() - t0:.0f} s)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
