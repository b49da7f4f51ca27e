"""The planner: its space against the schema, its bounds against the simulator, its best against a
brute-force sweep of the same space, and the `gpipe-sim plan` command."""

from __future__ import annotations

import csv
import dataclasses
import json
import math

import pytest
import yaml

from gpipe_sim.api import simulate
from gpipe_sim.cli import main
from gpipe_sim.errors import GpipeError
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.schedule import SCHEDULES
from gpipe_sim.scenario.scenario import parse_scenario
from gpipe_sim.planner.bounds import chunk_placement
from gpipe_sim.planner.held_bound import held_memory_ceiling
from gpipe_sim.planner.order_bound import OrderBounds
from gpipe_sim.planner.report import family_heads, schedules_text
from gpipe_sim.schema.units import format_seconds
from gpipe_sim.planner.search import (
    DATA_PARALLEL_SCHEDULE, Candidate, CostTable, PlanEntry, PlanOptions, candidate_space, enumerate_candidates,
    family, held_memory_bound, memory_lower_bound, pareto_front, program_step_bound, relaxed_step_bound, reserved_base,
    search_configurations, step_lower_bound,
)

UNIFORM = {
    "model": {"preset": "uniform", "layers": 6, "params_per_layer": 50_000_000},
    "hardware": {"preset": "v100", "accelerator": {"memory_bytes": "3 GB"}},
    "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 8, "schedule": "1f1b"},
}
TRANSFORMER = {
    "model": {"preset": "transformer", "layers": 4, "d_model": 256, "d_ff": 1024, "heads": 4, "seq_len": 128,
              "vocab": 1000},
    "hardware": {"preset": "a100-80gb", "accelerator": {"memory_bytes": "60 MB"}},
    "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 8, "schedule": "gpipe",
                 "partition": "time"},
    "training": {"dtype": "bf16"},
}


def _brute_force(base, options):
    """Every enumerated candidate simulated as `gpipe_sim.api.simulate` does: (overrides, Result or None)."""
    out = []
    for o in enumerate_candidates(base, options):
        try:
            out.append((o, simulate(base.with_updates(o), "auto")))
        except GpipeError:
            out.append((o, None))
    return out


def test_enumeration_is_what_the_schema_accepts():
    """Every (D, K, v, M, schedule) the schema accepts on 4 devices, and nothing else (each
    candidate re-validated on its own); remat x partition x zero on top. K=1 is data parallelism:
    one schedule (1f1b, gradient accumulation) and v=1."""
    base = parse_scenario({**UNIFORM, "model": {"preset": "uniform", "layers": 4}})
    options = PlanOptions(devices=4, max_chunks=2, remat=("none",), partitions=("uniform",))
    got = enumerate_candidates(base, options)
    assert got == enumerate_candidates(base, options)  # stable
    keys = {(o["pipeline.data_parallel"], o["pipeline.stages"], o["pipeline.chunks"], o["pipeline.micro_batches"],
             o["pipeline.schedule"], o["training.zero"]) for o in got}
    assert len(keys) == len(got)
    expected = set()
    for D, K in ((1, 4), (2, 2), (4, 1)):
        for name in (SCHEDULES if K > 1 else (DATA_PARALLEL_SCHEDULE,)):
            for v in ((1, 2) if K > 1 else (1,)):
                for M in range(1, 9):
                    try:
                        base.with_updates({"pipeline.data_parallel": D, "pipeline.stages": K, "pipeline.chunks": v,
                                           "pipeline.micro_batches": M, "pipeline.schedule": name})
                    except GpipeError:
                        continue
                    for zero in ((0, 1, 2, 3) if D > 1 else (0,)):
                        expected.add((D, K, v, M, name, zero))
    assert keys == expected
    for o in got:
        assert o["pipeline.data_parallel"] * o["pipeline.stages"] == 4


def test_explicit_device_map_is_cleared_where_it_no_longer_fits():
    base = parse_scenario({**UNIFORM, "hardware": {"preset": "v100", "stage_to_device": [1, 0]}})
    got = enumerate_candidates(base, PlanOptions(devices=2, schedules=("gpipe",), remat=("none",),
                                                 partitions=("uniform",)))
    for o in got:
        kept = o["pipeline.data_parallel"] == 1 and o["pipeline.stages"] == 2
        assert ("hardware.stage_to_device" in o) != kept
        base.with_updates(o)  # valid


