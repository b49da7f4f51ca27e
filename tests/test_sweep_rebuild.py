"""Every row of a sweep's table rebuilds into the scenario that ran (the app's Sweep page)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from gpipe_sim.scenario.scenario import parse_scenario
from gpipe_sim.sweeps import expand, load_sweep, run_sweep
from gpipe_sim.sweeps.runner import MAX_LIST_CELL_CHARS, flatten

pytest.importorskip("streamlit")
from gpipe_app.ui_data import row_scenario_data, split_sweep  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_every_row_of_the_guides_sweep_rebuilds_into_its_scenario(tmp_path, fmt):
    """scenarios/sweeps/k_m_grid.yaml (README and the sweeps guide): the A100 preset's GEMM tiles
    (a list of lists) and every other field come back as they ran, from either table file."""
    spec, base = load_sweep(ROOT / "scenarios" / "sweeps" / "k_m_grid.yaml")
    points = expand(spec, base)
    run_sweep(points, base, tmp_path, workers=0, progress=False)
    table = pd.read_parquet(tmp_path / "results.parquet") if fmt == "parquet" else pd.read_csv(tmp_path / "results.csv")
    cols = split_sweep(table)
    assert len(cols.ok) == len(points) and cols.failed.empty
    assert "hardware.accelerator.gpu.gemm_tiles" in cols.inputs
    for (_, row), point in zip(cols.ok.iterrows(), points):
        assert parse_scenario(row_scenario_data(row, cols.inputs)).to_dict() == point.scenario


def test_flatten_keeps_lists_as_json_and_summarises_only_large_ones():
    flat = flatten({"a": {"tiles": [[128, 256, 1.0]], "links": [{"bandwidth": 1.0}], "xs": [1, 2]}})
    assert flat == {"a.tiles": "[[128, 256, 1.0]]", "a.links": '[{"bandwidth": 1.0}]', "a.xs": "[1, 2]"}
    big = [{"name": f"layer{i}", "params": i} for i in range(MAX_LIST_CELL_CHARS // 10)]
    assert flatten({"layers": big}) == {"layers": f"<{len(big)} entries>"}
