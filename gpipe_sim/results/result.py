"""The result schema shared by the simulator and the executor, and how it is computed from a timeline."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from gpipe_sim.mesh import Mesh
from gpipe_sim.results.run_cost import RunCost
from gpipe_sim.schedule.actions import ACTION_KINDS, COMPUTE_KINDS, Kind
from gpipe_sim.schedule.registry import rank_chunks

_COMPUTE_CODES = np.array(sorted(COMPUTE_KINDS))  # for np.isin over Kind codes


@dataclass
class Timeline:
    """Every action of the step, columnar: rank, chunk (-1: the update), kind (a Kind code),
    micro-batch, start and end in seconds from the step's start. `tp_s` (optional, None where
    unknown: T = 1, a measured step, files written before it): per action, the seconds
    tensor-parallel collectives add to it, inside its [start_s, end_s] (0 for non-pass kinds)."""

    rank: np.ndarray
    chunk: np.ndarray
    kind: np.ndarray
    micro_batch: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    tp_s: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.rank)

    @property
    def kind_names(self) -> list[str]:
        return [ACTION_KINDS[int(k)] for k in self.kind]

    @property
    def is_compute(self) -> np.ndarray:
        return np.isin(self.kind, _COMPUTE_CODES)

    def to_records(self) -> list[dict[str, Any]]:
        """One dict per action; the key `tp_s` only where the column is present."""
        records = [
            {"rank": int(r), "chunk": int(c), "kind": ACTION_KINDS[int(k)], "micro_batch": int(m),
             "start_s": float(a), "end_s": float(b)}
            for r, c, k, m, a, b in zip(self.rank.tolist(), self.chunk.tolist(), self.kind.tolist(),
                                        self.micro_batch.tolist(), self.start_s.tolist(), self.end_s.tolist())
        ]
        if self.tp_s is not None:
            for record, tp in zip(records, np.asarray(self.tp_s, dtype=float).tolist()):
                record["tp_s"] = tp
        return records

    @classmethod
    def from_records(cls, records: Sequence[dict[str, Any]]) -> "Timeline":
        """From `to_records` output (files written before chunks existed name the rank `stage`;
        `tp_s` is None unless some record carries it, 0 for those that do not)."""
        rank = np.array([r["rank"] if "rank" in r else r["stage"] for r in records], dtype=np.int32)
        tp = (np.array([r.get("tp_s", 0.0) for r in records], dtype=float)
              if any("tp_s" in r for r in records) else None)
        return cls(
            rank=rank,
            chunk=np.array([r.get("chunk", rk) for r, rk in zip(records, rank.tolist())], dtype=np.int32),
            kind=np.array([ACTION_KINDS.index(r["kind"]) for r in records], dtype=np.int8),
            micro_batch=np.array([r.get("micro_batch", -1) for r in records], dtype=np.int32),
            start_s=np.array([r["start_s"] for r in records], dtype=float),
            end_s=np.array([r["end_s"] for r in records], dtype=float),
            tp_s=tp,
        )


@dataclass(frozen=True)
class Layout:
    """What a Result needs of the plan: each chunk's layers and rank, and the mesh (the sizes and
    each rank's device)."""

    chunk_layers: tuple[tuple[int, int], ...]
    chunk_rank: tuple[int, ...]
    mesh: Mesh
    # Replicas whose ranks the timeline holds (0: all): 1 where replica 0 was timed for D alike
    # replicas (gpipe_sim.plan.replica_symmetry), each of the others running its times
    timeline_replicas: int = 0

    @property
    def device_map(self) -> tuple[int, ...]:
        """The first device of each pipeline rank of replica 0."""
        return self.mesh.rank_devices[:self.mesh.stages]


@dataclass
class ChunkResult:
    """One model chunk's figures: its layers, its rank, its compute and its own activation peak."""

    index: int
    rank: int
    layers: tuple[int, int]
    busy_s: float
    peak_activation_bytes: float
    param_bytes: float
    state_bytes: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "rank": self.rank, "layers": list(self.layers), "busy_s": self.busy_s,
                "peak_activation_bytes": self.peak_activation_bytes, "param_bytes": self.param_bytes,
                "state_bytes": self.state_bytes}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ChunkResult":
        return cls(index=int(d["index"]), rank=int(d["rank"]), layers=(int(d["layers"][0]), int(d["layers"][1])),
                   busy_s=float(d["busy_s"]), peak_activation_bytes=float(d["peak_activation_bytes"]),
                   param_bytes=float(d["param_bytes"]), state_bytes=float(d.get("state_bytes", 0.0)))


