"""Predicted versus measured: profile here, calibrate the runtime, simulate, run for real, compare."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from gpipe_exec.calibration.runtime import RuntimeFit, calibrate_runtime
from gpipe_exec.checks.shared_devices import calibrate_shared
from gpipe_exec.checks.rounds import Calibration, Round, compare_rounds, predict_with_profile
from gpipe_exec.execute import check_layout, check_model, check_runnable, run_plan
from gpipe_exec.measure.steps import Measurement
from gpipe_exec.launch.spawn import LaunchOptions, launch
from gpipe_exec.profile import ProfileOptions
from gpipe_sim.errors import GpipeError, ScenarioError
from gpipe_sim.results.result import Result
from gpipe_sim.results.validation import ValidationDocument
from gpipe_sim.model.recompute import per_layer
from gpipe_sim.scenario.scenario import Scenario
from gpipe_sim.schema.units import format_bytes, format_seconds


def calibration_text(c: Calibration) -> str:
    """One line: the calibrated link (and host times per action)."""
    line = f"link: latency {c.latency_s * 1e6:.1f} us, bandwidth {c.bandwidth / 1e9:.2f} GB/s"
    if isinstance(c, RuntimeFit):
        line += (f"; host per action {c.action_s * 1e6:.1f} us, per send {c.send_s * 1e6:.1f} us, "
                 f"per receive {c.recv_s * 1e6:.1f} us, copies at {c.copy_bandwidth / 1e9:.2f} GB/s")
        if c.shared_scale != 1.0:
            line += f" (x{c.shared_scale:.2f} on shared devices)"
    return line


@dataclass
class Validation:
    """One scenario's prediction (from this machine's profile and calibration) beside its measurement."""

    scenario: Scenario  # as run: the zoo model with the simulator's partition written out
    predicted: Result
    measured: Measurement
    calibration: "Calibration | None"
    # With several rounds (profile, predict, run each): every round's predicted and measured step;
    # `predicted` and `measured` are then the rounds with the median of each.
    rounds: list[tuple[float, float]] = field(default_factory=list)
    table: dict[str, Any] | None = None  # the layer profile the prediction used (None: a table given)

    @property
    def relative_error(self) -> dict[str, float]:
        return relative_errors(self.predicted, self.measured.result)

    def document(self) -> ValidationDocument:
        """The validation as the one document schema the app and `--json` read."""
        cal = self.calibration
        return ValidationDocument(
            predicted=self.predicted, measured=self.measured.result, relative_error=self.relative_error,
            measured_step_times_s=list(self.measured.step_times_s),
            link=None if cal is None else cal.hardware_updates()["hardware.link"],
            calibration=None if cal is None else cal.to_dict(), rounds=list(self.rounds),
            scenario=self.scenario.to_dict())

    def to_dict(self, timeline: bool = True) -> dict[str, Any]:
        return self.document().to_dict(timeline)


def relative_error(predicted: float, measured: float) -> float:
    """|predicted - measured| / |measured| (0 when both are 0)."""
    if measured == 0:
        return 0.0 if predicted == 0 else float("inf")
    return abs(predicted - measured) / abs(measured)


ACCOUNTING = "accounting"  # the saved-tensor accounting check's figures are named under it


MEMORY_NOTE = ("peak_memory_bytes: measured, each rank's real tensor bytes at their peak over one step run "
               "after the timed ones; predicted, static + held activations + the running pass's or the "
               "update's temporaries + the executor's buffers. accounting.*: bytes saved for backward as "
               "both count them (equal by construction: a check of the schedule, not a measurement).")


def compared_fields(predicted: Result, measured: Result) -> list[tuple[str, float, float]]:
    """(field, predicted, measured) for every compared figure.

    `stageK.peak_memory_bytes`: the rank's memory in all, predicted (static + held activations +
    the running pass's or the update's temporaries + the runtime's buffers) against measured (its
    real tensor bytes at their peak over a dedicated step: gpipe_exec.measure.memory).
    `stageK.accounting.peak_activation_bytes` (and per chunk): the schedule's accounting of the
    bytes saved for backward, which the executor counts with saved-tensor hooks exactly as the
    simulator counts them -- a check of when each micro-batch's activations are held, equal by
    construction, not a measurement of memory."""
    rows = [
        ("step_time_s", predicted.step_time_s, measured.step_time_s),
        ("throughput_samples_per_s", predicted.throughput_samples_per_s, measured.throughput_samples_per_s),
        ("bubble_fraction", predicted.bubble_fraction, measured.bubble_fraction),
    ]
    for p, m in zip(predicted.stages, measured.stages):
        rows.append((f"stage{p.index}.peak_memory_bytes", p.peak_memory_bytes, m.peak_memory_bytes))
    for p, m in zip(predicted.stages, measured.stages):
        rows.append((f"stage{p.index}.{ACCOUNTING}.peak_activation_bytes", p.peak_activation_bytes,
                     m.peak_activation_bytes))
    if len(predicted.chunks) > len(predicted.stages):  # several chunks per rank: each one's own peak too
        for p, m in zip(predicted.chunks, measured.chunks):
            rows.append((f"chunk{p.index}.{ACCOUNTING}.peak_activation_bytes", p.peak_activation_bytes,
                         m.peak_activation_bytes))
    return rows


def relative_errors(predicted: Result, measured: Result) -> dict[str, float]:
    """|predicted - measured| / |measured| per compared field."""
    return {name: relative_error(p, m) for name, p, m in compared_fields(predicted, measured)}


def validate(scenario: Scenario, *, steps: int = 5, warmup: int = 2, profile: ProfileOptions | None = None,
             options: LaunchOptions = LaunchOptions(), calibration: Calibration | None = None,
             calibrate: bool = True, rounds: int = 1,
             table: dict[str, Any] | None = None,
             progress: Callable[[str], None] | None = None) -> Validation:
    """Calibrate, then profile, simulate and execute `scenario` (`rounds` times, in one launch);
    everything on this machine. With a `table`, that profile is used and the run is done once (a
    table profiled at the scenario's tensor_parallel T, context_parallel C and expert_parallel E:
    the simulator refuses others in one line; per-layer remat modes, which a table cannot take,
    are refused in one line). With T > 1 the profile is of the layers split over each rank's T
    processes, with C > 1 (at T = 1) of each device's share of the sequence with the ring's
    exchanges, with E > 1 of each device's share of the experts with the dispatch and combine,
    taken by all processes at once (`profile_on_rank`), as the run runs them."""
    say = progress or (lambda _msg: None)
    if rounds < 1:
        raise GpipeError(f"rounds must be at least 1, got {rounds}")
    T = scenario.pipeline.tensor_parallel
    if per_layer(scenario.pipeline.remat):  # the profile is a layer table, which has no blocks to checkpoint
        raise ScenarioError(f"pipeline.remat: validate predicts from a profiled layer table, which gpipe-sim "
                            f"cannot run {scenario.pipeline.remat} on; compare `gpipe-exec run` with "
                            "`gpipe-sim simulate` of the preset instead (as tests/test_exec_recompute.py does)")
    if table is None:  # before profiling: the model builds and (on CPU) its ranks fit in free memory
        check_runnable(scenario, options.device)
    device_map = scenario.mesh.process_devices()  # one process per device (T per rank)
    devices = sorted(set(device_map))
    if calibration is None and calibrate and len(devices) > 1:
        say("calibrating the runtime (host time per action, link)")
        calibration = calibrate_runtime((devices[0], devices[1]), options=options)
        if len(devices) < len(device_map) and T == 1:
            say("calibrating the runtime on the shared devices")
            calibration = calibrate_shared(calibration, scenario.mesh.rank_devices, options=options)
    if table is not None:  # one compile and one simulation: the plan predicted is the plan run
        check_model(scenario)
        prediction = predict_with_profile(scenario, table, calibration)
        check_layout(prediction.plan, options.device, predicted=prediction.result)
        say("running the pipeline")
        measured = run_plan(prediction.plan, model=scenario.model, steps=steps, warmup=warmup, options=options)
        return Validation(prediction.scenario, prediction.result, measured, calibration)
    say(f"profiling (every device at once), predicting and running: {rounds} round(s)")
    payload = {"cases": [scenario], "rounds": rounds, "steps": steps, "warmup": warmup, "alone": False,
               "profile": profile or ProfileOptions(threads=options.threads), "calibration": calibration}
    done: list[Round] = launch(payload, device_map, options, task=compare_rounds)[0]
    return combine_rounds(done, calibration)


def _median_index(values: list[float]) -> int:
    order = sorted(range(len(values)), key=values.__getitem__)
    return order[(len(order) - 1) // 2]


def combine_rounds(done: list[Round], calibration: Calibration | None) -> Validation:
    """One validation from a case's rounds: the round with the median prediction beside the
    round with the median measured step (the same round when there is one)."""
    pairs = [(r.predicted.step_time_s, r.measured.result.step_time_s) for r in done]
    p = _median_index([a for a, _ in pairs])
    m = _median_index([b for _, b in pairs])
    return Validation(done[m].scenario, done[p].predicted, done[m].measured, calibration,
                      rounds=pairs if len(done) > 1 else [], table=done[p].table)


SPREAD_WARNING = 0.10  # measured steps whose (max - min) / median exceeds this are flagged


def spread_warning(step_times_s: list[float], rounds: int = 1) -> str:
    """A one-line warning when the measured steps disagree with each other by more than 10%
    ('' otherwise): an error that large may be the machine, not the prediction."""
    if len(step_times_s) < 2:
        return ""
    ordered = sorted(step_times_s)
    median = ordered[(len(ordered) - 1) // 2]
    spread = (ordered[-1] - ordered[0]) / median if median > 0 else 0.0
    if spread <= SPREAD_WARNING:
        return ""
    advice = " (more --rounds spread a case over more machine states)" if rounds > 1 else \
        "; run with --rounds 3 to compare the median of three profile-predict-run rounds"
    return (f"warning: the measured steps spread {100 * spread:.0f}% ({format_seconds(ordered[0])} to "
            f"{format_seconds(ordered[-1])}): this machine's noise is of that size{advice}")


def _shown(name: str, value: float) -> str:
    """A compared figure in its unit."""
    if name.startswith("throughput"):
        return f"{value:,.2f} samples/s"
    if name.endswith("_s"):
        return format_seconds(value)
    if name.endswith("_bytes"):
        return format_bytes(value)
    return f"{value:.4f}"


def validation_text(v: Validation) -> str:
    """A table: predicted, measured and relative error per compared field, in their units; the
    measured steps, every round, and a warning when the measurement is noisier than 10%."""
    table = Table(title="predicted vs measured")
    for col in ("field", "predicted", "measured", "relative error"):
        table.add_column(col, justify="right" if col != "field" else "left")
    errors = v.relative_error
    for name, p, m in compared_fields(v.predicted, v.measured.result):
        table.add_row(name, _shown(name, p), _shown(name, m), f"{100 * errors[name]:.2f}%")
    buf = io.StringIO()
    console = Console(file=buf, width=100, force_terminal=False)
    console.print(table)
    steps = ", ".join(format_seconds(t) for t in v.measured.step_times_s)
    console.print(f"measured step times: {steps}")
    console.print(MEMORY_NOTE)
    if v.rounds:
        each = ", ".join(f"{format_seconds(p)}/{format_seconds(m)}" for p, m in v.rounds)
        console.print(f"rounds, predicted/measured step: {each} (the median round of each is shown)")
    warning = spread_warning(v.measured.step_times_s, max(1, len(v.rounds)))
    if warning:
        console.print(warning)
    if v.calibration is not None:
        console.print(calibration_text(v.calibration))
    return buf.getvalue().rstrip()
