"""What the charts share: rank colours, time units, GiB, and the dashes and markers of series variants."""

from __future__ import annotations

GIB = 2.0**30
_GOLDEN = 0.381966  # hue step between neighbouring ranks (the golden angle): neighbours never look alike
_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "star")


def rank_colors(n: int) -> list[str]:
    """One colour per rank, `n` of them, neighbours far apart in hue (and alternating in lightness),
    all distinct: rank k's hue is k golden-angle steps round the wheel."""
    import colorsys

    out = []
    for k in range(n):
        hue = (0.6 + k * _GOLDEN) % 1.0
        light = (0.42, 0.58)[k % 2] if n > 8 else 0.48
        r, g, b = colorsys.hls_to_rgb(hue, light, 0.75)
        out.append(f"#{round(255 * r):02x}{round(255 * g):02x}{round(255 * b):02x}")
    return out


def time_unit(seconds: float) -> tuple[str, float]:
    """A readable unit for a time axis spanning `seconds`: (name, seconds per unit)."""
    if seconds >= 1.0:
        return "s", 1.0
    if seconds >= 1e-3:
        return "ms", 1e-3
    return "us", 1e-6
