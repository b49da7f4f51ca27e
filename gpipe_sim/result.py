"""The result schema shared by the simulator and the executor, and how it is computed from a timeline."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from gpipe_sim.schedule import ACTION_KINDS, COMPUTE_KINDS

_COMPUTE_CODES = np.array([ACTION_KINDS.index(k) for k in sorted(COMPUTE_KINDS)])


@dataclass
class Timeline:
    """Every action of the step, columnar: stage, kind (index into ACTION_KINDS), micro-batch, times."""

    stage: np.ndarray
    kind: np.ndarray
    micro_batch: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray

    def __len__(self) -> int:
        return len(self.stage)

    @property
    def kind_names(self) -> list[str]:
        return [ACTION_KINDS[int(k)] for k in self.kind]

    @property
    def is_compute(self) -> np.ndarray:
        return np.isin(self.kind, _COMPUTE_CODES)

    def to_records(self) -> list[dict[str, Any]]:
        return [
            {"stage": int(s), "kind": ACTION_KINDS[int(k)], "micro_batch": int(m),
             "start_s": float(a), "end_s": float(b)}
            for s, k, m, a, b in zip(self.stage, self.kind, self.micro_batch, self.start_s, self.end_s)
        ]

    @classmethod
    def from_records(cls, records: Sequence[dict[str, Any]]) -> "Timeline":
        return cls(
            stage=np.array([r["stage"] for r in records], dtype=np.int32),
            kind=np.array([ACTION_KINDS.index(r["kind"]) for r in records], dtype=np.int8),
            micro_batch=np.array([r.get("micro_batch", -1) for r in records], dtype=np.int32),
            start_s=np.array([r["start_s"] for r in records], dtype=float),
            end_s=np.array([r["end_s"] for r in records], dtype=float),
        )


@dataclass
class StageResult:
    """One stage's figures. Bytes are per stage; `peak_memory_bytes` = static + peak activations."""

    index: int
    layers: tuple[int, int]
    device: int
    busy_s: float
    peak_activation_bytes: float
    peak_memory_bytes: float
    param_bytes: float
    state_bytes: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "layers": list(self.layers), "device": self.device,
            "busy_s": self.busy_s, "peak_activation_bytes": self.peak_activation_bytes,
            "peak_memory_bytes": self.peak_memory_bytes, "param_bytes": self.param_bytes,
            "state_bytes": self.state_bytes,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StageResult":
        return cls(
            index=int(d["index"]), layers=(int(d["layers"][0]), int(d["layers"][1])),
            device=int(d.get("device", d["index"])), busy_s=float(d["busy_s"]),
            peak_activation_bytes=float(d["peak_activation_bytes"]),
            peak_memory_bytes=float(d["peak_memory_bytes"]), param_bytes=float(d["param_bytes"]),
            state_bytes=float(d.get("state_bytes", 0.0)),
        )


