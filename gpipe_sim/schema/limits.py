"""Limits that no real scenario reaches, checked before any work starts.

Every input either gives a result whose every figure is finite, or one line naming the field; these
bounds keep the work (and every figure computed from them) far from overflow and from hours of
simulation. Each message that enforces one names the limit.
"""

from __future__ import annotations

import math
from typing import Any

# Files and their structure.
MAX_FILE_BYTES = 4 * 2**20  # a scenario, sweep or layer-table file (a YAML file this size loads in ~5 s)
MAX_DEPTH = 32  # nesting of mappings and lists (a scenario needs 5)
MAX_NODES = 2_000_000  # values in a file's data once YAML aliases are expanded

# Model sizes.
MAX_LAYERS = 100_000  # layers of a model (max-model's default search stops at 65,536)
MAX_DIMENSION = 10**9  # width, d_model, d_ff, heads, seq_len, vocab, filters, image size, classes...
MAX_EXPERTS = 65536  # experts of a mixture-of-experts layer (DeepSeek-V3 has 256)
MAX_PARAMS = 10**15  # parameters of one layer
MAX_KERNELS = 10**6  # kernels of one layer

# Pipeline.
MAX_STAGES = 4096  # K
MAX_CHUNKS = 1024  # v
MAX_BATCH = 10**9  # samples in a mini-batch (and micro-batch size of a measured timing)
MAX_PASSES = 2**17  # K x v x M: passes per replica per step (what `gpipe-sim bench` runs: 128 x 1024)
MAX_DEVICE_ID = 65_535  # hardware.stage_to_device entries

# Magnitudes (base units: seconds, bytes, FLOP/s, bytes/s).
MAX_SECONDS = 1.0e6  # any time: per sample, per micro-batch, latency, overhead, host time
MIN_SECONDS = 1.0e-15  # a model time (per sample, measured) is zero or at least this (a femtosecond)
MAX_QUANTITY = 1.0e30  # memory, bandwidth, peak FLOP/s, bytes or FLOPs per sample
MIN_RATE = 1.0  # bandwidths (bytes/s) and peak FLOP/s
MIN_FRACTION = 1.0e-6  # efficiency, usable memory fraction
MAX_DROPOUT = 0.99  # a dropout rate of 1 would scale the kept elements by 1/0

# Sweeps.
MAX_SWEEP_POINTS = 100_000


def count(value: int) -> str:
    """An integer for a message, with thousands separators; never fails on a huge one."""
    if abs(value) >= 10**30:
        return f"about 10^{len(str(abs(value))) - 1}" if abs(value) < 10**4000 else "a number over 4000 digits"
    return f"{value:,}"


