"""Is the planner's advice right? Run every configuration it ranks for this machine and compare the rankings."""

from __future__ import annotations

import dataclasses
import io
import math
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

from rich.console import Console
from rich.table import Table

from gpipe_sim.errors import GpipeError
from gpipe_sim.scenario.scenario import Scenario

# The default space, chosen so that a check of the accuracy study's models runs in about ten
# minutes on two quiet cores: the schedules the accuracy study validates (its default too,
# checks.accuracy; zb_h1 runs one chunk per rank, zbv two in a V, each only at the (M, v) its family
# accepts), no re-computation (with everything in memory it is only slower, and checking it doubles
# the run), the "time" partition (the others choose the same counts or worse here), no ZeRO (memory
# only), v <= 2, equal micro-batches.
DEFAULT_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv")
DEFAULT_REMAT = ("none",)


@dataclass(frozen=True)
class CheckOptions:
    """The space the planner searches here and how each configuration is measured.

    `schedules`, `remat`, `partitions`, `zero` and `max_chunks` are the planner's own options
    (`PlanOptions`; None: the planner's full axis). `micro_batches`: "even" keeps the M that split
    each replica's batch into equal micro-batches (M divides batch / D), "all" every M the batch
    allows, or explicit values. Every configuration runs `rounds` times (once per pass over all of
    them), `warmup` + `steps` training steps each time; a round's figure is its median step.
    """

    devices: int = 2
    rounds: int = 3
    steps: int = 3
    warmup: int = 1
    schedules: tuple[str, ...] | None = DEFAULT_SCHEDULES
    remat: tuple[str, ...] | None = DEFAULT_REMAT
    partitions: tuple[str, ...] | None = ("time",)
    zero: tuple[int, ...] | None = (0,)
    max_chunks: int = 2
    micro_batches: str | tuple[int, ...] = "even"
    profiles: int = 3  # profiles of the model, each timing every size; their median is planned on
    seed: int = 0  # the order of the configurations within each pass (shuffled per pass)


# ---------------------------------------------------------------------------------------------
# the figures: rank correlation, top-1 and regret


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's tau-b of two paired samples (ties allowed on either side):
    (concordant - discordant) / sqrt((n0 - ties_x) (n0 - ties_y)), n0 = n (n - 1) / 2, where a pair
    tied in x or y is neither concordant nor discordant and ties_x counts the pairs tied in x.
    None where it is undefined (fewer than two items, or every item tied on one side)."""
    if len(x) != len(y):
        raise ValueError(f"kendall_tau_b: {len(x)} and {len(y)} values")
    n = len(x)
    concordant = discordant = tied_x = tied_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0:
                tied_x += 1
            if dy == 0:
                tied_y += 1
            if dx == 0 or dy == 0:
                continue
            if (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    n0 = n * (n - 1) // 2
    denominator = math.sqrt((n0 - tied_x) * (n0 - tied_y))
    return None if denominator == 0 else (concordant - discordant) / denominator


def ranks_of(values: Sequence[float]) -> list[int]:
    """1-based rank of each value, largest first (ties: the order given)."""
    order = sorted(range(len(values)), key=lambda i: -values[i])
    ranks = [0] * len(values)
    for r, i in enumerate(order):
        ranks[i] = r + 1
    return ranks


def regret(picked: float, best: float) -> float:
    """1 - (measured throughput of the pick) / (best measured throughput)."""
    if best <= 0:
        raise ValueError("regret: the best throughput must be positive")
    return 1.0 - picked / best


def spread(values: Sequence[float]) -> float:
    """(max - min) / median of a configuration's measurements over its rounds."""
    median = statistics.median(values)
    return (max(values) - min(values)) / median if median > 0 else 0.0


