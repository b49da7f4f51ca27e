"""Measurement: an aligned clock across ranks and the bytes saved for backward (activation memory)."""

from __future__ import annotations

import socket
import sys
import time
from contextlib import contextmanager
from typing import Iterable, Iterator

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from gpipe_exec.measure.saved_hooks import nested_saved_tensors_hooks


def local_data(t: torch.Tensor) -> torch.Tensor:
    """The tensor this process holds: a wrapper subclass's inner data (a DTensor's local shard,
    a collective's pending result), else `t` itself."""
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        return local_data(getattr(t, names[0]))
    return t


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of a tensor's elements (a view counts its own elements, not its whole storage; a
    DTensor its local shard's)."""
    t = local_data(t)
    return t.numel() * t.element_size()


class SavedBytesMeter:
    """Counts the bytes that autograd saves for backward, per micro-batch, as the simulator defines them.

    Inside `track(m)`, every tensor packed by `saved_tensors_hooks` adds its bytes to micro-batch
    `m` once per `track` (a tensor two operators save -- a softmax's result kept by it and by the
    loss, a layer's output kept by it and by the next layer as its input -- is one allocation),
    except tensors that share storage with a parameter or buffer (static memory). The profiler
    tracks one layer at a time and records what a layer saves in common with the previous one
    (LayerSpec.saved_with_previous_bytes_per_sample), which gpipe_sim takes off inside a chunk. `retain`
    adds bytes kept by hand (the chunk input under re-materialization); `release(m)` frees all of
    `m`'s bytes (its last backward pass ended). `peak` is the largest total held at any time. So a
    kept forward holds its saved bytes, a re-materialized one its input, and the re-computation
    brings the micro-batch to max(saved, input) bytes, exactly gpipe_sim.plan.memory_timeline's definition.

    A chunk's meter passes every change on to its `parent`, the rank's meter (which holds nothing
    of its own): the chunk's `peak` is its own peak, the parent's the rank's over all its chunks.
    """

    def __init__(self, modules: Iterable[torch.nn.Module] = (), parent: "SavedBytesMeter | None" = None) -> None:
        self.static: set[int] = set()  # storage addresses of parameters and buffers
        self.static_ids: set[int] = set()  # their ids (meta tensors have no addresses)
        for module in modules:
            for t in [*module.parameters(), *module.buffers()]:
                self.static_ids.add(id(t))
                t = local_data(t)
                if t.device.type != "meta":
                    self.static.add(t.untyped_storage().data_ptr())
        self.parent = parent
        self.held: dict[int, int] = {}
        self.total = 0
        self.peak = 0
        self.last_packed = 0  # bytes packed during the latest `track`
        self._current: int | None = None
        self._packed: set[tuple[int, int]] = set()  # (address, bytes) packed in the current `track`

    def _is_static(self, t: torch.Tensor) -> bool:
        if id(t) in self.static_ids or (t._base is not None and id(t._base) in self.static_ids):
            return True
        t = local_data(t)
        return t.device.type != "meta" and t.untyped_storage().data_ptr() in self.static

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if self._current is not None and not self._is_static(t):
            nbytes = tensor_bytes(t)
            mine = local_data(t)
            key = (mine.data_ptr(), nbytes) if mine.device.type != "meta" else (id(t), -1)
            if key in self._packed:
                return t
            self._packed.add(key)
            self.last_packed += nbytes
            self._add(self._current, nbytes)
        return t

    def _change_total(self, delta: int) -> None:
        self.total += delta
        if self.total > self.peak:
            self.peak = self.total
        if self.parent is not None:
            self.parent._change_total(delta)

    def _add(self, m: int, nbytes: int) -> None:
        self.held[m] = self.held.get(m, 0) + nbytes
        self._change_total(nbytes)

    @contextmanager
    def track(self, m: int, retained: int = 0) -> Iterator[None]:
        """Count what autograd saves for micro-batch m. `retained`: bytes of the input kept since a
        re-materialized forward; the first layer saves that very input, so the re-computation adds
        only max(saved - retained, 0), as gpipe_sim.plan.memory_timeline counts it."""
        self._current = m
        self.last_packed = 0
        self._packed = set()
        self._add(m, -retained)
        before = self.held[m]
        try:
            # nested: a pair entered inside (a resharded GEMM input) is composed with this one, not hiding it
            with nested_saved_tensors_hooks(self._pack, lambda t: t):
                yield
        finally:
            self._current = None
            self._packed = set()
            shortfall = retained - (self.held[m] - before)
            if shortfall > 0:
                self._add(m, shortfall)

    def add_saved(self, m: int, nbytes: int, retained: int = 0) -> None:
        """Account `nbytes` saved for micro-batch m without hooks (a figure `track` measured before
        for the same pass and size), with the same `retained` rule as `track`."""
        self._add(m, -retained)
        self._add(m, max(nbytes, retained))

    def retain(self, m: int, nbytes: int) -> None:
        self._add(m, nbytes)

    def release(self, m: int) -> None:
        self._change_total(-self.held.pop(m, 0))

    def reset(self) -> None:
        """Forget everything (the parent is reset on its own)."""
        self.held.clear()
        self.total = self.peak = 0


class AlignedClock:
    """Seconds on a clock shared by all ranks: local `perf_counter` plus an offset to rank 0's.

    On one Linux machine every process's `perf_counter` reads the same system-wide monotonic
    clock, so the offset is exactly 0 (an estimate could only add error). Across machines it is
    estimated NTP-style: several ping-pongs with rank 0, the shortest round trip wins.
    """

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def __call__(self) -> float:
        return time.perf_counter() + self.offset

    @classmethod
    def synchronize(cls, rounds: int = 8) -> "AlignedClock":
        """Estimate this rank's offset to rank 0 (collective: every rank must call it)."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return cls()
        rank, world = dist.get_rank(), dist.get_world_size()
        hosts: list[str | None] = [None] * world
        dist.all_gather_object(hosts, socket.gethostname())
        if sys.platform.startswith("linux") and len(set(hosts)) == 1:
            return cls(0.0)
        buf = torch.zeros(1, dtype=torch.float64, device=collective_device())
        best_rtt, offset = float("inf"), 0.0
        for peer in range(1, world):
            for _ in range(rounds):
                if rank == 0:
                    dist.recv(buf, src=peer)
                    buf[0] = time.perf_counter()
                    dist.send(buf, dst=peer)
                elif rank == peer:
                    t1 = time.perf_counter()
                    dist.send(buf, dst=0)
                    dist.recv(buf, src=0)
                    t2 = time.perf_counter()
                    if t2 - t1 < best_rtt:
                        best_rtt, offset = t2 - t1, float(buf[0]) - (t1 + t2) / 2
        return cls(offset)


def collective_device() -> torch.device:
    """Where a tensor handed to the default process group must live: this process's current GPU
    under NCCL (which moves no host memory), host memory under gloo."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def cuda_peak_bytes(device: torch.device) -> float | None:
    """`torch.cuda.max_memory_allocated` on a CUDA device (None elsewhere)."""
    if device.type != "cuda":
        return None
    return float(torch.cuda.max_memory_allocated(device))
