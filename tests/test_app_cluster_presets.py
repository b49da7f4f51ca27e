"""The app's form with a cluster preset (issue 33): its nodes and NICs shown in the node widgets,
and what the user changes there (0 devices a node, an empty network) taken as written."""

from __future__ import annotations

import pytest

pytest.importorskip("streamlit")

from test_app_support import app_test, set_widget  # noqa: E402

from gpipe_sim.scenario.scenario import parse_scenario  # noqa: E402


def test_a_cluster_preset_shows_its_nodes_and_nics_and_takes_changes_as_written(monkeypatch):
    from gpipe_app import ui_form

    formed = []
    finish = ui_form.finish_boxes
    monkeypatch.setattr(ui_form, "finish_boxes", lambda notice, box, data: (formed.append(data),
                                                                           finish(notice, box, data)))
    at = app_test().run()
    set_widget(at, "cfg.hardware.preset", "dgx-a100")
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.number_input(key="cfg.hw.dgx-a100.devices_per_node").value == 8
    assert at.text_input(key="cfg.hw.dgx-a100.network").value == "25 GB/s"  # 200 Gb/s HDR
    hw = parse_scenario(formed[-1]).hardware
    assert (hw.devices_per_node, hw.network.bandwidth, hw.network.per, hw.network.nics, hw.network.latency_s) == \
        (8, 25e9, "node", 8, 9.6e-6)
    set_widget(at, "cfg.hw.dgx-a100.network", "")  # no network: nodes joined by the link
    set_widget(at, "cfg.hw.dgx-a100.devices_per_node", 0)  # every device in one node
    at.run()
    assert not at.error
    hw = parse_scenario(formed[-1]).hardware
    assert hw.devices_per_node is None and hw.network is None
    set_widget(at, "cfg.hardware.preset", "v100")  # a preset with no nodes: the widgets state none
    at.run()
    assert formed[-1]["hardware"]["network"] is None and formed[-1]["hardware"]["devices_per_node"] is None