@dataclass
class Checked:
    """One configuration: the planner's prediction and its measured throughput, round by round."""

    overrides: dict[str, Any]  # dotted updates of the base, as the planner enumerates them
    predicted_throughput: float  # samples/s
    predicted_step_s: float
    run: Scenario | None = None  # as run: the simulator's partition written out as layer counts
    device_map: tuple[int, ...] = ()  # the device of each process (Mesh.process_devices)
    same_as: list[dict[str, Any]] = field(default_factory=list)  # other candidates that run the same
    measured: list[float] = field(default_factory=list)  # samples/s, one per round

    @property
    def measured_throughput(self) -> float:
        return statistics.median(self.measured)

    @property
    def label(self) -> str:
        return config_label(self.overrides)

    def to_dict(self) -> dict[str, Any]:
        return {"configuration": self.label, "overrides": self.overrides,
                "partition": None if self.run is None else list(self.run.pipeline.partition),
                "same_as": [config_label(o) for o in self.same_as],
                "predicted_step_s": self.predicted_step_s,
                "predicted_throughput_samples_per_s": self.predicted_throughput,
                "measured_throughput_samples_per_s": self.measured_throughput if self.measured else None,
                "measured_round_throughputs": self.measured,
                "measured_spread": spread(self.measured) if self.measured else None}


def config_label(o: dict[str, Any]) -> str:
    """A configuration in a few words: D, K, v, M, schedule, remat (and ZeRO where on)."""
    text = (f"D={o.get('pipeline.data_parallel', 1)} K={o.get('pipeline.stages')} v={o.get('pipeline.chunks', 1)} "
            f"M={o.get('pipeline.micro_batches')} {o.get('pipeline.schedule')} remat={o.get('pipeline.remat')}")
    if o.get("training.zero"):
        text += f" zero={o['training.zero']}"
    return text


@dataclass
class Summary:
    """How the planner's ranking compares with the measured one."""

    configurations: int
    tau_b: float | None
    top1: bool
    pick: str
    pick_measured_rank: int
    best: str
    regret: float
    pick_spread: float
    best_spread: float
    within_noise: bool  # the pick's rounds reach the best's: the regret is within the measured spread
    resolved_pairs: int  # pairs whose measured rounds do not overlap
    resolved_agree: int  # ... of which the prediction orders the same way
    # Tau-b against each configuration's fastest round instead of its median: interference from
    # other work on the machine only slows a round, so this one is the less disturbed by it.
    tau_b_fastest: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def summarize_check(rows: Sequence[Checked]) -> Summary:
    """Tau-b between predicted and measured (median) throughput, top-1 agreement, regret of the
    planner's pick (`rows[0]`: the rows come in the planner's order), and whether that regret is
    within noise: the pick's best round reaches the best configuration's worst round."""
    if not rows or any(not r.measured for r in rows):
        raise GpipeError("plan-check: every configuration needs at least one measurement")
    predicted = [r.predicted_throughput for r in rows]
    measured = [r.measured_throughput for r in rows]
    best_i = max(range(len(rows)), key=lambda i: measured[i])
    pick, best = rows[0], rows[best_i]
    resolved = agree = 0
    for i in range(len(rows)):
        for j in range(i + 1, len(rows)):
            a, b = rows[i].measured, rows[j].measured
            if min(a) > max(b) or min(b) > max(a):
                resolved += 1
                agree += (predicted[i] - predicted[j]) * (measured[i] - measured[j]) > 0
    return Summary(
        configurations=len(rows), tau_b=kendall_tau_b(predicted, measured),
        top1=measured[0] >= measured[best_i], pick=pick.label,
        pick_measured_rank=1 + sum(m > measured[0] for m in measured),
        best=best.label, regret=regret(measured[0], measured[best_i]),
        pick_spread=spread(pick.measured), best_spread=spread(best.measured),
        within_noise=max(pick.measured) >= min(best.measured),
        resolved_pairs=resolved, resolved_agree=agree,
        tau_b_fastest=kendall_tau_b(predicted, [max(r.measured) for r in rows]))


