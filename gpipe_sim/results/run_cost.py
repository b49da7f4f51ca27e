"""Time and cost to train on a token budget, and the share of it failures and checkpoints take.

The goodput model is first-order (Young 1974, Daly 2006): failures arrive as a Poisson process at
the rate devices / MTBF per device, so the system fails every M = MTBF x 3600 / devices seconds.
Training runs in segments of a checkpoint interval tau followed by a save of delta seconds; each
failure costs the restart R plus, on average, half a segment (tau + delta) / 2 of lost work. The
useful share of wall-clock time is then

    goodput = tau / (tau + delta) x max(0, 1 - (R + (tau + delta) / 2) / M),

whose maximum over tau lies at tau* = sqrt(2 delta (M - R)) - delta (Young's sqrt(2 delta M)
with Daly's -delta, and the restart taken out of the time between failures).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from gpipe_sim.scenario.training_run import Goodput
from gpipe_sim.schema.units import format_seconds

if TYPE_CHECKING:
    from gpipe_sim.scenario.scenario import Scenario

HOUR_S = 3600.0
DAY_S = 86400.0


@dataclass(frozen=True)
class GoodputFigures:
    """The goodput model's figures for one device count (the formula in the module's docstring)."""

    system_mtbf_s: float  # M: mean seconds between failures of any of the devices
    checkpoint_interval_s: float | None  # tau: given, else the optimum (None: no interval makes progress)
    optimal_interval_s: float | None  # tau*: None where no interval makes progress
    goodput: float  # the useful share of wall-clock time, in [0, 1]


def optimal_interval(save_s: float, restart_s: float, system_mtbf_s: float) -> float | None:
    """tau* = sqrt(2 delta (M - R)) - delta, the interval that maximises goodput; None where it is
    not positive (a save or a restart as long as the time between failures: nothing helps)."""
    tau = math.sqrt(2.0 * save_s * max(0.0, system_mtbf_s - restart_s)) - save_s
    return tau if tau > 0 else None


def goodput_share(interval_s: float, save_s: float, restart_s: float, system_mtbf_s: float) -> float:
    """tau / (tau + delta) x max(0, 1 - (R + (tau + delta) / 2) / M)."""
    segment = interval_s + save_s
    return interval_s / segment * max(0.0, 1.0 - (restart_s + segment / 2.0) / system_mtbf_s)


def goodput_figures(spec: Goodput, devices: int) -> GoodputFigures:
    """The goodput of a run on `devices` devices under `spec`'s failure and checkpoint figures."""
    mtbf = spec.mtbf_device_hours * HOUR_S / max(1, devices)
    best = optimal_interval(spec.checkpoint_save_s, spec.restart_s, mtbf)
    interval = spec.checkpoint_interval_s if spec.checkpoint_interval_s is not None else best
    share = 0.0 if interval is None else goodput_share(interval, spec.checkpoint_save_s, spec.restart_s, mtbf)
    return GoodputFigures(system_mtbf_s=mtbf, checkpoint_interval_s=interval, optimal_interval_s=best,
                          goodput=share)


@dataclass(frozen=True)
class RunCost:
    """A training run's time and cost from one step's time. Each figure is None where what it
    needs is not given: `steps` and the times need `training.tokens`, `goodput` its model, the
    costs `hardware.price_per_device_hour`; the time, device-hours and cost are also None where the
    goodput is 0 (the run never finishes).

    steps = ceil(tokens / tokens per step); failure_free_time_s = steps x step time;
    time_s = failure_free_time_s / goodput (= failure-free without a goodput model);
    device_hours = time_s x devices / 3600; cost = device_hours x price;
    cost_per_hour = devices x price."""

    devices: int
    tokens: float | None = None
    tokens_per_step: float | None = None
    steps: int | None = None
    failure_free_time_s: float | None = None
    time_s: float | None = None
    device_hours: float | None = None
    price_per_device_hour: float | None = None
    cost: float | None = None
    cost_per_hour: float | None = None
    goodput: GoodputFigures | None = None

    @property
    def days(self) -> float | None:
        return None if self.time_s is None else self.time_s / DAY_S

    def to_dict(self) -> dict[str, Any]:
        """Plain figures (JSON-ready): the fields, `days`, and the goodput model's under `goodput`."""
        out = {k: v for k, v in asdict(self).items() if k != "goodput"}
        out["days"] = self.days
        out["goodput"] = None if self.goodput is None else asdict(self.goodput)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunCost":
        g = d.get("goodput")
        fields = {k: d.get(k) for k in cls.__dataclass_fields__ if k not in ("devices", "goodput")}
        return cls(devices=int(d["devices"]), **fields,
                   goodput=None if g is None else GoodputFigures(**g))


# A run's figures as flat columns (sweep tables, the planner's CSV)
RUN_COLUMNS = ("run_days", "run_device_hours", "run_goodput", "run_cost", "run_cost_per_hour")


