"""Faults: a failing or killed rank stops the run with a clear error in bounded time; bad input fails
before any process starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from gpipe_exec import cli, execute  # noqa: E402
from gpipe_exec.runtime import job  # noqa: E402
from gpipe_exec.errors import ExecutionError  # noqa: E402
from gpipe_exec.launch.spawn import LaunchOptions, launch  # noqa: E402
from gpipe_sim.scenario.scenario import parse_scenario  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = {
    "model": {"preset": "mlp", "layers": 2, "width": 16, "input_dim": 8},
    "hardware": {"preset": "cpu"},
    "pipeline": {"stages": 2, "micro_batches": 4, "batch_size": 8, "schedule": "gpipe", "remat": "none"},
}
OPTIONS = LaunchOptions(comm_timeout_s=20, run_timeout_s=120)


def _job(fault: dict, pipeline: dict | None = None) -> tuple:
    sc = parse_scenario({**SCENARIO, "pipeline": {**SCENARIO["pipeline"], **(pipeline or {})}})
    plan = execute.check_runnable(sc)
    return job.job_for(plan, steps=2, warmup=0, fault=fault), plan


@pytest.mark.parametrize("kind, pipeline", [
    ("raise", None), ("kill", None),
    ("raise", {"schedule": "interleaved_1f1b", "chunks": 2}),  # two chunks per rank
])
def test_failing_rank_stops_everyone_and_is_named(kind: str, pipeline: dict | None) -> None:
    # Rank 1 fails before its 5th action; rank 0 is then blocked waiting for its gradient.
    job, plan = _job({"rank": 1, "kind": kind, "action": 4, "step": 1}, pipeline)
    t0 = time.monotonic()
    with pytest.raises(ExecutionError) as info:
        launch([job], plan.device_map, OPTIONS)
    elapsed = time.monotonic() - t0
    message = str(info.value)
    assert "rank 1" in message and "\n" not in message
    assert ("killed by SIGKILL" if kind == "kill" else "injected fault") in message
    assert elapsed < 60  # bounded: far below the comm timeout plus start-up
    # The surviving rank noticed on its own and named the peer that stopped.
    peers = [e for e in info.value.rank_errors if e["rank"] == 0]
    assert peers and peers[0]["peer"] and "rank 1" in peers[0]["message"]


def test_a_native_crash_is_named_with_where_it_happened_not_its_peers_lost_connections() -> None:
    # Rank 1 dies of SIGSEGV: its peers' gloo calls fail with "Connection closed by peer", which
    # are consequences; the message names the crashed rank and the Python frame it crashed in.
    job, plan = _job({"rank": 1, "kind": "crash", "action": 4, "step": 1})
    with pytest.raises(ExecutionError) as info:
        launch([job], plan.device_map, OPTIONS)
    message = str(info.value)
    assert "\n" not in message and message.startswith("rank 1 was killed by SIGSEGV at File "), message
    assert "_fault" in message, message
    assert all(e["peer"] for e in info.value.rank_errors), info.value.rank_errors


def test_lost_connections_are_consequences() -> None:
    from gpipe_exec.launch.spawn import lost_peer
    gloo = "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:19599"
    assert lost_peer(RuntimeError(gloo)) and lost_peer(RuntimeError("Read error: Connection reset by peer"))
    assert not lost_peer(RuntimeError("injected fault at action 4"))


def test_a_killed_rank_stops_all_replicas_and_is_named() -> None:
    # D=2 replicas of K=2 ranks: global rank 3 (replica 1's last rank) is killed in its second step;
    # its pipeline peer (rank 2) and replica 0 (blocked in the chunks' all-reduces) stop too.
    job, plan = _job({"rank": 3, "kind": "kill", "action": 3, "step": 1}, {"data_parallel": 2, "micro_batches": 2})
    assert len(plan.device_map) == 4
    t0 = time.monotonic()
    with pytest.raises(ExecutionError) as info:
        launch([job], plan.device_map, OPTIONS)
    elapsed = time.monotonic() - t0
    message = str(info.value)
    assert "\n" not in message and message.startswith("rank 3 was killed by SIGKILL"), message
    assert elapsed < 60


def test_cli_exits_nonzero_naming_the_rank(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    env = {**os.environ, job.FAULT_ENV: "0:raise:2"}
    proc = subprocess.run([sys.executable, "-m", "gpipe_exec.cli", "run", str(path), "--steps", "1",
                           "--warmup", "0", "--timeout", "20"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("gpipe-exec: error: rank 0 failed") and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "change, field",
    [
        ({"pipeline": {**SCENARIO["pipeline"], "micro_batches": 16}}, "pipeline.micro_batches"),
        ({"pipeline": {**SCENARIO["pipeline"], "stages": 5}}, "pipeline.stages"),
        ({"pipeline": {**SCENARIO["pipeline"], "chunks": 2}}, "pipeline.chunks"),
        ({"pipeline": {**SCENARIO["pipeline"], "schedule": "interleaved_1f1b", "chunks": 3}}, "pipeline.chunks"),
        ({"model": {"preset": "amoebanet", "layers": 3, "filters": 8, "image_size": 16}}, "model.preset"),
        ({"model": {"preset": "convnet", "layers": 2, "channels": 4, "image_size": 2}}, "model.image_size"),
    ],
)
def test_unrunnable_scenario_fails_before_any_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture, change: dict,
                                                      field: str) -> None:
    import yaml

    def no_launch(*args: object, **kwargs: object) -> None:
        raise AssertionError("a process was started")

    monkeypatch.setattr(execute, "launch", no_launch)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**SCENARIO, **change}))
    assert cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err, err


def test_a_run_too_large_for_this_machine_is_refused_before_any_process_starts():
    from gpipe_exec.execute import check_host_memory
    from gpipe_sim import load_scenario
    from gpipe_sim.errors import ScenarioError
    from gpipe_sim.plan.compile import compile_plan

    plan = compile_plan(load_scenario(ROOT / "scenarios" / "exec" / "transformer_k2.yaml"))
    check_host_memory(plan, available=64 * 2**30)  # fits
    with pytest.raises(ScenarioError, match=r"model: running these 2 stages here needs about .* GiB"):
        check_host_memory(plan, available=0.5 * 2**30)


def test_cli_refuses_the_default_scenario_on_this_cpu_with_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "gpipe_exec.cli", "run", str(ROOT / "scenarios" / "default.yaml")],
        capture_output=True, text=True, timeout=120,
    )
    if proc.returncode == 0:
        pytest.skip("this machine has room for the default scenario")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "GiB free" in proc.stderr


@pytest.mark.parametrize("devices", ["0,x", "0", "0,-1"])
def test_cli_calibrate_refuses_bad_devices_before_measuring(devices: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "gpipe_exec.cli", "calibrate", "--devices", devices],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("gpipe-exec: error: --devices:")
