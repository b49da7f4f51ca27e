"""The commands users wait for, timed as whole processes beside a baseline checkout, as ratios.

`gpipe-sim bench --against DIR` times start-up (`--help`, a simulate of the default scenario) and
the published runs of scenarios/scale/; `gpipe-sim plan-bench --against DIR` the planner's
questions. DIR is another checkout (a `git worktree add DIR OLD_COMMIT`); each command runs with
DIR's code and with this checkout's in turn (which goes first alternates), `repeat` times, and the
report gives each side's median [min-max] wall and CPU seconds and the ratio of the medians, this /
against. A command the baseline refuses (a scenario it cannot read) is reported so, without a ratio.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from gpipe_sim.errors import GpipeError
from gpipe_sim.process import launch_environment

HERE = Path(__file__).resolve().parents[1]  # this checkout

# The planner's 16-GPU question (docs/guide/planner.md): a 1.3B GPT on 2 nodes of 8 A100-80GB, one
# 200 Gb/s NIC a node, global batch 512; the NIC written in bytes (25 GB/s), which every version reads alike.
GPT_16 = """\
model: {preset: transformer, layers: 24, d_model: 2048, d_ff: 8192, heads: 16, seq_len: 2048, vocab: 50257}
hardware: {preset: a100-80gb, devices_per_node: 8, network: {bandwidth: 25 GB/s, per: node, nics: 1}}
pipeline: {stages: 1, micro_batches: 1, batch_size: 512}
training: {dtype: bf16, optimizer: adam}
"""
# A Llama-3-8B question on 64 H100s (8 DGX H100 nodes), global batch 512 of 8,192 tokens: 832,466
# configurations at d2209e2.
LLAMA_8B_64 = """\
model: {preset: llama3-8b, seq_len: 8192}
hardware: {preset: dgx-h100}
pipeline: {stages: 1, micro_batches: 1, batch_size: 512}
training: {dtype: bf16, optimizer: adam}
"""
# The same on Llama-3-70B and 1,024 H100s (128 DGX H100 nodes), global batch 1,024: 560,004
# configurations at dca0142 (`plan-bench --large`: it takes minutes).
LLAMA_70B_1024 = LLAMA_8B_64.replace("llama3-8b", "llama3-70b").replace("batch_size: 512", "batch_size: 1024")


@dataclass(frozen=True)
class Wait:
    """One command a user waits for: `argv(tree, tmp)` gives its gpipe-sim arguments for the
    checkout `tree` (its own default scenario) with scratch files in `tmp`."""

    label: str
    argv: Callable[[Path, Path], list[str]]


def _written(tmp: Path, name: str, text: str) -> str:
    """`text` as the scenario file `name` in `tmp`."""
    path = tmp / name
    path.write_text(text)
    return str(path)


# The cluster presets the published runs name, written out (as presets/hardware.yaml gives them)
# for checkouts older than those presets; the NICs in bytes, which every version reads alike. (A
# checkout older than the model presets, llama3-405b, refuses that run: reported so.)
_NODES = {"dgx-a100": ("a100-80gb", "25 GB/s"), "dgx-h100": ("h100-sxm", "50 GB/s")}


def _published(name: str, tmp: Path) -> str:
    """scenarios/scale/NAME.yaml with its cluster preset written out, as a file in `tmp`."""
    import yaml

    data = yaml.safe_load((HERE / "scenarios" / "scale" / f"{name}.yaml").read_text())
    base, nic = _NODES[data["hardware"]["preset"]]
    data["hardware"] = {"preset": base, "devices_per_node": 8,
                        "network": {"bandwidth": nic, "latency_s": 9.6e-6, "per": "node", "nics": 8}}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


STARTUP = (
    Wait("gpipe-sim --help", lambda tree, tmp: ["--help"]),
    Wait("simulate, the default scenario", lambda tree, tmp: ["simulate", str(tree / "scenarios/default.yaml")]),
    Wait("simulate, Megatron-LM 1T on 3,072 A100s", lambda tree, tmp: ["simulate", _published("megatron-1t", tmp)]),
    Wait("simulate, Llama-3-405B-like on 16,384 H100s",
         lambda tree, tmp: ["simulate", _published("llama3-405b", tmp)]),
)
PLANNER = (
    Wait("plan: 1.3B GPT on 16 A100s, T searched",
         lambda tree, tmp: ["plan", _written(tmp, "gpt16.yaml", GPT_16), "--devices", "16", "--quiet"]),
    Wait("plan: Llama-3-8B on 64 H100s",
         lambda tree, tmp: ["plan", _written(tmp, "llama8b.yaml", LLAMA_8B_64), "--devices", "64", "--quiet"]),
    Wait("plan: default scenario on 8 devices",
         lambda tree, tmp: ["plan", str(tree / "scenarios/default.yaml"), "--devices", "8", "--quiet"]),
    Wait("plan: the same, --stages 8 --tensor-parallel 1",
         lambda tree, tmp: ["plan", str(tree / "scenarios/default.yaml"), "--devices", "8", "--stages", "8",
                            "--tensor-parallel", "1", "--quiet"]),
)
# `plan-bench --narrowings`: the default scenario's 8-device question narrowed by each option a user
# may give it (none of them should take longer than the whole question)
NARROWINGS = ("--stages 8", "--stages 4", "--stages 2", "--tensor-parallel 1", "--tensor-parallel 2",
              "--schedules 1f1b", "--remat none", "--remat always", "--zero 0", "--micro-batches 8", "--even-m",
              "--partitions uniform", "--max-chunks 1")


def _narrowed(options: str) -> Wait:
    """The default scenario's 8-device question with `options`."""
    return Wait(f"plan: the same, {options}",
                lambda tree, tmp: ["plan", str(tree / "scenarios/default.yaml"), "--devices", "8", *options.split(),
                                   "--quiet"])


