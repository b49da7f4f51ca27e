"""Scenario sweeps: a base scenario plus axes expanded into points, run in parallel, resumable.

The package's name gathers its parts: the file (`spec`), its points (`points`), the runner
(`runner`) and the best configurations (`best`); the HTML report is `report` (not imported here:
it needs plotly). Those modules never import the package's name.
"""

from __future__ import annotations

from gpipe_sim.sweeps.best import BEST_SHOWN, best_configurations, best_text, varying_inputs
from gpipe_sim.sweeps.points import SweepPoint, expand, scenario_key
from gpipe_sim.sweeps.runner import (
    RESULT_COLUMNS, RUNS_DIR, STATUS_COLUMNS, ProgressCallback, SweepRun, flatten, input_columns, merge_rows,
    result_columns, run_chunk, run_sweep, run_task, write_tables,
)
from gpipe_sim.sweeps.spec import (
    SCENARIO_SECTIONS, SweepError, SweepSpec, load_sweep, parse_sweep, point_count, resolve_base,
)

__all__ = [
    "BEST_SHOWN", "RESULT_COLUMNS", "RUNS_DIR", "SCENARIO_SECTIONS", "STATUS_COLUMNS", "ProgressCallback",
    "SweepError", "SweepPoint", "SweepRun", "SweepSpec", "best_configurations", "best_text", "expand",
    "flatten", "input_columns", "load_sweep", "merge_rows", "parse_sweep", "point_count", "resolve_base",
    "result_columns", "run_chunk", "run_sweep", "run_task", "scenario_key", "varying_inputs", "write_tables",
]