def test_candidates_are_the_enumerated_overrides():
    """`candidate_space` and `enumerate_candidates` list the same configurations in the same order:
    each `Candidate.overrides()` is the dict (key order included), and `from_overrides` inverts it."""
    base = parse_scenario({**UNIFORM, "hardware": {"preset": "v100", "stage_to_device": [1, 0]}})
    options = PlanOptions(devices=2, fewer_devices=True, max_chunks=2, remat=("none",))
    cands = candidate_space(base, options)
    dicts = enumerate_candidates(base, options)
    assert [list(c.overrides().items()) for c in cands] == [list(o.items()) for o in dicts]
    assert [Candidate.from_overrides(o) for o in dicts] == cands
    assert any(c.clears("hardware.stage_to_device") for c in cands)
    with pytest.raises(ValueError):
        Candidate.from_overrides({**dicts[0], "pipeline.batch_size": 4})


@pytest.mark.parametrize("data, options", [
    pytest.param(UNIFORM, PlanOptions(devices=2, max_chunks=2, micro_batches=(2, 8), top=3, remat=("none", "always"),
                                      partitions=("uniform", "time", "memory", "fit")), marks=pytest.mark.slow),
    (UNIFORM, PlanOptions(devices=2, max_chunks=2, micro_batches=(2, 8), top=3, remat=("none",),
                          schedules=("gpipe", "1f1b", "zbv", "interleaved_1f1b"), partitions=("time", "fit"))),
    (TRANSFORMER, PlanOptions(devices=2, fewer_devices=True, max_chunks=2, micro_batches=(1, 4), top=1,
                              remat=("none", "always"), schedules=("gpipe", "1f1b", "zb_h1", "interleaved_1f1b"))),
    ({**UNIFORM, "model": {"preset": "uniform", "layers": 8, "params_per_layer": 20_000_000},
      "hardware": {"preset": "v100", "accelerator": {"memory_bytes": "1.2 GB"}, "devices_per_node": 2,
                   "network": {"bandwidth": "2 GB/s", "latency_s": 1.0e-5}},
      "pipeline": {**UNIFORM["pipeline"], "batch_size": 4}},
     PlanOptions(devices=4, max_chunks=2, top=5, remat=("except_last", "always"),
                 schedules=("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv"))),
    # tensor parallelism T in {1, 2, 4} over nodes of 2 or 4 joined by a slower network: the
    # collectives priced inside the passes, the split layers' memory, with and without sequence parallelism
    ({**TRANSFORMER, "hardware": {"preset": "a100-80gb", "accelerator": {"memory_bytes": "50 MB"},
                                  "devices_per_node": 2, "network": {"bandwidth": "2 GB/s"}}},
     # pipelined ZeRO-3's reduction has no bound of its own yet (0: the backward may hide it): on this
     # slow network interleaved_1f1b's best then needs more decisions than the cap (its bounds hold)
     PlanOptions(devices=4, max_chunks=2, micro_batches=(1, 2, 4), top=5, remat=("none", "always"),
                 schedules=("gpipe", "1f1b", "zb_h1", "interleaved_1f1b"), zero=(0, 1, 2))),
    # T = 4 over two nodes of 2 (--tensor-parallel names it): its collectives cross one 16 Gb/s NIC
    ({**TRANSFORMER, "hardware": {"preset": "a100-80gb", "accelerator": {"memory_bytes": "50 MB"},
                                  "devices_per_node": 2,
                                  "network": {"bandwidth": "16 Gb/s", "latency_s": 1.0e-5, "per": "node", "nics": 1}}},
     PlanOptions(devices=4, max_chunks=2, micro_batches=(1, 2, 4), top=5, remat=("none",),
                 schedules=("1f1b", "zb_h1"), tensor_parallel=(1, 2, 4))),
    # one NIC a node, shared by both pipeline ranks' all-reduce rings: the SimPy engine times the
    # plans, the relaxed step (`relaxed_step_bound`) prunes them
    ({**UNIFORM, "model": {"preset": "uniform", "layers": 8, "params_per_layer": 20_000_000},
      "hardware": {"preset": "v100", "accelerator": {"memory_bytes": "1.2 GB"}, "devices_per_node": 2,
                   "network": {"bandwidth": "2 GB/s", "latency_s": 1.0e-5, "per": "node", "nics": 1}},
      "pipeline": {**UNIFORM["pipeline"], "batch_size": 8}},
     PlanOptions(devices=4, max_chunks=2, top=3, remat=("none",), partitions=("uniform",),
                 schedules=("1f1b", "interleaved_1f1b", "zb_h1", "zbv"), zero=(0, 1))),
    # a Llama-like block (grouped-query attention, SwiGLU, RMSNorm) and a large vocabulary: the head's
    # logits are the largest transient (`CostTable.pass_bytes`), per-layer and whole-chunk
    # re-computation, split backward passes
    ({**TRANSFORMER, "model": {**TRANSFORMER["model"], "kv_heads": 2, "mlp": "swiglu", "norm": "rmsnorm",
                               "vocab": 8000},
      "hardware": {"preset": "a100-80gb", "accelerator": {"memory_bytes": "120 MB"}}},
     PlanOptions(devices=2, max_chunks=2, micro_batches=(1, 2, 4), top=3, remat=("none", "full", "selective", "always"),
                 schedules=("1f1b", "zb_h1", "zbv"))),
    ({**TRANSFORMER, "hardware": {"preset": "a100-80gb", "accelerator": {"memory_bytes": "45 MB"},
                                  "devices_per_node": 4}},
     PlanOptions(devices=4, fewer_devices=True, max_chunks=2, micro_batches=(2, 4), top=5, remat=("none",),
                 schedules=("1f1b", "zbv"), sequence_parallel=True)),
])
def test_planner_matches_brute_force_and_bounds_hold(data, options):
    """The planner's top entries are the brute-force sweep's (the best exactly), some candidates do
    not fit, and both bounds are below what the simulator reports for every candidate (with and
    without the partition's counts). No reserve: the cases' memory is tuned to the capacity."""
    options = dataclasses.replace(options, reserve=0.0)
    base = reserved_base(parse_scenario(data), options)
    brute = _brute_force(base, options)
    fitting = sorted((r.throughput_samples_per_s for _, r in brute if r is not None and r.fits_in_memory),
                     reverse=True)
    assert fitting and len(fitting) < len(brute)  # memory is tight: some do not fit
    search = search_configurations(base, options)
    assert search.enumerated == len(brute)
    assert search.best.throughput_samples_per_s == pytest.approx(fitting[0], rel=1e-12)
    got = [e.throughput_samples_per_s for e in search.ranked[:options.top]]
    assert got == pytest.approx(fitting[:options.top], rel=1e-12)
    assert search.pruned_by_bound + search.pruned_by_memory > 0
    # each schedule family's fastest fitting configuration, exactly (the app's first rows)
    families: dict[str, float] = {}
    for o, r in brute:
        if r is not None and r.fits_in_memory:
            name = family(Candidate.from_overrides(o))
            families[name] = min(families.get(name, math.inf), r.step_time_s)
    assert not search.family_unproven
    assert {family(e.candidate): e.step_time_s for e in search.family_best} == pytest.approx(families, rel=1e-12)
    assert [e.step_time_s for e in search.family_best] == sorted(families.values())
    assert {Candidate.from_overrides(o).tensor_parallel for o, _ in brute} == set(
        search.options.tensor_parallel or {c.tensor_parallel for c in search.candidates})
    # the distinct ranking: brute force's fitting results collapsed by (D, K, M, ZeRO, step, peak)
    groups: dict[tuple, float] = {}
    for o, r in brute:
        if r is not None and r.fits_in_memory:
            key = (o["pipeline.data_parallel"], o["pipeline.stages"], o["pipeline.micro_batches"],
                   o["training.zero"], round(r.step_time_s, 12), round(max(r.device_peak_memory_bytes.values())))
            groups[key] = r.throughput_samples_per_s
    distinct = sorted(groups.values(), reverse=True)
    got = [e.throughput_samples_per_s for e in search.distinct[:options.top]]
    assert got == pytest.approx(distinct[:options.top], rel=1e-12)
    assert len({e.signature for e in search.distinct}) == len(search.distinct)
    assert sum(1 + e.alike for e in search.distinct) == len(search.ranked)
    assert (search.enumerated == search.simulated + search.reused + search.pruned_by_memory
            + search.pruned_by_bound + search.infeasible)
    # every entry (a reused twin's too) is its configuration's simulation, every step figure a
    # candidate was pruned by (a bound, its timed step, its twin's) at most its simulated step
    assert [c.overrides() for c in search.candidates] == [o for o, _ in brute]
    for e in search.simulated_entries:
        assert e.step_time_s == pytest.approx(brute[e.index][1].step_time_s, rel=1e-12), e.overrides
    for i, (reason, figure, _) in search.pruned.items():
        if reason in ("bound", "preferred") and brute[i][1] is not None:
            assert figure <= brute[i][1].step_time_s * (1 + 1e-12), (brute[i][0], reason, figure)
    costs = CostTable(base)
    for o, result in brute:
        if result is None:
            continue
        peak = max(result.device_peak_memory_bytes.values())
        compiled = compile_plan(base.with_updates(o))
        counts = compiled.layer_counts
        cand = Candidate.from_overrides(o)
        assert program_step_bound(costs, cand, compiled) <= result.step_time_s, o
        assert OrderBounds(costs)(cand, counts, chunk_placement(cand)) <= result.step_time_s, o
        assert relaxed_step_bound(compiled.simulated()) <= result.step_time_s, o
        for given in (None, counts):
            assert memory_lower_bound(costs, cand, given) <= peak, (o, given)
            assert held_memory_bound(costs, cand, given) <= peak, (o, given)
            assert step_lower_bound(costs, cand, given) <= result.step_time_s, (o, given)
        # the ceiling that spares computing the held bound is above it
        assert held_memory_ceiling(costs, cand, counts) >= held_memory_bound(costs, cand, counts), o
        # ZeRO 1 and 2 have one step bound (the search computes it once for both): each on a table
        # of its own, so that neither reads the other's kept parts
        assert step_lower_bound(CostTable(base), cand._replace(zero=1), counts) == \
            step_lower_bound(CostTable(base), cand._replace(zero=2), counts), o


