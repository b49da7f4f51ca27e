"""Chrome/Perfetto trace export of a timeline (opens in ui.perfetto.dev and chrome://tracing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpipe_sim.results.result import Timeline
from gpipe_sim.schedule import ACTION_KINDS

_LANES = {"send": 1, "recv": 2}  # transfers get their own lanes so they do not hide compute


def chrome_trace(timeline: Timeline, name: str = "pipeline") -> dict[str, Any]:
    """The timeline as a Chrome trace-event document: one process per rank, times in microseconds."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": name}}
    ]
    for rank in sorted(set(int(s) for s in timeline.rank)):
        events.append({"ph": "M", "name": "process_name", "pid": rank + 1, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        for lane, label in ((0, "compute"), (1, "send"), (2, "recv")):
            events.append({"ph": "M", "name": "thread_name", "pid": rank + 1, "tid": lane,
                           "args": {"name": label}})
    for r, c, k, m, a, b in zip(timeline.rank.tolist(), timeline.chunk.tolist(), timeline.kind.tolist(),
                                timeline.micro_batch.tolist(), timeline.start_s.tolist(), timeline.end_s.tolist()):
        kind = ACTION_KINDS[k]
        label = kind if m < 0 else f"{kind} c{c} m{m}"
        events.append({
            "ph": "X", "name": label, "cat": kind, "pid": r + 1, "tid": _LANES.get(kind, 0),
            "ts": a * 1e6, "dur": max(0.0, b - a) * 1e6,
            "args": {"chunk": c, "micro_batch": m},
        })
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(timeline: Timeline, path: str | Path, name: str = "pipeline") -> None:
    """Write the trace JSON to `path`."""
    Path(path).write_text(json.dumps(chrome_trace(timeline, name)))
