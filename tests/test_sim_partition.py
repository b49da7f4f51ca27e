"""Partitions that know the schedule's memory: `memory` (smallest largest device peak as the schedule
holds it) and `fit` (the fastest partition whose every device fits), checked against simulate() and
against brute force on small random tables."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpipe_sim.api import simulate
from gpipe_sim.errors import ScenarioError
from gpipe_sim.plan.compile import compile_plan, partition_memory_table
from gpipe_sim.plan.memory_partition import _bounds, _Layout
from gpipe_sim.plan.partition import MemoryTable, balance_by_memory, fastest_fitting, held_activations
from gpipe_sim.schedule import SCHEDULES, Kind, build_schedule
from gpipe_sim.model.layers import input_bytes_per_sample
from gpipe_sim.scenario.scenario import parse_scenario

GIB = 2.0**30


def gpt(partition, **pipeline):
    """The issue's example: 24-block GPT (d_model 2048, seq 2048), bf16, Adam, 8 x A100-80GB, M=64, 1F1B."""
    return parse_scenario({
        "model": {"preset": "transformer", "layers": 24, "d_model": 2048, "d_ff": 8192, "heads": 16,
                  "seq_len": 2048, "vocab": 32000},
        "hardware": {"preset": "a100-80gb"},
        "pipeline": {"stages": 8, "micro_batches": 64, "batch_size": 64, "schedule": "1f1b", "remat": "none",
                     "partition": partition, **pipeline},
        "training": {"optimizer": "adam", "dtype": "bf16"},
    })


def largest_peak(result) -> float:
    return max(result.device_peak_memory_bytes.values())


@pytest.fixture(scope="module")
def gpt_results():
    # [4, 3, ..., 3, 4]: what the schedule-blind `memory` partition chose before (14.3 GiB)
    names = ("time", "memory", "fit", "uniform")
    out = {name: simulate(gpt(name)) for name in names}
    out["old memory"] = simulate(gpt([4, 3, 3, 3, 3, 3, 3, 4]))
    return out


def test_memory_partition_beats_time_and_the_schedule_blind_one_on_the_gpt_example(gpt_results):
    mem, time, old = (largest_peak(gpt_results[k]) for k in ("memory", "time", "old memory"))
    assert old == pytest.approx(14.29 * GIB, rel=1e-3) and time == pytest.approx(13.97 * GIB, rel=1e-3)
    assert mem <= time and mem <= old
    assert mem < 0.7 * time  # the ranks that hold fewer micro-batches take more layers
    assert mem <= min(largest_peak(r) for r in gpt_results.values())


def test_fit_is_as_fast_as_time_where_time_fits(gpt_results):
    fit, time = gpt_results["fit"], gpt_results["time"]
    assert fit.fits_in_memory
    assert fit.step_time_s <= time.step_time_s * 1.001


def test_fit_near_the_memory_limit_fits_and_is_faster_than_memory():
    """With 12 GiB usable, `time` (14.0 GiB) does not fit; `fit` does, faster than `memory`."""
    cap = {"hardware.accelerator.memory_bytes": 12 * GIB, "hardware.accelerator.usable_memory_fraction": 1.0}
    time, mem, fit = (simulate(gpt(p).with_updates(cap)) for p in ("time", "memory", "fit"))
    assert not time.fits_in_memory and mem.fits_in_memory and fit.fits_in_memory
    assert largest_peak(fit) <= 12 * GIB
    assert fit.step_time_s < mem.step_time_s


def test_fit_names_the_field_and_how_far_over_in_one_line_when_nothing_fits():
    sc = gpt("fit").with_updates({"hardware.accelerator.memory_bytes": 4 * GIB})
    with pytest.raises(ScenarioError) as err:
        compile_plan(sc)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("pipeline.partition: fit:")
    assert "partition: memory" in msg and "over" in msg and "GiB" in msg


def _table(scenario):
    plan = compile_plan(scenario)
    return plan, partition_memory_table(scenario, list(plan.layers), plan.schedule, plan.micro_batch_sizes)


@pytest.mark.parametrize("schedule, chunks", [("gpipe", 1), ("1f1b", 1), ("zb_h1", 1),
                                              ("interleaved_1f1b", 2), ("zbv", 2)])