# ---------------------------------------------------------------------------------------------
# the planner's candidates and predictions, from this machine's profile


def _plan_options(options: CheckOptions, devices: int | None = None) -> Any:
    """The planner's options for this check: D*K up to `options.devices` (or exactly `devices`),
    and `top` above any space's size, so that the planner's step-time bound skips nothing and it
    ranks every configuration."""
    from gpipe_sim.planner.search import PlanOptions

    explicit = None if isinstance(options.micro_batches, str) else tuple(options.micro_batches)
    return PlanOptions(devices=devices or options.devices, fewer_devices=devices is None, schedules=options.schedules,
                       remat=options.remat, partitions=options.partitions, zero=options.zero,
                       max_chunks=options.max_chunks, micro_batches=explicit, top=1 << 30)


def _keeps_m(options: CheckOptions, overrides: dict[str, Any], batch: int) -> bool:
    """Whether the check runs this candidate's M (see `CheckOptions.micro_batches`)."""
    if options.micro_batches != "even":
        return True
    return (batch // overrides["pipeline.data_parallel"]) % overrides["pipeline.micro_batches"] == 0


def candidates(base: Scenario, options: CheckOptions) -> list[dict[str, Any]]:
    """The planner's configurations for this machine (`enumerate_candidates`, D*K <= devices),
    those with the M the check runs."""
    from gpipe_sim.planner.search import enumerate_candidates

    batch = base.pipeline.batch_size
    return [o for o in enumerate_candidates(base, _plan_options(options)) if _keeps_m(options, o, batch)]


def profile_sizes(base: Scenario, configs: Sequence[dict[str, Any]]) -> tuple[tuple[int, ...], bool]:
    """The micro-batch sizes the configurations run (each profiled once) and whether any of their
    schedules splits the backward (then the profile times the split passes too)."""
    from gpipe_exec.profile import default_sizes
    from gpipe_exec.checks.rounds import splits_backward

    sizes: set[int] = set()
    split = False
    for o in configs:
        sc = base.with_updates(o)
        sizes.update(default_sizes(sc))
        split = split or splits_backward(sc)
    return tuple(sorted(sizes)), split


class Prediction(NamedTuple):
    """The planner's figures for one configuration, and the scenario (profile) it planned on."""

    overrides: dict[str, Any]
    step_s: float
    throughput: float  # samples/s
    scenario: Scenario


def predictions(scenarios: dict[int, Scenario], options: CheckOptions, configs: Sequence[dict[str, Any]]
                ) -> list[Prediction]:
    """Every configuration that fits, in the planner's order. `scenarios[n]` is the model as this
    machine's profile taken on n devices at once (and the runtime as calibrated here):
    `search_configurations()` runs on it for D*K = n, and the rankings of the device counts merge by predicted throughput
    (what one ranking over all of them gives when each device count has its own profile);
    restricted to `configs` (the M the check runs)."""
    from gpipe_sim.planner.search import search_configurations

    wanted = {_key(o) for o in configs}
    out = []
    for n, scenario in sorted(scenarios.items()):
        search = search_configurations(scenario, _plan_options(options, n))
        out += [Prediction(dict(e.overrides), e.step_time_s, e.throughput_samples_per_s, scenario)
                for e in search.ranked if _key(e.overrides) in wanted]
    out.sort(key=lambda p: -p.throughput)  # stable: each planner's order among equal figures
    return out


def _key(o: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in o.items()))


# ---------------------------------------------------------------------------------------------
# running every configuration for real, round-robin


