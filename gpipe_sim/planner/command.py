"""The `gpipe-sim plan` subcommand: the fastest configurations that fit N devices, ranked."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Callable

from gpipe_sim.errors import GpipeError, ScenarioError
from gpipe_sim.frameworks.command import add_emit_option
from gpipe_sim.scenario.overrides import add_set_option
from gpipe_sim.schema.units import parse_quantity

MAX_DEVICES = 1 << 17


def _count(flag: str, text: str, low: int = 1, high: int = MAX_DEVICES) -> int:
    """A whole number option in [low, high], else ScenarioError naming the option."""
    try:
        value = int(str(text).strip().replace("_", ""), 10)
    except ValueError:
        raise ScenarioError(f"{flag}: expected a whole number, got {str(text)[:40]!r}") from None
    if not low <= value <= high:
        raise ScenarioError(f"{flag}: must be between {low:,} and {high:,}, got {value:,}")
    return value


def _names(flag: str, text: str | None, cast: Callable[[str], Any] = str) -> tuple[Any, ...] | None:
    if text is None:
        return None
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ScenarioError(f"{flag}: give at least one value (comma-separated)")
    try:
        return tuple(cast(item) for item in items)
    except ValueError:
        raise ScenarioError(f"{flag}: expected comma-separated whole numbers, got {text[:40]!r}") from None


def _share(flag: str, text: str | None, memory_bytes: float = math.inf) -> float | None:
    """A share option: "5%", "0.05", or (with `memory_bytes`) a size such as "4 GiB" read as
    that share of the device's memory; ScenarioError naming the option otherwise."""
    if text is None:
        return None
    raw = str(text).strip()
    try:
        if raw.endswith("%"):
            return float(raw[:-1]) / 100.0
        return float(raw)
    except ValueError:
        pass
    if math.isfinite(memory_bytes):
        try:
            return parse_quantity(raw, "bytes") / memory_bytes
        except ValueError:
            pass
    raise ScenarioError(f"{flag}: expected a share such as 5% or 0.05"
                        f"{' or a size such as 4 GiB' if math.isfinite(memory_bytes) else ''}, got {raw[:40]!r}")


def _stages(text: str | None, flag: str = "--stages") -> tuple[int, ...] | None:
    """--stages (or --tensor-parallel): "1,2,4" or a range "2-8" (or both: "1,4-8")."""
    if text is None:
        return None
    out: list[int] = []
    for item in (part.strip() for part in text.split(",")):
        low, _, high = item.partition("-")
        first = _count(flag, low, 1, MAX_DEVICES)
        out.extend(range(first, _count(flag, high, first, MAX_DEVICES) + 1) if high else [first])
    return tuple(sorted(set(out)))


def _tensor_parallel(text: str | None) -> tuple[int, ...] | None:
    """--tensor-parallel: T values ("1,2,4") or a range ("1-8": its powers of two)."""
    values = _stages(text, "--tensor-parallel")
    if values is None:
        return None
    if text is not None and "-" in text:
        values = tuple(t for t in values if not t & (t - 1)) or values
    return values


