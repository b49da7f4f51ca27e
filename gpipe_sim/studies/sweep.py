"""Scenario sweeps: a base scenario plus axes expanded into points, run in parallel, resumable."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import signal
import time
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpipe_sim.errors import GpipeError, ScenarioError, one_line
from gpipe_sim.spec import limits
from gpipe_sim.spec.files import read_data_file
from gpipe_sim.spec.scenario import (
    Scenario, clean_message, error_location, parse_scenario, parse_scenario_with_overrides, read_scenario_data,
    resolve_relative_paths, set_dotted,
)

SCENARIO_SECTIONS = ("model", "hardware", "pipeline", "training")
RESULT_COLUMNS = (
    "step_time_s",
    "throughput_samples_per_s",
    "bubble_fraction",
    "analytic_bubble_fraction",
    "fits_in_memory",
    "memory_capacity_bytes",
    "num_devices",
    "total_params",
    "max_stage_peak_memory_bytes",
    "max_stage_peak_activation_bytes",
    "max_device_peak_memory_bytes",
    "stage_peak_memory_bytes",
    "stage_peak_activation_bytes",
    "stage_param_bytes",
)
STATUS_COLUMNS = ("sweep.index", "sweep.key", "status", "error", "elapsed_s")
RUNS_DIR = "runs"


class SweepError(GpipeError, ValueError):
    """A sweep file is malformed or names an unknown field."""


# ---------------------------------------------------------------------------------------------
# the sweep file


class SweepSpec(BaseModel):
    """A sweep: a base scenario and the points to run (product of `axes` and/or listed `points`).

    `mode: product` (the default when `axes` is given) runs every combination of the axes' values,
    each combined with every listed point if `points` is given too; `mode: points` runs exactly the
    listed points. Field names are dotted scenario fields, e.g. `pipeline.stages`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "sweep"
    base: dict[str, Any] | str = Field(default_factory=dict)
    axes: dict[str, list[Any]] = Field(default_factory=dict)
    points: list[dict[str, Any]] = Field(default_factory=list)
    mode: Literal["product", "points"] | None = None
    engine: Literal["auto", "simpy", "fast"] = "auto"

    @model_validator(mode="after")
    def _consistent(self) -> "SweepSpec":
        mode = self.resolved_mode
        if mode == "points" and self.axes:
            raise ValueError("axes: `mode: points` runs only the listed points; remove `axes`")
        if mode == "points" and not self.points:
            raise ValueError("points: `mode: points` needs at least one point")
        for name, values in self.axes.items():
            _check_field_name(f"axes.{name}", name)
            if not values:
                raise ValueError(f"axes.{name}: needs at least one value")
        for i, point in enumerate(self.points):
            for name in point:
                _check_field_name(f"points.{i}.{name}", name)
        return self

    @property
    def resolved_mode(self) -> str:
        if self.mode is not None:
            return self.mode
        return "points" if self.points and not self.axes else "product"


def _check_field_name(where: str, name: str) -> None:
    head = name.split(".", 1)[0]
    if head not in SCENARIO_SECTIONS or "." not in name:
        raise ValueError(
            f"{one_line(where, 200)}: not a dotted scenario field "
            f"(start with one of {', '.join(SCENARIO_SECTIONS)})"
        )


