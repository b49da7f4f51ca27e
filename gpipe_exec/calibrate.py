"""Link calibration: point-to-point latency and bandwidth of the backend between two ranks."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist

from gpipe_exec.launch import LaunchOptions, launch
from gpipe_exec.measure import AlignedClock

DEFAULT_SIZES = (4, 1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22)


@dataclass(frozen=True)
class LinkFit:
    """One-way transfer time t(n) = latency_s + n / bandwidth, fitted on ping-pong medians."""

    latency_s: float
    bandwidth: float  # bytes per second
    samples: tuple[tuple[int, float], ...]  # (bytes, median one-way seconds)

    def as_link(self) -> dict[str, float]:
        """The scenario's `hardware.link` fields."""
        return {"latency_s": self.latency_s, "bandwidth": self.bandwidth}


def _ping_pong(rank: int, device: torch.device, clock: AlignedClock, payload: dict[str, Any]
               ) -> list[tuple[int, float]] | None:
    sizes, repeats = payload["sizes"], payload["repeats"]
    out = []
    for n in sizes:
        buf = torch.zeros(max(1, n // 4), dtype=torch.float32, device=device)
        samples = []
        dist.barrier()
        for r in range(repeats + 3):  # rank 0 times round trips; rank 1 echoes
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            if r >= 3:
                samples.append((time.perf_counter() - t0) / 2)
        out.append((buf.numel() * 4, statistics.median(samples)))
    return out if rank == 0 else None


def fit_link(samples: Sequence[tuple[int, float]]) -> LinkFit:
    """Latency: the smallest message's time; bandwidth: least squares of the time above that
    latency against size (robust to a noisy mid-size point, always positive)."""
    n = np.array([s[0] for s in samples], dtype=float)
    t = np.array([s[1] for s in samples], dtype=float)
    latency = float(t[np.argmin(n)])
    extra = np.maximum(t - latency, 0.0)
    slope = float(np.dot(n, extra) / np.dot(n, n))
    bandwidth = 1.0 / slope if slope > 0 else float("inf")
    return LinkFit(latency, bandwidth, tuple((int(a), float(b)) for a, b in zip(n, t)))


def calibrate_link(device_map: Sequence[int] = (0, 1), *, sizes: Sequence[int] = DEFAULT_SIZES,
                   repeats: int = 30, options: LaunchOptions = LaunchOptions()) -> LinkFit:
    """Measure the backend between two ranks placed on `device_map` (two different devices)."""
    samples = launch({"sizes": list(sizes), "repeats": repeats}, device_map, options, task=_ping_pong)
    return fit_link(samples)
