"""The Compare page names every field as the form does (never a raw dotted name), and takes a
scenario whose partition is a list of layer counts."""

from __future__ import annotations

import sys

import pytest
import yaml

from test_app_support import APP, app_test

pytest.importorskip("streamlit")
from gpipe_app.ui_run import readable_field  # noqa: E402


def _labels(at):
    return [w.label for kind in ("selectbox", "number_input") for w in getattr(at.main, kind)]


def test_compare_labels_are_human():
    at = app_test().run()
    at.switch_page("views/compare.py").run()
    assert not at.exception
    labels = _labels(at)
    assert "optimizer step" in labels and "micro-batches M" in labels
    assert not [label for label in labels if "." in label or "_" in label], labels


def test_readable_field():
    assert readable_field("training.optimizer_step") == "optimizer step"
    assert readable_field("hardware.network.latency_s") == "latency s (hardware.network)"
    assert readable_field("model.d_model") == "d model"


def test_compare_takes_a_list_of_layer_counts(tmp_path, monkeypatch):
    path = tmp_path / "listed.yaml"
    path.write_text(yaml.safe_dump({
        "model": {"preset": "uniform", "layers": 8}, "hardware": {"preset": "ideal"},
        "pipeline": {"stages": 2, "micro_batches": 4, "batch_size": 8, "partition": [3, 5]}}))
    monkeypatch.setattr(sys, "argv", [str(APP), str(path)])
    at = app_test().run()
    at.switch_page("views/compare.py").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert [w.value for w in at.main.selectbox if w.label == "partition"][0] == "layers: 3, 5"
