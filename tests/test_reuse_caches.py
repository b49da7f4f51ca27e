"""What the planner asks for many times is built once: schedules (read-only) and layer tables."""

from __future__ import annotations

import numpy as np
import pytest

from gpipe_sim.plan.layer_table import layer_table
from gpipe_sim.schedule import build_schedule
from gpipe_sim.scenario.scenario import load_scenario
from user_docs import ROOT


def test_a_schedule_is_built_once_and_read_only():
    first, again = build_schedule(4, 8, "1f1b", "always", 1), build_schedule(4, 8, "1f1b", "always", 1)
    assert first is again
    assert build_schedule(4, 8, "1f1b", "none", 1) is not first  # another remat mode, another schedule
    with pytest.raises(ValueError):
        first.columns.kind[0] = 0
    assert np.array_equal(first.columns.kind, again.columns.kind)


def test_a_layer_table_is_built_once_per_what_it_depends_on():
    scenario = load_scenario(ROOT / "scenarios" / "default.yaml")
    first, again = layer_table(scenario, 1, "none"), layer_table(scenario, 1, "none")
    assert first == again and first is not again  # a new list, the same layers
    first.append(first[0])
    assert len(layer_table(scenario, 1, "none")) == len(again)  # the caller's list is its own
    split = layer_table(scenario, 2, "none")
    assert split != again and sum(layer.params for layer in split) < sum(layer.params for layer in again)