@dataclass
class StageResult:
    """One pipeline rank's figures, over all its chunks. Bytes are per rank.

    `peak_memory_bytes`: predicted, static (parameters, gradients, optimizer states, master weights)
    + the peak of held activations plus the running pass's transient bytes (gpipe_sim.plan.memory_timeline);
    measured, the rank's real tensor bytes at their peak over a dedicated step (gpipe_exec.measure.memory).
    `peak_activation_bytes`: the bytes saved for backward by the schedule's accounting (measured: by
    the saved-tensor hooks, which count as the simulator counts). `memory_breakdown`: what
    `peak_memory_bytes` is made of at its peak, by category (empty when unknown).
    """

    index: int
    chunks: tuple[int, ...]
    layers: tuple[tuple[int, int], ...]  # per chunk: (first, last)
    device: int
    busy_s: float
    peak_activation_bytes: float
    peak_memory_bytes: float
    param_bytes: float
    state_bytes: float = 0.0
    exposed_allreduce_s: float = 0.0  # waiting for the data-parallel reductions before the update
    tp_comm_s: float = 0.0  # of its passes, the seconds tensor-parallel collectives add over the step
    memory_breakdown: dict[str, float] = field(default_factory=dict)

    @property
    def layers_text(self) -> str:
        """The layers as a reader writes them: "0-5" or "0-2, 9-11"."""
        return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in self.layers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "chunks": list(self.chunks), "layers": [list(pair) for pair in self.layers],
            "device": self.device, "busy_s": self.busy_s, "peak_activation_bytes": self.peak_activation_bytes,
            "peak_memory_bytes": self.peak_memory_bytes, "param_bytes": self.param_bytes,
            "state_bytes": self.state_bytes, "exposed_allreduce_s": self.exposed_allreduce_s,
            "tp_comm_s": self.tp_comm_s,
            **({"memory_breakdown": dict(self.memory_breakdown)} if self.memory_breakdown else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StageResult":
        layers = d["layers"]
        if layers and not isinstance(layers[0], (list, tuple)):  # written before chunks: [first, last]
            layers = [layers]
        index = int(d["index"])
        return cls(
            index=index, chunks=tuple(int(c) for c in d.get("chunks", [index])),
            layers=tuple((int(a), int(b)) for a, b in layers),
            device=int(d.get("device", index)), busy_s=float(d["busy_s"]),
            peak_activation_bytes=float(d["peak_activation_bytes"]),
            peak_memory_bytes=float(d["peak_memory_bytes"]), param_bytes=float(d["param_bytes"]),
            state_bytes=float(d.get("state_bytes", 0.0)),
            exposed_allreduce_s=float(d.get("exposed_allreduce_s", 0.0)),
            tp_comm_s=float(d.get("tp_comm_s", 0.0)),
            memory_breakdown={str(k): float(v) for k, v in (d.get("memory_breakdown") or {}).items()},
        )


@dataclass(frozen=True)
class ModelFigures:
    """What the model, the batch and the accelerator fix about a step whatever the schedule: the
    inputs of `Result.tokens_per_s`, `tflops_per_device` and `mfu` (`gpipe_sim.api.model_figures`).

    `model_flops_per_step`: the model FLOPs of one training step, re-computation NOT counted: for
    the transformer preset Megatron-LM's count (`gpipe_sim.model.model_flops`: its GEMMs and causal
    attention, 3x the forward), for other models the batch's forward and backward passes as the
    layer table counts them (sum over layers of forward + backward FLOPs per sample, times the
    batch size). None where a layer gives no FLOPs (timed in seconds). `palm_flops_per_step`: the
    transformer preset's under PaLM's convention (6 N + 12 L H Q T per token), else None. `tokens_per_step`: batch x seq_len for a token model (the
    transformer preset), None for others (their rate is samples/s). `peak_flops_per_device`: the
    accelerator's peak for the training dtype (the highest given where that dtype has none, as the
    cost model does).
    """

    parameters: int
    model_flops_per_step: float | None = None
    tokens_per_step: int | None = None
    peak_flops_per_device: float | None = None
    palm_flops_per_step: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"parameters": int(self.parameters),
                "model_flops_per_step": _optional_finite(self.model_flops_per_step),
                "tokens_per_step": self.tokens_per_step,
                "peak_flops_per_device": _optional_finite(self.peak_flops_per_device),
                "palm_flops_per_step": _optional_finite(self.palm_flops_per_step)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelFigures | None":
        """From a Result's JSON (None for files written before these figures)."""
        if d.get("parameters") is None:
            return None
        flops, tokens, peak = d.get("model_flops_per_step"), d.get("tokens_per_step"), d.get("peak_flops_per_device")
        palm = d.get("palm_flops_per_step")
        return cls(parameters=int(d["parameters"]), model_flops_per_step=None if flops is None else float(flops),
                   tokens_per_step=None if tokens is None else int(tokens),
                   peak_flops_per_device=None if peak is None else float(peak),
                   palm_flops_per_step=None if palm is None else float(palm))

    def tokens_per_s(self, step_time_s: float) -> float | None:
        """Tokens per second: tokens per step / step time (None for a non-token model)."""
        if self.tokens_per_step is None or not step_time_s > 0:
            return None
        return _optional_finite(self.tokens_per_step / step_time_s)

    def tflops_per_device(self, step_time_s: float, devices: int) -> float | None:
        """Achieved model TFLOP/s per device: model FLOPs per step / step time / devices / 1e12."""
        if self.model_flops_per_step is None or not step_time_s > 0 or devices < 1:
            return None
        return _optional_finite(self.model_flops_per_step / step_time_s / devices / 1e12)

    def mfu(self, step_time_s: float, devices: int, flops: float | None = None) -> float | None:
        """Model FLOPs utilisation: model FLOPs per step (`flops`, else `model_flops_per_step`:
        Megatron-LM's for the transformer preset) / (step time x devices x peak FLOP/s)."""
        flops = self.model_flops_per_step if flops is None else flops
        if flops is None or not self.peak_flops_per_device or not step_time_s > 0 or devices < 1:
            return None
        return _optional_finite(flops / (step_time_s * devices * self.peak_flops_per_device))

    def rates(self, step_time_s: float, devices: int) -> dict[str, Any]:
        """The figures people quote, under the keys of `Result.to_dict`: `mfu` Megatron-LM's,
        `mfu_palm` PaLM's (None but for the transformer preset)."""
        palm = None if self.palm_flops_per_step is None else self.mfu(step_time_s, devices, self.palm_flops_per_step)
        return {"parameters": int(self.parameters), "tokens_per_s": self.tokens_per_s(step_time_s),
                "tflops_per_device": self.tflops_per_device(step_time_s, devices),
                "mfu": self.mfu(step_time_s, devices), "mfu_palm": palm}


NO_FIGURES = {"parameters": None, "tokens_per_s": None, "tflops_per_device": None, "mfu": None, "mfu_palm": None}


@dataclass
class Result:
    """A predicted or measured training step. `to_dict` gives the JSON schema both halves share.
    `stages` has one entry per pipeline rank, `chunks` one per model chunk."""

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
    chunks: list[ChunkResult] = field(default_factory=list)
    data_parallel: int = 1  # D replicas of the pipeline; `stages` are replica 0's ranks
    num_devices: int = 0  # every device: T x K x D
    tensor_parallel: int = 1  # T devices per rank (bytes and times are each device's)
    # Per rank: (times, activation bytes held from each time on); optional.
    memory_timeline: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    figures: ModelFigures | None = None  # parameters, model FLOPs, tokens and peak (None: not known)
    run: RunCost | None = None  # the training run's days and cost (None: the scenario asks for none)

    @property
    def devices(self) -> int:
        """Every device of the step (all replicas)."""
        return max(1, self.num_devices or len({s.device for s in self.stages}))

    @property
    def quoted_figures(self) -> dict[str, Any]:
        """parameters, tokens_per_s, tflops_per_device and mfu (each None where unknown)."""
        if self.figures is None:
            return dict(NO_FIGURES)
        return self.figures.rates(self.step_time_s, self.devices)

    @property
    def parameters(self) -> int | None:
        """Total model parameters (of one replica)."""
        return self.quoted_figures["parameters"]

    @property
    def tokens_per_s(self) -> float | None:
        return self.quoted_figures["tokens_per_s"]

    @property
    def tflops_per_device(self) -> float | None:
        return self.quoted_figures["tflops_per_device"]

    @property
    def mfu(self) -> float | None:
        """Megatron-LM's MFU (`ModelFigures.mfu`)."""
        return self.quoted_figures["mfu"]

    @property
    def mfu_palm(self) -> float | None:
        """PaLM's MFU (the transformer preset's; None for other models)."""
        return self.quoted_figures["mfu_palm"]

    @property
    def exposed_allreduce_s(self) -> float:
        """The longest wait of any rank for its data-parallel reductions (0 with one replica)."""
        return max((s.exposed_allreduce_s for s in self.stages), default=0.0)

    @property
    def throughput_per_device(self) -> float:
        """Samples per second per device: what adding devices buys."""
        return self.throughput_samples_per_s / self.devices

    @property
    def imbalance_fraction(self) -> float:
        """The share of device time lost to uneven ranks: 1 - mean(busy) / max(busy) over the
        ranks. With `busiest_idle_fraction`: 1 - bubble = (1 - imbalance) x (1 - busiest idle)
        when every rank has a device of its own."""
        busy = [s.busy_s for s in self.stages]
        top = max(busy, default=0.0)
        return 1.0 - (sum(busy) / len(busy)) / top if top > 0 else 0.0

    @property
    def busiest_idle_fraction(self) -> float:
        """The share of the step the busiest rank idles: the pipeline's own fill and drain."""
        top = max((s.busy_s for s in self.stages), default=0.0)
        return max(0.0, 1.0 - top / self.step_time_s) if self.step_time_s > 0 else 0.0

    def devices_over_capacity(self) -> list[tuple[int, list[int], float]]:
        """(device, its ranks, peak bytes) for every device whose peak exceeds the capacity."""
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
            "imbalance_fraction": self.imbalance_fraction,
            "busiest_idle_fraction": self.busiest_idle_fraction,
            "data_parallel": self.data_parallel,
            "tensor_parallel": self.tensor_parallel,
            "num_devices": self.num_devices,
            "throughput_per_device": self.throughput_per_device,
            "exposed_allreduce_s": self.exposed_allreduce_s,
            **self.quoted_figures,
            **({k: v for k, v in self.figures.to_dict().items() if k != "parameters"} if self.figures else {}),
            "fits_in_memory": self.fits_in_memory,
            "batch_size": self.batch_size,
            "micro_batches": self.micro_batches,
            "memory_capacity_bytes": _finite_or_none(self.memory_capacity_bytes),
            "device_peak_memory_bytes": {str(k): v for k, v in self.device_peak_memory_bytes.items()},
            "source": self.source,
            "stages": [s.to_dict() for s in self.stages],
            "chunks": [c.to_dict() for c in self.chunks],
        }
        if self.run is not None:
            out["training_run"] = self.run.to_dict()
        if timeline:
            out["timeline"] = self.timeline.to_records()
            out["memory_timeline"] = [
                {"rank": k, "time_s": t.tolist(), "activation_bytes": b.tolist()}
                for k, (t, b) in enumerate(self.memory_timeline)
            ]
        return out

    def to_json(self, timeline: bool = True, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(timeline), indent=indent, allow_nan=False)

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
            chunks=[ChunkResult.from_dict(c) for c in d.get("chunks", [])],
            data_parallel=int(d.get("data_parallel", 1)),
            tensor_parallel=int(d.get("tensor_parallel", 1)),
            num_devices=int(d.get("num_devices", 0)),
            memory_timeline=[
                (np.asarray(m["time_s"], dtype=float), np.asarray(m["activation_bytes"], dtype=float))
                for m in d.get("memory_timeline", [])
            ],
            figures=ModelFigures.from_dict(d),
            run=RunCost.from_dict(d["training_run"]) if d.get("training_run") else None,
        )


