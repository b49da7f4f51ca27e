"""Limits that no real scenario reaches, checked before any work starts.

Every input either gives a result whose every figure is finite, or one line naming the field; these
bounds keep the work (and every figure computed from them) far from overflow and from hours of
simulation. Each message that enforces one names the limit.
"""

from __future__ import annotations

import math
from typing import Any

# Files and their structure.
MAX_FILE_BYTES = 16 * 2**20  # a scenario, sweep or layer-table file
MAX_DEPTH = 32  # nesting of mappings and lists (a scenario needs 5)
MAX_NODES = 2_000_000  # values in a file's data once YAML aliases are expanded

# Model sizes.
MAX_LAYERS = 100_000  # layers of a model (max-model's default search stops at 65,536)
MAX_DIMENSION = 10**9  # width, d_model, d_ff, heads, seq_len, vocab, filters, image size, classes...
MAX_PARAMS = 10**15  # parameters of one layer
MAX_KERNELS = 10**6  # kernels of one layer

# Pipeline.
MAX_STAGES = 4096  # K
MAX_CHUNKS = 1024  # v
MAX_BATCH = 10**9  # samples in a mini-batch (and micro-batch size of a measured timing)
MAX_PASSES = 2**20  # K x v x M: (rank, chunk, micro-batch) cells the schedule runs
MAX_DEVICE_ID = 65_535  # hardware.stage_to_device entries

# Magnitudes (base units: seconds, bytes, FLOP/s, bytes/s).
MAX_SECONDS = 1.0e6  # any time: per sample, per micro-batch, latency, overhead, host time
MAX_QUANTITY = 1.0e30  # memory, bandwidth, peak FLOP/s, bytes or FLOPs per sample
MIN_RATE = 1.0  # bandwidths (bytes/s) and peak FLOP/s
MIN_FRACTION = 1.0e-6  # efficiency, usable memory fraction

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
