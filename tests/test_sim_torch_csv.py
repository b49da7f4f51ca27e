"""torch's schedule CSV: read (torch-free) and written, checked against torch's own action strings."""

from __future__ import annotations

import pytest

from gpipe_sim.errors import ScheduleError
from gpipe_sim.schedule import SCHEDULES, Kind, build_schedule, lower
from gpipe_sim.schedule.torch_csv import parse_torch_csv, torch_csv_text

TORCH_NAMES = {"interleaved_1f1b": "Interleaved1F1B", "looped_bfs": "LoopedBFS",
               "interleaved_zb": "InterleavedZeroBubble", "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}


def test_a_hand_written_csv_with_every_cell_kind():
    text = ("0F0,0F1,,(0F2;0B0)OVERLAP_F_B,0SEND_F2,0I1,0W1,0REDUCE_GRAD,0UNSHARD\n")
    parsed = parse_torch_csv(text)
    assert parsed.orders == [[(int(Kind.FORWARD), 0, 0), (int(Kind.FORWARD), 0, 1), (int(Kind.FORWARD), 0, 2),
                              (int(Kind.BACKWARD), 0, 0), (int(Kind.BACKWARD_INPUT), 0, 1),
                              (int(Kind.BACKWARD_WEIGHT), 0, 1)]]
    assert parsed.placement == (0,) and parsed.micro_batches == 3
    assert any("OVERLAP_F_B" in n for n in parsed.notes) and any("REDUCE_GRAD" in n for n in parsed.notes)


@pytest.mark.parametrize("text, match", [
    ("0F0,0X1\n", r"rank 0, column 2: '0X1' is not an action"),
    ("0F0,0B0\n0F0,0B0\n", "stage 0 also runs on rank 0"),
    ("1F0,1B0\n", "no rank runs stage 0"),
    ("0F0,2F0\n1F0\n", "different numbers of stages"),
    ("0F\n", "names no micro-batch"),
    ("\n\n", "no rows"),
])
def test_bad_csv_is_one_line_naming_rank_and_cell(text, match):
    with pytest.raises(ScheduleError, match=match):
        parse_torch_csv(text)


@pytest.mark.parametrize("name, K, M, v", [("1f1b", 3, 5, 1), ("interleaved_1f1b", 2, 4, 2), ("zbv", 2, 4, 2),
                                           ("zb_h2", 4, 8, 1), ("dualpipev", 2, 4, 2)])
def test_our_schedules_round_trip_through_the_csv(name, K, M, v):
    schedule = build_schedule(K, M, name, "none", v)
    parsed = parse_torch_csv(torch_csv_text(schedule))
    again = lower(name, parsed.orders, parsed.placement, parsed.micro_batches, "none", parsed.chunks)
    assert again.placement == schedule.placement
    for a, b in zip(again.actions, schedule.actions):
        assert a == b


@pytest.mark.parametrize("ours", sorted(TORCH_NAMES))
@pytest.mark.parametrize("K", [2, 4, 8])
@pytest.mark.parametrize("rounds", [1, 2, 4])
def test_torchs_own_schedules_read_and_lower_like_ours(ours, K, rounds):
    pytest.importorskip("torch")
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    M = K * rounds
    try:
        rows = get_schedule_ops(TORCH_NAMES[ours], K, M, num_stages_per_rank=2)
    except ValueError:
        assert SCHEDULES[ours].problem(K, M, 2) is not None
        return
    parsed = parse_torch_csv("\n".join(",".join("" if a is None else str(a) for a in row) for row in rows))
    assert parsed.micro_batches == M and parsed.chunks == 2
    theirs = lower(ours, parsed.orders, parsed.placement, M, "always", 2)
    mine = build_schedule(K, M, ours, "always", 2)
    assert theirs.actions == mine.actions


def test_our_csv_cells_are_what_torch_parses():
    torch = pytest.importorskip("torch")  # noqa: F841
    from torch.distributed.pipelining.schedules import _Action

    text = torch_csv_text(build_schedule(2, 4, "zbv", "none", 2))
    for row in text.splitlines():
        for cell in row.split(","):
            action = _Action.from_str(cell)
            assert str(action) == cell


def test_torchs_1f1b_visualizer_row_is_refused_with_the_rank():
    """torch 2.13's `get_schedule_ops("1F1B", 2, 4)` names micro-batch 4 of 4 on rank 1."""
    pytest.importorskip("torch")
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    rows = get_schedule_ops("1F1B", 2, 4)
    parsed = parse_torch_csv("\n".join(",".join("" if a is None else str(a) for a in row) for row in rows))
    with pytest.raises(ScheduleError, match="rank 1: a pass names a micro-batch outside 0..3"):
        lower("torch-1f1b", parsed.orders, parsed.placement, 4, "none", parsed.chunks)


# ---------------------------------------------------------------------------------------------
# `pipeline.schedule: {csv: PATH}` in a scenario, and `gpipe-sim schedule --csv`

import json  # noqa: E402

import yaml  # noqa: E402

from gpipe_sim.cli import main  # noqa: E402

SCENARIO = {
    "model": {"preset": "uniform", "layers": 8},
    "hardware": {"preset": "v100"},
    "pipeline": {"stages": 2, "micro_batches": 4, "batch_size": 16, "remat": "always"},
}


def _scenario(folder, schedule, **pipeline):
    path = folder / f"scenario{len(list(folder.glob('scenario*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump({**SCENARIO, "pipeline": {**SCENARIO["pipeline"], "schedule": schedule,
                                                             **pipeline}}))
    return path


