"""The `gpipe-exec` command line: run, profile, calibrate and validate a scenario for real."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from gpipe_exec.launch.device_choice import DEVICE_TYPES
from gpipe_sim.cli import run_command
from gpipe_sim.errors import GpipeError
from gpipe_sim.scenario.overrides import add_set_option
from gpipe_sim.schema.units import format_seconds


def _options(args: argparse.Namespace):  # -> LaunchOptions
    from gpipe_exec.launch.spawn import LaunchOptions

    return LaunchOptions(threads=args.threads, pin=not args.no_pin, comm_timeout_s=args.timeout,
                         run_timeout_s=args.run_timeout, device=args.device)


def _cmd_run(args: argparse.Namespace) -> int:
    from gpipe_exec.execute import execute
    from gpipe_exec.checks.validate import spread_warning
    from gpipe_sim.summary import summary_text
    from gpipe_sim.scenario.scenario import load_scenario
    from gpipe_sim.results.trace import write_chrome_trace

    scenario = load_scenario(args.scenario, args.set)
    m = execute(scenario, steps=args.steps, warmup=args.warmup, options=_options(args))
    if args.trace:
        write_chrome_trace(m.result.timeline, args.trace, name="gpipe-exec measurement")
    if args.json:
        sys.stdout.write(m.result.to_json(timeline=not args.no_timeline) + "\n")
        return 0
    sys.stdout.write(f"MEASURED on this machine: the median of {len(m.step_times_s)} steps after "
                     f"{args.warmup} warm-up (gpipe-exec validate puts the prediction beside it)\n")
    sys.stdout.write(summary_text(scenario, m.result) + "\n")
    steps = ", ".join(format_seconds(t) for t in m.step_times_s)
    sys.stdout.write(f"measured step times: {steps}; loss {m.loss:.5f}\n")
    warning = spread_warning(m.step_times_s)
    if warning:
        sys.stdout.write(warning + "\n")
    if any(p is not None for p in m.cuda_peak_bytes):
        sys.stdout.write(f"cuda max_memory_allocated per rank: {m.cuda_peak_bytes}\n")
    if args.trace:
        sys.stdout.write(f"trace written to {args.trace} (open in ui.perfetto.dev)\n")
    return 0


def _sizes(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        sizes = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise GpipeError(f"--micro-batches: expected sizes like 1,2,4, got {text!r}") from None
    if min(sizes) < 1:
        raise GpipeError("--micro-batches: sizes must be >= 1")
    return sizes


def _cmd_profile(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from gpipe_exec.profile import ProfileOptions, profile_model, write_table
    from gpipe_sim.scenario.scenario import load_scenario

    from gpipe_exec.profile import too_large_to_build
    from gpipe_exec.profiling.layers import check_meta

    scenario = load_scenario(args.scenario, args.set)
    meta = args.meta or too_large_to_build(scenario)
    if meta and not args.meta:
        sys.stderr.write("gpipe-exec: the model does not fit in memory here; profiling FLOPs and bytes "
                         "on the meta device (no timings)\n")
    given = {k: v for k, v in (("repeats", args.repeats), ("clock", args.clock)) if v is not None}
    options = ProfileOptions(micro_batches=_sizes(args.micro_batches), warmup=args.warmup,
                             threads=args.threads, meta=meta, split_backward=args.split_backward and not meta,
                             device=args.device, **given)
    p = scenario.pipeline
    if p.tensor_parallel * p.context_parallel * p.expert_parallel > 1:  # split over T, C or E processes, all at once
        from gpipe_exec.launch.spawn import LaunchOptions
        from gpipe_exec.profile import profile_on_devices

        check_meta(meta, p.tensor_parallel, p.context_parallel, p.expert_parallel)
        table = profile_on_devices(scenario, options, LaunchOptions(threads=args.threads, device=args.device))
    else:
        with Progress(transient=True) as bar:
            task = bar.add_task("profiling", total=None)

            def progress(i: int, n: int, name: str) -> None:
                bar.update(task, total=n, completed=i, description=f"profiling {name}")

            table = profile_model(scenario, options, progress=progress)
    write_table(table, args.out)
    sys.stdout.write(f"{len(table['layers'])} layers written to {args.out} "
                     f"(use model: {{preset: table, path: {args.out}}})\n")
    return 0


def _nested(updates: dict[str, Any]) -> dict[str, Any]:
    """{"hardware.host": {...}} -> {"host": {...}}: the scenario's `hardware` fields to paste."""
    return {key.split(".", 1)[1]: value for key, value in updates.items()}


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from gpipe_exec.calibration.runtime import calibrate_link, calibrate_runtime
    from gpipe_exec.checks.shared_devices import calibrate_shared

    options = _options(args)
    device_map: list[int] = []
    if args.devices:
        try:
            device_map = [int(d) for d in args.devices.split(",")]
        except ValueError:
            raise GpipeError(f"--devices: expected device numbers such as 0,0,1,1, got {args.devices!r}") from None
        if len(device_map) < 2 or min(device_map) < 0:
            raise GpipeError(f"--devices: expected two or more device numbers >= 0, got {args.devices!r}")
    if args.gpu_tables:  # kernel tables of this GPU (gpipe_exec/calibration/gpu_tables.py)
        from gpipe_exec.calibration.gpu_tables import calibrate_gpu_tables

        hardware = calibrate_gpu_tables(args.gpu_tables, args.gpu_preset)
        sys.stdout.write(json.dumps({"hardware": hardware, "written": args.gpu_tables}) + "\n")
        return 0
    if args.link_only:
        link = calibrate_link(options=options)
        sys.stdout.write(json.dumps({**link.to_dict(), "hardware": _nested(link.hardware_updates())}) + "\n")
        return 0
    fit = calibrate_runtime(options=options)
    if device_map:
        fit = calibrate_shared(fit, device_map, options=options)
    sys.stdout.write(json.dumps({**fit.to_dict(), "hardware": _nested(fit.hardware_updates())}) + "\n")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from rich.console import Console

    from gpipe_exec.checks.validate import validate, validation_text
    from gpipe_sim.scenario.scenario import load_scenario

    scenario = load_scenario(args.scenario, args.set)
    options = _options(args)
    profile = None
    if args.profile_clock is not None:
        from gpipe_exec.profile import ProfileOptions

        profile = ProfileOptions(threads=options.threads, clock=args.profile_clock)
    console = Console(stderr=True)
    with console.status("validating") as status:
        v = validate(scenario, steps=args.steps, warmup=args.warmup, options=options, profile=profile,
                     rounds=args.rounds, progress=lambda msg: status.update(msg))
    if args.json:
        sys.stdout.write(json.dumps(v.to_dict(timeline=not args.no_timeline)) + "\n")
    else:
        sys.stdout.write(validation_text(v) + "\n")
    return 0


