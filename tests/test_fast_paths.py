"""The fast evaluator's two exact paths, vectorised sweeps and the per-transfer pass, agree to the bit."""

from __future__ import annotations

import numpy as np
import pytest

from gpipe_sim import SimulationError, parse_scenario
from gpipe_sim.engines import fast_sweeps
from gpipe_sim.engines.chain import rank_slices
from gpipe_sim.engines.fast import evaluate_fast
from gpipe_sim.engines.simpy_engine import run_simpy
from gpipe_sim.engines.sweep_rank import SweepRank
from gpipe_sim.engines.fast_sweeps import Sweeps
from gpipe_sim.plan.compile import compile_plan

SLOW_LINK = {"preset": "v100", "link": {"bandwidth": 2e7, "latency_s": 1e-5}}  # sends queue on their link


def _plan(schedule: str, K: int, M: int, v: int = 1, hardware: dict | None = None, remat: str = "none"):
    return compile_plan(parse_scenario({
        "model": {"preset": "transformer", "layers": 2 * K * v, "d_model": 256, "d_ff": 1024, "heads": 4,
                  "seq_len": 128, "vocab": 1000},
        "hardware": hardware or {"preset": "v100"},
        "pipeline": {"stages": K, "chunks": v, "micro_batches": M, "batch_size": 2 * M, "schedule": schedule,
                     "remat": remat, "partition": "time"},
    }))


def _sweep_on(monkeypatch) -> None:
    """Sweeps whatever they cost (a deadlock still ends them: its frontier stops advancing)."""
    monkeypatch.setattr(fast_sweeps, "TRIAL_SHARE", float("inf"))
    monkeypatch.setattr(fast_sweeps, "BUDGET_SHARE", 1e9)


CASES = [("1f1b", 4, 16, 1), ("interleaved_1f1b", 4, 8, 2), ("zbv", 4, 8, 2), ("zb_h1", 3, 9, 1),
         ("dualpipev", 3, 8, 2), ("interleaved_zb", 2, 6, 3), ("looped_bfs", 3, 5, 2)]


@pytest.mark.parametrize("hardware", [None, SLOW_LINK], ids=["v100", "slow-link"])
@pytest.mark.parametrize("schedule, K, M, v", CASES)
def test_sweeps_and_the_transfer_pass_give_the_same_bits(monkeypatch, schedule, K, M, v, hardware):
    plan = _plan(schedule, K, M, v, hardware, remat="always" if K == 3 else "none")
    monkeypatch.setattr(fast_sweeps, "TRIAL_SHARE", 0.0)  # the per-transfer pass after the first sweep
    by_pass = evaluate_fast(plan)
    _sweep_on(monkeypatch)
    ranks = rank_slices(plan)
    arrival, link_start = np.zeros(plan.program.num_messages), np.zeros(len(plan.program.kind))
    assert Sweeps(ranks, arrival, link_start).settle()
    by_sweeps = evaluate_fast(plan)
    assert np.array_equal(by_pass[0], by_sweeps[0]) and np.array_equal(by_pass[1], by_sweeps[1])
    simpy = run_simpy(plan)
    scale = float(simpy[1].max())
    assert np.abs(by_sweeps[1] - simpy[1]).max() <= 1e-9 * scale


def test_queued_sends_are_timed_one_after_another(monkeypatch):
    # a slow link: sends wait for the one before them, the sweeps' send-by-send branch
    plan = _plan("1f1b", 4, 16, hardware={"preset": "v100", "link": {"bandwidth": 5e6, "latency_s": 0.0}})
    calls = []
    original = SweepRank._queue
    monkeypatch.setattr(SweepRank, "_queue", lambda self, *a: calls.append(1) or original(self, *a))
    _sweep_on(monkeypatch)
    fast = evaluate_fast(plan)
    assert calls
    slow = run_simpy(plan)
    assert np.abs(fast[1] - slow[1]).max() <= 1e-9 * float(slow[1].max())


def test_fill_drain_settles_in_the_first_sweep(monkeypatch):
    plan = _plan("gpipe", 4, 8)
    monkeypatch.setattr(fast_sweeps, "TRIAL_SHARE", 0.0)  # no sweeps after the first
    arrival, link_start = np.zeros(plan.program.num_messages), np.zeros(len(plan.program.kind))
    assert Sweeps(rank_slices(plan), arrival, link_start).settle()


def test_a_deadlock_never_settles_the_sweeps(monkeypatch):
    from gpipe_sim.schedule import SCHEDULES, Kind, register

    F, B = int(Kind.FORWARD), int(Kind.BACKWARD)

    @register("sweeps-deadlock-test")
    def crossed(ranks, micro_batches, chunks):
        return [[(F, 0, 0), (B, 0, 0), (F, 0, 1), (B, 0, 1)], [(F, 1, 1), (B, 1, 1), (F, 1, 0), (B, 1, 0)]]

    try:
        _sweep_on(monkeypatch)
        plan = compile_plan(parse_scenario({
            "model": {"preset": "uniform", "layers": 2, "forward_s_per_sample": 0.0, "backward_s_per_sample": 0.0},
            "hardware": {"preset": "ideal"},
            "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 2, "schedule": "sweeps-deadlock-test"},
        }))
        with pytest.raises(SimulationError, match="deadlocks"):
            evaluate_fast(plan)
    finally:
        del SCHEDULES["sweeps-deadlock-test"]
