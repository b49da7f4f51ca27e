"""`gpipe-sim bench`: engine speed against a straightforward SimPy model, measured side by side.

`python -m gpipe_sim.studies.engine_bench --against DIR` times the same cases with the code in DIR (another
checkout or a `git worktree` of an older commit) and with this one, alternately, for a ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import yaml

from gpipe_sim.errors import SimulationError
from gpipe_sim.engines.fast import evaluate_fast
from gpipe_sim.engines.simpy_engine import run_simpy
from gpipe_sim.engines.reference import straightforward_simpy
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.schedule import COMPUTE_KINDS
from gpipe_sim.scenario.scenario import parse_scenario
from gpipe_sim.waits import spread, timed_child


def _uniform_scenario(stages: int, micro_batches: int, schedule: str, chunks: int = 1) -> dict[str, object]:
    """A scenario of identical layers (one per chunk) on V100s, no re-computation, batch M."""
    return {
        "model": {"preset": "uniform", "layers": stages * chunks},
        "hardware": {"preset": "v100"},
        "pipeline": {"stages": stages, "chunks": chunks, "micro_batches": micro_batches,
                     "batch_size": micro_batches, "schedule": schedule, "remat": "none"},
    }


def _median_time(fn: Callable[[], object], repeat: int) -> float:
    """Median wall seconds of `repeat` calls of `fn`."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _whole_process(scenario: dict[str, object], repeat: int) -> float:
    """Median seconds of `gpipe-sim simulate SCENARIO` as a fresh process (imports included)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.yaml"
        path.write_text(yaml.safe_dump(scenario))
        command = [sys.executable, "-m", "gpipe_sim.cli", "simulate", str(path), "--engine", "auto"]
        return _median_time(lambda: subprocess.run(command, check=True, capture_output=True), repeat)


def run_benchmark(stages: int = 128, micro_batches: int = 1024, repeat: int = 3) -> str:
    """Time the SimPy engine, the straightforward SimPy model and the fast evaluator on one plan
    (GPipe, uniform layers, V100 links), check they agree, and report actions per second; then
    whole `gpipe-sim simulate` processes of `_cases` (that plan, interleaved 1F1B at half the ranks
    and micro-batches with two chunks per rank, and 1F1B)."""
    t0 = time.perf_counter()
    scenario = _uniform_scenario(stages, micro_batches, "gpipe")
    plan = compile_plan(parse_scenario(scenario))
    compile_s = time.perf_counter() - t0
    prog = plan.program
    n_actions = len(prog.kind)
    n_compute = int(np.isin(prog.kind, sorted(COMPUTE_KINDS)).sum())
    ours = run_simpy(plan)
    base = straightforward_simpy(plan)
    quick = evaluate_fast(plan)
    for name, (s, e) in (("straightforward SimPy", base), ("fast evaluator", quick)):
        if not np.allclose(e, ours[1], rtol=1e-9, atol=1e-12):
            raise SimulationError(f"benchmark: {name} disagrees with the SimPy engine")
    t_ours = _median_time(lambda: run_simpy(plan), repeat)
    t_base = _median_time(lambda: straightforward_simpy(plan), max(1, repeat // 2))
    t_fast = _median_time(lambda: evaluate_fast(plan), repeat)
    lines = [
        f"GPipe K={stages} M={micro_batches}: {n_compute:,} compute actions, {n_actions:,} actions "
        f"in all (transfers included); step {ours[1].max():.6g} s simulated by all three",
        f"plan compile (schedule, partition, costs): {compile_s:.3f} s",
        f"{'engine':<24}{'seconds':>10}{'actions/s':>14}{'vs straightforward':>21}",
    ]
    for name, t in (("SimPy engine", t_ours), ("straightforward SimPy", t_base), ("fast evaluator", t_fast)):
        lines.append(f"{name:<24}{t:>10.3f}{n_actions / t:>14,.0f}{t_base / t:>20.1f}x")
    lines.append("whole `gpipe-sim simulate` process (imports, compile, fast evaluator, memory, summary):")
    for label, sc in _cases(stages, micro_batches):
        lines.append(f"  {label:<40}{_whole_process(sc, repeat):>8.3f} s")
    return "\n".join(lines)


def _cases(stages: int, micro_batches: int) -> list[tuple[str, dict[str, object]]]:
    """The whole-process cases: GPipe and 1F1B at K=`stages`, M=`micro_batches`, and interleaved
    1F1B at half the ranks and micro-batches with two chunks per rank."""
    K, M = max(1, stages // 2), max(1, micro_batches // 2)
    return [(f"gpipe K={stages} M={micro_batches}", _uniform_scenario(stages, micro_batches, "gpipe")),
            (f"interleaved_1f1b K={K} v=2 M={M}", _uniform_scenario(K, M, "interleaved_1f1b", 2)),
            (f"1f1b K={stages} M={micro_batches}", _uniform_scenario(stages, micro_batches, "1f1b"))]


# A child's in-process timing: the best of argv[2] `simulate` calls of the scenario file argv[1]
_IN_PROCESS = """
import sys, time, yaml
from gpipe_sim.api import simulate
from gpipe_sim.scenario.scenario import parse_scenario
scenario = parse_scenario(yaml.safe_load(open(sys.argv[1])))
best = float("inf")
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    simulate(scenario)
    best = min(best, time.perf_counter() - t0)