def runnable_rows(base: Scenario, predicted: Sequence[Prediction]) -> list[Checked]:
    """One row per distinct real run, in the planner's order: each configuration with the partition
    the simulator chose for it (on the profiled model it was planned on) written out as layer counts.
    Candidates that would run exactly the same (the same layout, partition and per-rank programs,
    e.g. partition methods that choose the same counts) are one run, listed in `same_as`."""
    from gpipe_exec.execute import check_runnable
    from gpipe_sim.plan.compile import compile_plan

    rows: list[Checked] = []
    seen: dict[Any, Checked] = {}
    for o, step, throughput, scenario in predicted:
        counts = list(compile_plan(scenario.with_updates(o)).layer_counts)
        run = base.with_updates({**o, "pipeline.partition": counts})
        plan = check_runnable(run)
        setup = run.to_dict()
        setup["pipeline"].pop("schedule", None)
        key = (repr(setup), plan.schedule.placement, plan.schedule.actions)
        if key in seen:
            seen[key].same_as.append(o)
            continue
        row = Checked(o, throughput, step, run, plan.mesh.process_devices())
        seen[key] = row
        rows.append(row)
    return rows


Progress = Callable[[int, int, str], None]  # (done, total, what is running)


def median_table(tables: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One layer table from several profiles of the same model: every timed figure (each layer's
    forward, backward and update seconds, per micro-batch size) the median over the profiles, the
    rest (bytes, FLOPs: the same in every profile) from the first. A burst of load on this shared
    machine slows the sizes profiled while it lasts; the median of three profiles leaves it out."""
    first = tables[0]
    layers = []
    for i, row in enumerate(first["layers"]):
        rows = [t["layers"][i] for t in tables]
        merged = dict(row)
        for key, value in row.items():
            if key.endswith("_s") or key.endswith("_s_per_sample"):
                merged[key] = statistics.median(r[key] for r in rows)
        if "timings" in row:
            merged["timings"] = [{k: (statistics.median(r["timings"][j][k] for r in rows)
                                      if k != "micro_batch" else v) for k, v in timing.items()}
                                 for j, timing in enumerate(row["timings"])]
        layers.append(merged)
    return {**first, "layers": layers}


def measure_rows(rows: Sequence[Checked], *, rounds: int, steps: int, warmup: int, options: Any,
                 seed: int = 0, progress: Progress | None = None) -> None:
    """Run every row `rounds` times, round-robin: each pass runs every configuration once (one
    launch per device map, the configurations in an order shuffled per pass), so each one's
    rounds see the same mix of machine states. Appends each round's throughput (global batch /
    median step) to the row's `measured`."""
    from gpipe_exec.measure.steps import measured_result
    from gpipe_exec.runtime.job import job_for
    from gpipe_exec.launch.spawn import launch
    from gpipe_sim.plan.compile import compile_plan

    plans = [compile_plan(r.run) for r in rows]  # type: ignore[arg-type]
    jobs = [job_for(p, steps=steps, warmup=warmup) for p in plans]
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(r.device_map, []).append(i)
    order = sorted(groups, key=lambda m: -len(m))
    total, done = rounds * len(rows), 0
    for p in range(rounds):
        for device_map in (order if p % 2 == 0 else order[::-1]):
            members = list(groups[device_map])
            random.Random(seed * 1000 + p).shuffle(members)
            if progress:
                progress(done, total, f"pass {p + 1}/{rounds}: {len(members)} configurations on "
                                      f"{len(device_map)} rank(s)")
            outputs = launch([jobs[i] for i in members], device_map, options)
            for i, out in zip(members, outputs):
                rows[i].measured.append(measured_result(plans[i], out).result.throughput_samples_per_s)
            done += len(members)
    if progress:
        progress(done, total, "measured")


