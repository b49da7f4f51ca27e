"""Rounds of profile, predict and run in one launch: the comparison unit of validate, calibration and accuracy."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Union

from gpipe_exec.measure.steps import Measurement, measured_result

from gpipe_exec.runtime.job import job_for
from gpipe_exec.profile import (ProfileOptions, default_sizes, profile_device, profile_model, profile_together,
                                table_scenario)
from gpipe_exec.calibration.runtime import LinkFit, RuntimeFit
from gpipe_sim.api import simulate_plan
from gpipe_sim.plan.compile import Plan, compile_plan, scenario_schedule
from gpipe_sim.plan.rescheduled import with_schedule
from gpipe_sim.results.result import Result
from gpipe_sim.schedule import Kind, Schedule
from gpipe_sim.scenario.scenario import Scenario

Calibration = Union[LinkFit, RuntimeFit]  # what `hardware_updates()` turns into scenario fields


class Prediction(NamedTuple):
    """A case priced from its measured layer table: the scenario as it runs (the simulator's
    partition written out), the plan compiled once (what the simulator timed and what the
    executor runs, with the scenario's zoo model), and the predicted step."""

    scenario: Scenario
    plan: Plan
    result: Result


def predict_with_profile(scenario: Scenario, table: dict[str, Any], calibration: Calibration | None,
                         programs: Callable[[Schedule], Schedule] | None = None) -> Prediction:
    """Compile the scenario once with the measured layer table (and calibration) and simulate it.
    `programs` (e.g. `programs.split_backward`) replaces the schedule's programs; run the plan with
    `job_for(prediction.plan, model=scenario.model)`."""
    updates: dict[str, Any] = {}
    if calibration is not None:
        updates.update(calibration.hardware_updates())
    updates["hardware.host.step_buffers"] = True  # the executor's receive buffers and data (RankRunner)
    plan = compile_plan(table_scenario(scenario, table, updates))
    if programs is not None:
        plan = with_schedule(plan, programs(plan.schedule))
    run_scenario = scenario.with_updates({"pipeline.partition": plan.layer_counts})
    return Prediction(run_scenario, plan, simulate_plan(plan))


def splits_backward(scenario: Scenario) -> bool:
    """Whether the scenario's schedule runs input- and weight-gradient passes apart (then the
    profile times them apart too, and the simulator uses those times)."""
    return scenario_schedule(scenario).count(Kind.BACKWARD_INPUT) > 0


class Round(NamedTuple):
    """One profile, prediction and run of a case."""

    scenario: Scenario  # as run: the simulator's partition written out
    predicted: Result
    measured: Measurement
    table: dict[str, Any]  # the profile the prediction used


def _profile_case(sc: Scenario, options: ProfileOptions, rank: int, alone: bool) -> dict[str, Any] | None:
    """Rank 0's layer table of the case (None on the other ranks), every rank calling this at once:
    profiled by every process at once and averaged (`profile_together`; with tensor parallelism
    each pipeline rank's T processes profile the layers split over them), or
    with `alone` by rank 0 (with its T - 1 tensor-parallel peers) while the others wait. With
    context or expert parallelism every process profiles at once (its group's exchanges need all
    of its members), `alone` or not."""
    from gpipe_exec.runtime.tensor_parallel import device_mesh

    p = sc.pipeline
    if not alone or p.context_parallel * p.expert_parallel > 1:
        return profile_together(sc, options, rank)
    if p.tensor_parallel == 1:
        return profile_model(sc, options) if rank == 0 else None
    mesh = device_mesh(profile_device(options.device).type, sc.mesh)  # collective
    table = profile_model(sc, options, mesh=mesh["tp"]) if rank < p.tensor_parallel else None
    return table if rank == 0 else None


def compare_rounds(rank: int, device: Any, clock: Any, payload: dict[str, Any]) -> list[list[Round]] | None:
    """A launch task, on every process: `rounds` passes over `cases`; in each pass every case is
    profiled (`_profile_case`: by every process at once, or with `alone` by rank 0), simulated by
    rank 0 with that profile and `calibration`, and run by all processes seconds later. Spread
    over the passes, a case's profiles and steps see the same mix of machine states. With tensor
    parallelism the processes are the T per pipeline rank the run has. Rank 0 returns each
    case's rounds."""
    import torch.distributed as dist

    from gpipe_exec.runtime.interpreter import run_job

    cases: list[Scenario] = payload["cases"]
    base: ProfileOptions = payload["profile"]
    out: list[list[Round]] = [[] for _ in cases]
    for _ in range(payload["rounds"]):
        for i, sc in enumerate(cases):
            options = base if base.micro_batches else dataclasses.replace(base, micro_batches=default_sizes(sc))
            options = dataclasses.replace(options, device=str(device))  # where this rank's stage runs
            if splits_backward(sc):
                options = dataclasses.replace(options, split_backward=True)
            table = _profile_case(sc, options, rank, payload["alone"])
            box: list[Any] = [None]
            if rank == 0:
                prediction = predict_with_profile(sc, table, payload["calibration"])  # type: ignore[arg-type]
                box = [job_for(prediction.plan, model=sc.model, steps=payload["steps"], warmup=payload["warmup"])]
            dist.broadcast_object_list(box, src=0)
            output = run_job(box[0], rank, device, clock)
            if rank == 0:
                out[i].append(Round(prediction.scenario, prediction.result,
                                    measured_result(prediction.plan, output), table))  # type: ignore[arg-type]
    return out if rank == 0 else None
