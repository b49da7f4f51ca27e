"""Running a sweep: each point simulated (in parallel, resumably) into one row, merged into tables."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from gpipe_sim.engines.choice import DEFAULT_ENGINE, Engine
from gpipe_sim.errors import GpipeError, ScenarioError
from gpipe_sim.results.run_cost import RUN_COLUMNS, run_columns
from gpipe_sim.schema import limits
from gpipe_sim.scenario.scenario import Scenario, parse_scenario, set_dotted
from gpipe_sim.sweeps.points import SweepPoint
from gpipe_sim.sweeps.spec import SCENARIO_SECTIONS

RESULT_COLUMNS = (
    "step_time_s",
    "throughput_samples_per_s",
    "bubble_fraction",
    "analytic_bubble_fraction",
    "fits_in_memory",
    "memory_capacity_bytes",
    "num_devices",
    "parameters",
    "tokens_per_s",
    "tflops_per_device",
    "mfu",
    "mfu_palm",
    "max_stage_peak_memory_bytes",
    "max_stage_peak_activation_bytes",
    "max_device_peak_memory_bytes",
    "stage_peak_memory_bytes",
    "stage_peak_activation_bytes",
    "stage_param_bytes",
    "max_stage_tp_comm_s",
)
# The training run's figures (gpipe_sim.results.run_cost.RUN_COLUMNS) are columns only where some
# row has them: the scenario gives training.tokens, training.goodput or hardware.price_per_device_hour.
STATUS_COLUMNS = ("sweep.index", "sweep.key", "status", "error", "elapsed_s")
RUNS_DIR = "runs"


# ---------------------------------------------------------------------------------------------
# one scenario -> one row


# A list field longer than this as JSON text (a large per-layer table) is kept as "<N entries>".
MAX_LIST_CELL_CHARS = 20_000


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested plain data as dotted names. A list (of scalars, lists or mappings: GEMM tiles, a
    placement, per-pair links) becomes its JSON text, which rebuilds it exactly; one over
    MAX_LIST_CELL_CHARS characters (a large layer table) only its length, "<N entries>"."""
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    name = prefix[:-1]
    if isinstance(data, (list, tuple)):
        text = json.dumps(list(data))
        out[name] = text if len(text) <= MAX_LIST_CELL_CHARS else f"<{len(data)} entries>"
    else:
        out[name] = data
    return out


def input_columns(point: SweepPoint, base: dict[str, Any]) -> dict[str, Any]:
    """The point's scenario fields as dotted columns (the base plus its updates if it is invalid)."""
    if point.scenario is not None:
        return flatten(point.scenario)
    data = json.loads(json.dumps(base))
    for name, value in point.updates.items():
        set_dotted(data, name, value)
    return flatten(data)


def result_columns(scenario: Scenario, engine: Engine) -> dict[str, Any]:
    """Simulate one scenario and return its scalar result fields (and per-stage lists)."""
    from gpipe_sim.plan.compile import compile_plan
    from gpipe_sim.api import simulate_plan

    plan = compile_plan(scenario)
    result = simulate_plan(plan, engine)
    problem = limits.result_problem(scenario, result)
    if problem:
        raise ScenarioError(problem)
    stages = result.stages
    cap = result.memory_capacity_bytes
    return {
        "step_time_s": result.step_time_s,
        "throughput_samples_per_s": result.throughput_samples_per_s,
        "bubble_fraction": result.bubble_fraction,
        "analytic_bubble_fraction": result.analytic_bubble_fraction,
        "fits_in_memory": bool(result.fits_in_memory),
        "memory_capacity_bytes": cap if math.isfinite(cap) else None,
        "num_devices": plan.num_devices,
        **result.quoted_figures,  # parameters, tokens_per_s, tflops_per_device, mfu
        "max_stage_peak_memory_bytes": max(s.peak_memory_bytes for s in stages),
        "max_stage_peak_activation_bytes": max(s.peak_activation_bytes for s in stages),
        "max_device_peak_memory_bytes": max(result.device_peak_memory_bytes.values()),
        "stage_peak_memory_bytes": [s.peak_memory_bytes for s in stages],
        "stage_peak_activation_bytes": [s.peak_activation_bytes for s in stages],
        "stage_param_bytes": [s.param_bytes for s in stages],
        "max_stage_tp_comm_s": max(s.tp_comm_s for s in stages),  # tensor-parallel collectives
        **run_columns(result.run),
    }


def run_task(task: tuple[str, dict[str, Any], str]) -> dict[str, Any]:
    """Simulate one validated scenario; never raises: a failure is returned as the row's error."""
    key, scenario_data, engine = task
    t0 = time.perf_counter()
    try:
        row = result_columns(parse_scenario(scenario_data), engine)
        row.update(status="ok", error=None)
    except Exception as exc:  # a failing scenario must not stop the sweep
        row = {"status": "error", "error": _first_line(exc)}
    row["sweep.key"] = key
    row["elapsed_s"] = time.perf_counter() - t0
    return row


