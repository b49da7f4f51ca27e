"""A sweep's points: the grid or point list expanded into validated scenarios, each keyed by a hash."""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Iterable, Sequence

from gpipe_sim.engines.choice import DEFAULT_ENGINE, Engine
from gpipe_sim.errors import GpipeError, ScenarioError
from gpipe_sim.scenario.scenario import Scenario, parse_scenario
from gpipe_sim.sweeps.spec import SweepError, SweepSpec, base_file

CHUNKS = "pipeline.chunks"


@dataclass(frozen=True)
class SweepPoint:
    """One scenario of a sweep: its updates to the base, and the validated scenario or its error."""

    index: int
    updates: dict[str, Any]
    scenario: dict[str, Any] | None  # validated plain data, None if invalid
    error: str | None
    key: str
    notes: tuple[str, ...] = ()  # fields filled in for its schedule, axis values meaningless for it


def expand(spec: SweepSpec, base: dict[str, Any], given: Collection[str] | None = None) -> list[SweepPoint]:
    """Every point of the sweep, validated (an invalid combination carries its error).

    A point whose schedule needs a chunk count other than the base's (zbv, dualpipev: 2 per rank;
    gpipe, 1f1b...: 1) runs with that count unless the point sets `pipeline.chunks` itself; an
    interleaved family gets 2 unless the user gave `pipeline.chunks` (`given`: the dotted fields
    the user wrote in the base, by default read from a mapping base). Each point notes what was
    filled in and which of its values mean nothing to its schedule (`SweepPoint.notes`)."""
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
    chunks_given = CHUNKS in (given_fields(spec) if given is None else given)
    for index, updates in enumerate(combos):
        scenario, error, updates, notes = _validated(base_scenario, dict(updates), chunks_given)
        if scenario is None:
            updates = {name: _row_value(value) for name, value in updates.items()}  # for its row
        key_data = scenario if scenario is not None else {"base": base, "updates": updates}
        points.append(SweepPoint(index, dict(updates), scenario, error, scenario_key(key_data, spec.engine),
                                 tuple(notes)))
    return points


def _validated(base: Scenario, updates: dict[str, Any], chunks_given: bool
               ) -> tuple[dict[str, Any] | None, str | None, dict[str, Any], list[str]]:
    """The point's scenario (or None and its error), its updates with the fields its schedule
    needs filled in, and its notes."""
    filled, notes = schedule_fields(base, updates, chunks_given)

    def attempt(changes: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
        try:
            return base.with_updates(changes).to_dict(), None
        except GpipeError as exc:
            return None, str(exc)

    scenario, error = attempt({**updates, **filled})
    family = _family(base, updates)
    if scenario is None and filled and family.chunks_per_rank is None:
        plain, _ = attempt(updates)  # an interleaved family that cannot run its default v
        if plain is not None:
            return plain, None, updates, [f"{family.name} runs one chunk per rank, not interleaved "
                                          f"({CHUNKS}={filled[CHUNKS]} would not run: {error})"]
    return scenario, error, {**updates, **filled}, notes


def _family(base: Scenario, updates: dict[str, Any]) -> Any:
    """The registered schedule family a point runs (None: a CSV schedule or an unknown name)."""
    from gpipe_sim.schedule import SCHEDULES

    schedule = updates.get("pipeline.schedule", base.pipeline.schedule)
    return SCHEDULES.get(schedule) if isinstance(schedule, str) else None


def schedule_fields(base: Scenario, updates: dict[str, Any], chunks_given: bool
                    ) -> tuple[dict[str, Any], list[str]]:
    """The fields a point's schedule needs that neither the point nor the user set (its chunks per
    rank), and notes: what was filled in, and point values meaningless for the schedule."""
    family = _family(base, updates)
    if family is None:
        return {}, []
    name, fixed = family.name, family.chunks_per_rank
    if CHUNKS in updates:
        value = str(updates[CHUNKS]).strip()
        if fixed is not None and value != str(fixed):
            return {}, [f"{CHUNKS}={value} means nothing to {name}, which runs {_count(fixed)} per rank"]
        if fixed is None and value == "1":
            return {}, [f"{CHUNKS}=1: {name} with one chunk per rank does not interleave"]
        return {}, []
    current = base.pipeline.chunks
    if fixed is not None:
        if current == fixed:
            return {}, []
        return {CHUNKS: fixed}, [f"{CHUNKS} set to {fixed}: {name} runs {_count(fixed)} per rank"]
    if current != 1:
        return {}, []
    if chunks_given:
        return {}, [f"{CHUNKS}=1: {name} with one chunk per rank does not interleave"]
    default = family.default_chunks
    return {CHUNKS: default}, [f"{CHUNKS} set to {default} for {name}; give {CHUNKS} to choose"]


def _count(chunks: int) -> str:
    return "one chunk" if chunks == 1 else f"{chunks} chunks"


def given_fields(spec: SweepSpec, base_dir: Path = Path("."), overrides: Sequence[str] | None = None
                 ) -> frozenset[str]:
    """The dotted fields the user wrote in the sweep's base (a mapping, or the file it names, read
    relative to `base_dir`) or gave as `--set KEY=VALUE` items."""
    data: Any = spec.base
    path = base_file(spec, base_dir)
    if path is not None:
        from gpipe_sim.scenario.scenario import read_scenario_data

        try:
            data = read_scenario_data(path)
        except GpipeError:
            data = {}
    names = set(_dotted(data)) if isinstance(data, dict) else set()
    names.update(str(item).split("=", 1)[0].strip() for item in overrides or ())
    return frozenset(names)


def _dotted(data: dict[str, Any], prefix: str = "", depth: int = 0) -> Iterable[str]:
    for key, value in data.items():
        name = f"{prefix}{key}"
        yield name
        if isinstance(value, dict) and depth < 3:
            yield from _dotted(value, name + ".", depth + 1)


def notes_text(points: Sequence[SweepPoint]) -> str:
    """The sweep's notes, each once with how many points it concerns (empty when there are none)."""
    counts: dict[str, int] = {}
    for point in points:
        for note in point.notes:
            counts[note] = counts.get(note, 0) + 1
    return "\n".join(f"note: {note} ({n} point{'s' if n != 1 else ''})" for note, n in counts.items())


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


def scenario_key(data: dict[str, Any], engine: Engine = DEFAULT_ENGINE) -> str:
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
