"""Start-up cost where users wait: `gpipe-sim --help` loads none of the heavy libraries, and the
package's public names load on first use."""

from __future__ import annotations

import subprocess
import sys

import gpipe_sim

HEAVY = ("numpy", "pydantic", "simpy", "rich", "plotly", "pandas")


def _modules_after(code: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sys.modules))"],
                          capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_help_loads_no_heavy_library():
    loaded = _modules_after("from gpipe_sim.cli import build_parser, _load_extra_commands\n"
                            "_load_extra_commands()\nbuild_parser().format_help()")
    assert not loaded & set(HEAVY), loaded & set(HEAVY)
    assert "gpipe_sim.plan.compile" not in loaded


def test_help_prints_every_command():
    out = subprocess.run([sys.executable, "-m", "gpipe_sim.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for command in ("simulate", "schedule", "presets", "bench", "sweep", "plan", "max-model", "paper"):
        assert command in out.stdout


def test_public_names_resolve_on_first_use():
    assert "numpy" not in _modules_after("import gpipe_sim")
    for name in gpipe_sim.__all__:
        assert getattr(gpipe_sim, name) is not None
    from gpipe_sim.api import simulate
    assert gpipe_sim.simulate is simulate
    assert set(gpipe_sim.__all__) <= set(dir(gpipe_sim))


def test_waits_are_timed_beside_a_baseline_checkout_as_ratios(tmp_path):
    from gpipe_sim.waits import HERE, Wait, compare_waits

    text = compare_waits(HERE, [Wait("help", lambda tree, tmp: ["--help"]),
                                Wait("refused", lambda tree, tmp: ["simulate", str(tmp_path / "none.yaml")])], repeat=1)
    assert "ratio" in text.split("refused")[0]  # both sides ran: a ratio of medians
    assert "against: exit 2: gpipe-sim: error:" in text  # a command refused: said, with no ratio
    assert "ratio" not in text.split("refused")[1]


def test_bench_against_a_directory_without_the_project_is_one_line(tmp_path):
    for command in (["bench", "--against", str(tmp_path)], ["plan-bench", "--against", str(tmp_path)]):
        done = subprocess.run([sys.executable, "-m", "gpipe_sim.cli", *command], capture_output=True, text=True)
        assert done.returncode == 2 and done.stderr.startswith("gpipe-sim: error: --against:"), done.stderr
        assert len(done.stderr.splitlines()) == 1