@dataclass
class PlanCheck:
    """The planner's ranking of this machine's configurations beside their measured throughputs."""

    rows: list[Checked]  # the planner's order (its pick first)
    summary: Summary
    options: CheckOptions
    enumerated: int  # the planner's candidates with the M checked
    profile_sizes: tuple[int, ...]
    calibration: Any
    tables: dict[int, dict[str, Any]]  # per device count, the profile planned on (median of `profiles`)
    load_average: tuple[float, float]  # 1-minute load at the start and end of the measurements
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        measured = ranks_of([r.measured_throughput for r in self.rows])
        return {
            "summary": self.summary.to_dict(),
            "options": dataclasses.asdict(self.options),
            "enumerated": self.enumerated, "runs": len(self.rows),
            "profile_micro_batch_sizes": list(self.profile_sizes),
            "calibration": None if self.calibration is None else self.calibration.to_dict(),
            "profiles": {str(n): t for n, t in self.tables.items()},
            "load_average": list(self.load_average), "cores": os.cpu_count(), "seconds": self.seconds,
            "configurations": [{"predicted_rank": i + 1, "measured_rank": measured[i], **r.to_dict()}
                               for i, r in enumerate(self.rows)],
        }


def check_options(options: CheckOptions) -> None:
    """GpipeError naming the option for values the check cannot run (before any work starts)."""
    from gpipe_sim.planner.search import check_options as planner_options_check

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if not 1 <= options.devices <= cores:
        raise GpipeError(f"--devices: expected 1 to {cores} (one device per core of this machine), "
                         f"got {options.devices}")
    for name, value in (("--rounds", options.rounds), ("--steps", options.steps), ("--profiles", options.profiles)):
        if value < 1:
            raise GpipeError(f"{name}: expected at least 1, got {value}")
    if options.warmup < 0:
        raise GpipeError(f"--warmup: expected 0 or more, got {options.warmup}")
    if not isinstance(options.micro_batches, str) and min(options.micro_batches, default=0) < 1:
        raise GpipeError(f"--micro-batches: expected even, all or values >= 1, got {options.micro_batches}")
    planner_options_check(_plan_options(options))  # the space's axes, as the planner checks them


def plan_check(base: Scenario, options: CheckOptions = CheckOptions(), *, launch_options: Any = None,
               progress: Progress | None = None) -> PlanCheck:
    """Calibrate the runtime; profile the model here (every micro-batch size the configurations
    use, `profiles` times, their median) on each device count n the configurations use, with n
    devices busy at once as those configurations run; run the planner on each profile for D*K = n
    and merge the rankings; run every distinct configuration `rounds` times for real, round-robin;
    compare (`summarize_check`)."""
    from gpipe_exec.launch.spawn import LaunchOptions
    from gpipe_exec.profile import ProfileOptions, profile_on_devices, table_scenario
    from gpipe_exec.calibration.runtime import calibrate_runtime

    check_options(options)
    say = progress or (lambda _d, _t, _w: None)
    launch_options = launch_options or LaunchOptions(comm_timeout_s=120, run_timeout_s=3600)
    t0 = time.monotonic()
    configs = candidates(base, options)
    if not configs:
        raise GpipeError("plan-check: the planner has no configuration for this model, batch and devices")
    sizes, split = profile_sizes(base, configs)
    calibration = None
    if options.devices >= 2:
        say(0, 1, "calibrating the runtime (host time per action, link)")
        calibration = calibrate_runtime((0, 1), options=launch_options)
    profile = ProfileOptions(micro_batches=sizes, split_backward=split, accumulate=True)
    counts = sorted({o["pipeline.data_parallel"] * o["pipeline.stages"] for o in configs})
    tables: dict[int, dict[str, Any]] = {}
    for n in counts:  # profiled as the configurations run: n devices busy at once
        profile_sc = base.with_updates({"pipeline.stages": n, "pipeline.data_parallel": 1, "pipeline.chunks": 1,
                                        "pipeline.micro_batches": 1, "pipeline.schedule": "gpipe",
                                        "pipeline.partition": "uniform", "hardware.placement": None,
                                        "hardware.stage_to_device": list(range(n))})
        taken = []
        for i in range(options.profiles):
            say(i, options.profiles, f"profiling micro-batch sizes {', '.join(map(str, sizes))} on {n} "
                                     f"device(s) at once ({i + 1}/{options.profiles})")
            taken.append(profile_on_devices(profile_sc, profile, launch_options))
        tables[n] = median_table(taken)
    updates = None if calibration is None else calibration.hardware_updates()
    scenarios = {n: table_scenario(base, table, updates) for n, table in tables.items()}
    say(0, 1, f"planning {len(configs)} configurations on these profiles")
    rows = runnable_rows(base, predictions(scenarios, options, configs))
    load0 = os.getloadavg()[0]
    measure_rows(rows, rounds=options.rounds, steps=options.steps, warmup=options.warmup,
                 options=launch_options, seed=options.seed, progress=progress)
    return PlanCheck(rows, summarize_check(rows), options, len(configs), sizes, calibration, tables,
                     (load0, os.getloadavg()[0]), time.monotonic() - t0)


