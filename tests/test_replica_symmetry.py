"""Data-parallel replicas timed once where they are alike: every figure equals timing all of them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gpipe_sim.api import simulate_plan
from gpipe_sim.errors import ScenarioError
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.scenario.scenario import load_scenario, parse_scenario
from gpipe_sim.summary import summary_text

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"preset": "transformer", "layers": 16, "d_model": 512, "d_ff": 2048, "heads": 8, "seq_len": 512,
         "attention": "flash"}


def _scenario(hardware: dict, pipeline: dict, training: dict | None = None, model: dict | None = None):
    return parse_scenario({"model": model or SMALL, "hardware": hardware, "pipeline": pipeline,
                           "training": training or {"dtype": "bf16"}})


NODES_OF_8 = {"devices_per_node": 8}
ALIKE = {
    # a rank's T = 8 devices fill a node; 8 NICs a node, shared by pipeline sends and the rings
    "llama-like": _scenario({"preset": "h100-sxm", **NODES_OF_8, "network": {"bandwidth": "50 GB/s", "per": "node",
                                                                             "nics": 8, "latency_s": 5e-6}},
                            {"stages": 4, "micro_batches": 8, "batch_size": 64, "data_parallel": 4,
                             "tensor_parallel": 8, "sequence_parallel": True, "schedule": "1f1b"},
                            {"dtype": "bf16", "zero": 1}),
    # interleaved, host time per transfer, two chunks' rings on one rank's NICs
    "1t-like": _scenario({"preset": "a100-80gb", **NODES_OF_8, "network": {"bandwidth": "25 GB/s", "per": "node",
                                                                           "nics": 8}},
                         {"stages": 4, "chunks": 2, "micro_batches": 8, "batch_size": 48, "data_parallel": 3,
                          "tensor_parallel": 8, "schedule": "interleaved_1f1b", "remat": "always"}),
    # Megatron's bucketed reduction overlapping the last backward (buckets of layers, one after another)
    "overlapped-buckets": _scenario({"preset": "h100-sxm", **NODES_OF_8,
                                     "network": {"bandwidth": "400 Gb/s", "per": "node", "nics": 8}},
                                    {"stages": 4, "micro_batches": 8, "batch_size": 32, "data_parallel": 2,
                                     "tensor_parallel": 8, "schedule": "interleaved_1f1b", "chunks": 2},
                                    {"dtype": "bf16", "zero": 1, "overlap_grad_reduce": True,
                                     "bucket_bytes": "40 MB"}),
    # one node: rings and sends on NVLink pairs; GPipe
    "one-node": _scenario({"preset": "a100-80gb"}, {"stages": 4, "micro_batches": 8, "batch_size": 32,
                                                    "data_parallel": 2, "schedule": "gpipe"}),
    # nodes of 4, a port per device: the replicas of a rank share a node, pipeline hops leave it
    "ports-per-device": _scenario({"preset": "h100-sxm", "devices_per_node": 4, "network": {"bandwidth": "50 GB/s"}},
                                  {"stages": 4, "micro_batches": 8, "batch_size": 32, "data_parallel": 2,
                                   "schedule": "zb_h1"}),
    # two ranks a device, the same in each replica (shared devices contend within a replica)
    "shared-devices": _scenario({"preset": "h100-sxm", "placement": [[0, 0, 1, 1], [2, 2, 3, 3]]},
                                {"stages": 4, "micro_batches": 8, "batch_size": 32, "data_parallel": 2,
                                 "schedule": "1f1b"}),
    # a runtime's step buffers (all-reduce buckets), CPU host time on the device
    "step-buffers": _scenario({"preset": "cpu", "host": {"step_buffers": True, "on_device": True, "send_s": 1e-4}},
                              {"stages": 2, "micro_batches": 4, "batch_size": 16, "data_parallel": 2,
                               "schedule": "1f1b"}, {"dtype": "fp32"},
                              {"preset": "transformer", "layers": 4, "d_model": 64, "d_ff": 256, "heads": 4,
                               "seq_len": 32, "vocab": 128}),
}
UNLIKE = {
    # one NIC a node: replicas' sends share it
    "shared NIC": (_scenario({"preset": "h100-sxm", **NODES_OF_8, "network": {"bandwidth": "50 GB/s", "per": "node"}},
                             {"stages": 4, "micro_batches": 8, "batch_size": 64, "data_parallel": 4}),
                   "a link carries sends of two replicas"),
    # nodes of 2: rank 0's ring leaves the node through replica 1's port, not replica 0's
    "uneven ring": (_scenario({"preset": "h100-sxm", "devices_per_node": 2, "network": {"bandwidth": "50 GB/s"}},
                              {"stages": 4, "micro_batches": 8, "batch_size": 64, "data_parallel": 4}),
                    "all-reduce ring holds the replicas' links unevenly"),
    "placement": (_scenario({"preset": "h100-sxm", "placement": [[0, 1, 2, 3], [4, 4, 5, 5]]},
                            {"stages": 4, "micro_batches": 8, "batch_size": 32, "data_parallel": 2}),
                  "share devices differently"),
    "ZeRO step buffers": (_scenario({"preset": "cpu", "host": {"step_buffers": True}},
                                    {"stages": 2, "micro_batches": 4, "batch_size": 16, "data_parallel": 2},
                                    {"dtype": "fp32", "zero": 1}, ALIKE["step-buffers"].model.model_dump()),
                          "ZeRO-1 step buffers differ per replica"),
}


def _figures(result) -> dict:
    """Every figure a result reports (its JSON without the timeline), flattened."""
    out = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{prefix}{i}.")
        else:
            out[prefix] = node
    walk(json.loads(result.to_json(timeline=False)), "")
    return out


@pytest.mark.parametrize("name", sorted(ALIKE))
def test_alike_replicas_timed_once_give_every_figure(name):
    scenario = ALIKE[name]
    plan = compile_plan(scenario)
    assert plan.symmetry.alike, plan.symmetry.reason
    once, every = simulate_plan(plan), simulate_plan(plan, every_replica=True)
    K, D = len(plan.ranks), plan.replicas
    assert set(once.timeline.rank.tolist()) == set(range(K))  # replica 0 alone was timed
    assert set(every.timeline.rank.tolist()) == set(range(D * K))
    a, b = _figures(once), _figures(every)
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(b[key], float):
            assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-12), key
        else:
            assert a[key] == b[key], key
    assert summary_text(scenario, once) == summary_text(scenario, every)
    assert len(every.device_peak_memory_bytes) == len(set(plan.device_map))  # every replica's devices


@pytest.mark.parametrize("name", sorted(UNLIKE))
def test_replicas_that_differ_are_each_simulated(name):
    scenario, reason = UNLIKE[name]
    plan = compile_plan(scenario)
    assert not plan.symmetry.alike and reason in plan.symmetry.reason
    assert plan.simulated() is plan
    result = simulate_plan(plan)
    assert int(result.timeline.rank.max()) + 1 == plan.replicas * len(plan.ranks)


def test_the_simulated_program_is_one_replicas():
    plan = compile_plan(ALIKE["llama-like"])
    once = plan.simulated()
    assert once.num_ranks == len(plan.ranks) and once.program.group_size == 1
    assert len(once.program.kind) * plan.replicas == len(plan.program.kind)
    # each all-reduce is still the D-replica ring's
    assert np.array_equal(once.program.group_seconds, plan.program.group_seconds)


def test_no_pass_limit_counts_alike_replicas_but_differing_ones_are_bounded():
    big = load_scenario(ROOT / "scenarios/scale/megatron-1t.yaml")  # 393,216 passes over 6 replicas
    assert compile_plan(big).symmetry.alike
    unlike = _scenario({"preset": "h100-sxm", **NODES_OF_8, "network": {"bandwidth": "50 GB/s", "per": "node"}},
                       {"stages": 16, "micro_batches": 1024, "batch_size": 16384, "data_parallel": 16})
    with pytest.raises(ScenarioError, match=r"^pipeline\.data_parallel: the 16 replicas differ \(a link carries"):
        compile_plan(unlike).simulated()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["megatron-1t", "llama3-405b"])
def test_published_runs_simulate_within_seconds(name):
    """Megatron-LM's 1T run on 3,072 A100s and Llama 3 405B on 16,384 H100s, whole process <= 5 s."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gpipe_sim.cli", "simulate", f"scenarios/scale/{name}.yaml"],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    assert done.returncode == 0, done.stderr
    assert "step time" in done.stdout
    assert wall <= 5.0, f"{name}: {wall:.2f} s"


def test_labels_rename_each_row_by_first_occurrence():
    """`_labels` of every row at once equals each row's renaming by np.unique's first occurrences."""
    from gpipe_sim.plan.replica_symmetry import _labels

    def one(row):
        _, first, inverse = np.unique(row, return_index=True, return_inverse=True)
        return np.argsort(np.argsort(first))[inverse.ravel()]

    rng = np.random.default_rng(0)
    for _ in range(500):
        rows = rng.integers(-3, int(rng.integers(1, 8)), size=(int(rng.integers(1, 6)), int(rng.integers(1, 12))))
        assert np.array_equal(_labels(rows * 997), np.array([one(row) for row in rows * 997]))
