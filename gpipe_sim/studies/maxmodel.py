"""Largest model that fits: grow one size field (layers, width...) until some stage runs out of memory."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from gpipe_sim.errors import GpipeError, ScenarioError
from gpipe_sim.model.layers import describe_layer_count
from gpipe_sim.model.model import AmoebaNetModel, TransformerModel
from gpipe_sim.scenario.scenario import Scenario
from gpipe_sim.schema.units import format_bytes

DEFAULT_LIMIT = 2**16
SHORT_NAMES = {"width": ("width", "d_model", "filters", "channels")}


class SearchError(GpipeError, ValueError):
    """The size field cannot be grown (unknown, not an integer, no valid starting value)."""


@dataclass(frozen=True)
class Fit:
    """Memory figures of one tried size."""

    value: int
    fits: bool
    params: int
    param_memory_bytes: float  # weights + gradients + optimizer states, all stages
    peak_activation_bytes: float  # sum over stages of each stage's activation peak
    max_stage_peak_bytes: float
    capacity_bytes: float
    scenario: Scenario | None = None


@dataclass
class MaxModel:
    """The outcome of a search: the largest fitting value (None if even the smallest fails)."""

    field: str
    step: int
    largest: int | None
    best: Fit | None
    first_too_big: Fit | None
    tried: list[Fit] = field(default_factory=list)


def resolve_field(scenario: Scenario, name: str) -> str:
    """The dotted field for `name` ("layers" -> "model.layers"; "width" -> the model's width field)."""
    if "." in name:
        return name
    model_fields = type(scenario.model).model_fields
    if name in model_fields:
        return f"model.{name}"
    for alias in SHORT_NAMES.get(name, ()):
        if alias in model_fields:
            return f"model.{alias}"
    raise SearchError(
        f"--grow: the {scenario.model.preset} model has no field {name!r} "
        f"(integer fields: {', '.join(_int_fields(scenario))})"
    )


def _int_fields(scenario: Scenario) -> list[str]:
    data = scenario.model.model_dump()
    return [k for k, v in data.items() if isinstance(v, int) and not isinstance(v, bool)]


def natural_step(scenario: Scenario, dotted: str) -> int:
    """The smallest valid increment: AmoebaNet's L grows by 3, a transformer's d_model by `heads`."""
    model = scenario.model
    if dotted == "model.layers" and isinstance(model, AmoebaNetModel):
        return 3
    if dotted == "model.d_model" and isinstance(model, TransformerModel):
        return model.heads
    return 1


def _get(scenario: Scenario, dotted: str) -> Any:
    node: Any = scenario.to_dict()
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            raise SearchError(f"--grow: {dotted} is not a field of this scenario")
        node = node[key]
    return node


def measure(scenario: Scenario, value: int, dotted: str) -> Fit:
    """Simulate the scenario with `dotted` set to `value` and return its memory figures."""
    from gpipe_sim.plan.compile import compile_plan
    from gpipe_sim.api import simulate_plan

    candidate = scenario.with_updates({dotted: value})
    plan = compile_plan(candidate)
    result = simulate_plan(plan)
    return Fit(
        value=value,
        fits=bool(result.fits_in_memory),
        params=int(sum(c.params for c in plan.chunks)),
        param_memory_bytes=float(sum(c.param_bytes + c.state_bytes for c in plan.chunks)),
        peak_activation_bytes=float(sum(s.peak_activation_bytes for s in result.stages)),
        max_stage_peak_bytes=float(max(result.device_peak_memory_bytes.values())),
        capacity_bytes=float(result.memory_capacity_bytes),
        scenario=candidate,
    )


def find_max_model(
    scenario: Scenario,
    grow: str,
    *,
    step: int | None = None,
    start: int | None = None,
    limit: int | None = None,
    progress: Callable[[Fit], None] | None = None,
) -> MaxModel:
    """Largest multiple of `step` (from `start`) for field `grow` whose every device fits in memory.

    Fitting must be monotone in the field (a bigger model never needs less memory): the search
    doubles the value until a size does not fit, then bisects, in steps of `step`. Values that
    the scenario schema rejects below the first valid one (say, fewer layers than stages) are
    skipped upward.
    """
    dotted, step, limit = _search_space(scenario, grow, step, start, limit)
    trials = _Trials(scenario, dotted, step, progress)
    lo, first = _first_valid(trials, start, limit)
    if not first.fits:
        return MaxModel(dotted, step, None, None, first, trials.ordered())
    return _grow(trials, lo, limit)


def _search_space(scenario: Scenario, grow: str, step: int | None, start: int | None,
                  limit: int | None) -> tuple[str, int, int]:
    """(the dotted field, the step, the limit) of a search; SearchError where the field is not an
    integer, memory is unlimited or a flag is below 1."""
    dotted = resolve_field(scenario, grow)
    current = _get(scenario, dotted)
    if not isinstance(current, int) or isinstance(current, bool):
        raise SearchError(f"--grow: {dotted} is not an integer field (it is {current!r})")
    if math.isinf(scenario.hardware.accelerator.memory_bytes):
        raise SearchError("hardware.accelerator.memory_bytes: unlimited memory, so every size fits")
    if step is None:
        step = natural_step(scenario, dotted)
    for flag, value in (("--step", step), ("--start", start), ("--limit", limit)):
        if value is not None and value < 1:
            raise SearchError(f"{flag}: must be >= 1, got {value}")
    return dotted, step, limit or DEFAULT_LIMIT


class _Trials:
    """The sizes tried so far, each measured once: values are `units` x `step`."""

    def __init__(self, scenario: Scenario, dotted: str, step: int,
                 progress: Callable[[Fit], None] | None) -> None:
        self.scenario, self.dotted, self.step, self.progress = scenario, dotted, step, progress
        self.tried: dict[int, Fit] = {}

    def check(self, units: int) -> Fit | None:
        """The Fit of value units x step (measured on first asking, then reported to `progress`);
        None where the scenario schema rejects the value."""
        value = units * self.step
        if value not in self.tried:
            try:
                self.tried[value] = measure(self.scenario, value, self.dotted)
            except ScenarioError:
                return None
            if self.progress is not None:
                self.progress(self.tried[value])
        return self.tried[value]

    def ordered(self) -> list[Fit]:
        """Every Fit measured, smallest value first."""
        return [self.tried[v] for v in sorted(self.tried)]


def _first_valid(trials: _Trials, start: int | None, limit: int) -> tuple[int, Fit]:
    """(units, Fit) of the value to grow from: `start` rounded up to a step (the first step without
    one), doubled while the schema rejects it (SearchError past `limit`); without `start`, then
    bisected down to the smallest valid value."""
    step = trials.step
    lo = max(1, -(-(start or step) // step))
    first = trials.check(lo)
    while first is None:  # below the first valid value: move up (doubling)
        lo *= 2
        if lo * step > limit:
            raise SearchError(f"--grow: no valid value of {trials.dotted} up to {limit}")
        first = trials.check(lo)
    # A smaller valid value than the doubling found may exist: bisect down to the first valid one.
    if lo > 1 and start is None:
        bad, good = lo // 2, lo
        while good - bad > 1:
            mid = (bad + good) // 2
            if trials.check(mid) is None:
                bad = mid
            else:
                good = mid
        lo = good
        first = trials.check(lo)
    assert first is not None
    return lo, first


def _grow(trials: _Trials, lo: int, limit: int) -> MaxModel:
    """From a fitting value of `lo` units: double until a value does not fit (or is invalid, or
    `limit` is reached), then bisect between the last that fitted and the first that did not."""
    step, dotted = trials.step, trials.dotted
    hi = lo
    while True:  # double until a value does not fit (or is invalid)
        nxt = hi * 2
        if nxt * step > limit:
            nxt = limit // step
            if nxt <= hi:
                fit = trials.check(hi)
                return MaxModel(dotted, step, hi * step, fit, None, trials.ordered())
        fit = trials.check(nxt)
        if fit is None or not fit.fits:
            break
        lo = hi = nxt
    bad = nxt
    while bad - lo > 1:
        mid = (lo + bad) // 2
        fit = trials.check(mid)
        if fit is not None and fit.fits:
            lo = mid
        else:
            bad = mid
    return MaxModel(dotted, step, lo * step, trials.check(lo), trials.tried.get(bad * step), trials.ordered())


def max_model_text(found: MaxModel) -> str:
    """A short report: the largest size, its parameters and memory, and the first that fails."""
    lines = []
    if found.best is None:
        first = found.first_too_big
        assert first is not None
        lines.append(
            f"no value of {found.field} fits: the smallest, {first.value}, needs "
            f"{format_bytes(first.max_stage_peak_bytes)} on its fullest device "
            f"(capacity {format_bytes(first.capacity_bytes)})"
        )
        return "\n".join(lines)
    b = found.best
    lines.append(f"largest {found.field} that fits: {found.largest} (search step {found.step})")
    if found.field == "model.layers" and b.scenario is not None:
        lines.append(f"  layers:                 {describe_layer_count(b.scenario.model)}")
    lines.append(f"  parameters:             {b.params:,} ({b.params / 1e6:,.1f}M)")
    lines.append(f"  parameter memory:       {format_bytes(b.param_memory_bytes)} "
                 "(weights, gradients, optimizer states; all stages)")
    lines.append(f"  peak activation memory: {format_bytes(b.peak_activation_bytes)} (sum of stage peaks)")
    lines.append(f"  fullest device:         {format_bytes(b.max_stage_peak_bytes)} of "
                 f"{format_bytes(b.capacity_bytes)}")
    if found.first_too_big is not None:
        t = found.first_too_big
        lines.append(f"  next size ({t.value}) needs {format_bytes(t.max_stage_peak_bytes)} on its "
                     "fullest device: does not fit")
    else:
        lines.append("  (reached the search limit)")
    return "\n".join(lines)