@pytest.mark.parametrize("remat", ["none", "except_last", "always"])
def test_partition_peaks_equal_simulated_device_peaks(schedule, chunks, remat):
    """What the partition optimises is exactly what simulate() reports, for any schedule, where
    memory is what the schedule holds (no transients, nothing kept between a split backward's
    passes, nothing freed when an input pass ends); with them, an upper bound that exceeds the
    simulated peak by at most the largest transient plus, for split schedules, what their input
    passes keep for the weight passes."""
    sc = _transformer(schedule, chunks, remat)
    plan = compile_plan(sc)
    held_only = [{**layer.model_dump(exclude_none=True), "transient_bytes_per_sample": 0.0, "transient_bytes": 0.0,
                  "kept_for_weight_bytes_per_sample": 0.0, "freed_after_input_pass_bytes_per_sample": 0.0}
                 for layer in plan.layers]
    for scenario in (sc.with_updates({"model": {"preset": "table", "layers": held_only,
                                                "input_bytes_per_sample": input_bytes_per_sample(sc.model, 2)}}), sc):
        plan, table = _table(scenario)
        mem, _ = _Layout([1.0] * len(plan.layers), table).figures(_bounds(plan.layer_counts))
        result = simulate(scenario)
        simulated = np.array([result.device_peak_memory_bytes[d] for d in sorted(result.device_peak_memory_bytes)])
        if scenario is not sc:
            assert mem == pytest.approx(simulated, rel=1e-9)
            continue
        assert np.all(mem >= simulated * (1 - 1e-9))
        samples = max(plan.micro_batch_sizes)
        slack = max(layer.transient_bytes + samples * layer.transient_bytes_per_sample for layer in plan.layers)
        if plan.schedule.count(Kind.BACKWARD_INPUT):
            slack += sum(layer.kept_for_weight_bytes_per_sample for layer in plan.layers) * samples * 4
        assert np.all(mem <= simulated + slack)


def _transformer(schedule, chunks, remat):
    return parse_scenario({
        "model": {"preset": "transformer", "layers": 6, "d_model": 256, "d_ff": 1024, "heads": 4,
                  "seq_len": 128, "vocab": 1000},
        "hardware": {"preset": "a100-80gb"},
        "pipeline": {"stages": 2, "chunks": chunks, "micro_batches": 4, "batch_size": 10, "schedule": schedule,
                     "remat": remat, "partition": "uniform"},
        "training": {"optimizer": "adam", "dtype": "bf16"},
    })


@pytest.mark.parametrize("zero", [0, 1])
def test_partition_peaks_with_data_parallel_replicas_equal_simulated(zero):
    """D = 2 replicas (each device one global rank), ZeRO-1 or not: `memory` and `fit` see what
    simulate() reports, and `memory` is no worse than `time`."""
    results = {}
    for part in ("time", "memory", "fit"):
        sc = gpt(part, stages=4, micro_batches=16, data_parallel=2).with_updates({"training.zero": zero})
        plan, table = _table(sc)
        result = simulate(sc)
        static = [(c.param_bytes + c.state_bytes) / c.params for c in plan.chunks if c.params]
        table = MemoryTable([layer.params * static[0] for layer in plan.layers], table.activation_bytes,
                            table.input_bytes, table.held, table.device_map, transient_bytes=table.transient_bytes)
        mem, _ = _Layout([1.0] * len(plan.layers), table).figures(_bounds(plan.layer_counts))
        simulated = [result.device_peak_memory_bytes[d] for d in sorted(result.device_peak_memory_bytes)]
        # exact but for the transient: the largest (a block's, at the backward's start, 1F1B) is charged
        # on top of the most activations held, which is where the simulated peak falls too
        assert len(simulated) == 8 and mem == pytest.approx(simulated, rel=1e-9)
        results[part] = result
    assert largest_peak(results["memory"]) <= largest_peak(results["time"])
    assert results["fit"].fits_in_memory


