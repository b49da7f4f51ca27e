"""Measurement: the timeline on one aligned clock, activation memory as the simulator defines it, the
profiler's table, link fitting and the CLI's JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gpipe_exec.calibration.runtime import LinkFit, fit_link, fit_runtime, runtime_sample  # noqa: E402
from gpipe_exec.execute import check_runnable  # noqa: E402
from gpipe_exec.measure.steps import measured_result  # noqa: E402
from gpipe_exec.runtime.job import job_for  # noqa: E402
from gpipe_exec.launch.spawn import LaunchOptions, launch  # noqa: E402
from gpipe_exec.profile import ProfileOptions, profile_model, write_table  # noqa: E402
from gpipe_sim.schedule.split_backward import split_backward  # noqa: E402
from gpipe_exec.checks.rounds import predict_with_profile  # noqa: E402
from gpipe_exec.checks.validate import relative_errors  # noqa: E402
from gpipe_exec.zoo import build_model  # noqa: E402
from gpipe_sim.results.result import summarize  # noqa: E402
from gpipe_sim.scenario.scenario import load_scenario, parse_scenario  # noqa: E402
from gpipe_sim.schedule import ACTION_KINDS, Kind  # noqa: E402
from gpipe_sim.results.trace import chrome_trace  # noqa: E402

BASE = {
    "model": {"preset": "transformer", "layers": 2, "d_model": 16, "d_ff": 32, "heads": 2, "seq_len": 8,
              "vocab": 31},
    "hardware": {"preset": "cpu"},
    "pipeline": {"stages": 2, "micro_batches": 3, "batch_size": 6, "schedule": "gpipe", "remat": "none"},
}


CASES = [  # (schedule, remat, chunks per rank, micro-batches, split backward)
    ("gpipe", "none", 1, 3, None), ("gpipe", "always", 1, 3, None), ("1f1b", "except_last", 1, 3, None),
    ("1f1b", "always", 1, 3, None), ("interleaved_1f1b", "always", 2, 4, None), ("looped_bfs", "none", 2, 3, None),
    ("interleaved_1f1b", "except_last", 2, 4, "deferred"), ("1f1b", "none", 1, 3, "adjacent"),
    ("zbv", "except_last", 2, 4, None),  # split backward built in; rank 0 holds the first and last chunks
]


@pytest.fixture(scope="module")
def runs():
    """Several schedules, chunkings and remat modes, each predicted from a profile and run for real
    (one spawn): (plan, predicted, measurement, the ranks' raw output)."""
    base = parse_scenario(BASE)
    table = profile_model(base, ProfileOptions(warmup=0, repeats=1))
    cases = []
    for schedule, remat, v, M, split in CASES:
        sc = base.with_updates({"pipeline.schedule": schedule, "pipeline.remat": remat, "pipeline.chunks": v,
                                "pipeline.micro_batches": M, "pipeline.batch_size": 2 * M})
        programs = (lambda s, split=split: split_backward(s, split)) if split else None
        plan, predicted = predict_with_profile(sc, table, None, programs)[1:]
        cases.append((plan, predicted, job_for(plan, model=sc.model, steps=3, warmup=1)))
    outs = launch([c[2] for c in cases], [0, 1], LaunchOptions(comm_timeout_s=60, run_timeout_s=300))
    return [(plan, predicted, measured_result(plan, out), out) for (plan, predicted, _), out in zip(cases, outs)]


def test_peak_activation_memory_matches_the_simulator_definition(runs) -> None:
    for plan, predicted, m, _ in runs:
        for p, q in zip(predicted.stages, m.result.stages):
            assert q.peak_activation_bytes > 0
            assert q.peak_activation_bytes == pytest.approx(p.peak_activation_bytes, rel=1e-9), plan.schedule.name
        assert len(m.result.chunks) == len(plan.chunks)
        for p, q in zip(predicted.chunks, m.result.chunks):  # each chunk on its own
            assert q.peak_activation_bytes == pytest.approx(p.peak_activation_bytes, rel=1e-9), plan.schedule.name
            assert (q.rank, q.layers, q.param_bytes, q.state_bytes) == (p.rank, p.layers, p.param_bytes, p.state_bytes)
        errors = relative_errors(predicted, m.result)
        assert set(errors) >= {"step_time_s", "throughput_samples_per_s", "bubble_fraction",
                               "stage0.peak_memory_bytes", "stage1.peak_memory_bytes",
                               "stage0.accounting.peak_activation_bytes", "stage1.accounting.peak_activation_bytes"}


def test_peak_memory_is_measured_not_the_accounting(runs) -> None:
    """Each stage's peak memory is the rank's real tensor bytes (measure.memory), broken down by
    category, with its parameters, gradients and optimizer states exactly; the prediction (with the
    profiled transients, what a split backward's I keeps for W, and the executor's step buffers) is
    within 10% of it, as torch's own allocator tests accept (measured here: 0.1-2% without a split
    backward, up to 10% with one)."""
    for plan, predicted, m, _ in runs:
        for p, q, accounting in zip(predicted.stages, m.result.stages, m.accounting_peak_bytes):
            b = q.memory_breakdown
            assert b["parameters"] == q.param_bytes and b["gradients"] == q.param_bytes, plan.schedule.name
            assert q.peak_memory_bytes == pytest.approx(sum(b.values()))
            assert q.peak_memory_bytes != pytest.approx(accounting, rel=1e-6)
            assert p.peak_memory_bytes == pytest.approx(q.peak_memory_bytes, rel=0.10), plan.schedule.name


def test_remat_lowers_the_measured_peak(runs) -> None:
    none = runs[0][2].result.stages[0].peak_activation_bytes
    always = runs[1][2].result.stages[0].peak_activation_bytes
    assert always < none


def test_the_ranks_ran_the_plans_programs(runs) -> None:
    """The measured timeline is what the ranks recorded as they ran (kind, chunk, micro-batch of
    each action), not the plan's columns copied: it equals the programs, I/W split included."""
    kinds = set()
    for plan, _, m, _ in runs:
        t, prog = m.result.timeline, plan.program
        for name in ("rank", "kind", "chunk", "micro_batch"):
            assert np.array_equal(getattr(t, name), getattr(prog, name)), (plan.schedule.name, name)
        kinds |= set(t.kind_names)
    assert kinds >= {"forward", "backward", "backward_input", "backward_weight", "recompute", "send", "recv", "update"}


def test_a_run_that_strays_from_its_program_is_refused(runs) -> None:
    import copy

    from gpipe_exec.errors import ExecutionError
    from gpipe_exec.measure.steps import check_ran_as_planned, step_timelines

    plan, _, _, out = runs[4]  # interleaved, two chunks per rank
    bad = copy.deepcopy(out)
    record = bad["ranks"][1]["records"][0]
    i = record.kind.index(int(Kind.FORWARD))
    j = i + 1 + record.kind[i + 1:].index(int(Kind.FORWARD))
    for column in (record.chunk, record.micro_batch):  # two forwards run the other way round
        column[i], column[j] = column[j], column[i]
    if (record.chunk[i], record.micro_batch[i]) == (record.chunk[j], record.micro_batch[j]):
        pytest.skip("the two forwards are alike")
    with pytest.raises(ExecutionError, match=rf"rank 1: action {i} ran forward"):
        step_timelines(plan, bad)
    with pytest.raises(ExecutionError, match="rank 1"):
        measured_result(plan, bad)
    short = copy.deepcopy(out)
    for column in ("kind", "chunk", "micro_batch", "message", "starts", "ends", "held"):
        getattr(short["ranks"][0]["records"][0], column).pop()  # the update never ran
    with pytest.raises(ExecutionError, match="ran nothing, the program says update"):
        step_timelines(plan, short)
    check_ran_as_planned(plan, step_timelines(plan, out)[0])


def test_timeline_is_causal_on_one_clock(runs) -> None:
    for plan, _, m, _ in runs:
        t = m.result.timeline
        prog = plan.program
        assert np.all(t.end_s >= t.start_s) and t.start_s.min() >= 0
        assert m.result.step_time_s == pytest.approx(t.end_s.max())
        assert m.result.step_time_s == pytest.approx(sorted(m.step_times_s)[1])  # the median of 3
        compute = t.is_compute
        for k in range(plan.schedule.ranks):
            sel = np.flatnonzero((t.rank == k) & compute)
            assert np.all(t.start_s[sel][1:] >= t.end_s[sel][:-1] - 1e-9)  # in order, no overlap
        # a receive cannot end before the matching send started
        send, recv = int(Kind.SEND), int(Kind.RECV)
        starts = {int(prog.message[i]): t.start_s[i] for i in np.flatnonzero(t.kind == send)}
        for i in np.flatnonzero(t.kind == recv):
            assert t.end_s[i] >= starts[int(prog.message[i])] - 1e-4
        # throughput and bubble are gpipe_sim.results.result.summarize's definitions
        r = m.result
        again = summarize(t, batch_size=r.batch_size, micro_batches=r.micro_batches, layout=plan.layout,
                          analytic_bubble_fraction=plan.analytic_bubble_fraction,
                          peak_activation_bytes=[s.peak_activation_bytes for s in r.stages],
                          chunk_peak_activation_bytes=[c.peak_activation_bytes for c in r.chunks],
                          param_bytes=[c.param_bytes for c in r.chunks],
                          state_bytes=[c.state_bytes for c in r.chunks], memory_capacity_bytes=float("inf"))
        assert again.bubble_fraction == pytest.approx(r.bubble_fraction)
        assert [c.busy_s for c in again.chunks] == pytest.approx([c.busy_s for c in r.chunks])
        assert r.throughput_samples_per_s == pytest.approx(r.batch_size / r.step_time_s)
        trace = chrome_trace(t)
        assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == len(t)


def test_profile_table_loads_and_matches_the_model(tmp_path: Path) -> None:
    sc = parse_scenario(BASE)
    table = profile_model(sc, ProfileOptions(micro_batches=(1, 3), warmup=0, repeats=2))
    meta = profile_model(sc, ProfileOptions(micro_batches=(1, 3), meta=True))
    model = build_model(sc.model)
    assert [r["params"] for r in table["layers"]] == [sum(p.numel() for p in l.parameters()) for l in model]
    for row, meta_row in zip(table["layers"], meta["layers"]):
        assert row["forward_flops_per_sample"] == meta_row["forward_flops_per_sample"]
        assert row["activation_bytes_per_sample"] == meta_row["activation_bytes_per_sample"]
        assert [t["micro_batch"] for t in row["timings"]] == [1, 3]
        assert "timings" not in meta_row
    block = table["layers"][1]
    d, f, s = 16, 32, 8
    assert block["forward_flops_per_sample"] == 2 * s * (4 * d * d + 2 * d * f) + 4 * s * s * d
    path = tmp_path / "table.yaml"
    write_table(table, path)
    loaded = parse_scenario({**BASE, "model": {"preset": "table", "path": str(path)}})
    assert len(loaded.model.layers) == len(model)
    assert loaded.model.input_bytes_per_sample == 8 * 8  # int64 token ids


def test_profile_holds_the_device_around_every_timed_layer_op() -> None:
    from contextlib import contextmanager

    base = parse_scenario(BASE)
    held = []

    @contextmanager
    def hold():
        held.append(1)
        yield

    options = ProfileOptions(micro_batches=(2,), warmup=1, repeats=2, min_time_s=0.0)
    table = profile_model(base, options, hold=hold)
    assert table["layers"]
    assert len(held) == (1 + 2) * 2  # (warm-up + repeats) x (forward chain, backward call)


def test_profile_on_devices_profiles_where_the_stages_run() -> None:
    from gpipe_exec.profile import profile_on_devices
    from gpipe_sim.model.model import LayerSpec

    shared = parse_scenario(BASE).with_updates({"pipeline.stages": 4, "pipeline.micro_batches": 2,
                                                "hardware.stage_to_device": [0, 0, 1, 1]})
    options = ProfileOptions(warmup=0, repeats=1, min_time_s=0.0)
    table = profile_on_devices(shared, options, LaunchOptions(comm_timeout_s=60, run_timeout_s=300))
    alone = profile_model(shared, options)
    assert [r["name"] for r in table["layers"]] == [r["name"] for r in alone["layers"]]
    for row, other in zip(table["layers"], alone["layers"]):
        LayerSpec.model_validate(row)
        assert row["params"] == other["params"] and row["activation_bytes_per_sample"] == other["activation_bytes_per_sample"]
        assert all(t["forward_s"] > 0 and t["backward_s"] >= 0 for t in row["timings"])


def test_fit_link_recovers_latency_and_bandwidth() -> None:
    fit = fit_link([(n, 5e-5 + n / 2e9) for n in (4, 1 << 12, 1 << 16, 1 << 20)])
    assert fit.latency_s == pytest.approx(5e-5, rel=1e-3)
    assert fit.bandwidth == pytest.approx(2e9, rel=1e-2)


def test_fit_runtime_recovers_host_times_and_copy_bandwidth() -> None:
    link = LinkFit(4e-5, 2e9, ())
    samples = [(n, 3e-6, 2e-5 + n / 8e9, 3e-5 + n / 8e9) for n in (4096, 65536, 262144)]
    fit = fit_runtime(samples, link)
    assert (fit.action_s, fit.send_s, fit.recv_s) == pytest.approx((3e-6, 2e-5, 3e-5), rel=1e-6)
    assert fit.copy_bandwidth == pytest.approx(8e9, rel=1e-6)
    assert (fit.latency_s, fit.bandwidth) == (4e-5, 2e9)
    updates = fit.hardware_updates()
    scenario = parse_scenario(BASE).with_updates(updates)
    assert scenario.hardware.host.send_s == pytest.approx(2e-5)
    assert scenario.hardware.link.latency_s == pytest.approx(4e-5)
    # Host times that shrink with size are noise: the slope is kept at zero, never negative.
    flat = fit_runtime([(n, 1e-6, 5e-5 - n * 1e-12, 5e-5) for n in (1, 10, 100)], link)
    assert flat.copy_bandwidth == float("inf") and flat.send_s > 0


def test_host_times_sit_where_the_runtime_spends_them(runs) -> None:
    # Simulated: a send's transfer leaves send_s after the previous action ends; a receive ends
    # recv_s after its data arrives; compute actions last action_s longer.
    from gpipe_sim.api import simulate

    host = {"action_s": 7e-6, "send_s": 3e-5, "recv_s": 2e-5}
    base = parse_scenario(BASE).with_updates({"pipeline.partition": [2, 2]})
    plain, charged = simulate(base), simulate(base.with_updates({"hardware.host": host}))
    names = plain.timeline.kind_names
    for k in range(2):
        idx = np.flatnonzero(charged.timeline.rank == k)
        for a, b in zip(idx[:-1], idx[1:]):
            if names[b] == "send":
                assert charged.timeline.start_s[b] >= charged.timeline.end_s[a] + 3e-5 - 1e-12
    assert charged.step_time_s > plain.step_time_s
    # Measured: the gaps the calibration reads are real, positive and small (host time, not compute).
    _, _, measured, _ = runs[0]
    action, send, recv = runtime_sample([measured.result.timeline], list(ACTION_KINDS))
    assert 0 <= action < 5e-3 and 0 < send < 5e-3 and 0 <= recv < 5e-3


def test_calibrate_shared_scales_host_times_to_reproduce_a_shared_run() -> None:
    from gpipe_exec.checks.shared_devices import calibrate_shared

    base = fit_runtime([(n, 5e-6, 3e-5, 3e-5) for n in (4096, 65536)], LinkFit(5e-5, 2e9, ()))
    fit = calibrate_shared(base, [0, 0], steps=2, options=LaunchOptions(comm_timeout_s=60, run_timeout_s=300))
    assert 1.0 <= fit.shared_scale <= 64.0
    assert fit.send_s == pytest.approx(base.send_s * fit.shared_scale)
    assert fit.recv_s == pytest.approx(base.recv_s * fit.shared_scale)
    assert (fit.latency_s, fit.bandwidth, fit.on_device) == (base.latency_s, base.bandwidth, True)
    assert fit.hardware_updates()["hardware.host"]["on_device"] is True


def test_cli_validate_json(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "s.yaml"  # interleaved: two chunks per rank
    path.write_text(yaml.safe_dump({**BASE, "pipeline": {**BASE["pipeline"], "schedule": "interleaved_1f1b",
                                                         "chunks": 2, "micro_batches": 4, "batch_size": 8}}))
    proc = subprocess.run([sys.executable, "-m", "gpipe_exec.cli", "validate", str(path), "--json",
                           "--steps", "1", "--warmup", "0", "--no-timeline"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["predicted"]["source"] == "simulated" and out["measured"]["source"] == "measured"
    assert set(out["relative_error"]) >= {"step_time_s", "throughput_samples_per_s", "bubble_fraction"}
    assert out["relative_error"]["stage1.accounting.peak_activation_bytes"] < 1e-9
    assert all(out["relative_error"][f"chunk{c}.accounting.peak_activation_bytes"] < 1e-9 for c in range(4))
    assert out["relative_error"]["stage1.peak_memory_bytes"] < 0.10  # measured apart (measure.memory)
    assert [len(s["chunks"]) for s in out["measured"]["stages"]] == [2, 2]
    measured = out["measured"]  # the quoted figures, from the one summary both halves use
    assert measured["parameters"] == out["predicted"]["parameters"] > 0
    assert all(k in measured for k in ("tokens_per_s", "tflops_per_device", "mfu"))


DATA_PARALLEL = {**BASE, "pipeline": {**BASE["pipeline"], "data_parallel": 2, "micro_batches": 2, "batch_size": 8},
                 "training": {"optimizer": "adam", "zero": 1}}


def test_cli_run_data_parallel(tmp_path: Path) -> None:
    """`gpipe-exec run` on D=2 replicas of K=2 ranks (four processes): the result is the
    replicas' step, with the all-reduce waits in the timeline."""
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(DATA_PARALLEL))
    proc = subprocess.run([sys.executable, "-m", "gpipe_exec.cli", "run", str(path), "--json",
                           "--steps", "1", "--warmup", "0"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["data_parallel"] == 2 and out["source"] == "measured" and len(out["stages"]) == 2
    assert {e["rank"] for e in out["timeline"]} == {0, 1, 2, 3}
    reductions = [e for e in out["timeline"] if e["kind"] == "allreduce"]
    assert sorted((e["rank"], e["chunk"]) for e in reductions) == [(0, 0), (1, 1), (2, 0), (3, 1)]


@pytest.mark.slow
def test_cli_validate_data_parallel(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "s.yaml"  # each core runs one rank of each replica, taking turns
    path.write_text(yaml.safe_dump({**DATA_PARALLEL, "hardware": {"preset": "cpu", "placement": [[0, 1], [0, 1]]}}))
    proc = subprocess.run([sys.executable, "-m", "gpipe_exec.cli", "validate", str(path), "--json",
                           "--steps", "2", "--warmup", "1", "--no-timeline"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["predicted"]["data_parallel"] == out["measured"]["data_parallel"] == 2
    assert out["relative_error"]["stage1.accounting.peak_activation_bytes"] < 1e-9


def test_accuracy_grid_covers_interleaved_where_it_runs() -> None:
    from gpipe_exec.checks.accuracy import base_scenario, grid, markdown

    cases = grid(base_scenario("transformer", 4, 32), [1, 4, 6, 8], ["gpipe", "interleaved_1f1b"], [1, 2], ["none"])
    got = {(sc.pipeline.schedule, sc.pipeline.chunks, sc.pipeline.micro_batches) for sc in cases}
    assert ("interleaved_1f1b", 2, 4) in got and ("interleaved_1f1b", 2, 8) in got
    assert ("interleaved_1f1b", 2, 6) not in got and ("interleaved_1f1b", 2, 1) not in got  # M not a multiple of K
    assert not any(schedule == "gpipe" and v == 2 for schedule, v, _ in got)
    row = {"model": "transformer", "K": 4, "M": 4, "schedule": "interleaved_1f1b", "v": 2, "remat": "none",
           "step_time_error": 0.02, "measured_spread": 0.01, "memory_error": 0.0, "predicted_step_s": 1.0,
           "measured_step_s": 1.02}
    assert "| transformer | 4 | interleaved_1f1b | 2 | none | 2.0% (4) |" in markdown([row])


def test_example_scenarios_are_runnable() -> None:
    for path in sorted(Path(__file__).resolve().parent.parent.glob("scenarios/exec/*.yaml")):
        check_runnable(load_scenario(path))


def test_stages_sharing_a_device_never_compute_at_once() -> None:
    """K=4 on two devices ([0, 0, 1, 1]): the device lock serializes compute as the simulator does."""
    sc = parse_scenario({**BASE, "hardware": {"preset": "cpu", "stage_to_device": [0, 0, 1, 1]},
                         "model": {"preset": "mlp", "layers": 4, "width": 32, "input_dim": 16},
                         "pipeline": {**BASE["pipeline"], "stages": 4, "micro_batches": 4, "batch_size": 8,
                                      "schedule": "1f1b"}})
    plan = check_runnable(sc)
    out = launch([job_for(plan, steps=1, warmup=0)], plan.device_map, LaunchOptions(comm_timeout_s=60))[0]
    t = measured_result(plan, out).result.timeline
    for pair in ((0, 1), (2, 3)):
        spans = sorted((t.start_s[i], t.end_s[i]) for i in np.flatnonzero(t.is_compute)
                       if int(t.rank[i]) in pair)
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert b0 >= a1 - 1e-4, (pair, (a0, a1), (b0, b1))
    # Memory of a shared device: its stages' measured curves merged in time, as the simulator does.
    result = measured_result(plan, out).result
    for k, stage in enumerate(result.stages):
        assert max(result.memory_timeline[k][1]) == pytest.approx(stage.peak_activation_bytes)
    for device, pair in ((0, (0, 1)), (1, (2, 3))):
        stages = [result.stages[k] for k in pair]
        assert max(s.param_bytes + s.state_bytes for s in stages) <= result.device_peak_memory_bytes[device]
        assert result.device_peak_memory_bytes[device] <= sum(s.peak_memory_bytes for s in stages)


def test_torchrun_runs_the_same_worker(tmp_path: Path) -> None:
    import shutil

    import yaml

    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    if not Path(torchrun).exists():
        pytest.skip("torchrun not installed")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(BASE))
    from gpipe_exec.launch.spawn import _free_port

    proc = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", str(_free_port()),
                           "-m", "gpipe_exec.launch.torchrun",
                           str(path), "--steps", "1", "--warmup", "0"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["source"] == "measured" and len(result["stages"]) == 2 and result["step_time_s"] > 0


def test_torchrun_worker_refuses_a_model_the_executor_cannot_run_in_one_line(tmp_path: Path, capsys: Any) -> None:
    import yaml

    from gpipe_exec.launch.torchrun import torchrun_main

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"model": {"preset": "transformer", "layers": 2, "d_model": 16, "d_ff": 32,
                                              "heads": 2, "seq_len": 7, "vocab": 32},
                                    "pipeline": {"stages": 1, "tensor_parallel": 2, "sequence_parallel": True,
                                                 "micro_batches": 1, "batch_size": 2}}))
    assert torchrun_main([str(path)]) == 2
    assert capsys.readouterr().err == ("gpipe-exec: error: model.seq_len: 7 does not split over "
                                       "pipeline.tensor_parallel 2 with sequence parallelism (give a multiple of 2)\n")


def test_models_too_large_to_build_are_profiled_on_meta() -> None:
    from gpipe_exec.profile import too_large_to_build

    huge = parse_scenario({**BASE, "model": {"preset": "transformer", "layers": 96, "d_model": 12288,
                                             "d_ff": 49152, "heads": 96, "seq_len": 2048, "vocab": 50257}})
    assert too_large_to_build(huge) and not too_large_to_build(parse_scenario(BASE))
    table = profile_model(huge.with_updates({"model.layers": 1}), ProfileOptions(micro_batches=(1,), meta=True))
    d, f = 12288, 49152  # block: 4d^2 + 2df weights, biases and LayerNorms 9d + f
    assert table["layers"][1]["params"] == 4 * d * d + 2 * d * f + 9 * d + f  # built, never allocated


def test_typical_time_is_the_mean_without_gross_outliers() -> None:
    from gpipe_exec.profile import typical

    assert typical([1.0, 2.0, 4.0]) == pytest.approx(7.0 / 3.0)  # a mean, not the median (2.0)
    assert typical([1.0, 1.0, 1.2, 9.0]) == pytest.approx(3.2 / 3.0)  # 9.0 > 3x the median: left out
    assert typical([0.0, 0.0, 0.0]) == 0.0  # a layer with nothing to backpropagate


def test_validate_in_rounds_compares_the_median_rounds() -> None:
    from gpipe_exec.checks.validate import validate
    from gpipe_sim.errors import GpipeError

    sc = parse_scenario(BASE)
    v = validate(sc, steps=2, warmup=1, rounds=3, profile=ProfileOptions(warmup=0, repeats=1, min_time_s=0.0),
                 options=LaunchOptions(comm_timeout_s=60, run_timeout_s=300))
    assert len(v.rounds) == 3
    predicted = sorted(p for p, _ in v.rounds)
    measured = sorted(m for _, m in v.rounds)
    assert v.predicted.step_time_s == predicted[1]
    assert v.measured.result.step_time_s == measured[1]
    assert v.relative_error["step_time_s"] == pytest.approx(abs(predicted[1] - measured[1]) / measured[1])
    assert [r["measured_step_s"] for r in v.to_dict(timeline=False)["rounds"]] == [m for _, m in v.rounds]
    with pytest.raises(GpipeError, match="rounds"):
        validate(sc, rounds=0)


def _clock_across_machines(rank: int, device: Any, clock: Any, payload: Any) -> tuple[str, float]:
    """A launch task: the clock estimated as if each rank were on a machine of its own (the
    ping-pong path), on the tensor device the group's backend takes."""
    import socket

    from gpipe_exec.measure.meters import AlignedClock, collective_device

    socket.gethostname = lambda: f"machine{rank}"  # type: ignore[assignment]
    return str(collective_device()), AlignedClock.synchronize(rounds=2).offset


def test_clock_across_machines_pings_on_the_backends_device() -> None:
    # rank 0's answer: its own offset is 0 and gloo moves host tensors (NCCL: the rank's GPU)
    assert launch(None, [0, 1], LaunchOptions(comm_timeout_s=30), task=_clock_across_machines) == ("cpu", 0.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_clock_across_machines_pings_on_the_gpu_under_nccl() -> None:
    options = LaunchOptions(comm_timeout_s=30, device="cuda")
    assert launch(None, [0, 1], options, task=_clock_across_machines) == ("cuda:0", 0.0)


def test_gpu_spans_replace_issue_times_and_keep_host_actions_after_the_gpu_work_they_follow():
    """A step whose host queued two passes at 0-1 ms and 1-2 ms, then sent at 2-3 ms, while the GPU
    ran the passes at 0.1-10 ms and 10-20 ms: the passes take their GPU spans, the send starts when
    the second pass ended (its copy waited for it) and keeps a zero length, not a negative one."""
    from gpipe_exec.measure.gpu_spans import place_spans

    starts, ends = [0.0, 0.001, 0.002, 0.0205], [0.001, 0.002, 0.003, 0.021]
    place_spans(starts, ends, {0: (0.0001, 0.010), 1: (0.010, 0.020)}, t0=0.0)
    assert starts == [0.0001, 0.010, 0.020, 0.0205]
    assert ends == [0.010, 0.020, 0.020, 0.021]
