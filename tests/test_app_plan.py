"""The Plan page driven with AppTest: the ranked table, the Pareto chart, the chosen row's plots."""

from __future__ import annotations

import pytest

from test_app_support import app_test, plotly_specs, set_widget

pytest.importorskip("streamlit")

SMALL = {"model.preset": "uniform", "hardware.preset": "v100", "pipeline.remat": "none",
         "pipeline.partition": "uniform", "pipeline.schedule": "gpipe", "pipeline.chunks": 1}


def search(at):
    """Press Search and wait for the background search; the page as it shows the answer."""
    at.button(key="plan.search").click().run()
    assert at.session_state["plan.job"].wait(60)
    return at.run()


def plan_app(devices: int = 2):
    at = app_test().run()
    for key, value in SMALL.items():
        set_widget(at, "cfg." + key, value)
    at.switch_page("views/plan.py").run()
    set_widget(at, "plan.devices", devices)
    set_widget(at, "plan.schedules", ["gpipe", "1f1b"])
    return search(at.run())


def test_plan_page_searches_only_when_asked():
    """Opening the page (and changing the question) shows a Search button, never a search; the
    answer is kept for the question until it changes."""
    at = app_test().run()
    at.switch_page("views/plan.py").run()
    assert not at.exception and "plan.job" not in at.session_state
    assert not at.dataframe and [b.label for b in at.button if b.key == "plan.search"] == ["Search"]
    at = plan_app()
    assert at.dataframe and not [b for b in at.button if b.key == "plan.search"]
    set_widget(at, "plan.devices", 4)
    at.run()
    assert not at.dataframe and [b for b in at.button if b.key == "plan.search"]
    set_widget(at, "plan.devices", 2)  # the question answered before: shown again without a search
    at.run()
    assert at.dataframe


def test_plan_page_ranks_and_plots():
    at = plan_app()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    table = at.dataframe[0].value
    assert len(table) >= 2 and list(table["rank"])[:2] == ["1", "2"]
    # the tie (within 5% of the fastest) first, simplest first; K=1 is data parallelism, no v
    assert "vs fastest" in table.columns
    k1 = [(s, v) for s, v, k in zip(table["schedule"], table["v"], table["K"]) if k == "1"]
    assert k1 and all(row == ("data parallel", "-") for row in k1)
    specs = plotly_specs(at)
    assert specs[0]["layout"]["xaxis"]["title"]["text"] == "peak memory per device (GiB)"
    assert specs[0]["layout"]["yaxis"]["title"]["text"] == "throughput (samples/s)"
    assert len(specs) == 4  # Pareto, timeline, stage memory, memory over time
    # the Pareto chart's y axis is scaled to its data (from 0 every point would sit on one line)
    ys = [y for trace in specs[0]["data"] for y in trace["y"]]
    low, high = specs[0]["layout"]["yaxis"]["range"]
    span = max(ys) - min(ys) or max(ys)
    assert low > 0 and min(ys) - 0.1 * span <= low <= min(ys) and max(ys) <= high <= max(ys) + 0.1 * span
    # choosing another row re-draws its timeline
    choice = at.selectbox(key="plan.choice")
    choice.set_value(choice.options[1]).run()
    assert not at.exception
    assert any(s.value == "Configuration #2" for s in at.main.subheader)


def test_pareto_figure_y_range_lies_within_the_padded_data():
    from gpipe_sim.planner.report import padded_range

    assert padded_range([100.0, 110.0, 105.0]) == pytest.approx([99.4, 110.6])
    assert padded_range([50.0, 50.0]) == pytest.approx([47.0, 53.0])  # all equal: padded by their size
    assert padded_range([float("nan")]) is None


def test_plan_page_nothing_fits_and_bad_devices():
    at = plan_app()
    set_widget(at, "cfg.model.uniform.layers", 2)
    at.run()
    set_widget(at, "plan.devices", 7)  # no D x K = 7 with K <= 2 layers and D dividing the batch
    search(at.run())
    assert not at.exception
    assert at.warning and "no configuration" in at.warning[0].value


def test_plan_page_opens_explore():
    at = plan_app()
    chosen = at.selectbox(key="plan.choice").value
    at.button(key="plan.open").click().run()
    assert not at.exception
    K = int(chosen.split("K=")[1].split(",")[0])
    assert at.sidebar.number_input(key="cfg.pipeline.stages").value == K


def test_pareto_front_stops_at_the_capacity_and_marks_what_lies_past_it():
    """A simulated configuration over the capacity (the memory bound let it through) is faster
    than every one that fits: the front of what fits ends at the capacity; past it, dotted grey."""
    from dataclasses import replace

    from gpipe_sim import parse_scenario
    from gpipe_sim.planner.entries import pareto_front
    from gpipe_sim.planner.report import pareto_figure
    from gpipe_sim.planner.search import PlanOptions, search_configurations

    base = parse_scenario({"model": {"preset": "uniform", "layers": 8, "params_per_layer": 1_000_000},
                           "hardware": {"preset": "ideal", "accelerator": {"memory_bytes": "1 GB"}},
                           "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": 16}})
    search = search_configurations(base, PlanOptions(devices=2, schedules=("gpipe", "1f1b"),
                                                     partitions=("uniform",)))
    fastest = max(search.simulated_entries, key=lambda e: e.throughput_samples_per_s)
    over = replace(fastest, index=10**6, fits=False, peak_memory_bytes=1.5 * search.capacity_bytes,
                   throughput_samples_per_s=2 * fastest.throughput_samples_per_s)
    entries = [*search.simulated_entries, over]
    front = pareto_front(entries)
    assert front[-1] is over
    fig = pareto_figure(entries, front, search.capacity_bytes)
    traces = {t.name: t for t in fig.data}
    inside, past = traces["Pareto front"], traces["front past capacity (does not fit)"]
    assert max(inside.x) <= search.capacity_bytes / 2**30 and len(inside.x) == len(front) - 1
    assert list(past.x) == [inside.x[-1], over.peak_memory_bytes / 2**30] and past.line.dash == "dot"
    fig = pareto_figure(search.simulated_entries, pareto_front(search.simulated_entries), search.capacity_bytes)
    assert "front past capacity (does not fit)" not in {t.name for t in fig.data}  # all fit: no such line