def _cmd_selfcheck(args: argparse.Namespace) -> int:
    from rich.console import Console

    from gpipe_exec.checks.selfcheck import selfcheck

    console = Console(stderr=True)
    with console.status("selfcheck") as status:
        text = selfcheck(_options(args), steps=args.steps, progress=lambda msg: status.update(msg),
                         plain=args.plain or args.gpu_tables is not None, tables=args.gpu_tables,
                         json_out=args.json)
    sys.stdout.write(text + "\n")
    return 0


def _csv(text: str | None, name: str, cast: Any = str) -> tuple[Any, ...] | None:
    """A comma-separated option ("a,b") as a tuple; None when not given; one line naming it if bad."""
    if text is None:
        return None
    try:
        values = tuple(cast(v.strip()) for v in text.split(",") if v.strip())
    except ValueError:
        raise GpipeError(f"{name}: expected comma-separated values, got {text!r}") from None
    if not values:
        raise GpipeError(f"{name}: expected at least one value, got {text!r}")
    return values


def _int_option(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise GpipeError(f"{name}: expected a whole number, got {text!r}") from None


def _cmd_plan_check(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from gpipe_exec.checks.plan_check import CheckOptions, check_options, check_text, plan_check
    from gpipe_sim.scenario.scenario import load_scenario

    micro: Any = args.micro_batches
    if micro not in ("even", "all"):
        micro = _csv(micro, "--micro-batches", int)
        if min(micro) < 1:
            raise GpipeError(f"--micro-batches: expected even, all or sizes >= 1, got {args.micro_batches!r}")
    defaults = CheckOptions()
    options = CheckOptions(
        devices=_int_option(args.devices, "--devices"), rounds=args.rounds, steps=args.steps, warmup=args.warmup,
        schedules=defaults.schedules if args.schedules is None else
        (None if args.schedules == "all" else _csv(args.schedules, "--schedules")),
        remat=defaults.remat if args.remat is None else (None if args.remat == "all" else _csv(args.remat, "--remat")),
        partitions=defaults.partitions if args.partitions is None else
        (None if args.partitions == "all" else _csv(args.partitions, "--partitions")),
        zero=defaults.zero if args.zero is None else ((0, 1) if args.zero == "all" else _csv(args.zero, "--zero", int)),
        max_chunks=args.max_chunks, micro_batches=micro, profiles=args.profiles)
    check_options(options)
    scenario = load_scenario(args.scenario, args.set)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("starting", total=None)

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=what)

        check = plan_check(scenario, options, launch_options=_options(args), progress=progress)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(check.to_dict(), f, indent=1)
    sys.stdout.write(check_text(check) + "\n")
    return 0


def _launch_flags(p: argparse.ArgumentParser) -> None:
    """How the ranks run: threads, pinning and time limits."""
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--no-pin", action="store_true", help="do not pin ranks to their device's cores")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds a rank waits on a peer before failing (default 60)")
    p.add_argument("--run-timeout", type=float, default=1800.0, help="seconds for the whole run")
    _device_flag(p)


def _device_flag(p: argparse.ArgumentParser) -> None:
    """Where to run: cpu, cuda or auto (the default: $GPIPE_EXEC_DEVICE, else CUDA where torch sees a GPU)."""
    p.add_argument("--device", choices=DEVICE_TYPES,
                   help="where the ranks run: auto (default: $GPIPE_EXEC_DEVICE, else a GPU where torch sees "
                        "one), cpu or cuda")


def _parser_selfcheck(sub: argparse._SubParsersAction) -> None:
    """`gpipe-exec selfcheck`."""
    p = sub.add_parser("selfcheck", help="validate a small built-in grid on this machine's GPU (or CPU): "
                                         "predicted vs measured per case and a summary")
    p.add_argument("--steps", type=int, default=5, help="measured steps per case (default 5)")
    p.add_argument("--plain", action="store_true",
                   help="also train each case in a plain PyTorch loop (CUDA events) and predict it from the "
                        "hardware preset alone, and compare both with the executor's measured step")
    p.add_argument("--gpu-tables", metavar="FILE",
                   help="with --plain: also predict each case on these kernel tables (calibrate --gpu-tables)")
    p.add_argument("--json", metavar="FILE", help="write every case's figures there as JSON")
    _launch_flags(p)
    p.set_defaults(func=_cmd_selfcheck)


def _parser_run(sub: argparse._SubParsersAction) -> None:
    """`gpipe-exec run`."""
    p = sub.add_parser("run", help="train one step per iteration for real and measure it")
    p.add_argument("scenario", help="scenario YAML (a zoo model: transformer, mlp or convnet)")
    add_set_option(p)
    p.add_argument("--steps", type=int, default=5, help="measured steps (the median is reported)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps, not measured")
    p.add_argument("--json", action="store_true", help="print the measured result JSON")
    p.add_argument("--no-timeline", action="store_true", help="with --json: leave out the timeline")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace of the measured step")
    _launch_flags(p)
    p.set_defaults(func=_cmd_run)


def _parser_profile(sub: argparse._SubParsersAction) -> None:
    """`gpipe-exec profile`."""
    p = sub.add_parser("profile", help="measure every layer and write the simulator's layer table")
    p.add_argument("scenario", help="scenario YAML (a zoo model)")
    add_set_option(p)
    p.add_argument("--out", required=True, help="table file (.yaml or .json)")
    p.add_argument("--micro-batches", help="sizes to time, e.g. 1,2,4 (default: the scenario's)")
    p.add_argument("--warmup", type=int, default=2, help="untimed repeats first (default 2)")
    p.add_argument("--repeats", type=int,
                   help="timed repeats per size, at least (default 7; the middle half is kept)")
    p.add_argument("--clock", choices=("thread", "wall"),
                   help="what is timed on CPU: the thread's CPU time (default; steady on a shared machine) "
                        "or wall time (the core's share included)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as a rank runs)")
    _device_flag(p)
    p.add_argument("--meta", action="store_true", help="FLOPs and bytes only, on the meta device")
    p.add_argument("--split-backward", action="store_true",
                   help="also time each layer's input- and weight-gradient passes (zero-bubble schedules)")
    p.set_defaults(func=_cmd_profile)


def _parser_calibrate(sub: argparse._SubParsersAction) -> None:
    """`gpipe-exec calibrate`."""
    p = sub.add_parser("calibrate", help="measure the link and the runtime's host time per action "
                                         "(gpipe_sim's hardware.link and hardware.host)")
    p.add_argument("--link-only", action="store_true", help="only the point-to-point latency and bandwidth")
    p.add_argument("--devices", help="also fit the host times for stages placed so, e.g. 0,0,1,1")
    p.add_argument("--gpu-tables", metavar="OUT.yaml",
                   help="instead: measure this GPU's kernel tables (GEMMs, bandwidth, attention, optimizer, "
                        "launch; under 3 minutes) and write a hardware YAML gpipe-sim takes")
    p.add_argument("--gpu-preset", default="h100-sxm",
                   help="with --gpu-tables: the preset whose peak rates and bandwidth the tables refine")
    _launch_flags(p)
    p.set_defaults(func=_cmd_calibrate)


def _parser_validate(sub: argparse._SubParsersAction) -> None:
    """`gpipe-exec validate`."""
    p = sub.add_parser("validate", help="predicted vs measured step time, throughput, bubble, memory")
    p.add_argument("scenario", help="scenario YAML (a zoo model)")
    add_set_option(p)
    p.add_argument("--steps", type=int, default=5, help="measured steps per round (the median is compared)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps per round, not measured")
    p.add_argument("--rounds", type=int, default=1,
                   help="profile, predict and run this many times, in one launch; the median round "
                        "of each is compared (default 1)")
    p.add_argument("--json", action="store_true",
                   help="print {predicted, measured, relative_error} as JSON")
    p.add_argument("--no-timeline", action="store_true", help="with --json: leave out the timelines")
    p.add_argument("--profile-clock", choices=("thread", "wall"),
                   help="what the profile times on CPU: the thread's CPU time (default) or wall time")
    _launch_flags(p)
    p.set_defaults(func=_cmd_validate)


def _parser_plan_check(sub: argparse._SubParsersAction) -> None:
    """`gpipe-exec plan-check`."""
    p = sub.add_parser("plan-check", help="run every configuration the planner ranks for this machine "
                                          "and compare its ranking with the measured one")
    p.add_argument("scenario", help="scenario YAML (a zoo model; its hardware, model and global batch)")
    add_set_option(p)
    p.add_argument("--devices", default="2", help="devices (cores) to plan for: D*K up to this (default 2)")
    p.add_argument("--rounds", type=int, default=3,
                   help="passes over all configurations, each running every one once (default 3)")
    p.add_argument("--steps", type=int, default=3, help="measured steps per configuration and round (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up steps per configuration and round (default 1)")
    p.add_argument("--schedules", help="comma-separated schedule families, or all "
                                       "(default gpipe,1f1b,interleaved_1f1b,zb_h1,zbv)")
    p.add_argument("--remat", help="comma-separated remat modes, or all (default none: with everything in "
                                   "memory re-computing is only slower, and checking it doubles the run)")
    p.add_argument("--partitions", help="comma-separated partition methods, or all (default time)")
    p.add_argument("--zero", help="comma-separated ZeRO stages for D > 1, or all (0,1: the stages gpipe-exec runs; default 0)")
    p.add_argument("--max-chunks", type=int, default=2, help="chunks per rank tried, at most (default 2)")
    p.add_argument("--profiles", type=int, default=3,
                   help="profiles of the model, each timing every micro-batch size once; the planner "
                        "works on their median (default 3)")
    p.add_argument("--micro-batches", default="even",
                   help="M checked: even (M divides each replica's batch; default), all, or values like 1,2,4")
    p.add_argument("--json", metavar="FILE", help="also write every configuration and the summary as JSON")
    _launch_flags(p)
    p.set_defaults(func=_cmd_plan_check)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpipe-exec", description="Run gpipe_sim's pipeline schedules for real on torch.distributed."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_parser_run, _parser_profile, _parser_calibrate, _parser_validate, _parser_plan_check,
                _parser_selfcheck):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: a failed rank exits 1, bad input exits 2, both with one line on stderr."""
    return run_command("gpipe-exec", build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
