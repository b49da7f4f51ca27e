"""`gpipe-sim bench`: engine speed against a straightforward SimPy model, measured side by side."""

from __future__ import annotations

import statistics
import time
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

from gpipe_sim.errors import SimulationError
from gpipe_sim.engines.fast import evaluate_fast
from gpipe_sim.engines.simpy_engine import run_simpy
from gpipe_sim.engines.reference import straightforward_simpy
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.schedule import COMPUTE_KINDS
from gpipe_sim.spec.scenario import parse_scenario


def _uniform_scenario(stages: int, micro_batches: int, schedule: str, chunks: int = 1) -> dict[str, object]:
    return {
        "model": {"preset": "uniform", "layers": stages * chunks},
        "hardware": {"preset": "v100"},
        "pipeline": {"stages": stages, "chunks": chunks, "micro_batches": micro_batches,
                     "batch_size": micro_batches, "schedule": schedule, "remat": "none"},
    }


def _median_time(fn: Callable[[], object], repeat: int) -> float:
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
    whole `gpipe-sim simulate` processes for that plan and for interleaved 1F1B at half the ranks
    and micro-batches with two chunks per rank."""
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
    interleaved = _uniform_scenario(max(1, stages // 2), max(1, micro_batches // 2), "interleaved_1f1b", 2)
    lines.append("whole `gpipe-sim simulate` process (imports, compile, fast evaluator, memory, summary):")
    for label, sc in ((f"gpipe K={stages} M={micro_batches}", scenario),
                      (f"interleaved_1f1b K={max(1, stages // 2)} v=2 M={max(1, micro_batches // 2)}", interleaved)):
        lines.append(f"  {label:<40}{_whole_process(sc, repeat):>8.3f} s")
    return "\n".join(lines)
