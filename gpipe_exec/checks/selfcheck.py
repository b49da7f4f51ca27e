"""`gpipe-exec selfcheck`: a built-in grid validated on this machine's own devices, each case's measured
step beside a plain PyTorch loop's and the preset's prediction, one table and a summary."""

from __future__ import annotations

import io
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from gpipe_exec.launch.devices import device_type
from gpipe_exec.checks.gpu_grid import (cpu_cases, gpu_bound, gpu_cases, model_host_seconds,
                                        profiled_host_seconds, with_tables)
from gpipe_exec.launch.spawn import LaunchOptions
from gpipe_sim.scenario.scenario import Scenario, parse_scenario
from gpipe_sim.schema.units import format_bytes, format_seconds

# Targets the selfcheck reports against (issue 23's for a validated GPU): step time median and worst,
# peak memory of every stage.
STEP_MEDIAN_TARGET, STEP_WORST_TARGET, MEMORY_TARGET = 0.03, 0.08, 0.03
PLAIN_TARGET = 0.05  # the executor's measured step against the plain loop, where it adds no work
PRESET_MEDIAN_TARGET = 0.10  # the preset alone against the plain loop, GPU-bound cases


@dataclass
class SelfcheckRow:
    """One case: predicted and measured step, the worst stage's peak-memory error, the plain loop's
    step, the preset's (and measured tables') predictions without a profile, or why it failed."""

    name: str
    predicted_step_s: float = float("nan")
    measured_step_s: float = float("nan")
    memory_error: float = float("nan")  # the largest |predicted - measured| / measured over the stages
    worst_stage_bytes: float = float("nan")
    step_error: float = float("nan")  # |predicted - measured| / measured step (validate.relative_error)
    error: str = ""
    plain_step_s: float = float("nan")  # the plain PyTorch loop of the same model and batch (plain_loop)
    same_work: bool = False  # the executor runs exactly the plain loop's work (plain_loop.same_work)
    gpu_bound: bool = False  # gpu_grid.gpu_bound
    preset_step_s: float = float("nan")  # simulated from the hardware preset alone, no profile
    tables_step_s: float = float("nan")  # simulated on the kernel tables `calibrate --gpu-tables` measured
    model_host_s: float = float("nan")  # host issue time the GPU model assigns the step's passes
    profiled_host_s: float = float("nan")  # host issue time the profiler measured for them

    @property
    def plain_error(self) -> float:
        """|executor's measured step - plain loop's| / plain loop's."""
        return abs(self.measured_step_s - self.plain_step_s) / self.plain_step_s

    def preset_error(self, tables: bool = False) -> float:
        """|preset's (or tables') predicted step - plain loop's| / plain loop's."""
        predicted = self.tables_step_s if tables else self.preset_step_s
        return abs(predicted - self.plain_step_s) / self.plain_step_s


def run_selfcheck(cases: list[tuple[str, Scenario]], options: LaunchOptions, *, steps: int = 5,
                  progress: Callable[[str], None] | None = None, plain: bool = False,
                  tables: Path | str | None = None,
                  done: Callable[[SelfcheckRow], None] | None = None) -> list[SelfcheckRow]:
    """Validate each case (profile on its devices, predict, run, compare: `validate`); a case that
    fails is reported with its one-line reason and the others go on. With `plain`, each case is
    also trained by the plain PyTorch loop in this process (`plain_loop`) and predicted from the
    hardware preset alone (and from `tables`, a `calibrate --gpu-tables` file, where given).
    `done` is called with each row as it is finished."""
    from gpipe_exec.checks.validate import validate
    from gpipe_sim.errors import GpipeError, first_line

    rows = []
    for i, (name, scenario) in enumerate(cases):
        if progress:
            progress(f"[{i + 1}/{len(cases)}] {name}")
        try:
            v = validate(scenario, steps=steps, warmup=2, options=options)
        except (GpipeError, RuntimeError, ValueError) as exc:
            rows.append(SelfcheckRow(name, error=first_line(exc)))
            continue
        errors = v.relative_error  # validate's own comparison, the one `gpipe-exec validate` prints
        stages = v.measured.result.stages
        memory = [errors[f"stage{s.index}.peak_memory_bytes"] for s in stages if s.peak_memory_bytes > 0]
        row = SelfcheckRow(name, v.predicted.step_time_s, v.measured.result.step_time_s,
                           max(memory, default=0.0), max(s.peak_memory_bytes for s in stages),
                           step_error=errors["step_time_s"])
        if plain:
            _beside_plain(row, v.scenario, v.table, options, steps, tables)
        rows.append(row)
        if done:
            done(row)
    return rows


