"""Exact closed forms of a uniform pipeline on ideal hardware (free links, identical layers)."""

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


@pytest.mark.parametrize("engine", ["simpy", "fast"])
@pytest.mark.parametrize("K, v", [(2, 2), (4, 2), (4, 3), (8, 2), (2, 4)])
@pytest.mark.parametrize("rounds", [1, 2, 4])
def test_interleaved_1f1b_step_bubble_and_peak(uniform, engine, K, v, rounds):
    """Narayanan et al. (SC'21): bubble (K-1)/(v*M+K-1), step (v*M+K-1) chunk passes of
    (B/M)(f+b)L/(K*v) each for M a multiple of K; rank 0 holds min(v*M, v*K+K-1) chunk-micro-batches."""
    M, layers = K * rounds, 48
    result = simulate(uniform(K, M, 2 * M, layers, "interleaved_1f1b", chunks=v), engine=engine)
    per_pass = 2 * (F + B) * layers / (K * v)
    assert result.step_time_s == pytest.approx((v * M + K - 1) * per_pass, rel=1e-9)
    assert result.bubble_fraction == pytest.approx((K - 1) / (v * M + K - 1), rel=1e-9, abs=1e-12)
    assert result.analytic_bubble_fraction == pytest.approx((K - 1) / (v * M + K - 1), rel=1e-12)
    per_chunk_micro_batch = 2 * ACT * layers / (K * v)
    assert result.stages[0].peak_activation_bytes == pytest.approx(
        min(v * M, v * K + K - 1) * per_chunk_micro_batch, rel=1e-12)


@pytest.mark.parametrize("K, v, M", [(2, 2, 3), (4, 2, 8), (3, 3, 5)])
def test_looped_bfs_bubble_and_holds_every_chunk_micro_batch(uniform, K, v, M):
    layers = K * v * 2
    result = simulate(uniform(K, M, 2 * M, layers, "looped_bfs", chunks=v), engine="fast")
    per_pass = 2 * (F + B) * layers / (K * v)
    assert result.step_time_s == pytest.approx((v * M + K - 1) * per_pass, rel=1e-9)
    assert result.bubble_fraction == pytest.approx((K - 1) / (v * M + K - 1), rel=1e-9)
    assert result.stages[0].peak_activation_bytes == pytest.approx(v * M * 2 * ACT * layers / (K * v), rel=1e-12)


def test_interleaved_with_one_chunk_per_rank_is_1f1b_on_ideal_hardware(uniform):
    one = simulate(uniform(4, 8, BATCH, LAYERS, "1f1b"))
    interleaved = simulate(uniform(4, 8, BATCH, LAYERS, "interleaved_1f1b", chunks=1))
    assert interleaved.step_time_s == pytest.approx(one.step_time_s, rel=1e-12)


def test_chunk_figures_add_up_to_their_rank(uniform):
    result = simulate(uniform(4, 8, BATCH, LAYERS, "interleaved_1f1b", remat="always", chunks=2))
    assert len(result.chunks) == 8 and [c.rank for c in result.chunks] == [0, 1, 2, 3] * 2
    for stage in result.stages:
        mine = [result.chunks[c] for c in stage.chunks]
        assert stage.param_bytes == pytest.approx(sum(c.param_bytes for c in mine))
        # the update (one per rank) is not a chunk's
        assert stage.busy_s > sum(c.busy_s for c in mine) - 1e-12
        assert max(c.peak_activation_bytes for c in mine) <= stage.peak_activation_bytes + 1e-6


def test_bubble_splits_into_imbalance_and_the_busiest_ranks_idle(uniform):
    # 16 layers on 3 ranks: 6/5/5 layers, so the ranks are uneven
    result = simulate(uniform(3, 8, BATCH, LAYERS, "1f1b"))
    busy = [s.busy_s for s in result.stages]
    assert result.imbalance_fraction == pytest.approx(1 - (sum(busy) / 3) / max(busy), rel=1e-12)
    assert 1 - result.bubble_fraction == pytest.approx(
        (1 - result.imbalance_fraction) * (1 - result.busiest_idle_fraction), rel=1e-12)
    balanced = simulate(uniform(4, 8, BATCH, LAYERS, "1f1b"))
    assert balanced.imbalance_fraction == pytest.approx(0.0, abs=1e-12)
    assert balanced.busiest_idle_fraction == pytest.approx(balanced.bubble_fraction, rel=1e-12)
