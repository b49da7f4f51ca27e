"""Loading the app's input files (sweep tables, layer tables) with one-line errors (validation JSON:
`ValidationDocument.from_json`)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from gpipe_sim.errors import first_line
from gpipe_sim.model.model import load_layer_table_file
from gpipe_sim.scenario.scenario import Scenario, set_dotted

SWEEP_FILES = ("results.parquet", "results.csv")


def read_sweep_bytes(name: str, data: bytes) -> pd.DataFrame:
    """A sweep table from an uploaded `.parquet` or `.csv` file's bytes."""
    try:
        if name.endswith(".parquet"):
            return pd.read_parquet(io.BytesIO(data))
        if name.endswith(".csv"):
            return pd.read_csv(io.BytesIO(data))
    except Exception as exc:  # pandas/pyarrow raise many types for malformed files
        raise ValueError(f"cannot read {name!r}: {first_line(exc)}") from None
    raise ValueError(f"{name!r}: expected results.parquet or results.csv")


def find_sweep_file(path: str | Path) -> Path:
    """The results file of a sweep output folder (or `path` itself when it is a file)."""
    path = Path(path).expanduser()
    if path.is_dir():
        for name in SWEEP_FILES:
            if (path / name).is_file():
                return path / name
        raise ValueError(f"{str(path)!r} holds neither {' nor '.join(SWEEP_FILES)}")
    if path.is_file():
        return path
    raise ValueError(f"{str(path)!r} does not exist")


def load_sweep_path(path: str | Path) -> pd.DataFrame:
    """A sweep table from a sweep output folder or a results file."""
    file = find_sweep_file(path)
    return read_sweep_bytes(file.name, file.read_bytes())


@dataclass
class SweepColumns:
    """A sweep table's columns: inputs (dotted names), numeric results, and the failed rows."""

    inputs: list[str]
    results: list[str]
    ok: pd.DataFrame
    failed: pd.DataFrame


MAX_STAGE_COLUMNS = 64


def _as_list(value: Any) -> list[float] | None:
    if isinstance(value, str) and value.startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        items = list(value.tolist() if hasattr(value, "tolist") else value)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
            return [float(v) for v in items]
    return None


def _expand_lists(df: pd.DataFrame, skip: set[str]) -> pd.DataFrame:
    """Per-stage list columns (e.g. stage_peak_memory_bytes) as one numeric column per stage: NAME[k]."""
    extra: dict[str, list[float | None]] = {}
    for column in df.columns:
        dtype = df[column].dtype
        if column in skip or not (pd.api.types.is_object_dtype(dtype) or pd.api.types.is_string_dtype(dtype)):
            continue
        lists = df[column].map(_as_list)
        present = lists.dropna()
        if present.empty or len(present) != df[column].notna().sum():
            continue
        width = min(MAX_STAGE_COLUMNS, max(len(v) for v in present))
        for k in range(width):
            extra[f"{column}[{k}]"] = [v[k] if isinstance(v, list) and k < len(v) else None for v in lists]
    if not extra:
        return df
    return pd.concat([df, pd.DataFrame(extra, index=df.index, dtype=float)], axis=1)


def split_sweep(df: pd.DataFrame) -> SweepColumns:
    """Separate input columns, numeric result columns, and successful from failed rows.

    Inputs are the dotted scenario fields (model.*, hardware.*, pipeline.*, training.*); list-valued
    per-stage results become one column per stage.
    """
    if df.empty:
        raise ValueError("the sweep table has no rows")
    sections = tuple(f"{name}." for name in Scenario.model_fields)
    inputs = [c for c in df.columns if str(c).startswith(sections)]
    if not inputs:
        raise ValueError("the sweep table has no input columns (dotted names such as pipeline.stages)")
    df = _expand_lists(df, set(inputs) | {"error", "note"})
    if "error" in df.columns:
        err = df["error"]
        bad = err.notna() & (err.astype(str).str.strip() != "")
    else:
        bad = pd.Series(False, index=df.index)
    ok, failed = df[~bad], df[bad]
    results = [
        c for c in df.columns
        if c not in inputs and c not in ("error", "note") and "." not in str(c)
        and (pd.api.types.is_numeric_dtype(df[c]) or pd.api.types.is_bool_dtype(df[c]))
    ]
    return SweepColumns(inputs, results, ok, failed)


def row_scenario_data(row: Mapping[str, Any], inputs: Sequence[str]) -> dict[str, Any]:
    """Scenario data rebuilt from one sweep row's dotted input columns (presets first)."""
    data: dict[str, Any] = {}
    for column in sorted(inputs, key=lambda c: (not c.endswith(".preset"), c)):
        value = row[column]
        if hasattr(value, "item") and not isinstance(value, (list, tuple)):
            value = value.item()
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        if isinstance(value, str) and value.startswith("<") and value.endswith("entries>"):
            raise ValueError(f"{column}: the table keeps only a summary ({value}); "
                             "load the sweep's scenario file instead")
        if isinstance(value, str) and value.startswith("["):
            with contextlib.suppress(json.JSONDecodeError):
                value = json.loads(value)
        set_dotted(data, column, value)
    return data


def read_layer_table(name: str, data: bytes) -> dict[str, Any]:
    """An uploaded per-layer table (YAML/JSON) as a `model` mapping `{preset: table, layers: [...]}`."""
    suffix = ".json" if name.lower().endswith(".json") else ".yaml"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"layers{suffix}"
        path.write_bytes(data)
        try:
            table = load_layer_table_file(path)
        except ValueError as exc:
            raise ValueError(str(exc).replace(str(path), name)) from None
    return {"preset": "table", **table}
