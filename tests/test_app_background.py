"""The app's background jobs (the Plan page's search): progress, cancel, an abandoned page, errors."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("streamlit")
from gpipe_app import ui_background  # noqa: E402
from gpipe_app.ui_background import BackgroundJob  # noqa: E402
from gpipe_sim.errors import ScenarioError  # noqa: E402


def _counting(steps: int, pause: float = 0.002):
    def work(progress):
        for i in range(steps):
            progress(i, steps)
            time.sleep(pause)
        return "answer"
    return work


def test_a_job_reports_progress_and_its_result():
    job = BackgroundJob("q", _counting(20)).start()
    assert job.wait(10) and job.result == "answer" and not job.cancelled and job.error is None
    assert (job.done, job.total) == (19, 20)


def test_a_cancelled_job_stops_at_its_next_progress_report():
    job = BackgroundJob("q", _counting(100_000, 0.001)).start()
    while job.done < 3:
        time.sleep(0.005)
    job.cancel()
    assert job.wait(5) and job.cancelled and job.result is None and job.done < 100_000 - 1


def test_a_job_nobody_watches_stops(monkeypatch):
    monkeypatch.setattr(ui_background, "ABANDONED_S", 0.05)
    job = BackgroundJob("q", _counting(100_000, 0.001)).start()
    assert job.wait(5) and job.cancelled and job.result is None


def test_a_failing_job_is_one_line():
    def bad(progress):
        raise ScenarioError("pipeline.stages: too many")

    def broken(progress):
        raise RuntimeError("first line\nsecond line")

    assert BackgroundJob("q", bad).start().wait(5)
    job = BackgroundJob("q", bad).start()
    job.wait(5)
    assert job.error == "pipeline.stages: too many" and job.result is None
    job = BackgroundJob("q", broken).start()
    job.wait(5)
    assert job.error == "RuntimeError: first line"
