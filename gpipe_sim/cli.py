"""The `gpipe-sim` command line: simulate, presets, bench (and the sweep commands)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable, NoReturn, Sequence

from gpipe_sim.engines.choice import DEFAULT_ENGINE, ENGINES
from gpipe_sim.errors import GpipeError, ScenarioError, one_line
from gpipe_sim.frameworks.command import add_emit_option
from gpipe_sim.process import run_program
from gpipe_sim.scenario.overrides import add_set_option


def _cmd_simulate(args: argparse.Namespace) -> int:
    from gpipe_sim.scenario.command_scenario import load_command_scenario, write_derived_notes, write_schedule_notes
    from gpipe_sim.plan.compile import compile_plan
    from gpipe_sim.api import simulate_plan
    from gpipe_sim.schema.limits import result_problem

    scenario = load_command_scenario(args.scenario, args.set)
    if args.emit:
        from gpipe_sim.frameworks.command import emit

        if args.json or args.trace:
            raise GpipeError("--emit: prints the scenario's configuration, not a simulation: leave out "
                             + ("--json" if args.json else "--trace"))
        return emit(args.emit, scenario)
    plan = compile_plan(scenario)
    write_schedule_notes(scenario)
    write_derived_notes(scenario)
    result = simulate_plan(plan, args.engine)
    problem = result_problem(scenario, result)
    if problem:
        raise ScenarioError(problem)
    if args.trace:
        from gpipe_sim.results.trace import write_chrome_trace

        try:
            write_chrome_trace(result.timeline, args.trace, name="gpipe-sim prediction")
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            raise GpipeError(f"--trace: cannot write {args.trace!r}: {reason}") from None
    if args.json:
        sys.stdout.write(result.to_json(timeline=not args.no_timeline) + "\n")
    else:
        from gpipe_sim.summary import summary_text  # rich: loaded only for the text summary

        sys.stdout.write(summary_text(scenario, result) + "\n")
        if args.trace:
            sys.stdout.write(f"trace written to {args.trace} (open in ui.perfetto.dev)\n")
    return 0


def _cmd_schedule(args: argparse.Namespace) -> int:
    from gpipe_sim.scenario.command_scenario import load_command_scenario, write_schedule_notes
    from gpipe_sim.plan.compile import scenario_schedule
    from gpipe_sim.schedule.torch_csv import torch_csv_text
    from gpipe_sim.summary import schedule_text

    scenario = load_command_scenario(args.scenario, args.set)
    schedule = scenario_schedule(scenario)
    write_schedule_notes(scenario)
    if args.csv:
        try:
            Path(args.csv).write_text(torch_csv_text(schedule))
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            raise GpipeError(f"--csv: cannot write {args.csv!r}: {reason}") from None
    sys.stdout.write(schedule_text(scenario, schedule) + "\n")
    if args.csv:
        sys.stdout.write(f"schedule written to {args.csv} (torch.distributed.pipelining's CSV format)\n")
    return 0


def _cmd_presets(args: argparse.Namespace) -> int:
    from gpipe_sim.summary import presets_text

    sys.stdout.write(presets_text() + "\n")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from gpipe_sim.studies.engine_bench import run_benchmark

    for flag, value in (("--stages", args.stages), ("--micro-batches", args.micro_batches), ("--repeat", args.repeat)):
        if value < 1:
            raise GpipeError(f"{flag}: must be >= 1, got {value}")
    if args.against is not None:
        from gpipe_sim.waits import STARTUP, compare_waits, checkout

        sys.stdout.write(compare_waits(checkout(args.against), STARTUP, args.repeat) + "\n")
        return 0
    sys.stdout.write(run_benchmark(args.stages, args.micro_batches, args.repeat) + "\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpipe-sim", description="Predict a pipeline-parallel training step (GPipe, 1F1B)."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("simulate", help="simulate one scenario and print a summary")
    p.add_argument("scenario", nargs="?", help="scenario YAML (default: scenarios/default.yaml)")
    p.add_argument("--json", action="store_true", help="print the result JSON on stdout")
    p.add_argument("--no-timeline", action="store_true", help="with --json: leave out the timeline")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace of the timeline")
    p.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE,
                   help="auto (default): the fast evaluator where no device or link is shared by two "
                        "ranks, else simpy; simpy: the SimPy engine (models contention); fast: the "
                        "vectorised evaluator (contention-free plans only)")
    add_emit_option(p, "the scenario")
    add_set_option(p)
    p.set_defaults(func=_cmd_simulate)

    p = sub.add_parser("schedule", help="show a scenario's schedule: passes per rank; --csv writes it for torch")
    p.add_argument("scenario", nargs="?", help="scenario YAML (default: scenarios/default.yaml)")
    p.add_argument("--csv", metavar="OUT",
                   help="write the schedule in torch.distributed.pipelining's CSV format (one row per rank)")
    add_set_option(p)
    p.set_defaults(func=_cmd_schedule)

    p = sub.add_parser("presets", help="list model and hardware presets")
    p.set_defaults(func=_cmd_presets)

    p = sub.add_parser("bench", help="benchmark the engines (simulated actions per second)")
    p.add_argument("--stages", type=int, default=128)
    p.add_argument("--micro-batches", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--against", metavar="DIR", help="instead: start-up and the published runs "
                   "(scenarios/scale/) as whole processes, this checkout beside the one in DIR, as ratios")
    p.set_defaults(func=_cmd_bench)

    for register in EXTRA_COMMANDS:
        register(sub)
    return parser


# Further subcommands (sweeps, max-model, paper) register here: each adds its own parser.
EXTRA_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = []


def _load_extra_commands() -> None:
    try:
        from gpipe_sim.studies import commands
    except ImportError:
        return
    if commands.register not in EXTRA_COMMANDS:
        EXTRA_COMMANDS.append(commands.register)


def run_command(prog: str, args: argparse.Namespace) -> int:
    """Run a parsed subcommand: any GpipeError ends it with one line on stderr and the error's
    `exit_status` (2 for bad input), never a traceback. Shared by gpipe-sim and gpipe-exec.

    Anything else is a bug, not bad input: one line saying so and exit status 1 (set
    GPIPE_TRACEBACK=1 to see the traceback instead). Running out of memory or stack on a huge
    input is reported as bad input (2)."""
    try:
        return int(args.func(args) or 0)
    except GpipeError as exc:
        sys.stderr.write(f"{prog}: error: {one_line(str(exc))}\n")
        return exc.exit_status
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except (RecursionError, MemoryError) as exc:
        if os.environ.get("GPIPE_TRACEBACK"):
            raise
        what = "nested too deeply" if isinstance(exc, RecursionError) else "too large for this machine's memory"
        sys.stderr.write(f"{prog}: error: the input is {what}\n")
        return 2
    except Exception as exc:  # noqa: BLE001 - the boundary: never a traceback
        if os.environ.get("GPIPE_TRACEBACK"):
            raise
        text = str(exc).strip().splitlines()
        detail = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
        sys.stderr.write(
            f"{prog}: internal error (a bug; set GPIPE_TRACEBACK=1 for the traceback): {one_line(detail)}\n"
        )
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command line (`argv`, default this process's arguments) and return its exit status:
    one clear line and exit status 2 on bad input, never a traceback."""
    _load_extra_commands()
    return run_command("gpipe-sim", build_parser().parse_args(argv))


def console_main() -> NoReturn:
    """The `gpipe-sim` program (its console script, `python -m gpipe_sim.cli`): `main` in a process
    set up and ended by `gpipe_sim.process.run_program`."""
    run_program(main)


if __name__ == "__main__":
    console_main()