def _progress() -> tuple[Callable[[int, int], None] | None, Callable[[], None]]:
    """A rich progress bar on stderr when it is a terminal (nothing otherwise)."""
    if not sys.stderr.isatty():
        return None, lambda: None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("planning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)
    task = bar.add_task("plan", total=None)
    bar.start()

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return update, bar.stop


def _write(flag: str, path: str, write: Callable[[], None]) -> None:
    try:
        write()
    except (OSError, ValueError) as exc:
        raise GpipeError(f"{flag}: cannot write {path!r}: {getattr(exc, 'strerror', None) or exc}") from None


def cmd_plan(args: argparse.Namespace) -> int:
    """Exit 0 with the ranked table; 1 when no configuration fits (the smallest peak is named);
    2 on bad input (one line naming the option)."""
    from gpipe_sim.scenario.command_scenario import load_command_scenario
    from gpipe_sim.planner.report import plan_json, plan_text, write_csv, write_html
    from gpipe_sim.planner.search import (DEFAULT_RESERVE, TIE, PlanOptions, check_options, device_layouts,
                                          search_configurations)

    if args.emit and args.json:
        raise ScenarioError("--emit: prints the pick's configuration, --json the ranking: give one of them")
    devices = _count("--devices", args.devices)
    top = _count("--top", args.top, 1, 10_000)
    max_chunks = _count("--max-chunks", args.max_chunks, 1, 64)
    scenario = load_command_scenario(args.scenario, args.set)
    reserve = _share("--reserve", args.reserve, scenario.hardware.accelerator.memory_bytes)
    options = PlanOptions(
        devices=devices, fewer_devices=args.fewer_devices, schedules=_names("--schedules", args.schedules),
        remat=_names("--remat", args.remat), partitions=_names("--partitions", args.partitions),
        zero=_names("--zero", args.zero, int), max_chunks=max_chunks, top=top,
        micro_batches=_names("--micro-batches", args.micro_batches, int), powers_of_two=args.powers_of_two,
        stages=_stages(args.stages), even_micro_batches=args.even_m,
        tie=TIE if args.tie is None else _share("--tie", args.tie),
        reserve=DEFAULT_RESERVE if reserve is None else reserve,
        headroom=_share("--headroom", args.headroom) or 0.0,
        tensor_parallel=_tensor_parallel(args.tensor_parallel), sequence_parallel=args.sequence_parallel,
        context_parallel=_stages(args.context_parallel, "--context-parallel"),
        expert_parallel=_stages(args.expert_parallel, "--expert-parallel"),
    )
    check_options(options)
    from gpipe_sim.frameworks.command import write_notes
    from gpipe_sim.planner.dropped import dropped_notes

    write_notes(dropped_notes(scenario, options))  # given values the space cannot use, on stderr
    if not device_layouts(scenario, options):
        raise ScenarioError(
            f"--devices: no T x C x D x K = {devices:,} suits this scenario (K at most its layers"
            f"{', K in --stages' if options.stages else ''}, D dividing the global batch of "
            f"{scenario.pipeline.batch_size}); try --fewer-devices")
    update, stop = _progress() if not args.quiet else (None, lambda: None)
    try:
        search = search_configurations(scenario, options, progress=update)
    finally:
        stop()
    if search.enumerated == 0:
        raise ScenarioError("--devices: no configuration of this scenario runs on "
                            f"{devices:,} device{'s' if devices != 1 else ''} with the schedules asked for")
    if args.csv:
        _write("--csv", args.csv, lambda: write_csv(search, args.csv))
    if args.html:
        _write("--html", args.html, lambda: write_html(search, args.html, top))
    if args.emit:
        return _emit_pick(search, args.emit)
    if args.json:
        sys.stdout.write(plan_json(search, top) + "\n")
    else:
        sys.stdout.write(plan_text(search, top) + "\n")
        for flag, path in (("csv", args.csv), ("html", args.html)):
            if path:
                sys.stdout.write(f"{flag} written to {Path(path)}\n")
    return 0 if search.ranked else 1


def _emit_pick(search: Any, framework: str) -> int:
    """Print the pick as `framework`'s configuration (exit 0), or why nothing fits (exit 1)."""
    from gpipe_sim.frameworks.command import emit, write_notes
    from gpipe_sim.planner.report import config_text, nothing_fits_text

    if search.pick is None:
        sys.stderr.write(f"gpipe-sim: {nothing_fits_text(search)}\n")
        return 1
    write_notes([f"the pick: {config_text(search.pick)}"])
    return emit(framework, search.base.with_updates(search.pick.overrides))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `plan` to the gpipe-sim command line."""
    p = subparsers.add_parser(
        "plan", help="the fastest configurations (T x D x K, v, M, schedule, remat, partition, ZeRO) that fit N devices",
        description="Search every configuration of the scenario's model, hardware and global batch on N devices "
                    "and rank those that fit by throughput. Exit status 1 when none fits.")
    p.add_argument("scenario", nargs="?", help="scenario YAML (default: scenarios/default.yaml)")
    p.add_argument("--devices", required=True, help="N: devices to use (D x K = N)")
    p.add_argument("--fewer-devices", action="store_true", help="also configurations on fewer devices")
    p.add_argument("--top", default="10", help="configurations shown (default 10)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--csv", metavar="FILE", help="write every configuration considered as CSV: its figures, "
                                                 "or why it was pruned or refused")
    p.add_argument("--html", metavar="FILE", help="write an HTML report: the table and the Pareto chart")
    p.add_argument("--schedules", help="comma-separated schedule names (default: every registered one)")
    p.add_argument("--remat", help="comma-separated remat modes (default: none,except_last,always, and "
                   "full,selective where the model is a transformer and the schedule's backward is one pass)")
    p.add_argument("--partitions", help="comma-separated partition methods (default: uniform,time; "
                                        "memory and fit cost a partition search each)")
    p.add_argument("--zero", help="comma-separated ZeRO stages of 0,1,2,3 (default: all four when D > 1; "
                                  "3 alone where the scenario shards within a node)")
    p.add_argument("--max-chunks", default="4", help="largest v tried for multi-chunk schedules (default 4)")
    p.add_argument("--micro-batches", help="comma-separated M values (default: every M the batch allows)")
    p.add_argument("--powers-of-two", action="store_true", help="K and D powers of two only")
    p.add_argument("--stages", help="K values tried: comma-separated, ranges allowed (e.g. 1,2,4 or 2-8)")
    p.add_argument("--even-m", action="store_true",
                   help="only M dividing the per-replica batch (else uneven M are marked * in the table)")
    p.add_argument("--tie", help="step times within this share of the fastest are a tie, broken toward the "
                                 "simplest configuration, then memory headroom (default 5%%: the model's error, "
                                 "docs/measurements/accuracy.md)")
    p.add_argument("--reserve", help="memory per device kept free of the simulated peak for the CUDA context, "
                                     "communicator buffers and fragmentation: a share or a size (default 6%%; "
                                     "a hardware reserving as much already is kept)")
    p.add_argument("--headroom", help="minimum share of the usable memory left free by a configuration "
                                      "(default 0)")
    p.add_argument("--tensor-parallel", metavar="T",
                   help="T values tried: comma-separated or a range of powers of two (e.g. 1,2 or 1-8; default: "
                        "1 and every power of two up to a node's devices that divides the model's heads and d_ff)")
    p.add_argument("--context-parallel", metavar="C",
                   help="C values tried: comma-separated or a range (e.g. 1,2,4 or 1-16; default: 1 and every "
                        "power of two that leaves each device at least 8,192 tokens of a sample)")
    p.add_argument("--expert-parallel", metavar="E",
                   help="E values tried for a mixture of experts: comma-separated or a range (default: 1 and "
                        "every power of two dividing its experts and D)")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="configurations with T > 1 use sequence parallelism (default: the scenario's setting)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_emit_option(p, "the pick (row 1)")
    add_set_option(p)
    p.set_defaults(func=cmd_plan)

    p = subparsers.add_parser("plan-bench", help="time the planner on the 8- and 1,024-GPU questions")
    p.add_argument("--against", metavar="DIR", help="instead: the 16-GPU question, a 64-GPU Llama-3-8B one and an "
                   "8-GPU one, whole and narrowed, as whole processes, this checkout beside the one in DIR, as ratios")
    p.add_argument("--repeat", type=int, default=3, help="with --against: alternating runs (default 3)")
    p.add_argument("--large", action="store_true",
                   help="with --against: a Llama-3-70B question on 1,024 H100s too (minutes)")
    p.add_argument("--narrowings", action="store_true",
                   help="with --against: the 8-GPU question narrowed by each of a dozen options too")
    p.set_defaults(func=_cmd_plan_bench)


def _cmd_plan_bench(args: argparse.Namespace) -> int:
    if args.against is not None:
        from gpipe_sim.waits import LARGE, NARROWED, PLANNER, checkout, compare_waits

        waits = PLANNER + (NARROWED if args.narrowings else ()) + (LARGE if args.large else ())
        sys.stdout.write(compare_waits(checkout(args.against), waits, args.repeat) + "\n")
        return 0
    for flag, given in (("--large", args.large), ("--narrowings", args.narrowings)):
        if given:
            raise GpipeError(f"{flag}: only with --against DIR (the questions timed beside a baseline checkout)")
    from gpipe_sim.planner.bench import run_plan_benchmark

    sys.stdout.write(run_plan_benchmark() + "\n")
    return 0
