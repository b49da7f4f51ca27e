"""Fuzz: every input gives a finite result (exit 0) or one line naming the field (exit 2), never a
traceback, a hang, an infinite or NaN figure, or a warning.

Scenarios of every model preset and every registered schedule are generated with valid values,
values at and beyond the limits, and hostile ones (wrong types, NaN, infinity, 10**400, keys with
line breaks, missing and unreadable files), written as YAML or JSON, and run through the call the
CLI makes (`gpipe_sim.cli.main`, in this process). A few hundred examples by default; thousands
with `-m slow`. `python tests/test_fuzz.py N` runs N examples and prints how many scenarios were
generated, how each ended, and every defect (without stopping at the first).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import io
import json
import math
import re
import shutil
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpipe_sim.cli import main
from gpipe_sim.schedule import SCHEDULES

FILES = Path(tempfile.mkdtemp(prefix="gpipe-fuzz-"))
atexit.register(shutil.rmtree, FILES, True)
SCHEDULE_NAMES = sorted(SCHEDULES)
HARDWARE_PRESETS = ["ideal", "tpuv2", "tpuv3", "p100-pcie", "v100", "a100-80gb", "h100-sxm", "h200", "cpu"]
# What a refusal must never show: pydantic's internal path segments.
INTERNALS = re.compile(r"literal\[|function-(after|before|wrap|plain)|\[key\]|tuple\[|union\[|"
                       r"lax-or-strict|json-or-python|list\[|dict\[|constrained-")


def _prepare_files() -> None:
    (FILES / "table.yaml").write_text(yaml.safe_dump({"layers": [
        {"name": f"l{i}", "params": 1000 * (i + 1), "forward_s_per_sample": 1e-4, "backward_s_per_sample": 2e-4,
         "activation_bytes_per_sample": 1e5, "output_bytes_per_sample": 1e4} for i in range(12)]}))
    (FILES / "table.json").write_text(json.dumps([
        {"name": f"l{i}", "forward_flops_per_sample": 1e9, "backward_flops_per_sample": 2e9, "params": 10}
        for i in range(6)]))
    (FILES / "latin1.yaml").write_bytes(b"layers:\n  - name: caf\xe9\n")
    (FILES / "deep.yaml").write_text("layers: " + "[" * 200 + "]" * 200 + "\n")
    (FILES / "bomb.yaml").write_text(
        "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"{n}: &{n} [{', '.join(['*' + p] * 10)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))
        + "layers: *i\n")
    (FILES / "empty.yaml").write_text("")
    (FILES / "scalar.yaml").write_text("42\n")


_prepare_files()

# ---------------------------------------------------------------------------------------------
# values

HOSTILE = st.sampled_from([
    None, True, False, -1, 0, 1, -(10**400), 10**400, 2**63, 9.5, -0.0, 5e-324, 1e308, 1e-308,
    math.inf, -math.inf, math.nan, "", "x", "a\nb", "1e400", "inf", "nan", "-5", "7", "10 GiB",
    "5 us", "3 parsecs", "\x00", "é" * 3, [], {}, [1, 2], {"a": 1}, {"a\nb": 1}, [[[[]]]],
])


def mostly(valid: st.SearchStrategy, hostile: st.SearchStrategy = HOSTILE, odds: int = 24) -> st.SearchStrategy:
    """`valid` about `odds` times in `odds + 1`, else a hostile value. (The hostile branch is a
    middle draw: hypothesis favours the ends of a range.)"""
    return st.integers(0, odds).flatmap(lambda i: hostile if i == odds // 2 else valid)


def fields(required: dict[str, st.SearchStrategy], optional: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """A mapping with every required key and some optional ones (each may hold a hostile value),
    and now and then a key that does not exist."""
    base = st.fixed_dictionaries({k: mostly(v) for k, v in required.items()},
                                 optional={k: mostly(v) for k, v in optional.items()})
    extra = st.sampled_from(["bogus", "a\nb", "Layers", "x" * 80, "k\u2028"])
    return st.tuples(base, st.integers(0, 40), extra).map(lambda t: {**t[0], t[2]: 1} if t[1] == 20 else t[0])


small_int = st.integers(1, 64)
seconds = st.one_of(st.floats(1e-9, 1e-2), st.sampled_from([0, 1e-3, 1e-15, 1e6, "1e-3"]))
bytes_ = st.one_of(st.floats(0, 1e8, allow_nan=False), st.sampled_from([0, 1e6, 1e30, 1e29]))
flops = st.one_of(st.floats(1, 1e13, allow_nan=False), st.sampled_from([1e9, 1e30, 1.0]))
quantity_bytes = st.sampled_from([1e9, "16 GiB", "80 GB", "inf", "unlimited", 1, "1 TiB", 1e30])
quantity_bw = st.sampled_from([1e9, "900 GB/s", "inf", "12.5 GB/s", 1.0, 1e30, "1 B/s"])
quantity_s = st.sampled_from([0, 1e-6, "5 us", "1 ms", 1e6, "0 s", 1e-20])
fraction = st.one_of(st.floats(1e-6, 1.0, allow_nan=False), st.sampled_from([1.0, 0.5, 1e-6]))


def model_strategy() -> st.SearchStrategy:
    uniform = fields({"preset": st.just("uniform")}, {
        "layers": small_int, "forward_s_per_sample": seconds, "backward_s_per_sample": seconds,
        "params_per_layer": st.integers(0, 10**9), "activation_bytes_per_sample": bytes_,
        "output_bytes_per_sample": bytes_})
    transformer = fields({"preset": st.just("transformer")}, {
        "layers": st.integers(1, 32), "d_model": st.sampled_from([64, 128, 256, 1024, 10**9]),
        "d_ff": st.integers(1, 8192), "heads": st.sampled_from([1, 2, 4, 8, 16]),
        "seq_len": st.sampled_from([1, 128, 512, 10**9]), "vocab": st.integers(1, 10**9)})
    amoebanet = fields({"preset": st.just("amoebanet")}, {
        "layers": st.sampled_from([3, 6, 18, 36, 4]), "filters": st.integers(1, 512),
        "image_size": st.integers(1, 512), "num_classes": st.integers(1, 10**9)})
    mlp = fields({"preset": st.just("mlp")}, {
        "layers": small_int, "width": st.integers(1, 10**9), "input_dim": st.integers(1, 4096),
        "num_classes": st.integers(1, 1000)})
    convnet = fields({"preset": st.just("convnet")}, {
        "layers": small_int, "channels": st.integers(1, 10**9), "image_size": st.integers(1, 10**9),
        "num_classes": st.integers(1, 1000)})
    timing = fields({"micro_batch": st.integers(1, 64), "forward_s": seconds, "backward_s": seconds}, {})
    row = st.one_of(
        fields({"name": st.text(max_size=8), "forward_s_per_sample": seconds, "backward_s_per_sample": seconds},
               {"params": st.integers(0, 10**15), "activation_bytes_per_sample": bytes_,
                "output_bytes_per_sample": bytes_, "kernels": st.integers(0, 10**6), "update_s": seconds}),
        fields({"name": st.text(max_size=8), "forward_flops_per_sample": flops, "backward_flops_per_sample": flops},
               {"params": st.integers(0, 10**15), "output_bytes_per_sample": bytes_, "kernels": st.integers(0, 50)}),
        fields({"name": st.just("t"), "timings": st.lists(timing, min_size=1, max_size=3)}, {}),
    )
    inline = fields({"preset": st.just("table"), "layers": st.lists(row, min_size=1, max_size=12)},
                    {"input_bytes_per_sample": bytes_})
    by_path = fields({"preset": st.just("table"), "path": st.sampled_from([
        str(FILES / "table.yaml"), str(FILES / "table.json"), str(FILES / "missing.yaml"),
        str(FILES / "latin1.yaml"), str(FILES / "deep.yaml"), str(FILES / "bomb.yaml"),
        str(FILES / "empty.yaml"), str(FILES / "scalar.yaml"), "/dev/zero", str(FILES), 12, ["a.yaml"]])}, {})
    return mostly(st.one_of(uniform, transformer, amoebanet, mlp, convnet, inline, by_path),
                  st.one_of(st.just({"preset": "resnet"}), st.just({}), HOSTILE), odds=12)


def hardware_strategy(stages: int) -> st.SearchStrategy:
    accelerator = fields({}, {
        "peak_flops": st.dictionaries(st.sampled_from(["fp32", "bf16", "fp16"]), mostly(flops),
                                      min_size=1, max_size=3),
        "efficiency": fraction, "memory_bytes": quantity_bytes, "usable_memory_fraction": fraction,
        "memory_bandwidth": quantity_bw, "kernel_overhead_s": quantity_s})
    link = fields({}, {"bandwidth": quantity_bw, "latency_s": quantity_s})
    host = fields({}, {"action_s": quantity_s, "send_s": quantity_s, "recv_s": quantity_s,
                       "copy_bandwidth": quantity_bw, "on_device": st.booleans()})
    n_links = st.sampled_from([max(stages - 1, 0), max(stages - 1, 0), 0, stages + 1])
    return fields({"preset": mostly(st.sampled_from(HARDWARE_PRESETS), st.just("tpu-v9"), odds=12)}, {
        "accelerator": accelerator, "link": link, "host": host,
        "links": n_links.flatmap(lambda n: st.lists(fields({"bandwidth": quantity_bw}, {"latency_s": quantity_s}),
                                                    min_size=n, max_size=n)),
        "stage_to_device": st.lists(mostly(st.integers(0, stages), st.sampled_from([65535, 65536, 2**63])),
                                    min_size=stages, max_size=stages),
        "devices_per_node": st.sampled_from([1, 2, 8, 65536]),
        "network": fields({"bandwidth": quantity_bw}, {"latency_s": quantity_s}),
    })


def pipeline_strategy(stages: int) -> st.SearchStrategy:
    return fields({"stages": st.just(stages)}, {
        "chunks": st.sampled_from([1, 1, 2, 3, 4]), "micro_batches": st.integers(1, 32),
        "data_parallel": st.sampled_from([1, 2, 4]),
        "batch_size": st.integers(1, 64), "schedule": st.sampled_from(SCHEDULE_NAMES + ["zigzag"]),
        "remat": st.sampled_from(["none", "except_last", "always", "sometimes"]),
        "partition": st.one_of(st.sampled_from(["uniform", "time", "memory", "fit", "foo"]),
                               st.lists(st.integers(0, 8), min_size=1, max_size=8)),
    })


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    stages = draw(st.sampled_from([1, 1, 2, 2, 3, 4, 8]))
    data: dict[str, Any] = {}
    for name, strategy in (("model", model_strategy()), ("hardware", hardware_strategy(stages)),
                           ("pipeline", pipeline_strategy(stages)),
                           ("training", fields({}, {"optimizer": st.sampled_from(["sgd", "adam", "lion"]),
                                                    "dtype": st.sampled_from(["fp32", "bf16", "fp16", "fp8"]),
                                                    "zero": st.sampled_from([0, 1, 2])}))):
        if draw(st.integers(0, 9)):
            data[name] = draw(strategy)
    pipeline, hardware = data.get("pipeline"), data.get("hardware")
    replicas = pipeline.get("data_parallel") if isinstance(pipeline, dict) else None
    # a placement lists every replica's devices: only for a D a list can hold (a hostile D, 10**400,
    # is refused without one)
    if isinstance(hardware, dict) and isinstance(replicas, int) and 1 < replicas <= 64 and draw(st.booleans()):
        hardware.pop("stage_to_device", None)  # one or the other
        hardware["placement"] = draw(st.lists(st.lists(mostly(st.integers(0, 2 * stages * replicas)),
                                                       min_size=stages, max_size=stages),
                                              min_size=replicas, max_size=replicas))
    return data


# One degenerate value put into an otherwise generated scenario (the crash classes of issue 16).
DEGENERATE = st.sampled_from([
    ("hardware.link.latency_s", math.inf), ("hardware.accelerator.kernel_overhead_s", math.inf),
    ("hardware.accelerator.efficiency", 5e-324), ("model.output_bytes_per_sample", 1e308),
    ("hardware.accelerator.peak_flops", {"fp32": math.inf}), ("hardware.accelerator.peak_flops", {}),
    ("hardware.links", []), ("hardware.accelerator.memory_bytes", 10**400), ("model.width", 10**400),
    ("model.vocab", 10**400), ("pipeline.batch_size", 10**400), ("hardware.stage_to_device", [2**63]),
    ("hardware.stage_to_device", [0, 10**12]), ("hardware.host.send_s", 1e300),
    ("hardware.link.bandwidth", 5e-324), ("hardware.accelerator.memory_bandwidth", 1e-300),
    ("model.forward_s_per_sample", 0.0), ("model.backward_s_per_sample", 5e-324),
    ("model.layers", 10**6), ("model.layers", 10**308), ("model.path", 12), ("model.path", ["a.yaml"]),
    ("model.path", "/dev/zero"), ("pipeline.partition", "bogus"), ("pipeline.micro_batches", 10**7),
    ("hardware.link.latency_s", "1e400 s"), ("hardware.accelerator.peak_flops", {"fp64": 1e12}),
    ("pipeline.stages", 10**4), ("hardware.host.copy_bandwidth", 1e-310),
])


def _inject(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    node = data
    keys = dotted.split(".")
    for key in keys[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[keys[-1]] = value
    return data


RAW_FILES = st.sampled_from([
    b"model:\n  preset: caf\xe9\n",  # not UTF-8
    b"pipeline:\n  stages: " + b"9" * 5000 + b"\n",  # over Python's digit limit
    b"a: " + b"[" * 490 + b"]" * 490 + b"\n",  # deep YAML
    b"[" * 992 + b"]" * 992,  # deep (as YAML; JSON below)
    b"", b"- 1\n- 2\n", b"just a string\n", b"model: [\n", b"\t\x00\x01",
    b"model: &a {preset: uniform}\nhardware: *a\n",
    b"model: {preset: uniform, \"a\\nb\": 1}\n",
    b'model: {preset: uniform, layers: !!float ""}\n',  # PyYAML raises IndexError on it
    b"x: &a [1, *a]\n",  # a recursive alias
])


@st.composite
def inputs(draw: st.DrawFn) -> tuple[bytes, str]:
    """File bytes and suffix: a generated scenario as YAML or JSON, or a hostile file."""
    choice = draw(st.integers(0, 19))
    if choice == 10:
        return draw(RAW_FILES), draw(st.sampled_from([".yaml", ".json"]))
    data = draw(scenarios())
    if choice in (12, 13, 14):
        data = _inject(data, *draw(DEGENERATE))
    if choice <= 5:
        return json.dumps(data).encode(), ".json"  # NaN and Infinity written as JSON allows
    return yaml.safe_dump(data, allow_unicode=draw(st.booleans())).encode(), ".yaml"


# ---------------------------------------------------------------------------------------------
# the rule


def _strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def _numbers(value: Any):
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _numbers(v)


def run_cli(raw: bytes, suffix: str, engine: str, as_json: bool) -> tuple[int | str, str, str, list[str], float]:
    """Run `gpipe-sim simulate` on the file in this process: status (or the escaped exception),
    stdout, stderr, warnings raised, seconds."""
    path = FILES / f"scenario{suffix}"
    path.write_bytes(raw)
    out, err = io.StringIO(), io.StringIO()
    argv = ["simulate", str(path), "--engine", engine] + (["--json", "--no-timeline"] if as_json else [])
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                status: int | str = main(argv)
        except BaseException as exc:  # noqa: BLE001 - a defect, recorded
            status = f"raised {type(exc).__name__}: {str(exc)[:200]}"
    seconds = time.perf_counter() - t0
    return status, out.getvalue(), err.getvalue(), [str(w.message)[:200] for w in caught], seconds


def defect(status: int | str, out: str, err: str, caught: list[str], seconds: float, as_json: bool) -> str | None:
    """What breaks the rule in one run, or None."""
    if not isinstance(status, int):
        return status
    if status not in (0, 2):
        return f"exit status {status}: {err.strip()[:300]}"
    if caught:
        return f"warning: {caught[0]}"
    if seconds > 30:
        return f"took {seconds:.0f} s"
    if status == 2:
        if out:
            return "exit 2 with output on stdout"
        if err.count("\n") != 1 or not err.endswith("\n") or not err.startswith("gpipe-sim: error: "):
            return f"refusal is not one line: {err[:300]!r}"
        if "Traceback" in err or INTERNALS.search(err):
            return f"refusal shows internals: {err.strip()[:300]}"
        return None
    # one-line notes of what the run derived or left out (`gpipe-sim: note: ...`) are output, not defects
    if any(not line.startswith("gpipe-sim: note: ") for line in err.splitlines()):
        return f"exit 0 with stderr: {err[:300]!r}"
    if as_json:
        try:
            result = _strict_json(out)
        except ValueError as exc:
            return f"--json is not strict JSON: {exc}"
        bad = [v for v in _numbers(result) if not math.isfinite(v)]
        if bad:
            return f"non-finite figure in the result: {bad[:3]}"
        if not result["step_time_s"] > 0 or not result["throughput_samples_per_s"] > 0:
            return f"degenerate step: {result['step_time_s']} s, {result['throughput_samples_per_s']} samples/s"
    elif re.search(r"\b(nan|inf|infinity)\b", out, re.IGNORECASE):
        return "a non-finite figure in the summary"
    return None


ENGINES = st.sampled_from(["simpy", "fast", "auto"])


def _check(case: tuple[bytes, str], engine: str, as_json: bool) -> None:
    raw, suffix = case
    status, out, err, caught, seconds = run_cli(raw, suffix, engine, as_json)
    problem = defect(status, out, err, caught, seconds, as_json)
    assert problem is None, f"{problem}\ninput ({suffix}): {raw[:2000]!r}\nengine: {engine}"


_SETTINGS = dict(deadline=None, database=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.filter_too_much])


@settings(max_examples=300, **_SETTINGS)
@given(inputs(), ENGINES, st.booleans())
def test_every_input_gives_a_finite_result_or_one_line(case, engine, as_json):
    _check(case, engine, as_json)


@pytest.mark.slow
@settings(max_examples=5000, **{**_SETTINGS, "derandomize": False})
@given(inputs(), ENGINES, st.booleans())
def test_every_input_gives_a_finite_result_or_one_line_thoroughly(case, engine, as_json):
    _check(case, engine, as_json)


class _Hang(BaseException):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Hang("still running after the time limit")


def census(examples: int, seed: int = 0, time_limit: int = 60) -> tuple[Counter, list[str], float]:
    """Run `examples` generated inputs without stopping: outcomes, defects, slowest run (s).
    A run still going after `time_limit` seconds is stopped and counted as a defect (a hang)."""
    import signal

    signal.signal(signal.SIGALRM, _on_alarm)
    outcomes: Counter = Counter()
    defects: list[str] = []
    slowest = [0.0]

    @settings(max_examples=examples, deadline=None, database=None, phases=["generate"],
              suppress_health_check=list(HealthCheck))
    @given(inputs(), ENGINES, st.booleans())
    def record(case, engine, as_json):
        raw, suffix = case
        signal.alarm(time_limit)
        try:
            status, out, err, caught, seconds = run_cli(raw, suffix, engine, as_json)
        finally:
            signal.alarm(0)
        slowest[0] = max(slowest[0], seconds)
        problem = defect(status, out, err, caught, seconds, as_json)
        outcomes["defect" if problem else f"exit {status}"] += 1
        if problem:
            defects.append(f"{problem} | {suffix} {raw[:300]!r} | {engine}")
            if os.environ.get("FUZZ_DUMP"):
                (Path(os.environ["FUZZ_DUMP"]) / f"defect{len(defects)}{suffix}").write_bytes(raw)

    import random

    random.seed(seed)
    record()
    return outcomes, defects, slowest[0]


if __name__ == "__main__":
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, resource.RLIM_INFINITY))  # MemoryError, not the OOM killer
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    outcomes, defects, slowest = census(n)
    print(f"generated {sum(outcomes.values())} scenarios: {dict(outcomes)}; slowest run {slowest:.2f} s")
    for line in defects:
        print("DEFECT", line)
