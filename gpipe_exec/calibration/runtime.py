"""Calibration on this machine: the backend's point-to-point link, then the runtime's host time per
action, in the terms of gpipe_sim's `hardware.link` and `hardware.host`."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist

from gpipe_exec.launch.spawn import LaunchOptions, launch
from gpipe_exec.measure.meters import AlignedClock

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

    def hardware_updates(self) -> dict[str, Any]:
        """Dotted scenario updates that make gpipe_sim use this link."""
        return {"hardware.link": self.as_link()}

    def to_dict(self) -> dict[str, Any]:
        return {"link": self.as_link(), "samples": [list(s) for s in self.samples]}


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


CALIBRATION_BYTES = (4 * 1024, 64 * 1024, 256 * 1024)
_WIDTH = 256  # the calibration MLP's width: compute per message grows with it, so keep it small


@dataclass(frozen=True)
class RuntimeFit:
    """This machine's pipeline runtime in gpipe_sim's terms, fitted on real pipeline runs.

    `hardware.host`: host time per compute action, per send and receive plus bytes over
    `copy_bandwidth` (on one machine the sender's and receiver's CPUs do the copying), from the
    runtime's own records; `hardware.link`: the ping-pong fit (`calibrate_link`).
    """

    action_s: float
    send_s: float
    recv_s: float
    copy_bandwidth: float
    latency_s: float
    bandwidth: float
    samples: tuple[tuple[float, float, float, float], ...]  # bytes, action, send, recv
    on_device: bool = True  # CPU ranks: the host time runs on the cores that compute
    shared_scale: float = 1.0  # host times scaled by this where stages share devices (`calibrate_shared`)

    def hardware_updates(self) -> dict[str, Any]:
        """Dotted scenario updates: `hardware.host` and `hardware.link`."""
        return {
            "hardware.host": {"action_s": self.action_s, "send_s": self.send_s, "recv_s": self.recv_s,
                              "copy_bandwidth": self.copy_bandwidth, "on_device": self.on_device},
            "hardware.link": {"latency_s": self.latency_s, "bandwidth": self.bandwidth},
        }

    def to_dict(self) -> dict[str, Any]:
        return {**{k: v for k, v in vars(self).items() if k != "samples"},
                "samples": [list(s) for s in self.samples]}


def runtime_sample(timelines: Sequence[Any], kind_names: Sequence[str]) -> tuple[float, float, float]:
    """Medians over steps and ranks of one run (actions in program order): the gap after a compute
    action, from a send's start to the next action's start, and the gap after a receive."""
    gaps: dict[str, list[float]] = {"compute": [], "send": [], "recv": []}
    for tl in timelines:
        names = [kind_names[int(c)] for c in tl.kind]
        for k in np.unique(tl.rank):
            idx = np.flatnonzero(tl.rank == k)
            for a, b in zip(idx[:-1], idx[1:]):
                if names[a] == "send":
                    gaps["send"].append(tl.start_s[b] - tl.start_s[a])
                else:
                    gaps["recv" if names[a] == "recv" else "compute"].append(tl.start_s[b] - tl.end_s[a])
    med = [float(np.median(v)) if v else 0.0 for v in gaps.values()]
    return med[0], med[1], med[2]


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares intercept and slope, both kept non-negative."""
    slope = float(np.polyfit(x, y, 1)[0]) if len(set(x.tolist())) > 1 else 0.0
    slope = max(slope, 0.0)
    return max(float(np.mean(y - slope * x)), 0.0), slope


def fit_runtime(samples: Sequence[tuple[float, float, float, float]], link: LinkFit,
                on_device: bool = True) -> RuntimeFit:
    """Fit `RuntimeFit` on (bytes, action, send, recv) samples at several message sizes: host
    times per transfer as a line in the bytes (the slope shared by both ends), the link as given."""
    a = np.asarray(samples, dtype=float)
    n = a[:, 0]
    send_s, send_slope = _line(n, a[:, 2])
    recv_s, recv_slope = _line(n, a[:, 3])
    copy_slope = (send_slope + recv_slope) / 2
    return RuntimeFit(
        action_s=float(np.median(a[:, 1])), send_s=send_s, recv_s=recv_s,
        copy_bandwidth=1.0 / copy_slope if copy_slope > 0 else float("inf"),
        latency_s=link.latency_s, bandwidth=link.bandwidth,
        samples=tuple(tuple(float(v) for v in row) for row in a),  # type: ignore[misc]
        on_device=on_device,
    )


def calibration_scenario(message_bytes: int, device_map: Sequence[int] = (0, 1)) -> Any:
    """A pipeline of a narrow MLP, one stage per entry of `device_map`, whose transfers carry
    `message_bytes` each (fp32): little compute and many transfers (64 a step per pair of
    neighbours), so the run is mostly the runtime's own time."""
    from gpipe_sim.scenario.scenario import parse_scenario

    micro, K = 16, len(device_map)
    per_micro = max(1, round(message_bytes / (4 * _WIDTH)))
    return parse_scenario({
        "model": {"preset": "mlp", "layers": K - 1, "input_dim": 16, "width": _WIDTH, "num_classes": 10},
        "hardware": {"preset": "cpu", "stage_to_device": list(device_map)},
        "pipeline": {"stages": K, "micro_batches": micro, "batch_size": micro * per_micro,
                     "schedule": "gpipe", "remat": "none", "partition": [2] + [1] * (K - 1)},
        "training": {"optimizer": "sgd"},
    })


def calibrate_runtime(device_map: Sequence[int] = (0, 1), *, sizes: Sequence[int] = CALIBRATION_BYTES,
                      steps: int = 5, options: LaunchOptions = LaunchOptions()) -> RuntimeFit:
    """Ping-pong the link, then run the executor's own runtime on `calibration_scenario` at each
    message size (one launch) and fit `RuntimeFit`: what gpipe_sim needs to predict the executor."""
    from gpipe_exec.measure.steps import step_timelines
    from gpipe_exec.runtime.job import job_for
    from gpipe_sim.plan.compile import compile_plan
    from gpipe_sim.schedule import ACTION_KINDS

    link = calibrate_link(device_map, options=options)
    scenarios = [calibration_scenario(n, device_map) for n in sizes]
    plans = [compile_plan(sc) for sc in scenarios]
    jobs = [job_for(plan, steps=steps, warmup=2) for plan in plans]
    outputs = launch(jobs, plans[0].mesh.process_devices(), options)
    samples = []
    for sc, plan, out in zip(scenarios, plans, outputs):
        sent = 4.0 * _WIDTH * sc.pipeline.batch_size // sc.pipeline.micro_batches
        samples.append((sent, *runtime_sample(step_timelines(plan, out), ACTION_KINDS)))
    on_cpu = options.backend == "gloo" or not torch.cuda.is_available()
    return fit_runtime(samples, link, on_device=on_cpu)
