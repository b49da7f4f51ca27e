"""Plotly figure builders for results: timeline Gantt, memory, bubble vs M, predicted vs measured, sweeps.

This module gathers the charts under one name; they live by kind in `plots_gantt` (timelines),
`plots_memory`, `plots_compare` (prediction against measurement) and `plots_sweep` (bubble against
M, sweeps), with what they share in `plot_style`. Those modules never import this one.
"""

from __future__ import annotations

from gpipe_sim.studies.plot_style import _DASHES, _SYMBOLS, GIB, rank_colors, time_unit
from gpipe_sim.studies.plots_compare import relative_error_figure, stage_comparison_figure, step_times_figure
from gpipe_sim.studies.plots_gantt import (
    _COMPUTE_LANE, _LANES, KIND_COLORS, GanttBars, compare_timelines_figure, gantt_bars, timeline_figure,
)
from gpipe_sim.studies.plots_memory import memory_timeline_figure, stage_memory_figure
from gpipe_sim.studies.plots_sweep import bubble_vs_m_figure, sweep_figure

__all__ = [
    "GIB", "KIND_COLORS", "GanttBars", "_COMPUTE_LANE", "_DASHES", "_LANES", "_SYMBOLS", "bubble_vs_m_figure",
    "compare_timelines_figure", "gantt_bars", "memory_timeline_figure", "rank_colors", "relative_error_figure",
    "stage_comparison_figure", "stage_memory_figure", "step_times_figure", "sweep_figure", "time_unit",
    "timeline_figure",
]
