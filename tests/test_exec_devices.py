"""Where ranks run: device choice, the transport for a layout, layouts that cannot run, host issue times."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpipe_exec.launch.devices import DEVICE_ENV, Transport, check_gpu_layout, device_type, transport  # noqa: E402
from gpipe_sim.errors import ScenarioError  # noqa: E402
from gpipe_sim.plan.compile import compile_plan  # noqa: E402
from gpipe_sim.scenario.scenario import parse_scenario  # noqa: E402


def test_device_type_follows_the_request_then_the_environment(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert device_type() == "cpu"
    assert device_type("cpu") == "cpu"
    monkeypatch.setenv(DEVICE_ENV, "auto")
    assert device_type() == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ScenarioError, match="device: 'tpu' is not one of"):
        device_type("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ScenarioError, match="torch sees no CUDA GPU"):
            device_type("cuda")


def test_ranks_sharing_a_gpu_go_over_gloo_staged_through_the_host():
    assert transport("cpu", [0, 1]) == Transport("gloo")
    assert transport("cuda", [0, 1]) == Transport("nccl")
    assert transport("cuda", [0, 0]) == Transport("gloo", staged=True)
    assert transport("cuda", [0, 1, 0, 1]) == Transport("gloo", staged=True)
    with pytest.raises(ScenarioError, match="NCCL refuses two ranks on one GPU"):
        transport("cuda", [0, 0], backend="nccl")


def test_a_layout_on_missing_gpus_is_refused_in_one_line():
    check_gpu_layout([0, 0, 0, 0], 1)
    with pytest.raises(ScenarioError) as err:
        check_gpu_layout([0, 1], 1)
    message = str(err.value)
    assert "\n" not in message and "uses GPU 1 but this machine has 1 GPU" in message
    assert "several stages may share one GPU" in message


def _table(host_s: float) -> dict:
    timing = {"micro_batch": 2, "forward_s": 0.001, "backward_s": 0.002, "forward_host_s": host_s,
              "backward_host_s": 2 * host_s}
    row = {"name": "layer", "params": 10, "activation_bytes_per_sample": 100.0, "output_bytes_per_sample": 10.0,
           "timings": [timing]}
    return {"model": {"preset": "table", "layers": [dict(row, name=f"l{i}") for i in range(4)]},
            "hardware": {"preset": "ideal"},
            "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 4, "schedule": "gpipe"}}


def test_a_pass_takes_at_least_what_issuing_its_kernels_takes_the_host():
    """GPU profiles record the host's time to issue each pass: a chunk's pass is the larger of its
    layers' summed device time and their summed host time."""
    device_bound = compile_plan(parse_scenario(_table(0.0002))).chunks[0]
    assert device_bound.forward_s[0] == pytest.approx(2 * 0.001)
    assert device_bound.backward_s[0] == pytest.approx(2 * 0.002)
    host_bound = compile_plan(parse_scenario(_table(0.003))).chunks[0]
    assert host_bound.forward_s[0] == pytest.approx(2 * 0.003)
    assert host_bound.backward_s[0] == pytest.approx(2 * 0.006)


def test_stamps_on_cpu_give_the_host_the_device_time():
    from gpipe_exec.profile import Stamps

    import time

    stamps = Stamps(torch.device("cpu"), "wall")
    a = stamps.now()
    time.sleep(0.02)
    b = stamps.now()
    assert stamps.host_seconds(a, b) == stamps.seconds(a, b) > 0
    assert 0.02 <= stamps.seconds(a, b) < 1.0  # a wall-clock interval, in seconds
    # the thread's CPU clock does not count a sleep
    thread = Stamps(torch.device("cpu"), "thread")
    c = thread.now()
    time.sleep(0.02)
    assert thread.seconds(c, thread.now()) < 0.01


def test_selfcheck_reports_each_case_and_a_summary():
    """One tiny CPU case validated end to end, and a failing case reported in its row."""
    from gpipe_exec.launch.spawn import LaunchOptions
    from gpipe_exec.checks.selfcheck import cpu_cases, run_selfcheck, selfcheck_text

    name, data = cpu_cases()[2]  # the mlp
    bad = dict(data, hardware={"preset": "cpu", "stage_to_device": [0]},
               model={**data["model"], "layers": 4})
    cases = [(name, parse_scenario(data)), ("broken", parse_scenario(bad).with_updates({"model.preset": "uniform"}))]
    rows = run_selfcheck(cases, LaunchOptions(), steps=2, plain=True)
    assert rows[0].error == "" and rows[0].predicted_step_s > 0 and rows[0].measured_step_s > 0
    assert rows[0].memory_error < 0.05
    assert rows[0].same_work and not rows[0].gpu_bound and rows[0].plain_step_s > 0 and rows[0].preset_step_s > 0
    assert "model.preset" in rows[1].error
    text = selfcheck_text(rows, "cpu", 1.0)
    assert name in text and "failed" in text and "1 of 2 cases ran, 1 failed" in text
    assert "executor vs plain loop (same work, 1 cases)" in text