def test_nothing_fits_names_the_smallest_peak():
    base = parse_scenario({**UNIFORM, "hardware": {"preset": "v100", "accelerator": {"memory_bytes": "100 MB"}}})
    options = PlanOptions(devices=2, schedules=("gpipe", "1f1b"), micro_batches=(1, 8), reserve=0.0)
    search = search_configurations(base, options)
    assert not search.ranked and search.smallest_peak is not None
    least = min(max(simulate(base.with_updates(o), "auto").device_peak_memory_bytes.values())
                for o in enumerate_candidates(base, options))
    assert search.smallest_peak.peak_memory_bytes == least


def _entry(i, throughput, peak):
    o = {"pipeline.data_parallel": 1, "pipeline.stages": 1, "pipeline.chunks": 1, "pipeline.micro_batches": 1,
         "pipeline.schedule": "gpipe", "pipeline.remat": "none", "pipeline.partition": "uniform", "training.zero": 0}
    return PlanEntry(i, o, 1 / throughput, throughput, 1, 0.0, 0.0, 0.0, peak, math.inf, True, "bubble")


def test_pareto_front_is_the_undominated_points():
    points = [(10, 5), (12, 7), (9, 3), (12, 6), (8, 8), (15, 9)]
    entries = [_entry(i, t, m) for i, (t, m) in enumerate(points)]
    front = pareto_front(entries)
    assert [(e.throughput_samples_per_s, e.peak_memory_bytes) for e in front] == [(9, 3), (10, 5), (12, 6), (15, 9)]


