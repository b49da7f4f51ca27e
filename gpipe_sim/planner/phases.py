"""Where a `gpipe-sim plan` search spends its time: wall seconds in each of its phases and dearest steps.

    python -m gpipe_sim.planner.phases plan FILE --devices N [plan's other options]

runs the `plan` command as `gpipe-sim plan` does (its report on stdout) and writes to stderr the
command's seconds in all (its imports aside), then the seconds spent inside each function of `TIMED`
(summed over its calls; nested ones are counted in both), dearest first. The functions are
wrapped for the run only and put back after it. A diagnostic for the benchmark log's entries on
the planner; the figures are wall seconds of this process, as noisy as the machine.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from gpipe_sim.errors import GpipeError
from gpipe_sim.planner import command, search

# The search's phases (queue, ties, families) and the steps its decisions take, by their names in
# gpipe_sim.planner.search
TIMED = ("space_blocks", "_coarse_queue", "_run_queue", "_resolve_ties", "_family_bests", "_finish", "_decide",
         "compile_plan", "run_engine", "result_from_times", "simulate_plan", "relaxed_step_bound", "program_step_bound", "held_memory_bound",
         "held_memory_ceiling")


@contextmanager
def timed(names: Sequence[str] = TIMED) -> Iterator[dict[str, float]]:
    """While open, each of `names` in gpipe_sim.planner.search adds its wall seconds (summed over
    calls) to the mapping yielded; the functions are put back on closing."""
    seconds: dict[str, float] = {name: 0.0 for name in names}
    originals = {name: getattr(search, name) for name in names}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - t0
        return run

    for name, fn in originals.items():
        setattr(search, name, wrap(name, fn))
    try:
        yield seconds
    finally:
        for name, fn in originals.items():
            setattr(search, name, fn)


def main(argv: Sequence[str] | None = None) -> int:
    """Run `plan` with `argv` (starting with "plan") and write where its time went to stderr."""
    parser = argparse.ArgumentParser(prog="python -m gpipe_sim.planner.phases",
                                     description="time the phases of a gpipe-sim plan search")
    command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    if args.command != "plan":
        parser.error("times `plan` only: give plan FILE --devices N ...")
    t0 = time.perf_counter()
    with timed() as seconds:
        try:
            status = args.func(args)
        except GpipeError as exc:
            sys.stderr.write(f"{parser.prog}: error: {str(exc).splitlines()[0] if str(exc) else exc}\n")
            return exc.exit_status
    sys.stderr.write(f"{'in all':<22s} {time.perf_counter() - t0:8.3f} s\n")
    for name, value in sorted(seconds.items(), key=lambda item: -item[1]):
        sys.stderr.write(f"{name:<22s} {value:8.3f} s\n")
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
