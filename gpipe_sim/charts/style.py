"""What the charts share: rank colours, time units, GiB, and the dashes and markers of series variants."""

from __future__ import annotations

import numbers
from typing import Any, Iterable

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


# A qualitative palette (Tableau 10): categories (schedules, K values) in hues no eye confuses.
CATEGORY_COLORS = ("#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b",
                   "#eeca3b", "#b279a2", "#ff9da6", "#9d755d", "#79706e")


def category_colors(n: int) -> list[str]:
    """`n` distinct colours for categories: the qualitative palette, then rank colours beyond it."""
    if n <= len(CATEGORY_COLORS):
        return list(CATEGORY_COLORS[:n])
    extra = [c for c in rank_colors(n) if c not in CATEGORY_COLORS]
    return list(CATEGORY_COLORS) + extra[: n - len(CATEGORY_COLORS)]


def schedule_colors(names: list[str]) -> list[str]:
    """One colour per schedule name, the same for a registered schedule in every chart (its place
    in the registry), all distinct."""
    from gpipe_sim.schedule import SCHEDULES

    registered = list(SCHEDULES)
    if len(set(names)) == len(names) and all(n in registered for n in names) \
            and len(registered) <= len(CATEGORY_COLORS):
        return [CATEGORY_COLORS[registered.index(n)] for n in names]
    return category_colors(len(names))


def log_ticks(values: list[float], most: int = 12) -> list[float]:
    """Tick positions for a log axis: the values used (1 2 4 8 16 32), thinned to about `most`
    (powers of two first) so the labels never crowd."""
    used = sorted({float(v) for v in values if v is not None and v == v and float(v) > 0})
    if len(used) <= most:
        return used
    powers = [v for v in used if v.is_integer() and int(v) & (int(v) - 1) == 0]
    if 2 <= len(powers) <= most:
        return powers
    step = -(-len(used) // most)
    picked = used[::step]
    return picked if picked[-1] == used[-1] else picked + [used[-1]]


def tick_text(value: float) -> str:
    """A tick label: whole numbers without a decimal point."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def log_x_axis(fig: Any, values: Iterable[Any]) -> None:
    """Make `fig`'s x axis logarithmic, ticked at the numeric `values` used (`log_ticks`: 1 2 4 8
    16 32), never plotly's minor 2 3 4 5 ... labels."""
    ticks = log_ticks([v for v in values if isinstance(v, numbers.Real)])  # numpy's too; never text
    fig.update_xaxes(type="log", tickmode="array", tickvals=ticks, ticktext=[tick_text(t) for t in ticks])


def time_unit(seconds: float) -> tuple[str, float]:
    """A readable unit for a time axis spanning `seconds`: (name, seconds per unit)."""
    if seconds >= 1.0:
        return "s", 1.0
    if seconds >= 1e-3:
        return "ms", 1e-3
    return "us", 1e-6