def _random_cases(seed, count, chunks_per_rank, shared=False):
    """Small random layer tables under random schedules: (time weights, memory table)."""
    rng = np.random.default_rng(seed)
    names = [n for n in SCHEDULES if n != "naive"]
    made = 0
    while made < count:
        name, K, M = str(rng.choice(names)), int(rng.integers(1, 5)), int(rng.integers(1, 9))
        remat = str(rng.choice(["none", "except_last", "always"]))
        if SCHEDULES[name].problem(K, M, chunks_per_rank):
            continue
        schedule = build_schedule(K, M, name, remat, chunks_per_rank)
        C = schedule.num_chunks
        L = int(rng.integers(C, C + 6))
        if L > 11:
            continue
        devices = [int(d) for d in rng.integers(0, max(K - 1, 1), size=K)] if shared else list(range(K))
        sizes = [int(s) for s in rng.integers(1, 4, size=M)]
        static = rng.choice([0, 1, 5, 20], size=L) * rng.uniform(0.5, 1.5, size=L)
        act = rng.choice([0, 1, 3, 10], size=L) * rng.uniform(0.5, 1.5, size=L)
        inputs = rng.choice([0.1, 1, 4], size=L) * rng.uniform(0.5, 1.5, size=L)
        time = rng.choice([0, 1, 2.5, 7], size=L) * rng.uniform(0.5, 1.5, size=L)
        made += 1
        yield f"{name} K={K} v={chunks_per_rank} M={M} {remat}", time, MemoryTable(
            static, act, inputs, held_activations(schedule, sizes), devices)


def _every_partition(lay):
    for cuts in itertools.combinations(range(1, lay.L), lay.C - 1):
        bounds = np.array((0, *cuts, lay.L))
        mem, time = lay.figures(bounds)
        yield float(mem.max()), float(time.max())


def _with_capacity(table, capacity):
    return MemoryTable(table.static_bytes, table.activation_bytes, table.input_bytes, table.held,
                       table.device_map, capacity)


@pytest.mark.parametrize("seed", [0, 1])
def test_memory_and_fit_equal_brute_force_with_one_chunk_per_device(seed):
    rng = np.random.default_rng(100 + seed)
    for label, time, table in _random_cases(seed, 40, chunks_per_rank=1):
        lay = _Layout(time, table)
        every = list(_every_partition(lay))
        least = min(m for m, _ in every)
        mem, _ = lay.figures(_bounds(balance_by_memory(time, table)))
        assert mem.max() <= least * (1 + 1e-9), label
        peaks = sorted({m for m, _ in every})
        capacity = peaks[int(rng.integers(0, len(peaks)))] * float(rng.choice([1.0, 1.0001, 0.9999]))
        fitting = [t for m, t in every if m <= capacity]
        if not fitting:
            with pytest.raises(ScenarioError, match="pipeline.partition: fit: no partition"):
                fastest_fitting(time, _with_capacity(table, capacity))
            continue
        mem, t = lay.figures(_bounds(fastest_fitting(time, _with_capacity(table, capacity))))
        assert mem.max() <= capacity, label
        assert t.max() <= min(fitting) * (1 + 1e-9) + 1e-12, label


@pytest.mark.parametrize("chunks_per_rank, shared", [(2, False), (1, True)])
def test_devices_holding_several_chunks_never_lose_to_time_or_uniform(chunks_per_rank, shared):
    """Where a device holds several chunks the search is not exact: it is never worse than the
    `time` and `uniform` partitions, and `fit` fits whenever one of those, or `memory`, does."""
    from gpipe_sim.plan.partition import balance_by_count, balance_by_weight

    for label, time, table in _random_cases(7, 25, chunks_per_rank, shared):
        lay = _Layout(time, table)
        simple = [_bounds(balance_by_weight(time, lay.C)), _bounds(balance_by_count(lay.L, lay.C))]
        mem, _ = lay.figures(_bounds(balance_by_memory(time, table)))
        assert all(mem.max() <= lay.figures(b)[0].max() * (1 + 1e-12) for b in simple), label
        least = float(mem.max())
        capacity = least * 1.2
        mem, t = lay.figures(_bounds(fastest_fitting(time, _with_capacity(table, capacity))))
        assert mem.max() <= capacity, label
        for b in simple:
            m2, t2 = lay.figures(b)
            if m2.max() <= capacity:
                assert t.max() <= t2.max() * (1 + 1e-12), label