print(best)
"""


# A child's fast-evaluator timings: {label: best CPU seconds} of the plans [label, scenario, repeats] on stdin
_EVALUATOR = """
import json, sys, time
from gpipe_sim.engines.fast import evaluate_fast
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.scenario.scenario import parse_scenario
best = {}
for label, scenario, repeat in json.loads(sys.stdin.read()):
    plan = compile_plan(parse_scenario(scenario))
    for _ in range(repeat):
        t0 = time.process_time()
        evaluate_fast(plan)
        best[label] = min(best.get(label, float("inf")), time.process_time() - t0)
print(json.dumps(best))
"""


def _evaluator_plans(stages: int, micro_batches: int) -> list[tuple[str, dict[str, object], int]]:
    """(label, scenario, repeats): six schedules at K 2-32 and M 8-512 (M >= 2K, K x M <= 8192),
    then the three whole-process cases' plans; more repeats for smaller plans."""
    grid = [(s, K, M, v) for s, v in (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("zbv", 2), ("zb_h1", 1),
                                      ("dualpipev", 2))
            for K in (2, 4, 8, 16, 32) for M in (8, 32, 128, 512) if M >= 2 * K and K * M <= 8192]
    plans = [(f"{s} K={K} M={M}", _uniform_scenario(K, M, s, v), max(3, min(25, 30000 // (K * M))))
             for s, K, M, v in grid]
    cases = _cases(stages, micro_batches)
    return plans + [(label, scenario, max(3, min(25, 30000 // (stages * micro_batches)))) for label, scenario in cases]


def compare_evaluator(against: Path, stages: int = 128, micro_batches: int = 1024, repeat: int = 2) -> str:
    """The fast evaluator alone on `_evaluator_plans`, timed by processes of the code in `against`
    and of this checkout in turn (`repeat` each, alternating; each plan's best CPU time over all of
    a side's runs). Reports the spread of the ratios this / against over the plans, the three
    least favourable, and the whole-process cases' plans."""
    plans = _evaluator_plans(stages, micro_batches)
    trees = {"against": Path(against).resolve(), "this": Path(__file__).resolve().parents[2]}
    best: dict[str, dict[str, float]] = {"against": {}, "this": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeat):
            for name in ("against", "this") if i % 2 == 0 else ("this", "against"):
                _, _, out = _child([sys.executable, "-c", _EVALUATOR], trees[name], tmp, json.dumps(plans))
                for label, seconds in json.loads(out).items():
                    best[name][label] = min(best[name].get(label, seconds), seconds)
    ratio = {label: best["this"][label] / best["against"][label] for label, _, _ in plans}
    grid = sorted((label for label, _, _ in plans[:-3]), key=ratio.__getitem__)
    lines = [f"fast evaluator, {len(grid)} plans: this / against {ratio[grid[0]]:.3f} to {ratio[grid[-1]]:.3f}, "
             f"median {statistics.median(ratio[label] for label in grid):.3f}; least favourable: "
             + ", ".join(f"{label} {ratio[label]:.3f}" for label in grid[-3:])]
    for label, _, _ in plans[-3:]:
        lines.append(f"  {label:<32} against {best['against'][label]:.4f} s  this {best['this'][label]:.4f} s  "
                     f"ratio {ratio[label]:.3f}")
    return "\n".join(lines)


def _child(command: list[str], tree: Path, cwd: str, stdin: str | None = None) -> tuple[float, float, str]:
    """`timed_child`'s (wall seconds, CPU seconds) and the stdout of a command that must succeed."""
    wall, cpu, done = timed_child(command, tree, cwd, stdin)
    done.check_returncode()
    return wall, cpu, done.stdout


def compare(against: Path, stages: int = 128, micro_batches: int = 1024, repeat: int = 5, inner: int = 3) -> str:
    """Time each case (`_cases`) with the code in `against` and with this checkout, alternately
    (which goes first alternates too), `repeat` times: whole `gpipe-sim simulate` processes (wall
    and CPU seconds) and, in another process, the best of `inner` in-process `simulate` calls.
    Reports each figure's median [min-max] and the ratio of the medians, this / against."""
    here = Path(__file__).resolve().parents[2]
    trees = {"against": Path(against).resolve(), "this": here}
    figures: dict[tuple[str, str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeat):
            for label, scenario in _cases(stages, micro_batches):
                path = Path(tmp) / f"{label.split()[0]}.yaml"
                path.write_text(yaml.safe_dump(scenario))
                for name in ("against", "this") if i % 2 == 0 else ("this", "against"):
                    wall, cpu, _ = _child([sys.executable, "-m", "gpipe_sim.cli", "simulate", str(path),
                                           "--engine", "auto"], trees[name], tmp)
                    _, _, out = _child([sys.executable, "-c", _IN_PROCESS, str(path), str(inner)], trees[name], tmp)
                    for figure, value in (("process wall", wall), ("process CPU", cpu), ("in-process best", float(out))):
                        figures.setdefault((label, figure, name), []).append(value)
    lines = [f"against {trees['against']} / this {here}: {repeat} alternating runs (seconds: median [min-max])"]
    for label, _ in _cases(stages, micro_batches):
        for figure in ("process wall", "process CPU", "in-process best"):
            old, new = figures[(label, figure, "against")], figures[(label, figure, "this")]
            lines.append(f"  {label:<32}{figure:<17} against {spread(old)}  this {spread(new)}  "
                         f"ratio {statistics.median(new) / statistics.median(old):.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m gpipe_sim.studies.engine_bench --against DIR [--evaluator] [--stages K --micro-batches M
    --repeat N]`: `compare`, or with --evaluator `compare_evaluator`."""
    parser = argparse.ArgumentParser(description=compare.__doc__)
    parser.add_argument("--against", type=Path, required=True, help="another checkout (say, a git worktree)")
    parser.add_argument("--evaluator", action="store_true", help="the fast evaluator alone over a grid of plans")
    parser.add_argument("--stages", type=int, default=128)
    parser.add_argument("--micro-batches", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=None, help="alternating runs (default 5, 2 with --evaluator)")
    args = parser.parse_args(argv)
    if args.evaluator:
        print(compare_evaluator(args.against, args.stages, args.micro_batches, args.repeat or 2))
    else:
        print(compare(args.against, args.stages, args.micro_batches, args.repeat or 5))
    return 0


if __name__ == "__main__":
    sys.exit(main())
