"""`python -m gpipe_sim.planner.phases`: where a plan search's time goes, the search left as it was."""

import pytest

from gpipe_sim.planner import phases, search

QUESTION = ["plan", "scenarios/default.yaml", "--devices", "2", "--schedules", "1f1b", "--micro-batches", "2,4",
            "--quiet"]


def test_phases_time_the_search_and_put_its_functions_back(capsys):
    before = {name: getattr(search, name) for name in phases.TIMED}
    assert phases.main(QUESTION) == 0
    out, err = capsys.readouterr()
    assert "configurations:" in out  # plan's own report
    lines = dict(line.rsplit(None, 2)[:2] for line in err.strip().splitlines())
    assert set(lines) == {"in all", *phases.TIMED}
    assert float(lines["_decide"]) > 0 and float(lines["in all"]) >= float(lines["_run_queue"])
    assert {name: getattr(search, name) for name in phases.TIMED} == before


def test_phases_times_plan_only_and_bad_input_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        phases.main(["plan-bench"])
    assert exit_.value.code == 2
    assert phases.main(["plan", "missing.yaml", "--devices", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("python -m gpipe_sim.planner.phases: error: ") and "missing.yaml" in err[-1]