NARROWED = tuple(_narrowed(options) for options in NARROWINGS)
# `plan-bench --large`: the 1,024-GPU question too
LARGE = (
    Wait("plan: Llama-3-70B on 1,024 H100s",
         lambda tree, tmp: ["plan", _written(tmp, "llama70b.yaml", LLAMA_70B_1024), "--devices", "1024", "--quiet"]),
)


def checkout(path: str) -> Path:
    """The baseline checkout `--against` names; GpipeError naming the option where it holds no gpipe_sim."""
    tree = Path(path).expanduser().resolve()
    if not (tree / "gpipe_sim" / "cli.py").is_file():
        raise GpipeError(f"--against: {path!r} is not a checkout of this project (no gpipe_sim/cli.py in it)")
    return tree


def timed_child(command: list[str], tree: Path, cwd: str, stdin: str | None = None
                ) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """(wall seconds, CPU seconds, the finished process) of `command` run with `tree` first on
    PYTHONPATH, in `cwd` (not a checkout: `python -m` and `-c` put the working directory before
    PYTHONPATH), reading `stdin`."""
    launched = launch_environment()
    env = dict(launched, PYTHONPATH=os.pathsep.join([str(tree), launched.get("PYTHONPATH", "")]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, input=stdin)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, done


def spread(values: Sequence[float]) -> str:
    """Median [min-max], in seconds."""
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def compare_waits(against: Path, waits: Sequence[Wait], repeat: int = 3) -> str:
    """Each of `waits` as a whole `gpipe-sim` process with `against`'s code and this checkout's,
    alternately, `repeat` times (module docstring)."""
    if repeat < 1:
        raise GpipeError(f"--repeat: must be >= 1, got {repeat}")
    trees = {"against": Path(against).resolve(), "this": HERE}
    walls: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    failed: dict[tuple[str, str], str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeat):
            for wait in waits:
                for name in ("against", "this") if i % 2 == 0 else ("this", "against"):
                    command = [sys.executable, "-m", "gpipe_sim.cli", *wait.argv(trees[name], Path(tmp))]
                    wall, cpu, done = timed_child(command, trees[name], tmp)
                    if done.returncode not in (0, 1):  # 1: the planner found nothing that fits
                        failed[(wait.label, name)] = (f"exit {done.returncode}: "
                                                      + (done.stderr.strip().splitlines() or [""])[-1][:120])
                    walls.setdefault((wait.label, name), []).append(wall)
                    cpus.setdefault((wait.label, name), []).append(cpu)
    lines = [f"against {trees['against']} / this {HERE}: {repeat} alternating runs "
             "(seconds: median [min-max]; ratio of the medians, this / against)"]
    for wait in waits:
        lines.append(f"  {wait.label}")
        if (wait.label, "this") in failed or (wait.label, "against") in failed:
            for name in ("against", "this"):
                lines.append(f"    {name}: " + failed.get((wait.label, name), f"wall {spread(walls[(wait.label, name)])}"
                                                                            f"  CPU {spread(cpus[(wait.label, name)])}"))
            continue
        for figure, table in (("wall", walls), ("CPU ", cpus)):
            old, new = table[(wait.label, "against")], table[(wait.label, "this")]
            lines.append(f"    {figure} against {spread(old)}  this {spread(new)}  "
                         f"ratio {statistics.median(new) / max(statistics.median(old), 1e-9):.2f}")
    try:
        lines.append("load average after: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
                     + f" ({os.cpu_count()} cores)")
    except OSError:
        pass
    return "\n".join(lines)