# ---------------------------------------------------------------------------------------------
# the command


@pytest.fixture
def scenario_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(UNIFORM))
    return path


def _refused(capsys, argv, *fragments, status=2):
    assert main(argv) == status
    err = capsys.readouterr().err
    assert err.startswith("gpipe-sim: error: ") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err


@pytest.mark.parametrize("devices", ["0", "-1", "x", "1e3", "99999999999", ""])
def test_bad_devices_is_one_line(capsys, scenario_file, devices):
    _refused(capsys, ["plan", str(scenario_file), "--devices", devices], "--devices")


def test_bad_options_are_one_line(capsys, scenario_file):
    _refused(capsys, ["plan", str(scenario_file), "--devices", "2", "--schedules", "nope"], "--schedules", "nope")
    _refused(capsys, ["plan", str(scenario_file), "--devices", "2", "--remat", "some"], "--remat")
    _refused(capsys, ["plan", str(scenario_file), "--devices", "2", "--zero", "4"], "--zero")
    _refused(capsys, ["plan", str(scenario_file), "--devices", "2", "--top", "0"], "--top")
    _refused(capsys, ["plan", str(scenario_file), "--devices", "5000"], "--devices")  # no D x K fits
    _refused(capsys, ["plan", str(scenario_file), "--devices", "2", "--set", "pipeline.stages=x"], "pipeline.stages")


