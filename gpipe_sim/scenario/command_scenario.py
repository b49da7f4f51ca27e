"""The scenario a command names: its file (or the default) with the command's `--set` items, and notes on it."""

from __future__ import annotations

import sys
from typing import Sequence

from gpipe_sim.errors import one_line
from gpipe_sim.costs.fp8 import DERIVED_NOTE, FP8
from gpipe_sim.scenario.scenario import DEFAULT_SCENARIO, Scenario, load_scenario, read_schedule_csv


def load_command_scenario(path: str | None, overrides: Sequence[str] | None = None) -> Scenario:
    """The scenario a command names (default: scenarios/default.yaml, else the schema defaults),
    with its `--set KEY=VALUE` items applied."""
    if path is not None:
        return load_scenario(path, overrides)
    if DEFAULT_SCENARIO.exists():
        return load_scenario(DEFAULT_SCENARIO, overrides)
    return Scenario().with_overrides(overrides)


def write_derived_notes(scenario: Scenario) -> None:
    """One line on stderr for each figure the scenario prices from derived rather than measured
    tables (FP8 GEMMs: gpipe_sim.costs.fp8)."""
    if scenario.training.dtype == FP8:
        sys.stderr.write(f"gpipe-sim: note: {DERIVED_NOTE}\n")


def write_schedule_notes(scenario: Scenario) -> None:
    """What reading the scenario's schedule CSV left out or changed (skipped actions), one line each
    on stderr; nothing for a registered schedule."""
    path = scenario.pipeline.schedule_csv
    if path is None:
        return
    for note in read_schedule_csv(path).notes:
        sys.stderr.write(f"gpipe-sim: note: {one_line(path, 200)}: {one_line(note)}\n")
