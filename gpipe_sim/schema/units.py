"""Parsing of quantities written with units ("16 GiB", "900 GB/s", "200 Gb/s", "125 TFLOPS", "5 us")."""

from __future__ import annotations

import math
import re

_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15, "e": 1e18}
_BINARY = {"ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40, "pi": 2.0**50}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_QUANTITY = re.compile(rf"^\s*{_NUMBER}\s*([A-Za-zµ/]*)\s*$")
_INFINITE = {"inf", "infinity", "unlimited", ".inf"}
# A data unit: an optional (binary) prefix, the bit or byte, and for a rate "/s" or "ps".
_DATA = re.compile(r"^(?P<prefix>[kmgtpe]i?)?(?P<size>bits?|bytes?|b)(?P<rate>/s|/sec|ps)?$", re.IGNORECASE)


def _split(value: str) -> tuple[float, str]:
    match = _QUANTITY.match(value) if len(value) <= 100 else None
    if not match:
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise ValueError(f"cannot read {shown!r} as a number with a unit")
    return float(match.group(1)), match.group(2)


def _number_or_text(value: object, text: str) -> float | str:
    """`value` as a float where it is a number (an int within the simulator's range), as itself
    where it is a string; ValueError naming what was expected (a number or `text`) otherwise."""
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    if isinstance(value, int):
        if abs(value) > 10**300:
            raise ValueError("a number beyond the range the simulator computes with (over 10^300)")
        return float(value)
    if isinstance(value, (float, str)):
        return value
    raise ValueError(f"expected a number or {text}, got {type(value).__name__}")


def parse_quantity(value: object, kind: str) -> float:
    """Return `value` in base units (bytes, bytes/s, FLOP/s or seconds); numbers pass through.

    `kind` is one of "bytes", "bandwidth", "flops", "seconds"; "inf" or "unlimited" gives infinity.
    Data units are read as written: `b` (or `bit`) is a bit and `B` (or `byte`) a byte, so
    "200 Gb/s", "200 Gbit/s" and "200 Gbps" are 25e9 bytes/s and "200 GB/s" is 200e9. A spelling
    whose case cannot tell them apart ("200 gb/s", "200 GBPS") and a size in bits ("80 Gb") raise
    ValueError, as does any unit that is not of `kind`.
    """
    value = _number_or_text(value, "a string with a unit")
    if isinstance(value, float):
        return value
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
    if kind == "seconds":
        if unit.lower() not in _TIME:
            raise ValueError(f"unknown time unit {unit!r} (use s, ms, us or ns)")
        return number * _TIME[unit.lower()]
    if kind == "flops":
        return number * _multiplier(_flops_prefix(unit), unit, kind)
    return number * _data_scale(number, unit, kind)


def _flops_prefix(unit: str) -> str:
    unit_l = unit.lower()
    for tail in ("flops", "flop/s"):
        if unit_l.endswith(tail):
            return unit_l[: -len(tail)]
    return unit_l


def _multiplier(prefix: str, unit: str, kind: str) -> float:
    """The factor a (lower-cased) decimal or binary prefix stands for."""
    if prefix in _BINARY:
        return _BINARY[prefix]
    if prefix in _PREFIX:
        return _PREFIX[prefix]
    raise ValueError(f"unknown unit {unit!r} for {kind}")


def _data_scale(number: float, unit: str, kind: str) -> float:
    """Bytes (or bytes/s) in one `unit` of `kind` "bytes" or "bandwidth"; ValueError naming the
    unit where it is of the other kind, ambiguous between bits and bytes, or a size in bits."""
    if not unit:
        return 1.0
    match = _DATA.match(unit)
    if match is None:
        if kind == "bytes" and (unit.lower() in _PREFIX or unit.lower() in _BINARY):
            return _multiplier(unit.lower(), unit, kind)  # a bare prefix ("16 G", "16 Gi"): bytes
        if kind == "bandwidth" and (unit.lower() in _PREFIX or unit.lower() in _BINARY):
            head = _shown(number, _canonical(unit))
            raise ValueError(f"{_shown(number, unit)!r} has no bit or byte: write {head}bit/s (bits) or {head}B/s (bytes)")
        raise ValueError(f"unknown unit {unit!r} for {kind}")
    prefix, size, rate = match.group("prefix") or "", match.group("size"), match.group("rate") or ""
    if kind == "bytes" and rate:
        raise ValueError(f"{unit!r} is a rate; a size is written in bytes (such as {_canonical(prefix)}B)")
    if kind == "bandwidth" and not rate:
        raise ValueError(f"{unit!r} is a size; a bandwidth is written per second (such as {unit}/s)")
    bits = _is_bits(prefix, size, rate)
    if bits is None or (bits and kind == "bytes"):
        raise ValueError(_bits_or_bytes(number, unit, prefix, kind, bits))
    return _multiplier(prefix.lower(), unit, kind) / (8.0 if bits else 1.0)


def _bits_or_bytes(number: float, unit: str, prefix: str, kind: str, bits: bool | None) -> str:
    """The one line for a spelling that could be bits or bytes, or a size given in bits."""
    written, head = _shown(number, unit), _shown(number, _canonical(prefix))
    if kind == "bandwidth":
        return f"{written!r} could be bits or bytes per second: write {head}bit/s (bits) or {head}B/s (bytes)"
    if bits:
        return (f"{written!r} is bits; a size is written in bytes: {head}B "
                f"(or {_shown(number / 8, _canonical(prefix))}B if {written} was meant)")
    return f"{written!r} could be bits or bytes; a size is written in bytes: {head}B"


def _is_bits(prefix: str, size: str, rate: str) -> bool | None:
    """True for a bit, False for a byte, None where the spelling's case cannot tell: `b` with no
    upper-case letter beside it ("gb/s", "kbps"), or `B` shouted with its rate ("GBPS", "GB/S")."""
    if len(size) > 1:
        return size.lower().startswith("bit")
    if size == "b":
        return True if any(c.isupper() for c in prefix + rate) else None
    rate_letters = [c for c in rate if c.isalpha()]
    return None if rate_letters and all(c.isupper() for c in rate_letters) else False


def _shown(number: float, unit: str) -> str:
    return f"{number:g} {unit}"


def _canonical(prefix: str) -> str:
    """A prefix as the SI and IEC write it: k, M, G, T, P, E; Ki, Mi, Gi, Ti, Pi."""
    if not prefix:
        return ""
    head = "k" if prefix.lower() == "k" else prefix[0].upper()
    return head + ("i" if len(prefix) > 1 else "")


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


_COUNT = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([kKmMbBtT]?)\s*$")
_COUNT_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def parse_count(value: object) -> float:
    """A count written as people write token budgets: a number, or one with a suffix K, M, B
    (billion) or T (trillion), e.g. "15T", "300B", "1.5e12"; ValueError otherwise."""
    value = _number_or_text(value, "text such as 1T or 300B")
    if isinstance(value, float):
        return value
    match = _COUNT.match(value) if len(value) <= 100 else None
    if not match:
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise ValueError(f"cannot read {shown!r} as a count (a number, or one with K, M, B or T: 300B, 15T)")
    return float(match.group(1)) * _COUNT_SCALE[match.group(2).lower()]