def _finite_or_none(value: float) -> float | None:
    return None if not np.isfinite(value) else float(value)


def _optional_finite(value: float | None) -> float | None:
    return None if value is None else _finite_or_none(value)


def _stage_results(layout: Layout, busy: np.ndarray, exposed: np.ndarray, peak_activation_bytes: Sequence[float],
                   param_bytes: Sequence[float], state_bytes: Sequence[float],
                   peak_memory_bytes: Sequence[float] | None,
                   memory_breakdown: Sequence[dict[str, float]] | None,
                   tp_comm_s: Sequence[float] | None = None) -> list[StageResult]:
    """Each pipeline rank of replica 0: its chunks, busy and exposed all-reduce time, static bytes
    and peaks (static + peak activations unless `peak_memory_bytes` gives the rank's peak)."""
    stages = []
    for k, mine in enumerate(rank_chunks(layout.chunk_rank, len(layout.device_map))):
        params = float(sum(param_bytes[c] for c in mine))
        states = float(sum(state_bytes[c] for c in mine))
        stages.append(
            StageResult(
                index=k, chunks=tuple(mine), layers=tuple(tuple(layout.chunk_layers[c]) for c in mine),
                device=int(layout.device_map[k]), busy_s=float(busy[k]),
                peak_activation_bytes=float(peak_activation_bytes[k]),
                peak_memory_bytes=(params + states + float(peak_activation_bytes[k]) if peak_memory_bytes is None
                                   else float(peak_memory_bytes[k])),
                param_bytes=params, state_bytes=states, exposed_allreduce_s=float(exposed[k]),
                tp_comm_s=float(tp_comm_s[k]) if tp_comm_s is not None else 0.0,
                memory_breakdown=dict(memory_breakdown[k]) if memory_breakdown is not None else {},
            )
        )
    return stages


