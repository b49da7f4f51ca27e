"""Layers priced once per twin: a chunk's pass times equal pricing every layer one by one (bit for
bit), whatever was priced before, and content tokens name equal values alike."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpipe_sim.costs.content_tokens import ContentTokens
from gpipe_sim.costs.layer_time import layer_pass_times, measured_host_seconds
from gpipe_sim.costs.twins import pricing_key, twins
from gpipe_sim.plan.chunk_times import chunk_times
from gpipe_sim.plan.context_parallel import combined, ring_work
from gpipe_sim.plan.experts import all_to_all_work
from gpipe_sim.plan.layer_table import scenario_layers
from gpipe_sim.plan.tensor_parallel import collective_work
from gpipe_sim.scenario.scenario import parse_scenario

GPT = {"preset": "transformer", "layers": 6, "d_model": 512, "d_ff": 2048, "heads": 8, "seq_len": 256, "vocab": 1000}
# (model, hardware, pipeline): T, C and E on kernel tables, the roofline, and measured host times
# (with `ops` the user wrote, which no cost reads: an unhashable list)
CASES = [
    (GPT, "a100-80gb", {"tensor_parallel": 1}),
    (GPT, "a100-80gb", {"tensor_parallel": 2, "remat": "full"}),
    ({**GPT, "preset": "llama3-8b", "layers": 4, "seq_len": 512}, "dgx-h100",
     {"tensor_parallel": 2, "context_parallel": 2, "sequence_parallel": True}),
    ({"preset": "mixtral-8x7b", "layers": 3, "seq_len": 256}, "dgx-h100",
     {"expert_parallel": 2, "data_parallel": 2}),
    (GPT, "v100", {"tensor_parallel": 2}),
    ({"preset": "table", "layers": [{"name": f"l{i}", "params": 10, "activation_bytes_per_sample": 100.0, "ops": [1, i],
                                     "output_bytes_per_sample": 10.0, "timings": [
                                         {"micro_batch": 2, "forward_s": 1e-3, "backward_s": 2e-3,
                                          "forward_host_s": 3e-3 if i % 2 else 1e-4, "backward_host_s": 6e-3}]}
                                    for i in range(4)]}, "ideal", {}),
]


def _scenario(model: dict, hardware: str, pipeline: dict):
    p = {"stages": 2, "micro_batches": 2, "batch_size": 16, "schedule": "1f1b", **pipeline}
    devices = p["stages"] * p.get("tensor_parallel", 1) * p.get("context_parallel", 1) * p.get("data_parallel", 1)
    return parse_scenario({"model": model, "hardware": {"preset": hardware, "devices_per_node": max(devices, 8)},
                           "pipeline": p, "training": {"dtype": "bf16"}})


def _one_by_one(scenario, own, first, device, sizes):
    """`chunk_times` as it was written before twins: every layer priced at every size."""
    accel, dtype, dtype_bytes = scenario.hardware.accelerator, scenario.training.dtype, scenario.training.dtype_bytes
    span = slice(first, first + len(own))
    extra = combined(ring_work(scenario, device, sizes, span), all_to_all_work(scenario, device, sizes, span, own))
    tp = collective_work(scenario, device, sizes, span)
    mine = combined(tp, extra)
    host = np.array([[math.fsum(measured_host_seconds(layer, b)[i] for layer in own) for i in range(2)]
                     for b in sizes])

    def summed(work):
        out = np.array([[math.fsum(layer_pass_times(layer, b, accel, dtype, dtype_bytes,
                                                    None if work is None else work[i][j])[k]
                                   for i, layer in enumerate(own)) for k in range(4)]
                        for j, b in enumerate(sizes)])
        out[:, :2] = np.maximum(out[:, :2], host)
        return out

    times = summed(mine)
    return times, None if tp is None else np.maximum(times[:, :2] - summed(extra)[:, :2], 0.0)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_chunk_times_equal_pricing_every_layer(case):
    scenario = _scenario(*CASES[case])
    layers = scenario_layers(scenario)
    assert len(set(twins(layers))) < len(layers)  # the blocks are twins
    devices = scenario.mesh.rank_devices
    sizes = [1, 3, 8]
    for repeat in range(2):  # the second time from what the first remembered
        for first, count in ((0, len(layers)), (1, len(layers) - 2), (len(layers) - 1, 1)):
            own = layers[first:first + count]
            got, got_tp = chunk_times(scenario, own, first, devices[-1], sizes)
            want, want_tp = _one_by_one(scenario, own, first, devices[-1], sizes)
            assert got.tolist() == want.tolist()
            assert (got_tp is None) == (want_tp is None)
            if got_tp is not None:
                assert got_tp.tolist() == want_tp.tolist()


def test_twins_are_layers_equal_but_for_the_name():
    layers = scenario_layers(_scenario(*CASES[0]))
    blocks = [i for i, layer in enumerate(layers) if layer.ops is not None and i not in (0, len(layers) - 1)]
    found = twins(layers)
    assert all(found[i] == blocks[0] for i in blocks)
    assert found[0] == 0 and found[-1] == len(layers) - 1
    renamed = layers[1].model_copy(update={"name": "other"})
    changed = layers[1].model_copy(update={"params": layers[1].params + 1})
    assert pricing_key(renamed) == pricing_key(layers[1]) != pricing_key(changed)


def test_content_tokens_name_equal_contents_alike_and_never_reuse_a_token():
    tokens: ContentTokens[list] = ContentTokens(lambda value: tuple(value), size=3)
    a, b, c = [1, 2], [1, 2], [3]
    assert tokens(a) == tokens(b) != tokens(c)
    seen = {tokens(a): (1, 2), tokens(c): (3,)}
    for i in range(10):  # past its size: forgotten objects found again, contents afresh
        value = [i, i]
        seen.setdefault(tokens(value), tuple(value))
        assert seen[tokens(value)] == tuple(value)
        assert tokens(list(value)) == tokens(value)
    assert len(seen) == 12  # every content its own token


@pytest.mark.parametrize("remat", ["none", "full"])
def test_collective_work_is_each_layers_collectives_however_often_asked(remat):
    """`collective_work` remembers each model's collectives and the stream work made of them: what
    it gives is `stream_work` of `recompute_collectives` of the layers asked, every time."""
    from gpipe_sim.model.recompute import recompute_collectives
    from gpipe_sim.model.tensor_parallel import transformer_collectives
    from gpipe_sim.plan.tensor_parallel import stream_work, tp_link

    scenario = _scenario(GPT, "dgx-h100", {"tensor_parallel": 2, "remat": remat})
    comms = recompute_collectives(transformer_collectives(scenario.model, 2, False, 2), scenario.model, remat)
    for device in (0, scenario.mesh.rank_devices[-1], 0):
        bandwidth, latency = tp_link(scenario, device)
        for span in (slice(None), slice(2, 5)):
            want = [[stream_work(c, b, 2, bandwidth, latency) for b in (1, 4, 9)] for c in comms[span]]
            assert collective_work(scenario, device, [1, 4, 9], span) == want


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_cost_table_stream_work_is_the_simulators(sequence_parallel):
    """The planner's table makes each alike layer's collectives once: per layer, what
    `collective_work` gives the compiled plan's first rank."""
    from gpipe_sim.planner.bounds import CostTable

    scenario = _scenario(GPT, "dgx-h100", {"tensor_parallel": 2, "sequence_parallel": sequence_parallel})
    costs = CostTable(scenario)
    for b in (1, 3, 8):
        want = [w[0] for w in collective_work(scenario, scenario.mesh.rank_devices[0], [b])]
        assert costs.stream_work(b) == want
