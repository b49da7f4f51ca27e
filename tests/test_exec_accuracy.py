"""The accuracy study's random cases (deterministic per seed, every one runnable), the profiler's
choice of repeats, its clock, the average of the ranks' profiles, and the study's command line."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from gpipe_exec.execute import check_runnable  # noqa: E402
from gpipe_exec.profile import Stamps, average_tables, typical_repeats  # noqa: E402
from gpipe_exec.checks import accuracy  # noqa: E402
from gpipe_exec.checks.random_cases import (  # noqa: E402
    DEVICE_MAPS, FAMILIES, MAX_STEP_FLOPS, MIN_STEP_FLOPS, case_text, draw_cases, step_flops)
from gpipe_sim.schedule import schedule_family  # noqa: E402
from gpipe_sim.model.layers import layer_count  # noqa: E402


def _dump(cases: list) -> list[dict]:
    return [sc.model_dump() for sc in cases]


def test_random_cases_are_the_same_for_a_seed_and_differ_between_seeds() -> None:
    assert _dump(draw_cases(8, 11)) == _dump(draw_cases(8, 11))
    assert _dump(draw_cases(8, 11)) != _dump(draw_cases(8, 12))
    assert _dump(draw_cases(3, 11)) == _dump(draw_cases(8, 11))[:3]  # a prefix: N does not reshuffle
    assert _dump(draw_cases(4, 11, K=4)) != _dump(draw_cases(4, 11, K=2))


@pytest.mark.parametrize("K", [2, 4])
def test_every_random_case_is_a_runnable_scenario(K: int) -> None:
    cases = [sc for seed in range(3) for sc in draw_cases(8, seed, K)]
    for sc in cases:
        p = sc.pipeline
        assert p.stages == K and list(sc.mesh.rank_devices) == DEVICE_MAPS[K]
        assert schedule_family(p.schedule_name).problem(K, p.micro_batches, p.chunks) is None
        assert K * p.chunks <= layer_count(sc.model) and p.micro_batches <= p.batch_size
        assert MIN_STEP_FLOPS <= step_flops(sc) <= MAX_STEP_FLOPS
        check_runnable(sc)  # the executor's own check: a zoo model, a plan that compiles, memory
        assert case_text(sc).startswith(sc.model.preset)
    assert {sc.model.preset for sc in cases} == set(FAMILIES)
    assert len({sc.pipeline.schedule_name for sc in cases}) >= 5
    assert len({sc.pipeline.remat for sc in cases}) == 3


def test_typical_repeats_keep_the_middle_half_by_total() -> None:
    assert typical_repeats([3.0, 1.0, 2.0]) == [0, 1, 2]  # fewer than 4: all
    totals = [5.0, 1.0, 3.0, 2.0, 4.0, 100.0, 0.5, 2.5]
    ranked = sorted(range(len(totals)), key=totals.__getitem__)
    assert typical_repeats(totals) == sorted(ranked[2:6])  # 8 repeats: drop the 2 fastest, 2 slowest
    assert typical_repeats([1.0] * 5) == [1, 2, 3]  # ties: by position


def test_average_tables_averages_every_time_and_nothing_else() -> None:
    def table(scale: float) -> dict:
        return {"input_bytes_per_sample": 8.0, "layers": [
            {"name": "a", "params": 3, "update_s": 1.0 * scale, "backward_input_s_per_sample": 0.5 * scale,
             "timings": [{"micro_batch": 2, "forward_s": 2.0 * scale, "backward_s": 4.0 * scale,
                          "backward_input_s": 1.0 * scale, "backward_weight_s": 3.0 * scale}]},
            {"name": "b", "params": 0, "timings": [{"micro_batch": 2, "forward_s": 1.0 * scale,
                                                    "backward_s": 0.0}]}]}

    one, three = table(1.0), table(3.0)
    mean = average_tables([one, three])
    assert one == table(1.0)  # the inputs are left as they were
    a, b = mean["layers"]
    assert (a["update_s"], a["backward_input_s_per_sample"]) == (2.0, 1.0)
    assert a["timings"][0] == {"micro_batch": 2, "forward_s": 4.0, "backward_s": 8.0,
                               "backward_input_s": 2.0, "backward_weight_s": 6.0}
    assert b["timings"][0] == {"micro_batch": 2, "forward_s": 2.0, "backward_s": 0.0}
    assert (a["params"], mean["input_bytes_per_sample"]) == (3, 8.0)


def test_thread_clock_does_not_count_time_away_from_the_core() -> None:
    cpu = torch.device("cpu")
    for clock, at_least, below in (("thread", 0.0, 0.02), ("wall", 0.05, 10.0)):
        stamps = Stamps(cpu, clock)
        t0 = stamps.now()
        time.sleep(0.05)  # off the core, as when another process holds it
        assert at_least <= stamps.seconds(t0, stamps.now()) < below
    with pytest.raises(ValueError, match="clock"):
        Stamps(cpu, "sundial")


@pytest.mark.parametrize("argv, field", [
    (["--random", "2"], "--seed"),
    (["--random", "0", "--seed", "1"], "--random"),
    (["--random", "2", "--seed", "1", "--k", "3"], "--k"),
    (["--random", "2", "--seed", "1", "--rounds", "0"], "--rounds"),
    (["--random", "2", "--seed", "1", "--profile-clock", "sundial"], "--profile-clock"),
])
def test_study_refuses_bad_options_with_status_2(argv: list[str], field: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        accuracy.main(argv)
    assert exc.value.code == 2
    assert field in capsys.readouterr().err


def test_random_table_counts_cases_within_their_spread() -> None:
    def row(p: float, m: float, spread: float, pspread: float, memory: float = 0.01) -> dict:
        return {"case": "x", "predicted_step_s": p, "measured_step_s": m, "step_time_error": abs(p - m) / m,
                "measured_spread": spread, "predicted_spread": pspread, "memory_error": memory}

    text = accuracy.random_markdown([row(1.02, 1.0, 0.05, 0.01), row(0.9, 1.0, 0.05, 0.10, 0.03),
                                     row(1.0, 1.0, 0.0, 0.0, 0.0)])
    assert "| +2.0% | 5.0% | 1.0% | yes | 1.00% |" in text and "| -10.0% | 5.0% | 10.0% | no | 3.00% |" in text
    assert "(worst stage of each case): median 1.00%, worst 3.00%" in text
    assert "median error 2.0%, worst 10.0%; 2/3 within their measured spread" in text
    assert "2/3 cases predicted no more spread than measured" in text


@pytest.mark.slow
def test_two_random_cases_end_to_end() -> None:
    from gpipe_exec.launch.spawn import LaunchOptions

    cases = draw_cases(2, 5)
    rows = accuracy.run_cases(cases, steps=2, warmup=1, options=LaunchOptions(comm_timeout_s=120),
                              calibration=None, rounds=2)
    assert [r["case"] for r in rows] == [case_text(sc) for sc in cases]
    for r in rows:
        assert r["predicted_step_s"] > 0 and r["measured_step_s"] > 0
        assert len(r["predicted_round_s"]) == len(r["measured_round_s"]) == 2
        assert r["predicted_spread"] >= 0 and r["measured_spread"] >= 0
