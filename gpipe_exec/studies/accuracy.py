"""Accuracy study: predicted versus measured over a grid of scenarios on this machine (`python -m
gpipe_exec.studies.accuracy`); prints the README's table with the median and worst errors."""

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

from gpipe_exec.studies.calibrate import calibrate_runtime
from gpipe_exec.studies.calibrate_shared import calibrate_shared
from gpipe_exec.launch.spawn import LaunchOptions, launch
from gpipe_exec.profile import ProfileOptions
from gpipe_exec.studies.rounds import Round, compare_rounds
from gpipe_exec.studies.validate import calibration_text, combine_rounds, relative_errors
from gpipe_sim.schedule import schedule_family
from gpipe_sim.spec.layers import layer_count
from gpipe_sim.spec.scenario import Scenario, parse_scenario

MODELS: dict[str, dict[str, Any]] = {
    "transformer": {"preset": "transformer", "layers": 6, "d_model": 128, "d_ff": 512, "heads": 4,
                    "seq_len": 64, "vocab": 512},
    "convnet": {"preset": "convnet", "layers": 6, "channels": 16, "image_size": 32, "num_classes": 10},
}
DEVICE_MAPS = {2: [0, 1], 4: [0, 0, 1, 1]}  # K=4 shares the two cores, and the hardware says so
# The schedules the study runs by default (--schedules picks others, any registered family):
# zb_h1 runs one chunk per rank, zbv two in a V; each only the (M, v) its family accepts.
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv")


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
    memory = [err for r in done for name, err in relative_errors(r.predicted, r.measured.result).items()
              if name.endswith("peak_activation_bytes")]
    return {
        "model": sc.model.preset, "K": sc.pipeline.stages, "M": sc.pipeline.micro_batches,
        "schedule": sc.pipeline.schedule_name, "v": sc.pipeline.chunks, "remat": sc.pipeline.remat,
        "predicted_step_s": v.predicted.step_time_s, "measured_step_s": v.measured.result.step_time_s,
        "step_time_error": v.relative_error["step_time_s"],
        "predicted_round_s": [p.step_time_s for p in predicted], "measured_round_s": per_round,
        # How far the case's own measurements disagree: the noise floor of its error.
        "measured_spread": (max(per_round) - min(per_round)) / v.measured.result.step_time_s,
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
              repeats: int = 5, concurrent: bool = True, rounds: int = 3,
              chunks: Sequence[int] = (1,)) -> list[dict[str, Any]]:
    """Every (M, schedule, chunks, remat) for this model and K, in one process group (`compare_rounds`)."""
    cases = grid(base_scenario(model, K, batch), Ms, schedules, chunks, remats)
    payload = {"cases": cases, "calibration": calibration, "steps": steps, "warmup": warmup, "rounds": rounds,
               "profile": ProfileOptions(warmup=1, repeats=repeats), "alone": not concurrent}
    done = launch(payload, DEVICE_MAPS[K], options, task=compare_rounds)
    return [_row(sc, rounds_of_case) for sc, rounds_of_case in zip(cases, done)]


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table: one line per (model, K, schedule, remat) with the errors over M, then a summary."""
    lines = ["| model | K | schedule | v | remat | step-time error per M (M) "
             "| measured spread over rounds per M | peak activation error (max) |",
             "|---|---|---|---|---|---|---|---|"]
    key = lambda r: (r["model"], r["K"], r["schedule"], r.get("v", 1), r["remat"])  # noqa: E731
    for group, items in itertools.groupby(sorted(rows, key=key), key=key):
        items = sorted(items, key=lambda r: r["M"])
        errs = " / ".join(f"{100 * r['step_time_error']:.1f}% ({r['M']})" for r in items)
        spreads = " / ".join(f"{100 * r['measured_spread']:.1f}%" for r in items)
        mem = max(r["memory_error"] for r in items)
        lines.append(f"| {group[0]} | {group[1]} | {group[2]} | {group[3]} | {group[4]} | {errs} | {spreads} "
                     f"| {100 * mem:.3f}% |")
    step = [r["step_time_error"] for r in rows]
    mem = [r["memory_error"] for r in rows]
    spread = [r["measured_spread"] for r in rows]
    within = sum(e <= 0.05 for e in step)
    signed = statistics.median((r["predicted_step_s"] - r["measured_step_s"]) / r["measured_step_s"] for r in rows)
    lines.append("")
    lines.append(f"{len(rows)} runs. Step time: median error {100 * statistics.median(step):.1f}%, "
                 f"worst {100 * max(step):.1f}%, {within}/{len(rows)} within 5%, signed median "
                 f"{100 * signed:+.1f}% (+: predicted longer). Peak activation memory: "
                 f"median {100 * statistics.median(mem):.3f}%, worst {100 * max(mem):.3f}%. "
                 f"Measured step of a case, spread over its rounds (max-min)/median: median "
                 f"{100 * statistics.median(spread):.1f}%, worst {100 * max(spread):.1f}%.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpipe_exec.studies.accuracy", description=__doc__)
    parser.add_argument("--models", default="transformer,convnet")
    parser.add_argument("--stages", default="2,4")
    parser.add_argument("--micro-batches", default="1,2,4,8,16")
    parser.add_argument("--schedules", default=",".join(SCHEDULES),
                        help=f"comma-separated schedule families (default {','.join(SCHEDULES)}); "
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
    parser.add_argument("--profile-alone", action="store_true",
                        help="profile on rank 0 while the other devices idle (default: every device "
                             "profiles at once, as in the pipeline's steady state)")
    args = parser.parse_args(argv)
    for name in args.schedules.split(","):
        try:
            schedule_family(name)
        except ValueError as exc:  # ScheduleError names the choices
            parser.error(f"--schedules: {exc}")
    options = LaunchOptions(comm_timeout_s=120, run_timeout_s=3600)
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
                              chunks=[int(v) for v in args.chunks.split(",")])
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


if __name__ == "__main__":
    sys.exit(main())