def summarize(
    timeline: Timeline,
    *,
    batch_size: int,
    micro_batches: int,
    layout: Layout,
    analytic_bubble_fraction: float,
    peak_activation_bytes: Sequence[float],
    chunk_peak_activation_bytes: Sequence[float],
    param_bytes: Sequence[float],
    state_bytes: Sequence[float],
    memory_capacity_bytes: float,
    device_peak_memory_bytes: dict[int, float] | None = None,
    source: str = "simulated",
    peak_memory_bytes: Sequence[float] | None = None,
    memory_breakdown: Sequence[dict[str, float]] | None = None,
    figures: ModelFigures | None = None,
    tp_comm_s: Sequence[float] | None = None,
) -> Result:
    """Compute a Result from a timeline: the one definition of step time, throughput and bubble.

    `peak_activation_bytes` is per rank; `chunk_peak_activation_bytes`, `param_bytes` and
    `state_bytes` are per chunk. Step time is the last action's end (the timeline starts at 0).
    `peak_memory_bytes` and `memory_breakdown` (per rank) replace static + peak activations where
    given (transients, or a measurement of memory in all). `tp_comm_s`: per rank, the seconds
    tensor-parallel collectives add to its passes. `figures` (what the model and batch fix)
    give the parameters, tokens/s, TFLOP/s per device and MFU.
    The bubble fraction is the share of device time idle within the step:
    1 - (compute seconds of all ranks) / (devices x step), a rank's compute keeping its T devices
    (tensor parallelism) busy.
    """
    K, C = len(layout.device_map), len(layout.chunk_rank)
    step = float(timeline.end_s.max()) if len(timeline) else 0.0
    durations = np.where(timeline.is_compute, timeline.end_s - timeline.start_s, 0.0)
    busy = np.bincount(timeline.rank, weights=durations, minlength=K)
    mesh = layout.mesh
    stands_for = mesh.data_parallel / (layout.timeline_replicas or mesh.data_parallel)  # replicas per timed one
    first = timeline.rank < K  # replica 0
    in_chunk = first & (timeline.chunk >= 0)
    chunk_busy = np.bincount(timeline.chunk[in_chunk], weights=durations[in_chunk], minlength=C)
    # waits for the data-parallel reductions: receives that carry no micro-batch
    waits = first & (timeline.kind == Kind.RECV) & (timeline.micro_batch < 0)
    exposed = np.bincount(timeline.rank[waits], weights=(timeline.end_s - timeline.start_s)[waits], minlength=K)
    devices = mesh.num_devices
    # each timed rank stands for its T x C devices
    bubble = 1.0 - float(busy.sum()) * stands_for * mesh.devices_per_rank / (devices * step) if step > 0 else 0.0
    chunks = [
        ChunkResult(index=c, rank=int(layout.chunk_rank[c]), layers=tuple(layout.chunk_layers[c]),
                    busy_s=float(chunk_busy[c]), peak_activation_bytes=float(chunk_peak_activation_bytes[c]),
                    param_bytes=float(param_bytes[c]), state_bytes=float(state_bytes[c]))
        for c in range(C)
    ]
    stages = _stage_results(layout, busy, exposed, peak_activation_bytes, param_bytes, state_bytes,
                            peak_memory_bytes, memory_breakdown, tp_comm_s)
    if device_peak_memory_bytes is None:
        device_peak_memory_bytes = {}
        for s in stages:
            device_peak_memory_bytes[s.device] = device_peak_memory_bytes.get(s.device, 0.0) + s.peak_memory_bytes
    fits = all(v <= memory_capacity_bytes for v in device_peak_memory_bytes.values())
    return Result(
        step_time_s=step,
        throughput_samples_per_s=batch_size / step if step > 0 else float("inf"),
        bubble_fraction=max(0.0, bubble),
        analytic_bubble_fraction=analytic_bubble_fraction,
        fits_in_memory=fits,
        stages=stages,
        timeline=timeline,
        batch_size=batch_size,
        micro_batches=micro_batches,
        memory_capacity_bytes=memory_capacity_bytes,
        device_peak_memory_bytes=device_peak_memory_bytes,
        source=source,
        chunks=chunks,
        data_parallel=mesh.data_parallel,
        tensor_parallel=mesh.tensor_parallel,
        num_devices=devices,
        figures=figures,
    )