# ---------------------------------------------------------------------------------------------
# the report


def check_text(check: PlanCheck) -> str:
    """The table (planner's order: predicted and measured throughput, the measured spread, both
    ranks) and the summary lines: tau-b, top-1, regret and whether it is within noise."""
    rows, s = check.rows, check.summary
    measured_rank = ranks_of([r.measured_throughput for r in rows])
    table = Table(title=f"planner's ranking vs measured ({check.options.rounds} rounds x "
                        f"{check.options.steps} steps each)")
    for col in ("pred", "meas", "configuration", "partition", "predicted samples/s", "measured samples/s",
                "spread", "error"):
        table.add_column(col, justify="left" if col in ("configuration", "partition") else "right")
    for i, r in enumerate(rows):
        m = r.measured_throughput
        table.add_row(str(i + 1), str(measured_rank[i]), r.label + (f" (+{len(r.same_as)} same)" if r.same_as else ""),
                      ",".join(map(str, r.run.pipeline.partition)) if r.run is not None else "",
                      f"{r.predicted_throughput:,.1f}", f"{m:,.1f}", f"{100 * spread(r.measured):.1f}%",
                      f"{100 * (r.predicted_throughput - m) / m:+.1f}%")
    buf = io.StringIO()
    console = Console(file=buf, width=140, force_terminal=False)
    console.print(table)
    tau = "n/a (every value tied)" if s.tau_b is None else f"{s.tau_b:.3f}"
    o = check.options
    axis = lambda values: "all" if values is None else ",".join(map(str, values))  # noqa: E731
    lines = [
        f"space: D*K <= {o.devices}; schedules {axis(o.schedules)}; remat {axis(o.remat)}; partition "
        f"{axis(o.partitions)}; ZeRO {axis(o.zero)}; v <= {o.max_chunks}; M "
        f"{o.micro_batches if isinstance(o.micro_batches, str) else axis(o.micro_batches)}",
        f"{s.configurations} distinct runs ({check.enumerated} of the planner's configurations); "
        f"Kendall tau-b (predicted vs measured throughput) {tau}"
        + ("" if s.tau_b_fastest is None else f" (against each one's fastest round: {s.tau_b_fastest:.3f})"),
        f"top-1: {'agree' if s.top1 else 'disagree'} -- the planner's pick {s.pick} measured rank "
        f"{s.pick_measured_rank} of {s.configurations}; best measured: {s.best}",
        f"regret {100 * s.regret:.1f}% ({'within' if s.within_noise else 'beyond'} the measured noise: "
        f"spread over rounds {100 * s.pick_spread:.1f}% for the pick, {100 * s.best_spread:.1f}% for the best)",
        f"pairs the measurement separates (rounds not overlapping): {s.resolved_agree}/{s.resolved_pairs} "
        f"ordered the same by the planner",
        f"(1-minute load average {check.load_average[0]:.1f} at the start, {check.load_average[1]:.1f} at the end, "
        f"on {os.cpu_count()} cores; profile sizes {', '.join(map(str, check.profile_sizes))}; "
        f"{check.seconds:.0f} s)",
    ]
    return buf.getvalue().rstrip() + "\n" + "\n".join(lines)
