"""The app's training-run figures and the frameworks' files (issue 36): the form's token budget and
price give the run's metrics; the Plan page offers the pick as each framework's file."""

from __future__ import annotations

import math

import pytest

from test_app_support import app_test, metric, set_widget
from test_app_plan import plan_app

pytest.importorskip("streamlit")


def test_tokens_and_price_in_the_form_give_the_run_metrics():
    at = app_test().run()
    assert not [m for m in at.metric if m.label in ("Days to train", "Cost")]  # nothing asked, nothing shown
    set_widget(at, "cfg.training.tokens", "100B")
    set_widget(at, "cfg.hardware.price_per_device_hour", "2")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    step = metric(at, "Step time")  # e.g. "1.38 s": three significant figures
    assert step.endswith(" s")
    days = float(metric(at, "Days to train").replace(",", ""))
    steps = math.ceil(100e9 / (64 * 1024))  # the default scenario's batch 64 of 1,024 tokens
    assert days == pytest.approx(steps * float(step[:-2]) / 86400, rel=0.01)
    assert metric(at, "Goodput") == "-"
    caption = " ".join(c.value for c in at.caption)
    assert "time to train: 100B tokens" in caption and "for the run" in caption


def test_plan_page_offers_the_pick_as_each_frameworks_file():
    at = plan_app()
    assert not at.exception, [e.message for e in at.exception]
    labels = [b.label for b in at.get("download_button")]
    assert {"Megatron-LM (launch line)", "torchtitan (job TOML)", "DeepSpeed (JSON)"} <= set(labels)
    assert any(e.label == "What the frameworks' files cannot express" for e in at.expander)



def test_an_opened_files_token_budget_price_and_goodput_model_are_kept():
    import yaml

    data = {"model": {"preset": "transformer", "layers": 4, "d_model": 256, "d_ff": 1024, "heads": 4,
                      "seq_len": 128, "vocab": 1000},
            "hardware": {"preset": "a100-80gb", "price_per_device_hour": 2.5},
            "pipeline": {"stages": 2, "micro_batches": 4, "batch_size": 8},
            "training": {"dtype": "bf16", "tokens": 123_456_789,
                         "goodput": {"mtbf_device_hours": 1000, "checkpoint_save_s": 30}}}
    at = app_test().run()
    at.sidebar.file_uploader(key="upload.scenario").set_value(("run.yaml", yaml.safe_dump(data).encode(),
                                                               "application/x-yaml"))
    at.run()
    assert not at.exception and not at.error and not at.warning, [w.value for w in at.warning]
    assert float(at.sidebar.text_input(key="cfg.training.tokens").value) == 123_456_789  # shown exactly
    assert at.sidebar.text_input(key="cfg.hardware.price_per_device_hour").value == "2.5"
    assert metric(at, "Goodput").endswith("%")  # the goodput model came through the form
