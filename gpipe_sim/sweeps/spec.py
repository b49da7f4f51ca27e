"""The sweep file: parsing and validating a sweep's YAML (its base scenario, axes and points)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpipe_sim.engines.choice import DEFAULT_ENGINE, Engine
from gpipe_sim.errors import GpipeError, ScenarioError, one_line
from gpipe_sim.schema import limits
from gpipe_sim.schema.files import read_data_file
from gpipe_sim.scenario.scenario import (
    SECTIONS, parse_scenario_with_overrides, read_scenario_data, resolve_relative_paths, with_default_sections,
)
from gpipe_sim.schema.field_errors import describe_error

SCENARIO_SECTIONS = SECTIONS  # a sweep's input columns start with one of these


class SweepError(GpipeError, ValueError):
    """A sweep file is malformed or names an unknown field."""


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
    engine: Engine = DEFAULT_ENGINE

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
    """ValueError unless `name` is a dotted field of a scenario section (`pipeline.stages`)."""
    head = name.split(".", 1)[0]
    if head not in SCENARIO_SECTIONS or "." not in name:
        raise ValueError(
            f"{one_line(where, 200)}: not a dotted scenario field "
            f"(start with one of {', '.join(SCENARIO_SECTIONS)})"
        )


# a sweep validator's message that leads with the field it names (`axes: ...`, `base.model: ...`)
_SWEEP_NAMES_FIELD = re.compile(r"^[A-Za-z0-9_.]+: ")


def _describe(exc: ValidationError) -> str:
    """The first validation error as one line, led by the sweep field it names."""
    return describe_error(exc.errors(include_url=False)[0], "sweep",
                          unknown_key="unknown key (sweep keys: name, base, axes, points, mode, engine)",
                          names_field=_SWEEP_NAMES_FIELD)


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


def base_file(spec: SweepSpec, base_dir: Path = Path(".")) -> Path | None:
    """The scenario file the sweep's base names (relative to `base_dir`), None for a mapping."""
    if not isinstance(spec.base, str):
        return None
    path = Path(spec.base)
    return path if path.is_absolute() else base_dir / path


def resolve_base(spec: SweepSpec, base_dir: Path = Path("."),
                 overrides: Sequence[str] | None = None) -> dict[str, Any]:
    """The base scenario as validated plain data (a path is read relative to `base_dir`), with the
    `--set` items `overrides` applied before it is validated."""
    def validated(data: Any) -> dict[str, Any]:
        return parse_scenario_with_overrides(data, overrides).to_dict()

    base_path = base_file(spec, base_dir)
    if base_path is not None:
        try:
            return validated(read_scenario_data(base_path))
        except ScenarioError as exc:
            raise SweepError(str(exc) if _from_overrides(exc) else f"base: {exc}") from None
    data = with_default_sections(_copy_plain(spec.base))  # as a scenario file: sections left out are the default's
    resolve_relative_paths(data, base_dir)
    try:
        return validated(data)
    except ScenarioError as exc:
        raise SweepError(str(exc) if _from_overrides(exc) else f"base.{exc}") from None


def _from_overrides(exc: ScenarioError) -> bool:
    """Whether the error came from a `--set` item (its message says so already: no prefix)."""
    return str(exc).startswith(("--set ", "with the --set items"))


def _copy_plain(value: Any) -> Any:
    """A deep copy of plain data (mappings and lists; tuples become lists)."""
    if isinstance(value, dict):
        return {k: _copy_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_copy_plain(v) for v in value]
    return value