def number(value: float) -> str:
    """A float (or int) for a message: short, and safe for any magnitude."""
    if isinstance(value, int) and not isinstance(value, bool):
        return count(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "infinity" if value > 0 else "-infinity"
    return f"{value:.6g}"


def data_shape(data: Any, depth_limit: int = MAX_DEPTH, node_limit: int = MAX_NODES) -> str | None:
    """Why `data` (plain nested dicts and lists) is too deep or too big once shared parts (YAML
    aliases) are counted each time they occur; None when it is within the limits.

    Linear in the number of distinct objects: a shared container is measured once, so an alias
    bomb is refused without ever being expanded.
    """
    sizes: dict[int, tuple[int, int]] = {}  # id -> (expanded values, height)
    keep: list[Any] = []  # keep measured objects alive so that their ids stay unique
    stack: list[tuple[Any, bool, int]] = [(data, False, 0)]
    while stack:
        obj, children_done, level = stack.pop()
        if not isinstance(obj, (dict, list, tuple)):
            continue
        key = id(obj)
        if key in sizes and not children_done:
            continue
        children = list(obj.values()) if isinstance(obj, dict) else list(obj)
        if not children_done:
            if level >= depth_limit:
                return f"nested more than {depth_limit} levels deep (the limit)"
            sizes[key] = (-1, 0)  # in progress: a cycle counts as too big
            keep.append(obj)
            stack.append((obj, True, level))
            for child in children:
                if isinstance(child, (dict, list, tuple)) and id(child) not in sizes:
                    stack.append((child, False, level + 1))
            continue
        total, height = 1 + (len(obj) if isinstance(obj, dict) else 0), 0
        for child in children:
            if isinstance(child, (dict, list, tuple)):
                size, child_height = sizes.get(id(child), (-1, 0))
                if size < 0:
                    return "contains itself (a recursive YAML alias)"
                total += size
                height = max(height, child_height + 1)
            else:
                total += 1
        if level + height >= depth_limit:
            return f"nested more than {depth_limit} levels deep (the limit)"
        if total > node_limit:
            return f"more than {count(node_limit)} values once YAML aliases are expanded (the limit)"
        sizes[key] = (total, height)
    return None


def result_problem(scenario: Any, result: Any) -> str | None:
    """Why a computed result is not meaningful (a figure that is infinite or NaN, or a step that
    takes no time), as one line naming the likely field; None when every figure is finite.

    The limits above keep every figure finite; this is the last check before a result is shown.
    """
    import numpy as np

    step = result.step_time_s
    if not (isinstance(step, (int, float)) and math.isfinite(step)):
        return f"{_likely_cause(scenario, 'largest')}: the step time comes out as {number(step)}; refused"
    if step <= 0:
        return f"{_likely_cause(scenario, 'zero')}: the step takes no time (every pass and transfer costs zero); refused"
    if not math.isfinite(result.throughput_samples_per_s):
        return f"{_likely_cause(scenario, 'zero')}: the step is too short ({number(step)} s) to give a throughput; refused"
    figures: list[tuple[str, Any]] = [
        ("throughput", result.throughput_samples_per_s),
        ("bubble fraction", result.bubble_fraction),
        ("analytic bubble fraction", result.analytic_bubble_fraction),
    ]
    figures += [("device peak memory", v) for v in result.device_peak_memory_bytes.values()]
    for stage in result.stages:
        figures += [("rank busy time", stage.busy_s), ("peak activations", stage.peak_activation_bytes),
                    ("peak memory", stage.peak_memory_bytes), ("parameter bytes", stage.param_bytes),
                    ("optimizer state bytes", stage.state_bytes)]
    for chunk in getattr(result, "chunks", []):
        figures += [("chunk busy time", chunk.busy_s), ("chunk peak activations", chunk.peak_activation_bytes)]
    for what, value in figures:
        if not math.isfinite(value):
            return f"{_likely_cause(scenario, 'largest')}: the {what} comes out as {number(value)}; refused"
    timeline = result.timeline
    for what, values in (("start time", timeline.start_s), ("end time", timeline.end_s)):
        if len(values) and not np.isfinite(values).all():
            return f"{_likely_cause(scenario, 'largest')}: an action's {what} is not finite; refused"
    for times, held in getattr(result, "memory_timeline", []):
        if not (np.isfinite(times).all() and np.isfinite(held).all()):
            return f"{_likely_cause(scenario, 'largest')}: the memory timeline is not finite; refused"
    return None


def _likely_cause(scenario: Any, kind: str) -> str:
    """The scenario field most likely behind a degenerate result: for an infinite figure the number
    nearest its limit, for a zero step the model's time fields."""
    try:
        data = scenario.to_dict()
    except Exception:  # noqa: BLE001 - only for the message
        return "scenario"
    if kind == "zero":
        model = data.get("model", {})
        if model.get("preset") == "uniform":
            return "model.forward_s_per_sample"
        if model.get("preset") == "table":
            return "model.layers"
        return "model"
    best, best_ratio = "scenario", -1.0
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        prefix, node = stack.pop()
        if isinstance(node, dict):
            stack.extend((f"{prefix}{k}.", v) for k, v in node.items())
        elif isinstance(node, list) and len(node) <= 1000:
            stack.extend((f"{prefix}{i}.", v) for i, v in enumerate(node))
        elif isinstance(node, (int, float)) and not isinstance(node, bool) and math.isfinite(node):
            ratio = abs(float(node)) / (MAX_SECONDS if prefix.rstrip(".").endswith("_s") else MAX_QUANTITY)
            if ratio > best_ratio:
                best, best_ratio = prefix.rstrip("."), ratio
    return best
