"""`gpipe-exec selfcheck`: a small built-in grid validated on this machine's own devices, one table and a summary."""

from __future__ import annotations

import io
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from gpipe_exec.launch.devices import device_type
from gpipe_exec.launch.spawn import LaunchOptions
from gpipe_sim.spec.scenario import Scenario, parse_scenario
from gpipe_sim.spec.units import format_bytes, format_seconds

# Targets the selfcheck reports against (issue 23's for a validated GPU): step time median and worst,
# peak memory of every stage.
STEP_MEDIAN_TARGET, STEP_WORST_TARGET, MEMORY_TARGET = 0.03, 0.08, 0.03


def _transformer(layers: int, d_model: int, seq: int, attention: str = "flash", vocab: int = 8192) -> dict[str, Any]:
    return {"preset": "transformer", "layers": layers, "d_model": d_model, "d_ff": 4 * d_model,
            "heads": max(1, d_model // 64), "seq_len": seq, "vocab": vocab, "attention": attention}


def _case(model: dict[str, Any], K: int, M: int, batch: int, *, schedule: str = "1f1b", remat: str = "none",
          dtype: str = "bf16", chunks: int = 1, hardware: str = "h100-sxm") -> dict[str, Any]:
    return {"model": model, "hardware": {"preset": hardware, "stage_to_device": [0] * K},
            "pipeline": {"stages": K, "chunks": chunks, "micro_batches": M, "batch_size": batch,
                         "schedule": schedule, "remat": remat},
            "training": {"optimizer": "adam", "dtype": dtype}}


def gpu_cases() -> list[tuple[str, dict[str, Any]]]:
    """The GPU grid: every stage on GPU 0 (K=2 shares it), bf16 and fp32 (TF32 off), flash and
    standard attention, remat none and always, large and host-bound small micro-batches, an
    interleaved and a zero-bubble schedule, an mlp and a convnet; a few minutes on one H100."""
    return [
        ("transformer d1024 bf16 flash K=1", _case(_transformer(8, 1024, 1024), 1, 4, 16)),
        ("transformer d768 fp32 standard remat K=1", _case(_transformer(6, 768, 512, "standard"), 1, 4, 8,
                                                           remat="always", dtype="fp32")),
        ("transformer d256 bf16 1 sample (host-bound) K=1", _case(_transformer(4, 256, 128), 1, 8, 8)),
        ("transformer d1024 bf16 1f1b K=2 on GPU 0", _case(_transformer(8, 1024, 512), 2, 8, 16)),
        ("transformer d768 bf16 zb_h1 K=2 on GPU 0", _case(_transformer(8, 768, 512), 2, 8, 16, schedule="zb_h1")),
        ("transformer d768 bf16 interleaved v=2 K=2", _case(_transformer(8, 768, 512), 2, 4, 8,
                                                             schedule="interleaved_1f1b", chunks=2)),
        ("mlp w4096 bf16 K=1", _case({"preset": "mlp", "layers": 8, "width": 4096, "input_dim": 1024,
                                      "num_classes": 1000}, 1, 4, 256)),
        ("convnet c64 fp32 K=1", _case({"preset": "convnet", "layers": 6, "channels": 64, "image_size": 64,
                                        "num_classes": 100}, 1, 4, 64, dtype="fp32")),
    ]


def cpu_cases() -> list[tuple[str, dict[str, Any]]]:
    """The CPU grid: small models that run in seconds, K=1 and K=2 on this machine's cores."""
    tiny = _transformer(4, 64, 32, "standard", vocab=256)
    return [
        ("transformer d64 K=1", _case(tiny, 1, 4, 8, hardware="cpu", dtype="fp32")),
        ("transformer d64 1f1b K=2", {**_case(tiny, 2, 4, 8, hardware="cpu", dtype="fp32"),
                                      "hardware": {"preset": "cpu", "stage_to_device": [0, 1]}}),
        ("mlp w256 K=1", _case({"preset": "mlp", "layers": 4, "width": 256, "input_dim": 64, "num_classes": 10},
                               1, 4, 32, hardware="cpu", dtype="fp32")),
    ]


@dataclass
class SelfcheckRow:
    """One case: predicted and measured step, the worst stage's peak-memory error, or why it failed."""

    name: str
    predicted_step_s: float = float("nan")
    measured_step_s: float = float("nan")
    memory_error: float = float("nan")  # the largest |predicted - measured| / measured over the stages
    worst_stage_bytes: float = float("nan")
    step_error: float = float("nan")  # |predicted - measured| / measured step (validate.relative_error)
    error: str = ""


def run_selfcheck(cases: list[tuple[str, Scenario]], options: LaunchOptions, *, steps: int = 5,
                  progress: Callable[[str], None] | None = None) -> list[SelfcheckRow]:
    """Validate each case (profile on its devices, predict, run, compare: `validate`); a case that
    fails is reported with its one-line reason and the others go on."""
    from gpipe_exec.checks.validate import validate
    from gpipe_sim.errors import GpipeError, first_line

    rows = []
    for i, (name, scenario) in enumerate(cases):
        if progress:
            progress(f"[{i + 1}/{len(cases)}] {name}")
        try:
            v = validate(scenario, steps=steps, warmup=2, options=options)
        except (GpipeError, RuntimeError, ValueError) as exc:
            rows.append(SelfcheckRow(name, error=first_line(exc)))
            continue
        errors = v.relative_error  # validate's own comparison, the one `gpipe-exec validate` prints
        stages = v.measured.result.stages
        memory = [errors[f"stage{s.index}.peak_memory_bytes"] for s in stages if s.peak_memory_bytes > 0]
        rows.append(SelfcheckRow(name, v.predicted.step_time_s, v.measured.result.step_time_s,
                                 max(memory, default=0.0), max(s.peak_memory_bytes for s in stages),
                                 step_error=errors["step_time_s"]))
    return rows


def selfcheck_text(rows: list[SelfcheckRow], device: str, elapsed_s: float) -> str:
    """Predicted vs measured per case, then the step-time median and worst error and the worst
    peak-memory error against their targets."""
    table = Table(title=f"gpipe-exec selfcheck on {device}")
    for col in ("case", "predicted step", "measured step", "step error", "peak memory", "memory error"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for r in rows:
        if r.error:
            table.add_row(r.name, "-", "-", "failed", "-", r.error[:60])
            continue
        table.add_row(r.name, format_seconds(r.predicted_step_s), format_seconds(r.measured_step_s),
                      f"{100 * r.step_error:.1f}%", format_bytes(r.worst_stage_bytes), f"{100 * r.memory_error:.1f}%")
    buf = io.StringIO()
    console = Console(file=buf, width=120, force_terminal=False)
    console.print(table)
    ran = [r for r in rows if not r.error]
    if ran:
        step = [r.step_error for r in ran]
        memory = max(r.memory_error for r in ran)
        console.print(
            f"step time: median error {100 * statistics.median(step):.1f}% (target {100 * STEP_MEDIAN_TARGET:.0f}%), "
            f"worst {100 * max(step):.1f}% (target {100 * STEP_WORST_TARGET:.0f}%); "
            f"peak memory: worst stage {100 * memory:.1f}% (target {100 * MEMORY_TARGET:.0f}%)")
    failed = len(rows) - len(ran)
    console.print(f"{len(ran)} of {len(rows)} cases ran{f', {failed} failed' if failed else ''} in {elapsed_s:.0f} s")
    return buf.getvalue().rstrip()


def selfcheck(options: LaunchOptions, *, steps: int = 5, progress: Callable[[str], None] | None = None) -> str:
    """Run the grid for this machine's device type (GPU grid on CUDA, CPU grid otherwise) and
    return the report."""
    kind = device_type(options.device)
    cases = [(name, parse_scenario(data)) for name, data in (gpu_cases() if kind == "cuda" else cpu_cases())]
    start = time.monotonic()
    rows = run_selfcheck(cases, options, steps=steps, progress=progress)
    where = kind
    if kind == "cuda":
        import torch

        where = f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}, TF32 off"
    return selfcheck_text(rows, where, time.monotonic() - start)
