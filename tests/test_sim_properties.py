"""Property tests over random valid scenarios."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytest

from gpipe_sim import SimulationError, parse_scenario, simulate
from gpipe_sim.engines.fast import evaluate_fast
from gpipe_sim.engines.reference import straightforward_simpy
from gpipe_sim.engines.simpy_engine import run_simpy
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.schedule import SCHEDULES, Kind, register

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
def scenarios(draw, schedules=("gpipe", "1f1b", "naive", "interleaved_1f1b", "looped_bfs")):
    model = draw(layer_tables())
    n_layers = len(model["layers"])
    schedule = draw(st.sampled_from(schedules))
    several = SCHEDULES[schedule].problem(1, 1, 2) is None  # the family runs several chunks per rank
    chunks = draw(st.integers(1, min(3, n_layers))) if several else 1
    stages = draw(st.integers(1, n_layers // chunks))
    batch = draw(st.integers(1, 48))
    micro = draw(st.integers(1, batch))
    if SCHEDULES[schedule].problem(stages, micro, chunks):  # e.g. naive (M=1), interleaved (M % K)
        micro = next(m for m in (stages * max(1, micro // stages), 1)
                     if not SCHEDULES[schedule].problem(stages, m, chunks))
        batch = max(batch, micro)
    return {
        "model": model,
        "hardware": {
            "accelerator": {"peak_flops": {"fp32": 1e12}},
            "link": {"bandwidth": draw(st.floats(1e6, 1e12)), "latency_s": draw(st.floats(0, 1e-3))},
            "host": draw(st.sampled_from([{}, {"action_s": 1e-5, "send_s": 5e-5, "recv_s": 3e-5,
                                                    "copy_bandwidth": 1e9}])),
        },
        "pipeline": {
            "stages": stages, "chunks": chunks, "micro_batches": micro, "batch_size": batch, "schedule": schedule,
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
    bandwidth=st.floats(1e10, 1e12),
    latency=st.floats(0, 1e-5),
)
def test_more_micro_batches_never_raise_the_bubble_of_a_uniform_pipeline(
    uniform, stages, m_small, extra, schedule, remat, bandwidth, latency
):
    """With transfers much faster than compute. (Not in general: K=2, 1F1B, 16 layers, batch 20,
    1e8 B/s links, where a micro-batch's transfer outlasts its stage's forward: bubble 0.400 at
    M=4 but 0.412 at M=5.)"""
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
    covered = [c.layers for c in result.chunks]
    assert covered[0][0] == 0 and covered[-1][1] == len(data["model"]["layers"]) - 1
    assert all(a[1] + 1 == b[0] for a, b in zip(covered, covered[1:]))
    assert sorted(c for s in result.stages for c in s.chunks) == list(range(len(result.chunks)))


@st.composite
def random_programs(draw):
    """Any valid per-rank pass orders: random placement of K*v chunks, random interleaving of each
    rank's passes (full or split backward) in an order that respects its local hand-overs. Such
    programs may deadlock across ranks; engines must then agree that they do."""
    K = draw(st.integers(1, 4))
    v = draw(st.integers(1, 3))
    M = draw(st.integers(1, 4))
    placement = draw(st.permutations(list(range(K)) * v))
    split = draw(st.booleans())
    done: set[tuple[int, int, int]] = set()
    pending = {r: [] for r in range(K)}
    for c, r in enumerate(placement):
        for m in range(M):
            pending[r].append((int(Kind.FORWARD), c, m))
            if split:
                pending[r] += [(int(Kind.BACKWARD_INPUT), c, m), (int(Kind.BACKWARD_WEIGHT), c, m)]
            else:
                pending[r].append((int(Kind.BACKWARD), c, m))
    F, B, I, W = (int(k) for k in (Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT))
    C = K * v

    def ready(p: tuple[int, int, int], r: int) -> bool:
        kind, c, m = p
        local_prev = c > 0 and placement[c - 1] == r
        local_next = c < C - 1 and placement[c + 1] == r
        if kind == F:
            return not local_prev or (F, c - 1, m) in done
        if kind in (B, I):
            nxt = (B if not split else I, c + 1, m)
            return (F, c, m) in done and (not local_next or nxt in done)
        return (I, c, m) in done

    orders = []
    for r in range(K):
        order = []
        left = list(pending[r])
        while left:
            choices = [p for p in left if ready(p, r)]
            pick = choices[draw(st.integers(0, len(choices) - 1))]
            order.append(pick)
            done.add(pick)
            left.remove(pick)
        orders.append(order)
    return K, v, M, tuple(placement), orders


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_programs(), st.sampled_from(["none", "always"]), st.floats(1e5, 1e9))
def test_engines_agree_on_random_programs_or_both_find_the_deadlock(program, remat, bandwidth):
    K, v, M, placement, orders = program

    @register("random-program-test", placement=lambda ranks, chunks: placement)
    def generate(ranks, micro_batches, chunks):
        return orders

    try:
        layers = [{"name": f"l{i}", "forward_s_per_sample": 1e-3 * (1 + i % 3), "backward_s_per_sample": 2e-3,
                   "output_bytes_per_sample": 1e5 * (1 + i % 2), "activation_bytes_per_sample": 1e6}
                  for i in range(K * v)]
        scenario = parse_scenario({
            "model": {"preset": "table", "layers": layers},
            "hardware": {"accelerator": {"peak_flops": {"fp32": 1e12}},
                         "link": {"bandwidth": bandwidth, "latency_s": 1e-5},
                         "host": {"action_s": 1e-5, "send_s": 2e-5, "recv_s": 1e-5}},
            "pipeline": {"stages": K, "chunks": v, "micro_batches": M, "batch_size": 2 * M,
                         "schedule": "random-program-test", "remat": remat, "partition": "uniform"},
        })
        plan = compile_plan(scenario)
        try:
            slow = run_simpy(plan)
        except SimulationError as exc:
            assert "deadlocks" in str(exc)
            with pytest.raises(SimulationError, match="deadlocks"):
                evaluate_fast(plan)
            return
        fast = evaluate_fast(plan)
        textbook = straightforward_simpy(plan)
        scale = float(slow[1].max())
        for got in (fast, textbook):
            assert np.abs(got[0] - slow[0]).max() <= 1e-9 * scale
            assert np.abs(got[1] - slow[1]).max() <= 1e-9 * scale
    finally:
        del SCHEDULES["random-program-test"]
