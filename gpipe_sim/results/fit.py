"""Which devices do not fit, in one short line however many there are (the CLI report and the app)."""

from __future__ import annotations

from typing import Any, Sequence

from gpipe_sim.schema.units import format_bytes

MAX_RANGES = 4  # beyond, the devices are counted rather than listed


def id_ranges(ids: Sequence[int]) -> str:
    """Sorted ids as ranges: [0, 1, 2, 3, 6, 8, 9] -> "0-3, 6, 8-9"."""
    parts: list[str] = []
    values = sorted(set(ids))
    start = prev = None
    for value in [*values, None]:
        if start is not None and (value is None or value != prev + 1):
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if value is not None:
            if start is None:
                start = value
            prev = value
    return ", ".join(parts)


def over_capacity_text(result: Any) -> str | None:
    """The devices whose peak exceeds the capacity, on one line, or None when everything fits:
    "device 3 (rank 3) needs 90.0 GiB but has 80.0 GiB"; for several, their ids as ranges (or their
    count) and the fullest: "devices 0-13 (14 of 16) do not fit; the fullest, device 0 (rank 0),
    needs 90.0 GiB but has 80.0 GiB"."""
    over = result.devices_over_capacity()
    if not over:
        return None
    cap = format_bytes(result.memory_capacity_bytes)
    device, ranks, peak = max(over, key=lambda entry: (entry[2], -entry[0]))
    fullest = f"device {device} (rank {', '.join(map(str, ranks))})"
    if len(over) == 1:
        return f"{fullest} needs {format_bytes(peak)} but has {cap}"
    ids = [d for d, _, _ in over]
    total = len(result.device_peak_memory_bytes)
    listed = id_ranges(ids)
    which = f"devices {listed} ({len(over)} of {total})" if listed.count(",") < MAX_RANGES else f"{len(over)} of {total} devices"
    return f"{which} do not fit; the fullest, {fullest}, needs {format_bytes(peak)} but has {cap}"
