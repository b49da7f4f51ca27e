"""When each action ran on the GPU, not when the host issued it: CUDA events around every action,
read back on the step's host clock once the step's work has finished."""

from __future__ import annotations

from typing import Any

import torch


class GpuSpans:
    """CUDA events recorded on the current stream around a step's actions.

    On a GPU the host only queues an action's kernels: it returns long before they finish when
    the GPU is the bottleneck, so host clock readings time the issue, and a step timed by them
    ends when its last kernel is queued, not run. Each action records an event before and after
    its work; `begin` synchronizes the device and records a reference event at a host time it
    reads, so an event's time on the host clock is that time plus its elapsed time from the
    reference; `resolve` waits for the step's kernels and rewrites the recorded spans so.

    An action's start is then when the GPU reached its first kernel (the end of the work queued
    before it, or its issue, whichever is later), and its end when its last kernel finished:
    what a pass takes on the device, host-bound or not. Actions that wait on the host (sends
    and receives staged through host memory, which synchronize on their copies) keep their host
    times, moved to start no earlier than the GPU work queued before them ended (so a rank's
    spans stay in program order and do not overlap).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._reference: Any = None
        self._host_start = 0.0
        self._pending: list[tuple[int, Any, Any]] = []

    def begin(self, clock: Any) -> float:
        """Wait for the device to be idle, record the reference event, and return its host time."""
        torch.cuda.synchronize(self.device)
        self._pending = []
        self._reference = torch.cuda.Event(enable_timing=True)
        self._host_start = clock()
        self._reference.record()
        return self._host_start

    def start(self) -> Any:
        """Record an action's start event (before its first kernel is queued)."""
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def end(self, index: int, started: Any) -> None:
        """Record action `index`'s end event (after its last kernel is queued)."""
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self._pending.append((index, started, event))

    def resolve(self, starts: list[float], ends: list[float]) -> None:
        """Wait for the step's kernels, then set each recorded action's span to its GPU times on
        the host clock."""
        torch.cuda.synchronize(self.device)
        ref, t0 = self._reference, self._host_start
        timed = {}
        for index, begin, end in self._pending:
            start = t0 + ref.elapsed_time(begin) / 1e3
            timed[index] = (start, max(start, t0 + ref.elapsed_time(end) / 1e3))
        self._pending = []
        place_spans(starts, ends, timed, t0)


def place_spans(starts: list[float], ends: list[float], timed: dict[int, tuple[float, float]], t0: float) -> None:
    """Set the actions in `timed` to their GPU spans and move every other (host) action, in program
    order, to start no earlier than the GPU spans before it ended (nor before `t0`), its end no
    earlier than its start."""
    gpu_end = t0
    for i in range(len(starts)):
        if i in timed:
            starts[i], ends[i] = timed[i]
            gpu_end = max(gpu_end, ends[i])
        else:
            starts[i] = max(starts[i], gpu_end)
            ends[i] = max(ends[i], starts[i])
