"""Largest-model search: exact boundary on a model with known memory, agreement with a scan, steps."""

from __future__ import annotations

import math

import pytest

from gpipe_sim.cli import main
from gpipe_sim.studies.maxmodel import SearchError, find_max_model, measure, resolve_field
from gpipe_sim.scenario.scenario import parse_scenario

PARAMS, ACT, BATCH, CAP = 1_000_000, 2.0e6, 10, 1.0e9


def _uniform(**pipeline):
    return parse_scenario({
        "model": {"preset": "uniform", "layers": 4, "params_per_layer": PARAMS,
                  "activation_bytes_per_sample": ACT, "output_bytes_per_sample": 1.0e6},
        "hardware": {"preset": "ideal", "accelerator": {"memory_bytes": CAP}},
        "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": BATCH, "schedule": "naive",
                     "remat": "none", **pipeline},
        "training": {"optimizer": "adam", "dtype": "fp32"},
    })


def test_naive_boundary_is_the_closed_form():
    # No re-materialization, one device: each layer costs 16 B/param (Adam, fp32) + its activations.
    per_layer = PARAMS * 16 + ACT * BATCH
    found = find_max_model(_uniform(), "layers")
    assert found.field == "model.layers" and found.step == 1
    assert found.largest == math.floor(CAP / per_layer)
    assert found.best.max_stage_peak_bytes == pytest.approx(found.largest * per_layer)
    assert found.best.max_stage_peak_bytes <= CAP < found.first_too_big.max_stage_peak_bytes
    assert found.best.params == found.largest * PARAMS
    assert found.best.param_memory_bytes == pytest.approx(found.largest * PARAMS * 16)


@pytest.mark.parametrize("stages, remat, m", [(1, "none", 1), (2, "always", 4), (4, "except_last", 5)])
def test_search_agrees_with_a_scan(stages, remat, m):
    scenario = _uniform(stages=stages, schedule="gpipe", remat=remat, micro_batches=m)
    found = find_max_model(scenario, "layers")
    fits = {n: measure(scenario, n, "model.layers").fits for n in range(stages, found.largest + 3)}
    assert fits[found.largest] and not fits[found.largest + 1]
    assert all(fits[n] for n in range(stages, found.largest + 1))  # fitting is monotone here
    assert found.largest > 0


def test_more_stages_fit_a_larger_model():
    sizes = [find_max_model(_uniform(stages=k, schedule="gpipe", remat="always", micro_batches=2),
                            "layers").largest for k in (1, 2, 4)]
    assert sizes[0] < sizes[1] < sizes[2]


def test_amoebanet_layers_grow_in_steps_of_three_and_widths_resolve():
    scenario = parse_scenario({
        "model": {"preset": "amoebanet", "layers": 6, "filters": 64, "image_size": 64},
        "hardware": {"preset": "ideal", "accelerator": {"memory_bytes": "2 GiB"}},
        "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 8},
    })
    found = find_max_model(scenario, "layers")
    assert found.step == 3 and found.largest % 3 == 0
    assert all(t.value % 3 == 0 for t in found.tried)
    assert resolve_field(scenario, "width") == "model.filters"


def test_values_the_schema_rejects_are_skipped_upward():
    # 8 stages need at least 6 transformer blocks (embedding + blocks + head >= 8 entries).
    scenario = parse_scenario({
        "model": {"preset": "transformer", "layers": 8, "d_model": 64, "d_ff": 256, "heads": 4,
                  "seq_len": 32, "vocab": 100},
        "hardware": {"preset": "ideal", "accelerator": {"memory_bytes": "64 MiB"}},
        "pipeline": {"stages": 8, "micro_batches": 2, "batch_size": 4},
    })
    found = find_max_model(scenario, "layers")
    assert found.tried[0].value == 6
    assert found.largest is not None and found.largest >= 6


def test_nothing_fits_is_reported():
    found = find_max_model(_uniform(), "layers", start=200)
    assert found.largest is None and found.first_too_big is not None


def test_unknown_field_is_one_line():
    with pytest.raises(SearchError, match="no field 'depth'"):
        find_max_model(_uniform(), "depth")
    with pytest.raises(SearchError, match="not an integer field"):
        find_max_model(_uniform(), "pipeline.schedule")
    unlimited = _uniform().with_updates({"hardware.accelerator.memory_bytes": "inf"})
    with pytest.raises(SearchError, match="unlimited memory"):
        find_max_model(unlimited, "layers")
    with pytest.raises(SearchError, match="--step: must be >= 1"):
        find_max_model(_uniform(), "layers", step=0)


def test_cli_max_model(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(_uniform().to_yaml())
    assert main(["max-model", str(path), "--grow", "layers"]) == 0
    out = capsys.readouterr().out
    expected = math.floor(CAP / (PARAMS * 16 + ACT * BATCH))
    assert f"largest model.layers that fits: {expected} " in out and "parameter memory" in out
    assert "peak activation memory" in out
    assert main(["max-model", str(path), "--grow", "depth"]) == 2
    assert capsys.readouterr().err.startswith("gpipe-sim: error: --grow:")
