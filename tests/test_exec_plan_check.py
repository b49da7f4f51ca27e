"""gpipe-exec plan-check: Kendall tau-b, regret and top-1 on known cases, bad input, and (slow) a real check."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys

import pytest

from gpipe_exec.checks.plan_check import (CheckOptions, Checked, kendall_tau_b, ranks_of, regret, spread,
                                           summarize_check)


def _brute_tau_b(x: list[float], y: list[float]) -> float:
    """tau-b from its definition with sign products, written apart from the module's loop."""
    sign = lambda v: (v > 0) - (v < 0)  # noqa: E731
    pairs = list(itertools.combinations(range(len(x)), 2))
    s = sum(sign(x[i] - x[j]) * sign(y[i] - y[j]) for i, j in pairs)
    untied_x = sum(x[i] != x[j] for i, j in pairs)
    untied_y = sum(y[i] != y[j] for i, j in pairs)
    return s / math.sqrt(untied_x * untied_y)


def test_kendall_tau_b_on_hand_computed_cases():
    assert kendall_tau_b([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau_b([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    # x = 1..5, y = 3,1,2,5,4: of the 10 pairs, (1,2) (1,3) (4,5) are discordant, 7 concordant
    assert kendall_tau_b([1, 2, 3, 4, 5], [3, 1, 2, 5, 4]) == pytest.approx((7 - 3) / 10)
    # a tie in x: pair (2,3) counts neither way; 5 concordant of 6 pairs, 1 tied in x, none in y
    assert kendall_tau_b([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(5 / math.sqrt(5 * 6))
    # ties on both sides: 1 concordant, 1 discordant, 2 pairs tied in x and 2 in y
    assert kendall_tau_b([1, 1, 2, 2], [1, 2, 1, 2]) == 0.0
    # ties on both sides, not symmetric: x = 1,1,2,3, y = 1,2,2,3
    # pairs: (0,1) tx; (0,2) C; (0,3) C; (1,2) ty; (1,3) C; (2,3) C -> 4 C, 0 D; 1 tied in x, 1 in y
    assert kendall_tau_b([1, 1, 2, 3], [1, 2, 2, 3]) == pytest.approx(4 / math.sqrt(5 * 5))


def test_kendall_tau_b_is_undefined_without_order():
    assert kendall_tau_b([1.0], [2.0]) is None
    assert kendall_tau_b([1, 1, 1], [1, 2, 3]) is None
    with pytest.raises(ValueError):
        kendall_tau_b([1, 2], [1])


def test_kendall_tau_b_matches_its_definition_on_random_ties():
    import random

    rng = random.Random(3)
    for _ in range(50):
        n = rng.randint(2, 12)
        x = [rng.randint(0, 4) for _ in range(n)]
        y = [rng.randint(0, 4) for _ in range(n)]
        if len(set(x)) < 2 or len(set(y)) < 2:
            continue
        assert kendall_tau_b(x, y) == pytest.approx(_brute_tau_b(x, y))


def _numpy_tau_b(x: list[float], y: list[float]) -> float:
    """tau-b as scipy.stats.kendalltau(variant="b") computes it, from numpy sign matrices (no scipy)."""
    import numpy as np

    dx = np.sign(np.subtract.outer(np.asarray(x, float), np.asarray(x, float)))[np.triu_indices(len(x), 1)]
    dy = np.sign(np.subtract.outer(np.asarray(y, float), np.asarray(y, float)))[np.triu_indices(len(y), 1)]
    return float((dx * dy).sum() / np.sqrt(np.count_nonzero(dx) * np.count_nonzero(dy)))


def test_kendall_tau_b_matches_a_numpy_tau_b_and_scipys_value():
    x, y = [3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]
    # scipy.stats.kendalltau(x, y, variant="b").statistic, (C - D) / sqrt(untied in x * untied in y):
    # 13 concordant and 9 discordant of the 28 pairs, 27 untied in x, 23 in y
    assert _numpy_tau_b(x, y) == pytest.approx(4 / math.sqrt(27 * 23))
    assert kendall_tau_b(x, y) == pytest.approx(_numpy_tau_b(x, y))
    import random

    rng = random.Random(7)
    for _ in range(30):
        n = rng.randint(2, 40)
        a = [rng.randint(0, 6) for _ in range(n)]
        b = [rng.random() if rng.random() < 0.5 else rng.randint(0, 3) for _ in range(n)]
        if len(set(a)) > 1 and len(set(b)) > 1:
            assert kendall_tau_b(a, b) == pytest.approx(_numpy_tau_b(a, b))


def _row(name: str, predicted: float, measured: list[float]) -> Checked:
    return Checked({"pipeline.stages": 1, "pipeline.micro_batches": 1, "pipeline.schedule": name,
                    "pipeline.remat": "none"}, predicted, 16 / predicted, measured=measured)


def test_regret_top1_and_noise_on_a_hand_built_table():
    # the planner's order: a, b, c; measured medians 100, 110, 50
    rows = [_row("a", 300, [95, 100, 104]), _row("b", 200, [108, 110, 112]), _row("c", 100, [50, 51, 49])]
    s = summarize_check(rows)
    assert s.configurations == 3
    assert not s.top1 and s.pick_measured_rank == 2
    assert s.best.endswith("b remat=none") and s.pick.endswith("a remat=none")
    assert s.regret == pytest.approx(1 - 100 / 110)
    assert s.pick_spread == pytest.approx((104 - 95) / 100)
    assert s.best_spread == pytest.approx((112 - 108) / 110)
    assert not s.within_noise  # the pick's best round 104 < the best's worst 108
    # predicted 300, 200, 100 against 100, 110, 50: pairs (a,b) D, (a,c) C, (b,c) C
    assert s.tau_b == pytest.approx(1 / 3)
    assert s.tau_b_fastest == pytest.approx(1 / 3)  # fastest rounds 104, 112, 51: the same order
    s2 = summarize_check([_row("a", 300, [95, 100, 120]), *rows[1:]])
    assert s2.tau_b == pytest.approx(1 / 3) and s2.tau_b_fastest == 1.0  # a's fastest round 120 is first
    # every pair is separated by the measurement; the planner orders (a,c) and (b,c) right
    assert (s.resolved_pairs, s.resolved_agree) == (3, 2)
    assert ranks_of([100, 110, 50]) == [2, 1, 3]


def test_a_regret_inside_the_spread_is_called_noise_and_top1_agrees_on_the_best():
    rows = [_row("a", 300, [100, 105, 109]), _row("b", 200, [104, 106, 110])]
    s = summarize_check(rows)
    assert s.regret == pytest.approx(1 - 105 / 106)
    assert s.within_noise and not s.top1 and s.resolved_pairs == 0
    s = summarize_check([_row("b", 300, [104, 106, 110]), _row("a", 200, [100, 105, 109])])
    assert s.top1 and s.regret == 0.0 and s.pick_measured_rank == 1 and s.tau_b == 1.0
    assert regret(90, 100) == pytest.approx(0.1)
    assert spread([1.0, 2.0, 3.0]) == pytest.approx(1.0)


@pytest.mark.parametrize("args, option", [
    (("--devices", "0"), "--devices"),
    (("--devices", str(len(os.sched_getaffinity(0)) + 1)), "--devices"),
    (("--devices", "x"), "--devices"),
    (("--schedules", "1f1b,nope"), "--schedules"),
    (("--remat", "sometimes"), "--remat"),
    (("--rounds", "0"), "--rounds"),
    (("--micro-batches", "0"), "--micro-batches"),
])
def test_bad_input_is_one_line_naming_the_option(args, option, capsys):
    from gpipe_exec.cli import main

    assert main(["plan-check", "scenarios/exec/convnet_k2.yaml", *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and option in lines[0]


def test_bad_input_exits_2_from_the_command_line():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-m", "gpipe_exec.cli", "plan-check", "scenarios/exec/convnet_k2.yaml",
                           "--devices", "0"], capture_output=True, text=True, timeout=60, cwd=root)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--devices" in done.stderr


@pytest.mark.slow
def test_plan_check_runs_every_configuration_of_a_tiny_model(tmp_path):
    """End to end on a tiny transformer, two schedules: every distinct configuration the planner
    ranks (D, K in {1, 2}) runs twice, and the figures are consistent with the rows."""
    from gpipe_exec.checks.plan_check import plan_check
    from gpipe_sim.scenario.scenario import parse_scenario

    base = parse_scenario({
        "model": {"preset": "transformer", "layers": 2, "d_model": 32, "d_ff": 64, "heads": 2, "seq_len": 16,
                  "vocab": 64},
        "hardware": {"preset": "cpu"},
        "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": 4, "schedule": "gpipe", "remat": "none"},
        "training": {"optimizer": "sgd"},
    })
    options = CheckOptions(devices=2, rounds=2, steps=1, warmup=1, schedules=("gpipe", "1f1b"), remat=("none",))
    check = plan_check(base, options)
    layouts = {(r.overrides["pipeline.data_parallel"], r.overrides["pipeline.stages"]) for r in check.rows}
    assert layouts == {(1, 1), (1, 2), (2, 1)}
    assert all(len(r.measured) == 2 and min(r.measured) > 0 for r in check.rows)
    predicted = [r.predicted_throughput for r in check.rows]
    assert predicted == sorted(predicted, reverse=True)  # the planner's order, its pick first
    s = check.summary
    best = max(r.measured_throughput for r in check.rows)
    assert s.regret == pytest.approx(1 - check.rows[0].measured_throughput / best)
    assert s.tau_b is None or -1 <= s.tau_b <= 1
    data = json.loads(json.dumps(check.to_dict()))
    assert len(data["configurations"]) == len(check.rows) and data["summary"]["configurations"] == len(check.rows)


def test_median_table_takes_each_timing_median_and_keeps_the_rest():
    from gpipe_exec.checks.plan_check import median_table

    def table(scale: float, flops: float) -> dict:
        return {"input_bytes_per_sample": 4.0, "layers": [
            {"name": "a", "params": 3, "forward_flops_per_sample": flops, "update_s": 1e-3 * scale,
             "timings": [{"micro_batch": 1, "forward_s": 1.0 * scale, "backward_s": 2.0 * scale},
                         {"micro_batch": 4, "forward_s": 3.0 * scale, "backward_s": 5.0 * scale}]}]}

    merged = median_table([table(1.0, 7.0), table(9.0, 7.0), table(2.0, 7.0)])
    row = merged["layers"][0]
    assert row["update_s"] == pytest.approx(2e-3) and row["params"] == 3 and row["forward_flops_per_sample"] == 7.0
    assert row["timings"] == [{"micro_batch": 1, "forward_s": 2.0, "backward_s": 4.0},
                              {"micro_batch": 4, "forward_s": 6.0, "backward_s": 10.0}]
    assert merged["input_bytes_per_sample"] == 4.0
