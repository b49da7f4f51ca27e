"""Parsing of quantities written with units ("16 GiB", "900 GB/s", "125 TFLOPS", "5 us")."""

from __future__ import annotations

import math
import re

_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15, "e": 1e18}
_BINARY = {"ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40, "pi": 2.0**50}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_QUANTITY = re.compile(rf"^\s*{_NUMBER}\s*([A-Za-zµ/]*)\s*$")
_INFINITE = {"inf", "infinity", "unlimited", ".inf"}


def _split(value: str) -> tuple[float, str]:
    match = _QUANTITY.match(value) if len(value) <= 100 else None
    if not match:
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise ValueError(f"cannot read {shown!r} as a number with a unit")
    return float(match.group(1)), match.group(2)


def parse_quantity(value: object, kind: str) -> float:
    """Return `value` in base units (bytes, bytes/s, FLOP/s or seconds); numbers pass through.

    `kind` is one of "bytes", "bandwidth", "flops", "seconds"; "inf" or "unlimited" gives infinity.
    """
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    if isinstance(value, int):
        if abs(value) > 10**300:
            raise ValueError("a number beyond the range the simulator computes with (over 10^300)")
        return float(value)
    if isinstance(value, float):
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a number or a string with a unit, got {type(value).__name__}")
    if value.strip().lower() in _INFINITE:
        return math.inf
    number, unit = _split(value)
    scaled = _scale(number, unit, kind)
    if not math.isfinite(scaled):
        raise ValueError(
            f"{value.strip()!r} is beyond the range the simulator computes with (write inf for unlimited)"
        )
    return scaled


def _scale(number: float, unit: str, kind: str) -> float:
    unit_l = unit.lower()
    if kind == "seconds":
        if unit_l not in _TIME:
            raise ValueError(f"unknown time unit {unit!r} (use s, ms, us or ns)")
        return number * _TIME[unit_l]
    suffix = {"bytes": ("b",), "bandwidth": ("b/s", "bps"), "flops": ("flops", "flop/s")}[kind]
    for tail in suffix:
        if unit_l.endswith(tail):
            head = unit_l[: -len(tail)]
            break
    else:
        if unit_l in _PREFIX or unit_l in _BINARY:
            head = unit_l
        else:
            raise ValueError(f"unknown unit {unit!r} for {kind}")
    if head in _BINARY:
        return number * _BINARY[head]
    if head in _PREFIX:
        return number * _PREFIX[head]
    raise ValueError(f"unknown unit prefix in {unit!r}")


def format_bytes(value: float) -> str:
    """Human-readable bytes in binary units ("1.50 GiB")."""
    if math.isinf(value):
        return "unlimited"
    for unit, scale in (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


def format_seconds(value: float) -> str:
    """Human-readable duration ("12.3 ms")."""
    if value == 0:
        return "0 s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"
