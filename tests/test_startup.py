"""Start-up cost where users wait: `gpipe-sim --help` loads none of the heavy libraries, a simulate
loads only what its output needs, the package's public names load on first use, and the process
starts with one BLAS thread and ends without collecting what it frees."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gpipe_sim

HEAVY = ("numpy", "pydantic", "yaml", "simpy", "rich", "plotly", "pandas")
DEFAULT = Path(gpipe_sim.__file__).parent / "scenarios" / "default.yaml"


def _modules_after(code: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sys.modules))"],
                          capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_help_loads_no_heavy_library():
    loaded = _modules_after("from gpipe_sim.cli import build_parser, _load_extra_commands\n"
                            "_load_extra_commands()\nbuild_parser().format_help()")
    assert not loaded & set(HEAVY), loaded & set(HEAVY)
    assert "gpipe_sim.plan.compile" not in loaded


def test_a_simulate_loads_rich_only_for_its_text_summary():
    run = f"from gpipe_sim.cli import main\nmain(['simulate', {str(DEFAULT)!r}, '--json', '--no-timeline'])"
    loaded = _modules_after(run)
    assert "numpy" in loaded and "pydantic" in loaded  # the run itself happened
    assert not loaded & {"rich", "simpy", "plotly", "pandas", "torch"}, loaded & {"rich", "simpy", "plotly", "pandas"}
    assert "rich" in _modules_after(run.replace(", '--json', '--no-timeline'", ""))


def test_reading_a_scenario_loads_no_output_or_engine_library():
    loaded = _modules_after("from gpipe_sim.scenario.command_scenario import load_command_scenario\n"
                            f"load_command_scenario({str(DEFAULT)!r})")
    assert "pydantic" in loaded
    assert not loaded & {"rich", "simpy", "plotly", "pandas", "gpipe_sim.plan.compile"}


def _program(body: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = ("import os, sys\nfrom gpipe_sim.process import launch_environment, run_program\n"
            f"def main():\n{body}\nrun_program(main)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


def test_the_program_runs_with_one_blas_thread_unless_the_user_set_it():
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    body = ("    print(os.environ['OPENBLAS_NUM_THREADS'], launch_environment().get('OPENBLAS_NUM_THREADS'))\n"
            "    return 3")
    done = _program(body, env)
    assert (done.returncode, done.stdout.split()) == (3, ["1", "None"])  # added, and not passed on to a timed child
    done = _program(body, {**env, "OPENBLAS_NUM_THREADS": "4"})
    assert (done.returncode, done.stdout.split()) == (3, ["4", "4"])  # the user's own setting is kept


def test_the_program_exits_with_its_status_and_frozen_objects():
    body = ("    import atexit, gc\n"
            "    atexit.register(lambda: print(gc.get_freeze_count() > 1000, flush=True))\n"
            "    sys.exit('usage: bad') if len(sys.argv) > 1 else print('ran')\n"
            "    return 0")
    done = _program(body, dict(os.environ))
    assert (done.returncode, done.stdout.split()) == (0, ["ran", "True"])
    code = done.args[-1].replace("run_program(main)", "sys.argv.append('x'); run_program(main)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (done.returncode, done.stderr.strip(), done.stdout.split()) == (1, "usage: bad", ["True"])


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


def test_plan_bench_large_needs_a_baseline_and_names_the_70b_question(tmp_path):
    from gpipe_sim.scenario.scenario import parse_scenario
    from gpipe_sim.waits import LARGE, LLAMA_70B_1024
    import yaml

    done = subprocess.run([sys.executable, "-m", "gpipe_sim.cli", "plan-bench", "--large"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("gpipe-sim: error: --large:"), done.stderr
    scenario = parse_scenario(yaml.safe_load(LLAMA_70B_1024))
    assert (scenario.model.layers, scenario.model.d_model, scenario.pipeline.batch_size) == (80, 8192, 1024)
    assert LARGE[0].argv(Path("."), tmp_path)[-3:] == ["--devices", "1024", "--quiet"]


def test_plan_bench_narrowings_need_a_baseline_and_narrow_the_8_gpu_question(tmp_path):
    from gpipe_sim.waits import NARROWED, NARROWINGS

    done = subprocess.run([sys.executable, "-m", "gpipe_sim.cli", "plan-bench", "--narrowings"], capture_output=True,
                          text=True)
    assert done.returncode == 2 and done.stderr.startswith("gpipe-sim: error: --narrowings:"), done.stderr
    assert len(NARROWED) == len(NARROWINGS)
    for wait, options in zip(NARROWED, NARROWINGS):
        argv = wait.argv(Path("/tree"), tmp_path)
        assert argv[:4] == ["plan", "/tree/scenarios/default.yaml", "--devices", "8"] and argv[-1] == "--quiet"
        assert argv[4:-1] == options.split() and options in wait.label
