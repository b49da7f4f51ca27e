"""Property tests over random valid scenarios."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpipe_sim import parse_scenario, simulate
from gpipe_sim.engine import run_simpy
from gpipe_sim.fast import evaluate_fast
from gpipe_sim.plan import compile_plan

PROFILE = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def layer_tables(draw, max_layers=10):
    """Random per-layer tables; each layer saves at least its own input (as real layers do)."""
    n = draw(st.integers(1, max_layers))
    input_bytes = draw(st.floats(1e3, 1e6))
    layers, previous_output = [], input_bytes
    for i in range(n):
        output = draw(st.floats(1e3, 1e6))
        layers.append({
            "name": f"l{i}",
            "forward_s_per_sample": draw(st.floats(1e-5, 1e-2)),
            "backward_s_per_sample": draw(st.floats(1e-5, 2e-2)),
            "params": draw(st.integers(0, 10**6)),
            "output_bytes_per_sample": output,
            "activation_bytes_per_sample": previous_output + draw(st.floats(0, 1e7)),
        })
        previous_output = output
    return {"preset": "table", "layers": layers, "input_bytes_per_sample": input_bytes}


@st.composite
def scenarios(draw, schedules=("gpipe", "1f1b", "naive")):
    model = draw(layer_tables())
    n_layers = len(model["layers"])
    stages = draw(st.integers(1, n_layers))
    schedule = draw(st.sampled_from(schedules))
    batch = draw(st.integers(1, 48))
    micro = 1 if schedule == "naive" else draw(st.integers(1, batch))
    return {
        "model": model,
        "hardware": {
            "accelerator": {"peak_flops": {"fp32": 1e12}},
            "link": {"bandwidth": draw(st.floats(1e6, 1e12)), "latency_s": draw(st.floats(0, 1e-3))},
            "host": draw(st.sampled_from([{}, {"action_s": 1e-5, "send_s": 5e-5, "recv_s": 3e-5,
                                                    "copy_bandwidth": 1e9}])),
        },
        "pipeline": {
            "stages": stages, "micro_batches": micro, "batch_size": batch, "schedule": schedule,
            "remat": draw(st.sampled_from(["none", "except_last", "always"])),
            "partition": draw(st.sampled_from(["uniform", "time", "memory"])),
        },
    }


@PROFILE
@given(scenarios())
def test_simpy_engine_and_fast_evaluator_agree_without_contention(data):
    plan = compile_plan(parse_scenario(data))
    s1, e1 = run_simpy(plan)
    s2, e2 = evaluate_fast(plan)
    scale = max(float(e1.max()), 1e-30)
    assert np.abs(e1 - e2).max() <= 1e-9 * scale
    assert np.abs(s1 - s2).max() <= 1e-9 * scale


@PROFILE
@given(
    stages=st.integers(1, 8),
    m_small=st.integers(1, 12),
    extra=st.integers(1, 12),
    schedule=st.sampled_from(["gpipe", "1f1b"]),
    remat=st.sampled_from(["none", "except_last", "always"]),
    bandwidth=st.floats(1e8, 1e12),
    latency=st.floats(0, 1e-4),
)
def test_more_micro_batches_never_raise_the_bubble_of_a_uniform_pipeline(
    uniform, stages, m_small, extra, schedule, remat, bandwidth, latency
):
    m_large = m_small + extra
    batch = m_small * m_large
    hardware = {"accelerator": {"peak_flops": {"fp32": 1e12}},
                "link": {"bandwidth": bandwidth, "latency_s": latency}}
    small = simulate(uniform(stages, m_small, batch, 16, schedule, remat, hardware), engine="auto")
    large = simulate(uniform(stages, m_large, batch, 16, schedule, remat, hardware), engine="auto")
    assert large.bubble_fraction <= small.bubble_fraction + 1e-9


@PROFILE
@given(scenarios(schedules=("gpipe", "1f1b")))
def test_rematerialization_never_raises_peak_activation_memory(data):
    peaks = {}
    for remat in ("none", "except_last", "always"):
        data["pipeline"]["remat"] = remat
        data["pipeline"]["partition"] = "uniform"  # same partition for all three
        result = simulate(parse_scenario(data), engine="auto")
        peaks[remat] = np.array([s.peak_activation_bytes for s in result.stages])
    assert (peaks["always"] <= peaks["none"] * (1 + 1e-12)).all()
    assert (peaks["except_last"] <= peaks["none"] * (1 + 1e-12)).all()


@PROFILE
@given(scenarios())
def test_result_invariants(data):
    result = simulate(parse_scenario(data), engine="auto")
    assert 0.0 <= result.bubble_fraction < 1.0
    assert result.step_time_s >= max(s.busy_s for s in result.stages) * (1 - 1e-12)
    samples = result.throughput_samples_per_s * result.step_time_s
    assert abs(samples / data["pipeline"]["batch_size"] - 1) < 1e-12
    covered = sorted((s.layers for s in result.stages))
    assert covered[0][0] == 0 and covered[-1][1] == len(data["model"]["layers"]) - 1
    assert all(a[1] + 1 == b[0] for a, b in zip(covered, covered[1:]))
