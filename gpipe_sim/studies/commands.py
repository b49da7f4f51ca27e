"""The `gpipe-sim sweep`, `max-model` and `paper` subcommands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpipe_sim.errors import GpipeError
from gpipe_sim.scenario.overrides import add_set_option


def _cmd_sweep(args: argparse.Namespace) -> int:
    from gpipe_sim.sweeps import best_text, expand, load_sweep, run_sweep
    from gpipe_sim.sweeps.points import given_fields, notes_text
    from gpipe_sim.sweeps.report import write_report

    spec, base = load_sweep(args.sweep, args.set)
    points = expand(spec, base, given_fields(spec, Path(args.sweep).parent, args.set))
    out = Path(args.out)
    if args.workers is not None and args.workers < 0:
        raise GpipeError("--workers: must be >= 0")
    try:
        run = run_sweep(points, base, out, workers=args.workers, progress=not args.quiet,
                        engine=spec.engine)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        raise GpipeError(f"--out: cannot write to {str(out)!r}: {getattr(exc, 'strerror', None) or exc}") from None
    if run.interrupted:
        sys.stderr.write(
            f"gpipe-sim: interrupted: {len(run.table)} of {run.total} scenarios saved in {out}; "
            "run the same command again to finish\n"
        )
        return 130
    # the sweep's axes and the fields filled in for a row's schedule (chunks): what tells rows apart
    axes = list(dict.fromkeys([*spec.axes, *(k for point in spec.points for k in point),
                               *(k for point in points for k in point.updates)]))
    if not args.no_report:
        try:
            write_report(run.table, out / "report.html", title=f"gpipe-sim sweep: {spec.name}", axes=axes)
        except (OSError, ValueError) as exc:
            raise GpipeError(f"--out: cannot write the report: {getattr(exc, 'strerror', None) or exc}") from None
    rate = f"{run.scenarios_per_second:,.1f} scenarios/s" if run.computed else "nothing to compute"
    sys.stdout.write(
        f"{run.total} scenarios: {run.computed} computed, {run.reused} reused, {run.failed} failed "
        f"in {run.seconds:.2f} s ({rate})\n"
        f"results: {out / 'results.parquet'}, {out / 'results.csv'}"
        + ("" if args.no_report else f", {out / 'report.html'}") + "\n"
    )
    notes = notes_text(points)
    if notes:  # fields filled in for a schedule, axis values that mean nothing to a row's schedule
        sys.stdout.write(notes + "\n")
    sys.stdout.write(best_text(run.table, axes) + "\n")
    for message in run.infrastructure_errors[:3]:
        sys.stderr.write(f"gpipe-sim: executor error (not saved; re-run retries): {message}\n")
    return 0


def _cmd_max_model(args: argparse.Namespace) -> int:
    from gpipe_sim.scenario.scenario import load_scenario
    from gpipe_sim.studies.maxmodel import find_max_model, max_model_text

    scenario = load_scenario(args.scenario, args.set)
    found = find_max_model(scenario, args.grow, step=args.step, start=args.start, limit=args.limit)
    sys.stdout.write(max_model_text(found) + "\n")
    return 0 if found.largest is not None else 1


def _cmd_paper(args: argparse.Namespace) -> int:
    from gpipe_sim.studies.paper import PAPER_DIR, paper_text, run_paper

    tables = run_paper(Path(args.dir) if args.dir else PAPER_DIR, only=args.table)
    sys.stdout.write(paper_text(tables, markdown=args.markdown) + "\n")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `sweep`, `max-model` and `paper` to the gpipe-sim command line."""
    p = subparsers.add_parser("sweep", help="run a sweep of scenarios in parallel (resumable)")
    p.add_argument("sweep", help="sweep YAML: base scenario plus axes and/or points")
    p.add_argument("--out", required=True, help="output folder (results.parquet, results.csv, report.html)")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: one per core; 0 runs in this process)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    add_set_option(p, "change a field of the sweep's base scenario, e.g. --set hardware.preset=a100-80gb "
                      "(repeatable; VALUE is read as YAML; the axes and points still apply on top)")
    p.set_defaults(func=_cmd_sweep)

    p = subparsers.add_parser("max-model", help="largest model (by a size field) whose every stage fits")
    p.add_argument("scenario", help="scenario YAML")
    p.add_argument("--grow", required=True,
                   help="size field to grow: layers, filters, d_model, width... (or a dotted field)")
    p.add_argument("--step", type=int, default=None, help="search step (default: the field's natural step)")
    p.add_argument("--start", type=int, default=None, help="smallest value tried (default: one step)")
    p.add_argument("--limit", type=int, default=None, help="largest value tried (default: 65536)")
    add_set_option(p)
    p.set_defaults(func=_cmd_max_model)

    p = subparsers.add_parser("paper", help="the GPipe paper's tables: published figures beside predictions")
    p.add_argument("--table", choices=("1", "2", "3"), action="append",
                   help="only this table (repeatable)")
    p.add_argument("--markdown", action="store_true", help="print markdown tables (as in docs/guide/paper.md)")
    p.add_argument("--dir", default=None, help="folder of paper experiment files (default: scenarios/paper)")
    p.set_defaults(func=_cmd_paper)

    from gpipe_sim.frameworks.command import register as register_read
    from gpipe_sim.planner.command import register as register_plan

    register_plan(subparsers)
    register_read(subparsers)
