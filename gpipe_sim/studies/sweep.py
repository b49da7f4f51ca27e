"""Scenario sweeps: a base scenario plus axes expanded into points, run in parallel, resumable.

This module gathers the sweep's parts under one name: the file (`sweep_spec`), its points
(`sweep_points`), the runner (`sweep_runner`) and the best configurations (`sweep_best`); the
HTML report is `sweep_report`. Those modules never import this one.
"""

from __future__ import annotations

from gpipe_sim.studies.sweep_best import BEST_SHOWN, best_configurations, best_text, varying_inputs
from gpipe_sim.studies.sweep_points import SweepPoint, expand, scenario_key
from gpipe_sim.studies.sweep_runner import (
    RESULT_COLUMNS, RUNS_DIR, STATUS_COLUMNS, ProgressCallback, SweepRun, flatten, input_columns, merge_rows,
    result_columns, run_chunk, run_sweep, run_task, write_tables,
)
from gpipe_sim.studies.sweep_spec import (
    SCENARIO_SECTIONS, SweepError, SweepSpec, load_sweep, parse_sweep, point_count, resolve_base,
)

__all__ = [
    "BEST_SHOWN", "RESULT_COLUMNS", "RUNS_DIR", "SCENARIO_SECTIONS", "STATUS_COLUMNS", "ProgressCallback",
    "SweepError", "SweepPoint", "SweepRun", "SweepSpec", "best_configurations", "best_text", "expand",
    "flatten", "input_columns", "load_sweep", "merge_rows", "parse_sweep", "point_count", "resolve_base",
    "result_columns", "run_chunk", "run_sweep", "run_task", "scenario_key", "varying_inputs", "write_tables",
]
