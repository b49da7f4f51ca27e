"""`gpipe-sim plan-bench`: how fast the planner answers the issue's two questions (8 and 1,024 GPUs)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from gpipe_sim.scenario.scenario import Scenario, parse_scenario
from gpipe_sim.planner.report import config_text
from gpipe_sim.planner.search import PlanOptions, PlanSearch, search_configurations

# The question: a 24-layer GPT (d_model 2048, seq 2048) on 8 A100-80GB, global batch 64.
GPT_8: dict[str, Any] = {
    "model": {"preset": "transformer", "layers": 24, "d_model": 2048, "d_ff": 8192, "heads": 16,
              "seq_len": 2048, "vocab": 50257},
    "hardware": {"preset": "a100-80gb"},
    "pipeline": {"stages": 8, "micro_batches": 8, "batch_size": 64, "schedule": "1f1b"},
    "training": {"dtype": "bf16", "optimizer": "adam"},
}
# A 13B GPT (40 layers, d_model 5120) on 1,024 A100-80GB in nodes of 8 joined by a 25 GB/s-per-GPU
# network, global batch 1,024.
GPT_1024: dict[str, Any] = {
    "model": {"preset": "transformer", "layers": 40, "d_model": 5120, "d_ff": 20480, "heads": 40,
              "seq_len": 2048, "vocab": 50257},
    "hardware": {"preset": "a100-80gb", "devices_per_node": 8,
                 "network": {"bandwidth": "25 GB/s", "latency_s": 5.0e-6}},
    "pipeline": {"stages": 8, "micro_batches": 8, "batch_size": 1024, "schedule": "1f1b"},
    "training": {"dtype": "bf16", "optimizer": "adam"},
}
# At 1,024 devices the space is narrowed (said in the output): K and D powers of two (1,024's
# divisors are anyway), M powers of two up to 64 (more micro-batches than 64 per replica add
# passes, not throughput, once the bubble is a few percent), remat "none" and "always", v <= 2
# (each simulation of 1,024 ranks sharing node ports runs the SimPy engine: about a second).
NARROW_1024 = dict(micro_batches=(1, 2, 4, 8, 16, 32, 64), remat=("none", "always"), powers_of_two=True, max_chunks=2)


@dataclass(frozen=True)
class BenchCase:
    """One benchmark question: a base scenario and the planner's options."""

    label: str
    base: dict[str, Any]
    options: PlanOptions
    target_s: float
    narrowing: str = ""


CASES = (
    BenchCase("24-layer GPT, 8 x A100-80GB, batch 64 (the full default space)", GPT_8, PlanOptions(devices=8), 5.0),
    BenchCase("40-layer 13B GPT, 1,024 x A100-80GB (nodes of 8), batch 1,024", GPT_1024, PlanOptions(devices=1024, **NARROW_1024),
              60.0, "K, D powers of two; M in 1, 2, 4, .., 64; remat none/always; v at most 2"),
)


def _line(case: BenchCase, search: PlanSearch) -> str:
    best = search.best
    pick = ("nothing fits" if best is None else
            f"best {config_text(best)}: {best.throughput_samples_per_s:,.1f} samples/s")
    verdict = "within" if search.seconds <= case.target_s else "OVER"
    return (f"{case.label}\n  {search.seconds:.2f} s ({verdict} the {case.target_s:g} s target), "
            f"{search.enumerated:,} configurations ({search.configs_per_second:,.0f}/s): {search.simulated:,} simulated, "
            f"{search.reused:,} reused, {search.pruned_by_memory:,} pruned by memory, {search.pruned_by_bound:,} by "
            f"the step bound, {search.infeasible:,} infeasible\n  {pick}"
            + (f"\n  space narrowed: {case.narrowing}" if case.narrowing else ""))


def run_plan_benchmark(cases: tuple[BenchCase, ...] = CASES) -> str:
    """Time the planner on each case (one search each, the load average beside it)."""
    lines = []
    for case in cases:
        base: Scenario = parse_scenario(case.base)
        t0 = time.perf_counter()
        search = search_configurations(base, case.options)
        search.seconds = time.perf_counter() - t0
        lines.append(_line(case, search))
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        lines.append(f"load average while measuring: {load} ({os.cpu_count()} cores)")
    except OSError:
        pass
    return "\n".join(lines)