def _first_line(exc: BaseException) -> str:
    """One line for an exception: our own messages as they are, others prefixed by their type."""
    lines = str(exc).strip().splitlines()
    message = lines[0] if lines else ""
    if isinstance(exc, GpipeError):
        return message
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def run_chunk(tasks: list[tuple[str, dict[str, Any], str]]) -> list[dict[str, Any]]:
    """Run several scenarios in one worker call (fewer round trips)."""
    return [run_task(t) for t in tasks]


def _ignore_sigint() -> None:
    """A pool worker's initializer: Ctrl-C stops the parent, which shuts the pool down."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# ---------------------------------------------------------------------------------------------
# the runner


@dataclass
class SweepRun:
    """What a run did: the merged table, and how many points were computed, reused and failed."""

    table: Any  # pandas.DataFrame
    total: int
    computed: int
    reused: int
    failed: int
    seconds: float
    interrupted: bool = False
    infrastructure_errors: list[str] = field(default_factory=list)

    @property
    def scenarios_per_second(self) -> float:
        return self.computed / self.seconds if self.seconds > 0 else float("inf")


def _write_row(runs: Path, row: dict[str, Any]) -> None:
    """Save a finished point's row as `runs/KEY.json`, whole or not at all."""
    path = runs / f"{row['sweep.key']}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(row, default=str))
    os.replace(tmp, path)  # atomic: a killed sweep leaves whole files or none


