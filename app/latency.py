"""Interaction latency of the Explore page over K <= 16, M <= 64 (a benchmark, not a test).

Run: `.venv/bin/python app/latency.py`. Each change of K or M reruns the page through
streamlit's AppTest; "cold" is a scenario's first visit (simulations run), "warm" a repeat
(simulations come from the cache). Times are the server's: the browser adds its rendering.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = Path(__file__).resolve().parent / "streamlit_app.py"
GRID = [(k, m) for k in (1, 2, 4, 8, 12, 16) for m in (1, 4, 8, 16, 32, 64)]


def _summary(name: str, seconds: list[float]) -> str:
    ms = sorted(1000 * s for s in seconds)
    p90 = ms[int(0.9 * (len(ms) - 1))]
    return (f"{name}: n={len(ms)} median {statistics.median(ms):.0f} ms, p90 {p90:.0f} ms, "
            f"max {ms[-1]:.0f} ms")


def main() -> int:
    at = AppTest.from_file(str(APP), default_timeout=120).run()
    if at.exception:
        print(at.exception[0].message, file=sys.stderr)
        return 1
    timings: dict[str, list[float]] = {"cold": [], "warm": []}
    for phase in ("cold", "warm"):
        for k, m in GRID:
            at.sidebar.number_input(key="cfg.pipeline.micro_batches").set_value(m)
            started = time.perf_counter()
            at.sidebar.number_input(key="cfg.pipeline.stages").set_value(k).run()
            timings[phase].append(time.perf_counter() - started)
            errors = [e.value for e in at.error if not e.value.startswith("Does not fit")]
            if at.exception or errors:
                print(f"K={k} M={m}: the page failed: {errors or at.exception[0].message}", file=sys.stderr)
                return 1
    print(f"Explore page, default scenario, {len(GRID)} (K, M) settings with K <= 16, M <= 64:")
    for phase, seconds in timings.items():
        print("  " + _summary(phase, seconds))
    slow = sum(s > 0.5 for s in timings["cold"] + timings["warm"])
    print(f"  interactions over 0.5 s: {slow} of {2 * len(GRID)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