@dataclass
class Result:
    """A predicted or measured training step. `to_dict` gives the JSON schema both halves share."""

    step_time_s: float
    throughput_samples_per_s: float
    bubble_fraction: float
    analytic_bubble_fraction: float
    fits_in_memory: bool
    stages: list[StageResult]
    timeline: Timeline
    batch_size: int
    micro_batches: int
    memory_capacity_bytes: float = float("inf")
    device_peak_memory_bytes: dict[int, float] = field(default_factory=dict)
    source: str = "simulated"
    # Per stage: (times, activation bytes held from each time on); optional.
    memory_timeline: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)

    def devices_over_capacity(self) -> list[tuple[int, list[int], float]]:
        """(device, its stages, peak bytes) for every device whose peak exceeds the capacity."""
        return [
            (device, [s.index for s in self.stages if s.device == device], peak)
            for device, peak in sorted(self.device_peak_memory_bytes.items())
            if peak > self.memory_capacity_bytes
        ]

    def to_dict(self, timeline: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "step_time_s": self.step_time_s,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "bubble_fraction": self.bubble_fraction,
            "analytic_bubble_fraction": self.analytic_bubble_fraction,
            "fits_in_memory": self.fits_in_memory,
            "batch_size": self.batch_size,
            "micro_batches": self.micro_batches,
            "memory_capacity_bytes": _finite_or_none(self.memory_capacity_bytes),
            "device_peak_memory_bytes": {str(k): v for k, v in self.device_peak_memory_bytes.items()},
            "source": self.source,
            "stages": [s.to_dict() for s in self.stages],
        }
        if timeline:
            out["timeline"] = self.timeline.to_records()
            out["memory_timeline"] = [
                {"stage": k, "time_s": t.tolist(), "activation_bytes": b.tolist()}
                for k, (t, b) in enumerate(self.memory_timeline)
            ]
        return out

    def to_json(self, timeline: bool = True, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(timeline), indent=indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Result":
        cap = d.get("memory_capacity_bytes")
        return cls(
            step_time_s=float(d["step_time_s"]),
            throughput_samples_per_s=float(d["throughput_samples_per_s"]),
            bubble_fraction=float(d["bubble_fraction"]),
            analytic_bubble_fraction=float(d["analytic_bubble_fraction"]),
            fits_in_memory=bool(d["fits_in_memory"]),
            stages=[StageResult.from_dict(s) for s in d["stages"]],
            timeline=Timeline.from_records(d.get("timeline", [])),
            batch_size=int(d.get("batch_size", 0)),
            micro_batches=int(d.get("micro_batches", 0)),
            memory_capacity_bytes=float("inf") if cap is None else float(cap),
            device_peak_memory_bytes={int(k): float(v) for k, v in d.get("device_peak_memory_bytes", {}).items()},
            source=str(d.get("source", "simulated")),
            memory_timeline=[
                (np.asarray(m["time_s"], dtype=float), np.asarray(m["activation_bytes"], dtype=float))
                for m in d.get("memory_timeline", [])
            ],
        )


def _finite_or_none(value: float) -> float | None:
    return None if not np.isfinite(value) else float(value)


def analytic_bubble(stages: int, micro_batches: int) -> float:
    """GPipe's bubble overhead (K-1)/(M+K-1)."""
    return (stages - 1) / (micro_batches + stages - 1)


def summarize(
    timeline: Timeline,
    *,
    batch_size: int,
    micro_batches: int,
    stage_layers: Sequence[tuple[int, int]],
    device_map: Sequence[int],
    peak_activation_bytes: Sequence[float],
    param_bytes: Sequence[float],
    state_bytes: Sequence[float],
    memory_capacity_bytes: float,
    device_peak_memory_bytes: dict[int, float] | None = None,
    source: str = "simulated",
) -> Result:
    """Compute a Result from a timeline: the one definition of step time, throughput and bubble.

    Step time is the last action's end (the timeline starts at 0). The bubble fraction is the share
    of device time idle within the step: 1 - (compute seconds of all stages) / (devices x step).
    """
    K = len(stage_layers)
    step = float(timeline.end_s.max()) if len(timeline) else 0.0
    durations = np.where(timeline.is_compute, timeline.end_s - timeline.start_s, 0.0)
    busy = np.bincount(timeline.stage, weights=durations, minlength=K)
    devices = len(set(device_map))
    bubble = 1.0 - float(busy.sum()) / (devices * step) if step > 0 else 0.0
    stages = []
    for k in range(K):
        static = param_bytes[k] + state_bytes[k]
        stages.append(
            StageResult(
                index=k, layers=tuple(stage_layers[k]), device=int(device_map[k]),
                busy_s=float(busy[k]), peak_activation_bytes=float(peak_activation_bytes[k]),
                peak_memory_bytes=float(static + peak_activation_bytes[k]),
                param_bytes=float(param_bytes[k]), state_bytes=float(state_bytes[k]),
            )
        )
    if device_peak_memory_bytes is None:
        device_peak_memory_bytes = {}
        for s in stages:
            device_peak_memory_bytes[s.device] = device_peak_memory_bytes.get(s.device, 0.0) + s.peak_memory_bytes
    fits = all(v <= memory_capacity_bytes for v in device_peak_memory_bytes.values())
    return Result(
        step_time_s=step,
        throughput_samples_per_s=batch_size / step if step > 0 else float("inf"),
        bubble_fraction=max(0.0, bubble),
        analytic_bubble_fraction=analytic_bubble(K, micro_batches),
        fits_in_memory=fits,
        stages=stages,
        timeline=timeline,
        batch_size=batch_size,
        micro_batches=micro_batches,
        memory_capacity_bytes=memory_capacity_bytes,
        device_peak_memory_bytes=device_peak_memory_bytes,
        source=source,
    )