def run_columns(run: RunCost | None) -> dict[str, Any]:
    """The RUN_COLUMNS of a run (none for None: the scenario asks for no run figures)."""
    if run is None:
        return {}
    return {"run_days": run.days, "run_device_hours": run.device_hours,
            "run_goodput": None if run.goodput is None else run.goodput.goodput,
            "run_cost": run.cost, "run_cost_per_hour": run.cost_per_hour}


def run_cost(*, devices: int, step_time_s: float, tokens_per_step: float | None, tokens: float | None,
             price_per_device_hour: float | None, goodput: Goodput | None) -> RunCost | None:
    """The run's figures (RunCost) for a step of `step_time_s` on `devices` devices; None when
    none of the token budget, the price and the goodput model is given."""
    if tokens is None and price_per_device_hour is None and goodput is None:
        return None
    g = None if goodput is None else goodput_figures(goodput, devices)
    share = 1.0 if g is None else g.goodput
    steps = free = time_s = hours = cost = None
    if tokens is not None and tokens_per_step and math.isfinite(step_time_s):
        steps = math.ceil(tokens / tokens_per_step)
        free = steps * step_time_s
        if share > 0:
            time_s = free / share
            hours = time_s * devices / HOUR_S
            cost = None if price_per_device_hour is None else hours * price_per_device_hour
    per_hour = None if price_per_device_hour is None else devices * price_per_device_hour
    return RunCost(devices=devices, tokens=tokens, tokens_per_step=tokens_per_step, steps=steps,
                   failure_free_time_s=free, time_s=time_s, device_hours=hours,
                   price_per_device_hour=price_per_device_hour, cost=cost, cost_per_hour=per_hour, goodput=g)


def scenario_run_cost(scenario: "Scenario", step_time_s: float, devices: int, tokens_per_step: float | None) -> RunCost | None:
    """`run_cost` with the scenario's `training.tokens`, `training.goodput` and
    `hardware.price_per_device_hour` (None where it gives none of them)."""
    t = scenario.training
    return run_cost(devices=devices, step_time_s=step_time_s, tokens_per_step=tokens_per_step, tokens=t.tokens,
                    price_per_device_hour=scenario.hardware.price_per_device_hour, goodput=t.goodput)


def count_short(value: float) -> str:
    """A large count as people say it: "1T", "300B", "2.5M"."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:,.0f}"


def long_duration_text(seconds: float) -> str:
    """A long duration in the unit people plan in: days from two days up, else hours, minutes or seconds."""
    if seconds >= 2 * DAY_S:
        return f"{seconds / DAY_S:,.1f} days"
    if seconds >= HOUR_S:
        return f"{seconds / HOUR_S:,.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:,.1f} min"
    return format_seconds(seconds)


def money(value: float) -> str:
    return f"{value:,.2f}" if value < 1e6 else f"{value:,.0f}"


def run_cost_rows(rc: RunCost | None) -> list[tuple[str, str]]:
    """The summary's rows for a run (none for None): time to train, goodput and cost."""
    if rc is None:
        return []
    rows: list[tuple[str, str]] = []
    on = f"on {rc.devices:,} device{'s' if rc.devices != 1 else ''}"
    if rc.tokens is not None and rc.steps is not None and rc.failure_free_time_s is not None:
        text = (f"{count_short(rc.tokens)} tokens = {rc.steps:,} steps of {rc.tokens_per_step:,.0f} tokens: "
                f"{long_duration_text(rc.failure_free_time_s)} failure-free")
        if rc.goodput is not None:
            text += ("; " + long_duration_text(rc.time_s) + " with failures and checkpoints" if rc.time_s is not None
                     else "; never finishes with failures and checkpoints (goodput 0)")
        if rc.device_hours is not None:
            text += f", {rc.device_hours:,.0f} device-hours {on}"
        rows.append(("time to train", text))
    if rc.goodput is not None:
        rows.append(("goodput", goodput_text(rc.goodput, rc.devices)))
    if rc.price_per_device_hour is not None:
        text = f"{money(rc.cost_per_hour or 0.0)} per hour {on} ({rc.price_per_device_hour:g} per device-hour)"
        if rc.cost is not None:
            text = f"{money(rc.cost)} for the run; " + text
        elif rc.tokens is None:
            text += "; give training.tokens for the run's cost"
        rows.append(("cost", text))
    return rows


def goodput_text(g: GoodputFigures, devices: int) -> str:
    """The goodput, the failure rate at this scale and the checkpoint interval against the optimum."""
    text = f"{g.goodput:.1%} of the time trains: a failure every {long_duration_text(g.system_mtbf_s)} on {devices:,} devices"
    if g.checkpoint_interval_s is None:
        return text + "; saves or restarts as long as the time between failures: no checkpoint interval makes progress"
    best = g.optimal_interval_s
    hint = ("" if best is None else
            " (the optimum)" if math.isclose(best, g.checkpoint_interval_s) else
            f" (the optimum: {long_duration_text(best)}, Young/Daly)")
    return text + f", a checkpoint every {long_duration_text(g.checkpoint_interval_s)}{hint}"
