"""gpipe-exec's command line: what-ifs with --set, readable figures, a warning on noisy measurements."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from gpipe_exec.cli import build_parser  # noqa: E402
from gpipe_exec.checks.validate import _shown, spread_warning  # noqa: E402


def test_every_option_has_help():
    parser = build_parser()
    for command in parser._subparsers._group_actions[0].choices.values():  # type: ignore[union-attr]
        for action in command._actions:
            if action.dest != "help":
                assert action.help, f"{command.prog} {action.option_strings or action.dest}"


def test_scenario_commands_take_set():
    parser = build_parser()
    for command in ("run", "profile", "validate"):
        args = parser.parse_args([command, "s.yaml", "--set", "pipeline.stages=2", "--set", "pipeline.micro_batches=4"]
                                 + (["--out", "t.yaml"] if command == "profile" else []))
        assert args.set == ["pipeline.stages=2", "pipeline.micro_batches=4"]


def test_figures_are_shown_in_their_units():
    assert _shown("step_time_s", 0.0415545) == "41.6 ms"
    assert "MiB" in _shown("stage0.peak_activation_bytes", 6.44301e6)
    assert _shown("throughput_samples_per_s", 771.2) == "771.20 samples/s"
    assert _shown("bubble_fraction", 0.12346) == "0.1235"


def test_noisy_measurements_are_flagged_with_advice():
    assert spread_warning([0.100, 0.101, 0.102]) == ""
    warning = spread_warning([0.099, 0.101, 0.140])
    assert warning.startswith("warning: the measured steps spread 41%") and "--rounds 3" in warning
    assert "\n" not in warning


def test_profile_options_say_the_profilers_defaults():
    """The profile command's help names the profiler's own defaults; its clocks are the profiler's."""
    from gpipe_exec.profile import CLOCKS, ProfileOptions

    parser = build_parser()
    profile = parser._subparsers._group_actions[0].choices["profile"]  # type: ignore[union-attr]
    actions = {a.dest: a for a in profile._actions}
    assert f"default {ProfileOptions.repeats};" in actions["repeats"].help
    assert tuple(actions["clock"].choices) == CLOCKS
    assert "(default;" in actions["clock"].help and ProfileOptions.clock == "thread"
    validate = parser._subparsers._group_actions[0].choices["validate"]  # type: ignore[union-attr]
    assert tuple({a.dest: a for a in validate._actions}["profile_clock"].choices) == CLOCKS
