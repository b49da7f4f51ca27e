"""Exact closed forms of a uniform pipeline on ideal hardware."""

from __future__ import annotations

import pytest

from gpipe_sim import simulate

F, B = 1.0e-3, 2.0e-3  # the uniform preset's default seconds per sample
LAYERS, BATCH, ACT = 16, 64, 4.0e6


@pytest.mark.parametrize("engine", ["simpy", "fast"])
@pytest.mark.parametrize("K", [1, 2, 4, 8])
@pytest.mark.parametrize("M", [1, 4, 32])
def test_gpipe_step_time_and_bubble(uniform, engine, K, M):
    result = simulate(uniform(K, M, BATCH, LAYERS), engine=engine)
    expected = (M + K - 1) * (BATCH / M) * (F + B) * (LAYERS / K)
    assert result.step_time_s == pytest.approx(expected, rel=1e-9)
    assert result.bubble_fraction == pytest.approx((K - 1) / (M + K - 1), rel=1e-9, abs=1e-12)
    assert result.analytic_bubble_fraction == pytest.approx((K - 1) / (M + K - 1), rel=1e-12)
    assert result.throughput_samples_per_s == pytest.approx(BATCH / expected, rel=1e-9)


@pytest.mark.parametrize("K", [1, 2, 4, 8])
@pytest.mark.parametrize("M", [1, 4, 32])
def test_gpipe_stage0_peak_activation_holds_whole_batch(uniform, K, M):
    result = simulate(uniform(K, M, BATCH, LAYERS))
    assert result.stages[0].peak_activation_bytes == pytest.approx((LAYERS / K) * BATCH * ACT, rel=1e-12)


@pytest.mark.parametrize("K", [1, 2, 4, 8])
@pytest.mark.parametrize("M", [1, 4, 32])
def test_1f1b_stage0_peak_activation_is_min_m_k_micro_batches(uniform, K, M):
    result = simulate(uniform(K, M, BATCH, LAYERS, schedule="1f1b"))
    per_micro_batch = (LAYERS / K) * (BATCH / M) * ACT
    assert result.stages[0].peak_activation_bytes == pytest.approx(min(M, K) * per_micro_batch, rel=1e-12)


@pytest.mark.parametrize("K", [2, 4, 8])
@pytest.mark.parametrize("M", [4, 32])
def test_1f1b_has_the_same_step_time_as_gpipe_on_ideal_hardware(uniform, K, M):
    gpipe = simulate(uniform(K, M, BATCH, LAYERS))
    one_f_one_b = simulate(uniform(K, M, BATCH, LAYERS, schedule="1f1b"))
    assert one_f_one_b.step_time_s == pytest.approx(gpipe.step_time_s, rel=1e-9)


def test_remat_always_adds_one_forward_per_micro_batch(uniform):
    K, M = 4, 8
    plain = simulate(uniform(K, M, BATCH, LAYERS))
    remat = simulate(uniform(K, M, BATCH, LAYERS, remat="always"))
    # Every stage re-computes every micro-batch: busy time grows by the forward time.
    extra = BATCH * F * LAYERS / K
    for p, r in zip(plain.stages, remat.stages):
        assert r.busy_s == pytest.approx(p.busy_s + extra, rel=1e-9)


def test_remat_peak_memory_matches_paper_formula(uniform):
    """GPipe with re-materialization keeps M stage inputs plus one micro-batch's activations."""
    K, M, out = 4, 8, 1.0e6
    result = simulate(uniform(K, M, BATCH, LAYERS, remat="always"))
    micro = BATCH / M
    expected = M * micro * out + (LAYERS / K) * micro * ACT - micro * out
    assert result.stages[1].peak_activation_bytes == pytest.approx(expected, rel=1e-12)


def test_naive_schedule_runs_the_batch_whole(uniform):
    K = 4
    result = simulate(uniform(K, 1, BATCH, LAYERS, schedule="naive"))
    assert result.step_time_s == pytest.approx(BATCH * (F + B) * LAYERS, rel=1e-9)
    assert result.bubble_fraction == pytest.approx((K - 1) / K, rel=1e-9)


def test_parameter_and_optimizer_memory(uniform):
    result = simulate(uniform(4, 4, BATCH, LAYERS))
    per_stage_params = 4 * 10_000_000
    stage = result.stages[0]
    assert stage.param_bytes == per_stage_params * 4  # fp32 weights
    assert stage.state_bytes == per_stage_params * (4 + 8)  # gradient + Adam's two states
    assert stage.peak_memory_bytes == stage.param_bytes + stage.state_bytes + stage.peak_activation_bytes