def test_cli_summary_shows_imbalance_and_fill_drain_beside_the_bubble(gpt_results):
    from gpipe_sim.summary import summary_text

    result = gpt_results["uniform"]
    lines = summary_text(gpt("uniform"), result).splitlines()
    bubble = next(i for i, line in enumerate(lines) if line.startswith("bubble"))
    imbalance, fill = lines[bubble + 1].split(), lines[bubble + 2].split()
    assert imbalance[0] == "imbalance" and float(imbalance[1]) == pytest.approx(result.imbalance_fraction, abs=1e-4)
    assert fill[0] == "fill/drain" and "busiest rank idle" in lines[bubble + 2]
    assert float(fill[1]) == pytest.approx(result.busiest_idle_fraction, abs=1e-4)
    # the case: a 0.26 bubble against an analytic 0.099 is mostly imbalance (the output
    # head, one layer, is the slowest rank whatever the partition)
    assert result.imbalance_fraction > 0.15 and result.bubble_fraction > 2 * result.analytic_bubble_fraction


@pytest.mark.parametrize("step", ["for_loop", "foreach", "fused"])
def test_partition_charges_the_update_where_it_is_the_peak(step):
    """Layers with large weights and small activations: a rank's peak is its update's temporaries
    (Adam: two copies of its largest tensor one at a time, one copy of every parameter on lists),
    and the partition's figure equals the simulated device peak exactly."""
    layers = [{"name": f"l{i}", "params": p, "largest_tensor_params": p - 100, "activation_bytes_per_sample": 64.0,
               "output_bytes_per_sample": 16.0, "forward_s_per_sample": 1e-3, "backward_s_per_sample": 2e-3}
              for i, p in enumerate([40_000, 10_000, 30_000, 20_000, 50_000, 10_000])]
    sc = parse_scenario({
        "model": {"preset": "table", "input_bytes_per_sample": 16.0, "layers": layers},
        "hardware": {"preset": "v100"},
        "pipeline": {"stages": 3, "micro_batches": 4, "batch_size": 8, "schedule": "1f1b", "remat": "none",
                     "partition": "memory"},
        "training": {"optimizer": "adam", "optimizer_step": step}})
    plan, table = _table(sc)
    mem, _ = _Layout([1.0] * len(plan.layers), table).figures(_bounds(plan.layer_counts))
    result = simulate(sc)
    simulated = np.array([result.device_peak_memory_bytes[d] for d in sorted(result.device_peak_memory_bytes)])
    assert mem == pytest.approx(simulated, rel=1e-12)
    counts = np.cumsum([0, *plan.layer_counts])
    for k, stage in enumerate(result.stages):
        mine = [layers[i]["params"] for i in range(counts[k], counts[k + 1])]
        update = {"for_loop": 2 * 4 * (max(mine) - 100), "foreach": 4 * sum(mine), "fused": 0}[step]
        static = 16 * sum(mine)  # fp32 weight, gradient and two Adam states
        if step == "fused":  # no temporaries: the held activations' peak
            assert stage.peak_memory_bytes == static + stage.peak_activation_bytes
        else:  # the update is the peak
            assert stage.peak_memory_bytes == static + update > static + stage.peak_activation_bytes


@pytest.mark.parametrize("schedule, chunks", [("zb_h1", 1), ("zbv", 2)])
def test_partition_stays_an_upper_bound_with_measured_input_passes(schedule, chunks):
    """Rows with the profiler's input-pass bytes (here 20x the layer's transient plus its kept
    gradients): the input pass can set the peak, and the partition's figure still bounds it."""
    sc = _transformer(schedule, chunks, "none")
    plan = compile_plan(sc)
    rows = [{**layer.model_dump(exclude_none=True), "input_pass_bytes_per_sample":
             20 * layer.transient_bytes_per_sample + layer.kept_for_weight_bytes_per_sample} for layer in plan.layers]
    scenario = sc.with_updates({"model": {"preset": "table", "layers": rows,
                                          "input_bytes_per_sample": input_bytes_per_sample(sc.model, 2)}})
    plan, table = _table(scenario)
    mem, _ = _Layout([1.0] * len(plan.layers), table).figures(_bounds(plan.layer_counts))
    result = simulate(scenario)
    simulated = np.array([result.device_peak_memory_bytes[d] for d in sorted(result.device_peak_memory_bytes)])
    assert np.all(mem >= simulated * (1 - 1e-9))
    assert result.stages[-1].peak_memory_bytes > simulate(sc).stages[-1].peak_memory_bytes  # the I pass counts
