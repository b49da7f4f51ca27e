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
        for r in range(repeats + 2):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            if r >= 2:
                samples.append((time.perf_counter() - t0) / 2)
        out.append((buf.numel() * 4, statistics.median(samples)))
    return out if rank == 0 else None


def fit_link(samples: Sequence[tuple[int, float]]) -> LinkFit:
    """Least-squares fit of latency and bandwidth (both kept positive)."""
    n = np.array([s[0] for s in samples], dtype=float)
    t = np.array([s[1] for s in samples], dtype=float)
    slope, intercept = np.polyfit(n, t, 1)
    slope = max(float(slope), 1e-15)
    latency = max(float(intercept), float(t[np.argmin(n)]) * 0.5, 0.0)
    return LinkFit(latency, 1.0 / slope, tuple((int(a), float(b)) for a, b in zip(n, t)))


def calibrate_link(device_map: Sequence[int] = (0, 1), *, sizes: Sequence[int] = DEFAULT_SIZES,
                   repeats: int = 10, options: LaunchOptions = LaunchOptions()) -> LinkFit:
    """Measure the backend between two ranks placed on `device_map` (two different devices)."""
    samples = launch({"sizes": list(sizes), "repeats": repeats}, device_map, options, task=_ping_pong)
    return fit_link(samples)
