"""`gpipe-sim bench` and its side-by-side comparison with another checkout, at a tiny size."""

from __future__ import annotations

from pathlib import Path

from gpipe_sim.studies.engine_bench import compare, run_benchmark


def test_benchmark_reports_the_engines_and_three_whole_processes():
    text = run_benchmark(stages=4, micro_batches=8, repeat=1)
    assert "fast evaluator" in text and "straightforward SimPy" in text
    for case in ("gpipe K=4 M=8", "interleaved_1f1b K=2 v=2 M=4", "1f1b K=4 M=8"):
        assert case in text


def test_compare_against_this_checkout_gives_ratios_for_every_case_and_figure():
    here = Path(__file__).resolve().parents[1]
    text = compare(here, stages=2, micro_batches=4, repeat=1, inner=1)
    rows = [line for line in text.splitlines() if "ratio" in line]
    assert len(rows) == 9  # three cases x (process wall, process CPU, in-process best)
    assert all(float(line.rsplit("ratio", 1)[1]) > 0 for line in rows)


def test_compare_evaluator_reports_the_grid_and_the_cases(monkeypatch):
    from gpipe_sim.studies import engine_bench

    small = engine_bench._evaluator_plans(2, 4)
    monkeypatch.setattr(engine_bench, "_evaluator_plans", lambda stages, micro_batches: small[:2] + small[-3:])
    text = engine_bench.compare_evaluator(Path(__file__).resolve().parents[1], stages=2, micro_batches=4, repeat=1)
    assert text.startswith("fast evaluator, 2 plans")
    assert len([line for line in text.splitlines() if "ratio" in line]) == 3