def _read_row(path: Path) -> dict[str, Any] | None:
    """A saved row, or None when the file is missing or unreadable (its point runs again)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


ProgressCallback = Callable[[int, int], None]


def run_sweep(
    points: Sequence[SweepPoint],
    base: dict[str, Any],
    out_dir: str | Path,
    *,
    executor: Executor | None = None,
    workers: int | None = None,
    chunk_size: int | None = None,
    progress: bool | ProgressCallback = True,
    engine: Engine = DEFAULT_ENGINE,
) -> SweepRun:
    """Run every point not already finished in `out_dir`, then write results.parquet and .csv.

    Finished points are kept as one file each under `out_dir/runs/` (named by the scenario's
    hash), so an interrupted sweep resumes where it stopped. `executor` may be any
    `concurrent.futures.Executor` (a Dask or Ray cluster's, say); by default a process pool of
    `workers` processes (0: run here, serially).
    """
    out = Path(out_dir)
    runs = out / RUNS_DIR
    runs.mkdir(parents=True, exist_ok=True)
    for stale in runs.glob("*.tmp*"):  # a write cut short by a kill; its scenario reruns
        stale.unlink(missing_ok=True)
    t0 = time.perf_counter()
    done: dict[str, dict[str, Any]] = {}
    todo: list[SweepPoint] = []
    seen: set[str] = set()
    failed_validation = 0
    for point in points:
        if point.key in seen:
            continue
        seen.add(point.key)
        existing = _read_row(runs / f"{point.key}.json")
        if existing is not None:
            done[point.key] = existing
        elif point.scenario is None:
            row = {"status": "error", "error": point.error, "sweep.key": point.key, "elapsed_s": 0.0}
            _write_row(runs, row)
            done[point.key] = row
            failed_validation += 1
        else:
            todo.append(point)
    reused = len(seen) - len(todo) - failed_validation
    tasks = [(p.key, p.scenario, engine) for p in todo]
    interrupted = False
    infra: list[str] = []
    computed = failed_validation
    if tasks:
        computed_rows, interrupted, infra = _execute(
            tasks, runs, executor, workers, chunk_size, progress, len(seen), len(seen) - len(tasks)
        )
        done.update(computed_rows)
        computed += len(computed_rows)
    seconds = time.perf_counter() - t0
    table = merge_rows(points, base, done)
    write_tables(table, out)
    failed = int((table["status"] != "ok").sum()) if len(table) else 0
    return SweepRun(table, len(seen), computed, reused, failed, seconds, interrupted, infra)


def _execute(
    tasks: list[tuple[str, dict[str, Any], str]],
    runs: Path,
    executor: Executor | None,
    workers: int | None,
    chunk_size: int | None,
    progress: bool | ProgressCallback,
    total: int,
    already: int,
) -> tuple[dict[str, dict[str, Any]], bool, list[str]]:
    """Run `tasks` in chunks (here, or on `executor` / a process pool), saving each row under `runs`.

    Returns the rows by key, whether Ctrl-C cut the run short, and the executor's own failures
    (their chunks' rows are errors, not saved, so they run again next time)."""
    n_workers = workers if workers is not None else (os.cpu_count() or 1)
    if chunk_size is None:
        per_worker = max(1, n_workers)
        chunk_size = max(1, min(16, len(tasks) // (per_worker * 8)))
    chunks = [tasks[i : i + chunk_size] for i in range(0, len(tasks), chunk_size)]
    rows: dict[str, dict[str, Any]] = {}
    infra: list[str] = []
    tracker = _Tracker(progress, total, already)

    def finish(result_rows: list[dict[str, Any]]) -> None:
        for row in result_rows:
            _write_row(runs, row)
            rows[row["sweep.key"]] = row
        tracker.advance(len(result_rows))

    own_pool = None
    interrupted = False
    try:
        with tracker:
            if executor is None and n_workers <= 1:
                for chunk in chunks:
                    finish(run_chunk(chunk))
                return rows, False, infra
            if executor is None:
                own_pool = ProcessPoolExecutor(max_workers=n_workers, initializer=_ignore_sigint)
                executor = own_pool
            pending: dict[Future, list] = {}
            queue = iter(chunks)
            window = max(4, 4 * n_workers)

            def submit_more() -> None:
                while len(pending) < window:
                    chunk = next(queue, None)
                    if chunk is None:
                        return
                    pending[executor.submit(run_chunk, chunk)] = chunk

            submit_more()
            while pending:
                finished, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                for fut in finished:
                    chunk = pending.pop(fut)
                    try:
                        finish(fut.result())
                    except Exception as exc:  # the executor failed, not the scenario: not saved
                        message = _first_line(exc)
                        infra.append(message)
                        for key, _, _ in chunk:
                            rows[key] = {"status": "error", "error": f"executor: {message}",
                                         "sweep.key": key, "elapsed_s": 0.0}
                        tracker.advance(len(chunk))
                submit_more()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if own_pool is not None:
            own_pool.shutdown(wait=not interrupted, cancel_futures=True)
    return rows, interrupted, infra


class _Tracker:
    """A rich progress bar with scenarios per second (or a callback, or nothing)."""

    def __init__(self, progress: bool | ProgressCallback, total: int, already: int) -> None:
        self.callback = progress if callable(progress) else None
        self.total, self.count = total, already
        self.bar = None
        if progress is True:
            from rich.progress import (
                BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                transient=False,
            )
            self.task = self.bar.add_task("sweep", total=total, completed=already, rate="")
        self.t0 = time.perf_counter()
        self.started = already

    def __enter__(self) -> "_Tracker":
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def advance(self, n: int) -> None:
        self.count += n
        if self.callback is not None:
            self.callback(self.count, self.total)
        if self.bar is not None:
            dt = time.perf_counter() - self.t0
            rate = f"{(self.count - self.started) / dt:,.0f} scen/s" if dt > 0 else ""
            self.bar.update(self.task, completed=self.count, rate=rate)


# ---------------------------------------------------------------------------------------------
# merging


def merge_rows(
    points: Sequence[SweepPoint], base: dict[str, Any], rows: dict[str, dict[str, Any]]
) -> Any:
    """One row per point, in sweep order: input columns, result columns, status (a DataFrame)."""
    import pandas as pd

    records = []
    seen: set[str] = set()
    for point in points:
        if point.key in seen:
            continue
        seen.add(point.key)
        row = rows.get(point.key)
        if row is None:
            continue
        record = {"sweep.index": point.index, "sweep.key": point.key}
        record.update(input_columns(point, base))
        for name in RESULT_COLUMNS + RUN_COLUMNS:
            record[name] = row.get(name)
        record["status"] = row.get("status", "error")
        record["error"] = row.get("error")
        record["note"] = "; ".join(point.notes) or None  # what was filled in, what means nothing here
        record["elapsed_s"] = row.get("elapsed_s")
        records.append(record)
    table = pd.DataFrame.from_records(records)
    if table.empty:
        return pd.DataFrame(columns=list(STATUS_COLUMNS) + ["note"] + list(RESULT_COLUMNS))
    inputs = [c for c in table.columns if c.split(".", 1)[0] in SCENARIO_SECTIONS]
    run = [c for c in RUN_COLUMNS if table[c].notna().any()]
    ordered = ["sweep.index", "sweep.key", *inputs, *RESULT_COLUMNS, *run, "status", "error", "note", "elapsed_s"]
    table = table[ordered]
    for column in inputs:  # one type per column, so parquet can store it
        values = table[column].dropna()
        kinds = {type(v) for v in values}
        if kinds and not kinds <= {int, float} and not kinds <= {bool} and not kinds <= {str}:
            table[column] = table[column].map(lambda v: None if v is None else _text(v))
    table["fits_in_memory"] = table["fits_in_memory"].astype("boolean")
    return table


def _text(value: Any) -> str:
    """A mixed-type column's value as text (an integer past Python's digit limit in hexadecimal)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**4000:
        return f"{value:#x}"
    return str(value)


def write_tables(table: Any, out: Path) -> None:
    """DIR/results.parquet and DIR/results.csv (written to temporary names, then renamed)."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".results.parquet.tmp"
    table.to_parquet(tmp, index=False)
    os.replace(tmp, out / "results.parquet")
    tmp = out / ".results.csv.tmp"
    table.to_csv(tmp, index=False)
    os.replace(tmp, out / "results.csv")