def test_plan_command_outputs(capsys, scenario_file, tmp_path):
    html_path, csv_path = tmp_path / "p.html", tmp_path / "p.csv"
    argv = ["plan", str(scenario_file), "--devices", "2", "--schedules", "gpipe,1f1b", "--top", "3",
            "--html", str(html_path), "--csv", str(csv_path), "--set", "hardware.accelerator.memory_bytes=4 GB"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "samples/s" in out and "limiter" in out and "configurations/s" in out
    page = html_path.read_text()
    assert "plotly" in page and "peak memory per device (GiB)" in page
    assert "throughput (samples/s)" in page.replace("\\u002f", "/")
    rows = list(csv.DictReader(csv_path.open()))
    assert rows and rows[0]["rank"] == "1"
    assert main([*argv[:8], *argv[-2:], "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["ranked"]) == 3
    best = data["pick"]
    assert best == data["ranked"][0] and best["tied"]
    assert best["limiter"] in ("bubble", "imbalance", "memory", "communication", "compute")
    assert data["tie"] == 0.05 and data["reserve"] == 0.06


def test_plan_command_nothing_fits_exits_1(capsys, scenario_file):
    argv = ["plan", str(scenario_file), "--devices", "2", "--schedules", "gpipe",
            "--set", "hardware.accelerator.memory_bytes=10 MB"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "no configuration fits" in out and "smallest peak" in out


def test_k1_is_named_data_parallel_alike_for_entries_and_pruned_candidates():
    """K=1 shows as "data parallel" with no v or partition, the same for a simulated entry (table,
    JSON) and a pruned candidate (CSV): one rule, `Candidate.shown_axes`."""
    entry = _entry(0, 1.0, 1.0)
    cand = Candidate.from_overrides(entry.overrides)
    expected = {"D": 1, "K": 1, "v": None, "M": 1, "schedule": "data parallel", "remat": "none",
                "partition": None, "zero": 0, "T": 1, "C": 1, "E": 1}
    assert cand.shown_axes() == expected
    assert {k: entry.to_dict()[k] for k in expected} == expected
    assert {k: entry.shown(k) for k in expected} == expected
    piped = cand._replace(stages=2, data_parallel=1)
    assert piped.shown_axes()["schedule"] == "gpipe" and piped.shown_axes()["v"] == 1


def test_plan_prints_each_schedule_familys_fastest(scenario_file, capsys):
    """After the table, one line compares each other schedule family's fastest with the pick."""
    assert main(["plan", str(scenario_file), "--devices", "2", "--quiet", "--reserve", "0"]) == 0
    assert any(x.startswith("each schedule family's fastest") for x in capsys.readouterr().out.splitlines())
    options = PlanOptions(devices=2, reserve=0.0)
    search = search_configurations(reserved_base(parse_scenario(UNIFORM), options), options)
    heads = family_heads(search)
    line = schedules_text(search)
    assert len(heads) > 2 and f"the pick's {format_seconds(heads[0].step_time_s)} ({family(heads[0].candidate)}): " in line
    names = [family(e.candidate) for e in heads]
    assert len(set(names)) == len(names)
    for e in heads[1:]:
        assert f"{family(e.candidate)} {format_seconds(e.step_time_s)} (" in line


def test_the_tie_line_counts_past_the_rows_shown_only_what_was_found():
    """The search makes its first `top` rows exact and stops resolving the tie there: past them
    the line says how many more it found, as a least count."""
    from gpipe_sim.planner.report import choice_text

    base = parse_scenario({**TRANSFORMER, "hardware": {"preset": "a100-80gb"}})
    search = search_configurations(base, PlanOptions(devices=2, micro_batches=(1, 2, 4), top=2, tie=1.0,
                                                     schedules=("gpipe", "1f1b")))
    assert search.tied > 2
    assert choice_text(search).startswith(f"rows 1-2 (and at least {search.tied - 2:,} more configurations) are "
                                          "within 100% of the fastest step")
    assert choice_text(search, top=1).startswith(f"row 1 (and at least {search.tied - 1:,} more configurations) is ")
    assert choice_text(search, top=search.tied).startswith("rows 1-2 (and")  # no more exact than `top`
    wide = search_configurations(base, PlanOptions(devices=2, micro_batches=(1, 2, 4), top=50, tie=1.0,
                                                   schedules=("gpipe", "1f1b")))
    assert choice_text(wide).startswith(f"rows 1-{wide.tied} are within 100%")


def test_tied_candidates_past_the_top_are_bounded_again_before_they_are_called_tied():
    """Past the tie's top rows, candidates are noted "preferred" only where even their pass
    orders' bound is within the tie; the others are noted with that bound ("bound")."""
    base = reserved_base(parse_scenario(yaml.safe_load(open("scenarios/default.yaml"))), PlanOptions(devices=8))
    search = search_configurations(base, PlanOptions(devices=8, stages=(4,)))
    limit = search.best.step_time_s * (1 + search.options.tie)
    preferred = search.pruned.where("preferred")
    assert 0 < len(preferred) <= 512
    assert (search.pruned.figure[preferred] <= limit).all()
    assert {search.candidates[i].tensor_parallel for i in preferred} == {1}  # T = 2's bounds leave the tie
