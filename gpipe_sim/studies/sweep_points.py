"""A sweep's points: the grid or point list expanded into validated scenarios, each keyed by a hash."""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from typing import Any, Iterable

from gpipe_sim.errors import GpipeError, ScenarioError
from gpipe_sim.spec.scenario import Scenario, parse_scenario
from gpipe_sim.studies.sweep_spec import SweepError, SweepSpec


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
            if ": unknown key" in str(exc):
                raise SweepError(f"axes: {exc}") from None


def scenario_key(data: dict[str, Any], engine: str = "auto") -> str:
    """A stable short hash of a scenario's plain data (and the engine) naming its result file."""
    text = json.dumps({"scenario": _storable(data), "engine": engine}, sort_keys=True, default=_plain)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:20]



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
    """A mapping key as text (`_storable`, then JSON for what is not text already)."""
    value = _storable(key)
    return value if isinstance(value, str) else json.dumps(value, default=_plain)