def _describe(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    kind = str(error.get("type", ""))
    where = error_location(error.get("loc", ()), kind) or "sweep"
    msg = clean_message(str(error.get("msg", "invalid")))
    if str(error.get("msg", "")).startswith("Value error, "):
        if ": " in msg and msg.split(": ", 1)[0].replace(".", "").replace("_", "").isalnum():
            return msg
    if kind == "extra_forbidden":
        return f"{where}: unknown key (sweep keys: name, base, axes, points, mode, engine)"
    return f"{where}: {msg}"


def parse_sweep(data: Any) -> SweepSpec:
    """Validate plain data as a SweepSpec; SweepError with one line naming the field.

    The data's shape is measured first (shared parts counted each time they occur), so a YAML
    alias bomb under `base` or in the axes is refused before anything walks it."""
    if not isinstance(data, dict):
        raise SweepError("sweep: expected a mapping with keys base, axes and/or points")
    problem = limits.data_shape(data)
    if problem:
        raise SweepError(f"sweep: {problem}")
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise SweepError(_describe(exc)) from None
    total = point_count(spec)
    if total > limits.MAX_SWEEP_POINTS:
        field = "points" if spec.resolved_mode == "points" else "axes"
        raise SweepError(
            f"{field}: {limits.count(total)} points, over the limit of {limits.MAX_SWEEP_POINTS:,} per sweep"
        )
    return spec


def point_count(spec: SweepSpec) -> int:
    """How many points the sweep expands to (without expanding it)."""
    listed = max(1, len(spec.points))
    if spec.resolved_mode == "points":
        return listed
    return listed * math.prod(len(values) for values in spec.axes.values())


def load_sweep(path: str | Path, overrides: Sequence[str] | None = None) -> tuple[SweepSpec, dict[str, Any]]:
    """Read a sweep file; return the spec and its validated base scenario as plain data, with the
    command line's `--set KEY=VALUE` items (`overrides`) applied to the base."""
    path = Path(path)
    data = read_data_file(path, "sweep", SweepError)
    spec = parse_sweep(data)
    return spec, resolve_base(spec, path.parent, overrides)


def resolve_base(spec: SweepSpec, base_dir: Path = Path("."),
                 overrides: Sequence[str] | None = None) -> dict[str, Any]:
    """The base scenario as validated plain data (a path is read relative to `base_dir`), with the
    `--set` items `overrides` applied before it is validated."""
    def validated(data: Any) -> dict[str, Any]:
        return parse_scenario_with_overrides(data, overrides).to_dict()

    if isinstance(spec.base, str):
        base_path = Path(spec.base)
        if not base_path.is_absolute():
            base_path = base_dir / base_path
        try:
            return validated(read_scenario_data(base_path))
        except ScenarioError as exc:
            raise SweepError(str(exc) if _from_overrides(exc) else f"base: {exc}") from None
    data = _copy_plain(spec.base)
    resolve_relative_paths(data, base_dir)
    try:
        return validated(data)
    except ScenarioError as exc:
        raise SweepError(str(exc) if _from_overrides(exc) else f"base.{exc}") from None


def _from_overrides(exc: ScenarioError) -> bool:
    return str(exc).startswith(("--set ", "with the --set items"))


# ---------------------------------------------------------------------------------------------
# expansion


@dataclass(frozen=True)
class SweepPoint:
    """One scenario of a sweep: its updates to the base, and the validated scenario or its error."""

    index: int
    updates: dict[str, Any]
    scenario: dict[str, Any] | None  # validated plain data, None if invalid
    error: str | None
    key: str


def expand(spec: SweepSpec, base: dict[str, Any]) -> list[SweepPoint]:
    """Every point of the sweep, validated (an invalid combination carries its error)."""
    listed = spec.points or [{}]
    if spec.resolved_mode == "points":
        combos: Iterable[dict[str, Any]] = listed
    else:
        names = list(spec.axes)
        grid = [dict(zip(names, values)) for values in itertools.product(*spec.axes.values())]
        combos = [{**point, **axis_values} for point in listed for axis_values in grid]
    base_scenario = parse_scenario(base)
    _check_axis_names(spec, base_scenario)
    points = []
    for index, updates in enumerate(combos):
        try:
            scenario = base_scenario.with_updates(updates).to_dict()
            error = None
        except GpipeError as exc:
            scenario, error = None, str(exc)
        if scenario is None:
            updates = {name: _row_value(value) for name, value in updates.items()}  # for its row
        key_data = scenario if scenario is not None else {"base": base, "updates": updates}
        points.append(SweepPoint(index, dict(updates), scenario, error, scenario_key(key_data, spec.engine)))
    return points


def _check_axis_names(spec: SweepSpec, base: Scenario) -> None:
    """Refuse a misspelled field at once instead of failing every point."""
    names = {name: values[0] for name, values in spec.axes.items()}
    for point in spec.points:
        names.update(point)
    for name, value in names.items():
        try:
            base.with_updates({name: value})
        except ScenarioError as exc:
            if str(exc).endswith("unknown key"):
                raise SweepError(f"axes: {exc}") from None


def scenario_key(data: dict[str, Any], engine: str = "auto") -> str:
    """A stable short hash of a scenario's plain data (and the engine) naming its result file."""
    text = json.dumps({"scenario": _storable(data), "engine": engine}, sort_keys=True, default=_plain)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def _copy_plain(value: Any) -> Any:
    """A deep copy of plain data (mappings and lists; tuples become lists)."""
    if isinstance(value, dict):
        return {k: _copy_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_copy_plain(v) for v in value]
    return value


def _plain(value: Any) -> Any:
    """json.dumps' fallback for values plain data does not hold (str, as before)."""
    return str(value)


def _storable(value: Any) -> Any:
    """`value` with what JSON, CSV and parquet cannot hold made storable: integers beyond 64 bits
    as text (hexadecimal beyond Python's decimal digit limit), keys as text. Input data only
    (its shape was checked when it was read, so this walk is bounded)."""
    if isinstance(value, bool) or value is None or isinstance(value, (float, str)):
        return value
    if isinstance(value, int):
        if -(2**63) <= value < 2**63:
            return value
        return str(value) if abs(value) < 10**4000 else f"{value:#x}"
    if isinstance(value, dict):
        return {_storable_key(k): _storable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_storable(v) for v in value]
    return str(value)


_SMALL = 1000  # an invalid point's value up to this many values (expanded) is kept whole


def _row_value(value: Any) -> Any:
    """An invalid point's value as its row keeps it: a scalar as it is (made storable), a mapping or
    list as JSON text, or, when it is large once shared parts are expanded (a YAML alias bomb), a
    short summary with a digest; never expanded."""
    if not isinstance(value, (dict, list, tuple)):
        return _storable(value)
    memo: dict[int, Any] = {}
    size = _expanded_size(value, memo)
    if size > _SMALL:
        kind = "mapping" if isinstance(value, dict) else "list"
        return f"<a {kind} of {size:,} values, sha256 {_digest(value, {})[:16]}>"
    return json.dumps(_storable(value), sort_keys=True, default=_plain)


def _expanded_size(value: Any, memo: dict[int, Any]) -> int:
    """Values in `value` with shared parts counted each time they occur; linear in distinct objects
    (the sweep's shape was checked when it was parsed: no cycles, bounded depth)."""
    if not isinstance(value, (dict, list, tuple)):
        return 1
    key = id(value)
    if key not in memo:
        memo[key] = 1  # a cycle (not reachable after parse_sweep) counts once
        children = list(value.items()) if isinstance(value, dict) else [(None, v) for v in value]
        memo[key] = 1 + sum((k is not None) + _expanded_size(v, memo) for k, v in children)
    return memo[key]


def _digest(value: Any, memo: dict[int, str]) -> str:
    """A hash of `value`'s content (shared parts hashed once), for keys of values too large to write."""
    if isinstance(value, (dict, list, tuple)):
        key = id(value)
        if key not in memo:
            memo[key] = ""
            if isinstance(value, dict):
                parts = sorted(f"{_digest(k, memo)}:{_digest(v, memo)}" for k, v in value.items())
                text = "{" + ",".join(parts) + "}"
            else:
                text = "[" + ",".join(_digest(v, memo) for v in value) + "]"
            memo[key] = hashlib.sha256(text.encode()).hexdigest()
        return memo[key]
    text = json.dumps(_storable(value), default=_plain)
    return hashlib.sha256(f"{type(value).__name__}:{text}".encode("utf-8", "surrogatepass")).hexdigest()


def _storable_key(key: Any) -> str:
    value = _storable(key)
    return value if isinstance(value, str) else json.dumps(value, default=_plain)


# ---------------------------------------------------------------------------------------------
# one scenario -> one row


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested plain data as dotted names; lists of scalars become JSON text, tables their length."""
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    name = prefix[:-1]
    if isinstance(data, (list, tuple)):
        if any(isinstance(v, (dict, list, tuple)) for v in data):
            out[name] = f"<{len(data)} entries>"
        else:
            out[name] = json.dumps(list(data))
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


def result_columns(scenario: Scenario, engine: str) -> dict[str, Any]:
    """Simulate one scenario and return its scalar result fields (and per-stage lists)."""
    from gpipe_sim.plan.compile import compile_plan
    from gpipe_sim.api import result_from_times, run_engine

    plan = compile_plan(scenario)
    start, end = run_engine(plan, engine)  # type: ignore[arg-type]
    result = result_from_times(plan, start, end)
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
        "total_params": int(sum(c.params for c in plan.chunks)),
        "max_stage_peak_memory_bytes": max(s.peak_memory_bytes for s in stages),
        "max_stage_peak_activation_bytes": max(s.peak_activation_bytes for s in stages),
        "max_device_peak_memory_bytes": max(result.device_peak_memory_bytes.values()),
        "stage_peak_memory_bytes": [s.peak_memory_bytes for s in stages],
        "stage_peak_activation_bytes": [s.peak_activation_bytes for s in stages],
        "stage_param_bytes": [s.param_bytes for s in stages],
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
    path = runs / f"{row['sweep.key']}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(row, default=str))
    os.replace(tmp, path)  # atomic: a killed sweep leaves whole files or none


def _read_row(path: Path) -> dict[str, Any] | None:
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
    engine: str = "auto",
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
        for name in RESULT_COLUMNS:
            record[name] = row.get(name)
        record["status"] = row.get("status", "error")
        record["error"] = row.get("error")
        record["elapsed_s"] = row.get("elapsed_s")
        records.append(record)
    table = pd.DataFrame.from_records(records)
    if table.empty:
        return pd.DataFrame(columns=list(STATUS_COLUMNS) + list(RESULT_COLUMNS))
    inputs = [c for c in table.columns if c.split(".", 1)[0] in SCENARIO_SECTIONS]
    ordered = ["sweep.index", "sweep.key", *inputs, *RESULT_COLUMNS, "status", "error", "elapsed_s"]
    table = table[ordered]
    for column in inputs:  # one type per column, so parquet can store it
        values = table[column].dropna()
        kinds = {type(v) for v in values}
        if kinds and not kinds <= {int, float} and not kinds <= {bool} and not kinds <= {str}:
            table[column] = table[column].map(lambda v: None if v is None else _text(v))
    table["fits_in_memory"] = table["fits_in_memory"].astype("boolean")
    return table


def _text(value: Any) -> str:
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


# ---------------------------------------------------------------------------------------------
# the best configurations


BEST_SHOWN = 5


def varying_inputs(table: Any, axes: Sequence[str] = ()) -> list[str]:
    """The input columns that tell the rows apart: the sweep's own axis and point fields that are
    columns (a mapping value is several: `pipeline.schedule.csv`), else every input column whose
    value differs between rows."""
    inputs = [c for c in table.columns if c.split(".", 1)[0] in SCENARIO_SECTIONS]
    named = [c for c in inputs if any(c == a or c.startswith(a + ".") for a in axes)]
    varying = [c for c in inputs if table[c].astype(str).nunique(dropna=False) > 1]
    named = [c for c in named if c in varying] or named
    return named or varying


def best_configurations(table: Any, top: int = BEST_SHOWN) -> Any:
    """The `top` rows that ran and fit in memory, fastest (highest throughput) first (a DataFrame)."""
    if not len(table):
        return table
    ok = table[(table["status"] == "ok") & table["fits_in_memory"].fillna(False).astype(bool)]
    return ok.sort_values(["throughput_samples_per_s", "sweep.index"], ascending=[False, True],
                          kind="stable").head(top)


def best_text(table: Any, axes: Sequence[str] = (), top: int = BEST_SHOWN) -> str:
    """The best configurations that fit, as a table: their varying inputs, step time, throughput,
    bubble and largest device peak; or one line saying that none fits (and the nearest miss)."""
    from rich.table import Table

    from gpipe_sim.studies.report import _render
    from gpipe_sim.spec.units import format_bytes, format_seconds

    ran = table[table["status"] == "ok"] if len(table) else table
    if not len(ran):
        return "no configuration ran: nothing to rank"
    best = best_configurations(table, top)
    if not len(best):
        near = ran.sort_values(["max_device_peak_memory_bytes", "sweep.index"], kind="stable").iloc[0]
        cap = near["memory_capacity_bytes"]
        capacity = format_bytes(float(cap)) if cap is not None and cap == cap else "inf"
        return (f"none of the {len(ran)} configurations that ran fits in memory; the nearest, sweep.index "
                f"{int(near['sweep.index'])}, needs {format_bytes(float(near['max_device_peak_memory_bytes']))} "
                f"on its fullest device (capacity {capacity})")
    fits = int(ran["fits_in_memory"].fillna(False).astype(bool).sum())
    columns = varying_inputs(table, axes)
    short = _short_names(columns)
    out = Table(title=f"best {len(best)} of the {fits} configurations that fit in memory (by throughput)")
    out.add_column("#", justify="right")
    for name in columns:
        out.add_column(short[name])
    for name in ("step time", "samples/s", "bubble", "largest device peak"):
        out.add_column(name, justify="right")
    for rank, (_, row) in enumerate(best.iterrows(), start=1):
        cap = row["memory_capacity_bytes"]
        peak = format_bytes(float(row["max_device_peak_memory_bytes"]))
        if cap is not None and cap == cap:
            peak += f" of {format_bytes(float(cap))}"
        out.add_row(
            str(rank), *(_cell(row[name]) for name in columns),
            format_seconds(float(row["step_time_s"])),
            f"{float(row['throughput_samples_per_s']):,.1f}",
            f"{float(row['bubble_fraction']):.3f}",
            peak,
        )
    return _render(out)


def _short_names(columns: Sequence[str]) -> dict[str, str]:
    """"pipeline.stages" -> "stages" where the last part names one column only."""
    last = [c.rsplit(".", 1)[-1] for c in columns]
    return {c: (tail if last.count(tail) == 1 else c) for c, tail in zip(columns, last)}


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return one_line(str(value), 60)
