"""Peak memory per stage, predicted from a profile against the tracker's measurement, over a grid of cases."""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from importlib import resources
from typing import Callable, Sequence

from gpipe_exec.checks.validate import validate
from gpipe_sim.scenario.scenario import Scenario, load_scenario

MODELS = ("transformer", "convnet")
SPLIT_SCHEDULES = ("gpipe", "1f1b", "zb_h1")  # x remat none/always x M 2/8
CHUNKED_SCHEDULES = ("interleaved_1f1b", "zbv")  # two chunks a rank, the file's M
# Adam (the update's temporaries: stepping one tensor at a time, the CPU default, and on lists, the
# CUDA default; in bf16 with fp32 master weights) on one replica, then D = 2 replicas (the
# all-reduce buckets) without and with ZeRO-1 (its flat copies), 1F1B at the file's M; both
# replicas share the two cores
ADAM = ["pipeline.schedule=1f1b", "training.optimizer=adam"]
DATA_PARALLEL = [*ADAM, "pipeline.data_parallel=2", "hardware.stage_to_device=null",
                 "hardware.placement=[[0,1],[0,1]]"]
OPTIMIZER_CASES = {"1f1b adam": ADAM, "1f1b adam foreach": [*ADAM, "training.optimizer_step=foreach"],
                   "1f1b adam bf16": [*ADAM, "training.dtype=bf16"],
                   "1f1b adam D=2": [*DATA_PARALLEL, "training.zero=0"],
                   "1f1b adam D=2 ZeRO-1": [*DATA_PARALLEL, "training.zero=1"]}


@dataclass(frozen=True)
class StageFigure:
    """One stage of one case: measured and predicted peak bytes."""

    case: str
    stage: int
    measured_bytes: float
    predicted_bytes: float

    @property
    def error(self) -> float:
        return self.predicted_bytes / self.measured_bytes - 1


def grid_cases(models: Sequence[str] = MODELS) -> list[tuple[str, Scenario]]:
    """(label, scenario) for every case of the grid, on the accuracy study's K=2 scenario files."""
    cases = []
    for model in models:
        path = resources.files("gpipe_sim").joinpath("scenarios", "exec", f"accuracy_{model}_k2.yaml")
        for schedule in SPLIT_SCHEDULES:
            for remat in ("none", "always"):
                for M in (2, 8):
                    sets = [f"pipeline.schedule={schedule}", f"pipeline.remat={remat}", f"pipeline.micro_batches={M}"]
                    cases.append((f"{model} {schedule} {remat} M={M}", load_scenario(str(path), sets)))
        for schedule in CHUNKED_SCHEDULES:
            sets = [f"pipeline.schedule={schedule}", "pipeline.chunks=2"]
            cases.append((f"{model} {schedule} v=2", load_scenario(str(path), sets)))
        for label, sets in OPTIMIZER_CASES.items():
            cases.append((f"{model} {label}", load_scenario(str(path), sets)))
    return cases


def run_grid(cases: list[tuple[str, Scenario]], *, say: Callable[[str], None] = print) -> list[StageFigure]:
    """Validate every case (one step after one warm-up; memory does not depend on timing)."""
    figures = []
    for label, scenario in cases:
        v = validate(scenario, steps=1, warmup=1)
        row = []
        for k, (p, m) in enumerate(zip(v.predicted.stages, v.measured.result.stages)):
            figure = StageFigure(label, k, m.peak_memory_bytes, p.peak_memory_bytes)
            figures.append(figure)
            row.append(f"stage {k} {figure.measured_bytes / 2**20:7.2f} MiB {figure.error:+6.2%}")
        partition = v.scenario.pipeline.partition  # as run: the layers per chunk
        counts = "/".join(map(str, partition)) if isinstance(partition, tuple) else str(partition)
        say(f"{label:36s} " + "  ".join(row) + f"  layers {counts}")
    return figures


def summary(figures: list[StageFigure]) -> str:
    """The median and worst absolute error over the figures, naming the worst."""
    errors = [abs(f.error) for f in figures]
    worst = max(figures, key=lambda f: abs(f.error))
    return (f"{len(figures)} stage figures: median error {statistics.median(errors):.2%}, worst "
            f"{abs(worst.error):.2%} ({worst.case}, stage {worst.stage})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpipe_exec.checks.memory_grid", description=__doc__)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: transformer, convnet")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        sys.stderr.write(f"--models: unknown {', '.join(unknown)} (choose from {', '.join(MODELS)})\n")
        return 2
    figures = run_grid(grid_cases(models))
    print(summary(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