def _simulate(capsys, path, *extra):
    assert main(["simulate", str(path), "--json", "--no-timeline", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def _refused(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpipe-sim: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("name, K, M, v, remat", [("1f1b", 4, 8, 1, "always"), ("gpipe", 2, 4, 1, "except_last"),
                                                  ("interleaved_1f1b", 2, 4, 2, "always"),
                                                  ("zbv", 2, 4, 2, "none")])
def test_a_registered_schedule_round_trips_through_the_csv_to_the_same_prediction(
        tmp_path, capsys, monkeypatch, name, K, M, v, remat):
    pipeline = {"stages": K, "micro_batches": M, "chunks": v, "remat": remat}
    registered = _scenario(tmp_path, name, **pipeline)
    out = tmp_path / "written.csv"
    assert main(["schedule", str(registered), "--csv", str(out)]) == 0
    assert f"schedule {name}: K={K} ranks x v={v}" in capsys.readouterr().out
    from_csv = _scenario(tmp_path, {"csv": "written.csv"}, **pipeline)  # relative to the scenario's folder
    monkeypatch.chdir(tmp_path.parent)
    a, b = _simulate(capsys, registered), _simulate(capsys, from_csv)
    for key in ("step_time_s", "bubble_fraction", "device_peak_memory_bytes"):
        assert a[key] == b[key], key
    # the analytic bubble of a schedule read from a file is fill-drain's (K-1)/(v*M+K-1)
    assert b["analytic_bubble_fraction"] == pytest.approx((K - 1) / (v * M + K - 1))
    # written again from the CSV scenario: the same file
    again = tmp_path / "again.csv"
    assert main(["schedule", str(from_csv), "--csv", str(again)]) == 0
    assert again.read_text() == out.read_text()


def test_a_csv_that_does_not_match_the_pipeline_is_one_line_naming_the_field(tmp_path, capsys):
    (tmp_path / "k2.csv").write_text("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")
    wrong_k = _scenario(tmp_path, {"csv": "k2.csv"}, stages=4, micro_batches=2)
    err = _refused(capsys, ["simulate", str(wrong_k)])
    assert "pipeline.stages: 4 stages, but the schedule CSV" in err and "k2.csv' has 2 rows (one per rank)" in err
    wrong_m = _scenario(tmp_path, {"csv": "k2.csv"}, micro_batches=4)
    err = _refused(capsys, ["simulate", str(wrong_m)])
    assert "pipeline.micro_batches: 4 micro-batches, but the schedule CSV" in err
    wrong_v = _scenario(tmp_path, {"csv": "k2.csv"}, micro_batches=2, chunks=2)
    assert "pipeline.chunks: 2 chunks per rank, but the schedule CSV" in _refused(capsys, ["simulate", str(wrong_v)])
    # --set fixes it without editing the file, and switches back to a registered schedule
    assert _simulate(capsys, wrong_k, "--set", "pipeline.stages=2")["micro_batches"] == 2
    assert main(["simulate", str(wrong_k), "--set", "pipeline.schedule=1f1b", "--set", "pipeline.micro_batches=4"]) == 0
    assert "K=4 v=1 M=4 batch=16 schedule=1f1b" in capsys.readouterr().out


@pytest.mark.parametrize("text, fragment", [
    ("0F0,0X1\n1F0,1B0\n", "rank 0, column 2: '0X1' is not an action"),
    ("0F0,0F1,0B0\n1F0,1B0,1F1,1B1\n", "schedule: chunk 0, micro-batch 1 must be one that is backwarded once"),
    ("0F0,0B0,0F1,0B1\n1B0,1F0,1F1,1B1\n", "must be one that is backwarded after its forward"),
    ("", "no rows"),
])
def test_a_bad_csv_is_one_line_naming_the_file(tmp_path, capsys, text, fragment):
    (tmp_path / "bad.csv").write_text(text)
    path = _scenario(tmp_path, {"csv": "bad.csv"}, micro_batches=2)
    err = _refused(capsys, ["simulate", str(path)])
    assert "pipeline.schedule.csv: " in err and "bad.csv" in err and fragment in err


def test_unreadable_or_misnamed_csv_is_one_line(tmp_path, capsys):
    for schedule, fragment in (({"csv": "missing.csv"}, "pipeline.schedule.csv: cannot read"),
                               ({"csv": "/dev/zero"}, "pipeline.schedule.csv: '/dev/zero' is not a regular file"),
                               ({"csv": str(tmp_path)}, "is not a regular file"),
                               ({"csv": 3}, "pipeline.schedule.csv: give the path"),
                               ({"path": "x.csv"}, "pipeline.schedule.path: unknown key"),
                               ({"csv": "a\0b"}, "pipeline.schedule.csv: a file name cannot contain a NUL")):
        path = _scenario(tmp_path, schedule)
        assert fragment in _refused(capsys, ["simulate", str(path)])


def test_a_deadlocking_csv_is_one_line_naming_the_rank_and_action(tmp_path, capsys):
    # rank 0 waits for micro-batch 0's gradient before it sends micro-batch 1; rank 1 wants micro-batch 1 first
    (tmp_path / "deadlock.csv").write_text("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n")
    path = _scenario(tmp_path, {"csv": "deadlock.csv"}, micro_batches=2)
    for engine in ("simpy", "fast"):
        err = _refused(capsys, ["simulate", str(path), "--engine", engine])
        assert "schedule deadlocks: rank " in err and " waits forever at recv(" in err, err


def test_notes_from_reading_the_csv_go_to_stderr_one_line_each(tmp_path, capsys):
    (tmp_path / "comms.csv").write_text(
        "0F0,0SEND_F0,0F1,0SEND_F1,0B0,0B1,0REDUCE_GRAD\n1RECV_F0,1F0,1B0,1F1,1B1,1REDUCE_GRAD\n")
    path = _scenario(tmp_path, {"csv": "comms.csv"}, micro_batches=2)
    assert main(["simulate", str(path)]) == 0
    captured = capsys.readouterr()
    notes = captured.err.splitlines()
    assert len(notes) == 2 and all(line.startswith("gpipe-sim: note: ") and "comms.csv" in line for line in notes)
    assert any("REDUCE_GRAD actions skipped" in line for line in notes)
    assert any("SEND/RECV actions dropped" in line for line in notes)
    assert "schedule=csv:" in captured.out


def test_a_sweep_over_a_csv_base(tmp_path, capsys):
    """A sweep's base may name a CSV (relative to the sweep file); its rows run like any other."""
    (tmp_path / "s.csv").write_text(torch_csv_text(build_schedule(2, 4, "1f1b", "none", 1)))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"base": {**SCENARIO, "pipeline": {**SCENARIO["pipeline"],
                                                                        "schedule": {"csv": "s.csv"}}},
                                     "axes": {"pipeline.remat": ["none", "always"]}}))
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "out"), "--workers", "0", "--quiet",
                 "--no-report"]) == 0
    assert "2 scenarios: 2 computed, 0 reused, 0 failed" in capsys.readouterr().out