def _beside_plain(row: SelfcheckRow, scenario: Scenario, table: dict[str, Any] | None, options: LaunchOptions,
                  steps: int, tables: Path | str | None) -> None:
    """Fill the row's plain-loop step and the predictions made without a profile."""
    from gpipe_exec.checks.plain_loop import plain_step_times, same_work
    from gpipe_sim.api import simulate

    row.same_work, row.gpu_bound = same_work(scenario), gpu_bound(scenario)
    row.plain_step_s = plain_step_times(scenario, steps=steps, warmup=2,
                                        device=device_type(options.device), threads=options.threads).step_s
    row.preset_step_s = simulate(scenario).step_time_s
    row.model_host_s, row.profiled_host_s = model_host_seconds(scenario), profiled_host_seconds(table, scenario)
    if tables is not None:
        row.tables_step_s = simulate(with_tables(scenario, tables)).step_time_s


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def selfcheck_text(rows: list[SelfcheckRow], device: str, elapsed_s: float) -> str:
    """Predicted vs measured per case, then the step-time median and worst error and the worst
    peak-memory error against their targets; where the plain loop ran, the executor's step against
    it (cases where it adds no work) and the preset's prediction against it (GPU-bound cases)."""
    plain = any(not math.isnan(r.plain_step_s) for r in rows)
    tables = any(not math.isnan(r.tables_step_s) for r in rows)
    table = Table(title=f"gpipe-exec selfcheck on {device}")
    columns = ["case", "predicted step", "measured step", "step error", "peak memory", "memory error"]
    if plain:
        columns += ["plain loop", "measured/plain", "preset", "preset error"] + (["tables error"] if tables else [])
    for col in columns:
        table.add_column(col, justify="left" if col == "case" else "right")
    for r in rows:
        if r.error:
            table.add_row(r.name, "-", "-", "failed", "-", r.error[:60], *["-"] * (len(columns) - 6))
            continue
        cells = [r.name, format_seconds(r.predicted_step_s), format_seconds(r.measured_step_s),
                 _pct(r.step_error), format_bytes(r.worst_stage_bytes), _pct(r.memory_error)]
        if plain:
            cells += [format_seconds(r.plain_step_s), f"{r.measured_step_s / r.plain_step_s:.3f}"
                      + ("" if r.same_work else " *"), format_seconds(r.preset_step_s),
                      _pct(r.preset_error()) + (" (GPU-bound)" if r.gpu_bound else "")]
            cells += [_pct(r.preset_error(tables=True))] if tables else []
        table.add_row(*cells)
    buf = io.StringIO()
    console = Console(file=buf, width=200 if plain else 120, force_terminal=False)
    console.print(table)
    ran = [r for r in rows if not r.error]
    if ran:
        step = [r.step_error for r in ran]
        memory = max(r.memory_error for r in ran)
        console.print(
            f"step time: median error {100 * statistics.median(step):.1f}% (target {100 * STEP_MEDIAN_TARGET:.0f}%), "
            f"worst {100 * max(step):.1f}% (target {100 * STEP_WORST_TARGET:.0f}%); "
            f"peak memory: worst stage {100 * memory:.1f}% (target {100 * MEMORY_TARGET:.0f}%)")
    if plain:
        console.print(_plain_summary([r for r in ran if not math.isnan(r.plain_step_s)], tables))
    failed = len(rows) - len(ran)
    console.print(f"{len(ran)} of {len(rows)} cases ran{f', {failed} failed' if failed else ''} in {elapsed_s:.0f} s")
    return buf.getvalue().rstrip()


def _plain_summary(rows: list[SelfcheckRow], tables: bool) -> str:
    """The plain-loop lines: the executor where it adds no work (* marks the others: stages sharing
    a device hand over through the host), the preset on GPU-bound cases, host-bound cases' host time."""
    lines = []
    same = [r.plain_error for r in rows if r.same_work]
    if same:
        lines.append(f"executor vs plain loop (same work, {len(same)} cases): median {_pct(statistics.median(same))}, "
                     f"worst {_pct(max(same))} (target {100 * PLAIN_TARGET:.0f}%); * = the executor adds hand-overs")
    bound = [r for r in rows if r.gpu_bound]
    for label, use_tables in (("preset alone", False), ("measured tables", True)):
        if bound and (tables or not use_tables):
            errs = [r.preset_error(use_tables) for r in bound]
            lines.append(f"{label} vs plain loop (GPU-bound, {len(errs)} cases): median {_pct(statistics.median(errs))}, "
                         f"worst {_pct(max(errs))} (target median {100 * PRESET_MEDIAN_TARGET:.0f}%)")
    for r in rows:
        if not r.gpu_bound and not math.isnan(r.model_host_s):
            lines.append(f"host issue ({r.name}): model {format_seconds(r.model_host_s)}, "
                         f"profiled {format_seconds(r.profiled_host_s)}; preset error {_pct(r.preset_error())}")
    return "\n".join(lines)


def selfcheck(options: LaunchOptions, *, steps: int = 5, progress: Callable[[str], None] | None = None,
              plain: bool = False, tables: Path | str | None = None, json_out: Path | str | None = None) -> str:
    """Run the grid for this machine's device type (GPU grid on CUDA, CPU grid otherwise) and
    return the report. `plain`, `tables`: as `run_selfcheck`; `json_out`: every row written there
    as JSON, rewritten after each case (a run cut short keeps what it finished)."""
    kind = device_type(options.device)
    cases = [(name, parse_scenario(data)) for name, data in (gpu_cases() if kind == "cuda" else cpu_cases())]
    where = kind
    if kind == "cuda":
        import torch

        where = f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}, TF32 off"
    finished: list[SelfcheckRow] = []

    def done(row: SelfcheckRow) -> None:
        finished.append(row)
        if json_out is not None:
            Path(json_out).write_text(json.dumps({"device": where, "rows": [asdict(r) for r in finished]}, indent=1))

    start = time.monotonic()
    rows = run_selfcheck(cases, options, steps=steps, progress=progress, plain=plain, tables=tables, done=done)
    if json_out is not None:
        Path(json_out).write_text(json.dumps({"device": where, "rows": [asdict(r) for r in rows]}, indent=1))
    return selfcheck_text(rows, where, time.monotonic() - start)
