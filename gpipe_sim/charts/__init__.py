"""Plotly figure builders for results: timeline Gantt, memory, bubble vs M, predicted vs measured, sweeps.

The package's name gathers the charts; they live by kind in `gantt` (timelines), `memory`,
`compare` (prediction against measurement) and `sweep` (bubble against M, sweeps), with what they
share in `style`. Those modules never import the package's name.
"""

from __future__ import annotations

from gpipe_sim.charts.style import _DASHES, _SYMBOLS, GIB, rank_colors, time_unit
from gpipe_sim.charts.compare import relative_error_figure, stage_comparison_figure, step_times_figure
from gpipe_sim.charts.gantt import (
    _COMPUTE_LANE, _LANES, KIND_COLORS, TP_NAME, GanttBars, compare_timelines_figure, gantt_bars, timeline_figure,
)
from gpipe_sim.charts.memory import memory_timeline_figure, stage_memory_figure
from gpipe_sim.charts.sweep import bubble_vs_m_figure, sweep_figure

__all__ = [
    "GIB", "KIND_COLORS", "GanttBars", "_COMPUTE_LANE", "_DASHES", "_LANES", "_SYMBOLS", "bubble_vs_m_figure",
    "compare_timelines_figure", "gantt_bars", "memory_timeline_figure", "rank_colors", "relative_error_figure",
    "stage_comparison_figure", "stage_memory_figure", "step_times_figure", "sweep_figure", "time_unit",
    "timeline_figure", "TP_NAME",
]
