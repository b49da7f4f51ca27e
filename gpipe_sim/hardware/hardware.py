"""The hardware part of a scenario: accelerator, links, host time per action, stage-to-device map."""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

from pydantic import Field, field_validator, model_validator

from gpipe_sim.hardware.gpu_tables import GpuTables, peak_for
from gpipe_sim.schema.fields import (Bandwidth, DeviceCount, DeviceId, Flops, Fraction, PositiveBytes, Price, Seconds,
                                     _Strict)
from gpipe_sim.schema.limits import MAX_STAGES


# ---------------------------------------------------------------------------------------------
# hardware


class Accelerator(_Strict):
    """One accelerator: compute, memory and per-kernel overhead."""

    name: str = "custom"
    peak_flops: dict[Literal["fp32", "bf16", "fp16", "fp8"], Flops]  # fp8: dense (gpipe_sim.costs.fp8)
    efficiency: Fraction = 0.5
    memory_bytes: PositiveBytes = math.inf
    usable_memory_fraction: Fraction = 1.0  # the rest: runtime, fragmentation
    memory_bandwidth: Bandwidth = math.inf
    kernel_overhead_s: Seconds = 0.0
    # How the framework keeps a dropout mask for backward: "bool", one byte an element (CUDA's
    # fused dropout); "dtype", the scaled noise in the activations' own type (torch on CPU).
    dropout_masks: Literal["bool", "dtype"] = "bool"
    # How the framework's optimizer steps by default (gpipe_sim.scenario.scenario.OPTIMIZER_STEPS):
    # "fused" on GPUs, as large-model training steps (apex's FusedAdam in Megatron-LM and
    # DeepSpeed, torch's fused=True; gpipe-exec then steps so too), and where a compiler fuses the
    # update (XLA); "for_loop" on CPU, torch's default there.
    optimizer_step: Literal["for_loop", "foreach", "fused"] = "fused"
    # How an optimizer with no fused step (RMSprop) steps where the default is fused: torch's
    # "foreach" on CUDA; "for_loop" on the TPUs.
    unfused_optimizer_step: Literal["for_loop", "foreach"] = "foreach"
    # Kernel-level tables (gpipe_sim.costs.gpu_model): where given, a preset layer's time is the
    # sum of its kernels' and `efficiency`/`kernel_overhead_s` are not used for it.
    gpu: GpuTables | None = None

    @field_validator("peak_flops")
    @classmethod
    def _some_rate(cls, value: dict[str, float]) -> dict[str, float]:
        if not value:
            raise ValueError("give the peak rate of at least one of fp32, bf16, fp16")
        return value

    def dropout_mask_bytes(self, dtype_bytes: int) -> int:
        """Bytes a dropout mask keeps per element, for activations of `dtype_bytes` bytes."""
        return 1 if self.dropout_masks == "bool" else dtype_bytes

    def peak_flops_for(self, dtype: str) -> float:
        """The peak FLOP/s for `dtype`: its entry, else the highest given (the cost model's rate
        and the MFU's denominator)."""
        return peak_for(self.peak_flops, dtype)

    @property
    def usable_memory_bytes(self) -> float:
        """The capacity a stage's memory is checked against."""
        return self.memory_bytes * self.usable_memory_fraction


class Link(_Strict):
    """A point-to-point link between two accelerators, per direction."""

    bandwidth: Bandwidth
    latency_s: Seconds = 0.0


class Network(Link):
    """The network joining nodes. `per: device` (the default): every device has its own port of
    `bandwidth` to it. `per: node`: each node has `nics` ports (NICs) of `bandwidth` each, shared
    by its devices: device i of a node of P sends through NIC i * nics // P, so the devices on one
    NIC take turns (one 200 Gb/s HDR NIC, 25 GB/s, per node of 8: `{bandwidth: 200 Gb/s, per: node,
    nics: 1}`; `b` is a bit and `B` a byte, as `gpipe_sim.schema.units` reads them).
    Pipeline sends between nodes use the sender's port; an all-reduce ring between nodes runs, as
    NCCL's channels do, as `nics` rings side by side (at `nics` x `bandwidth`), holding every NIC
    of the nodes it leaves. Traffic inside a node uses `link`."""

    per: Literal["device", "node"] = "device"
    nics: DeviceCount = 1  # NICs per node (per: node only)

    @model_validator(mode="after")
    def _nics_per_node_only(self) -> "Network":
        if self.per == "device" and self.nics != 1:
            raise ValueError("nics: NICs per node are given with per: node (per: device gives each device a port)")
        return self


class Host(_Strict):
    """Host time per pipeline action, spent on the stage's own timeline before it can go on.

    What a real runtime costs beyond the kernels and the wire: dispatching an action, issuing a
    send (before its transfer starts), completing a receive (after its data arrives). Zero on
    every preset but a100-80gb (Megatron-DeepSpeed's synchronous pipeline p2p, fitted to vTrain's
    rows); `gpipe-exec calibrate` measures them for the executor on this machine.
    """

    action_s: Seconds = 0.0  # per compute action (forward, recompute, backward, update)
    send_s: Seconds = 0.0  # per send, before the transfer leaves
    recv_s: Seconds = 0.0  # per receive, after the data has arrived
    copy_bandwidth: Bandwidth = math.inf  # plus bytes / copy_bandwidth at each end (host copies)
    # The host time runs on the device's own cores (a CPU "device"): a device shared by several
    # stages serves it as it serves compute, one stage at a time.
    on_device: bool = False
    # The runtime holds, all step, a buffer for every receive of the step (allocated once, reused
    # step after step) and its share of the batch on the first chunk's rank, as gpipe-exec and
    # torch.distributed.pipelining do; with data parallelism, gpipe-exec's flat all-reduce bucket
    # per chunk and ZeRO-1's master shard, shard gradient and all-gather buffers: counted in each
    # rank's memory (gpipe_sim.plan.memory_timeline).
    step_buffers: bool = False

    def send_seconds(self, nbytes: float | np.ndarray) -> float | np.ndarray:
        """A send of `nbytes` on the sender's timeline: `send_s` plus its host copy."""
        return self.send_s + nbytes / self.copy_bandwidth

    def recv_seconds(self, nbytes: float | np.ndarray) -> float | np.ndarray:
        """A receive of `nbytes` on the receiver's timeline once the data is there: `recv_s` plus its copy."""
        return self.recv_s + nbytes / self.copy_bandwidth


# What a preset gives a scenario's hardware: an accelerator preset the first three, a cluster
# preset (a node as its vendor sells it) the nodes and the network too.
_PRESET_FIELDS = ("accelerator", "link", "host", "devices_per_node", "network")


class Hardware(_Strict):
    """Accelerators, links and the stage-to-device map. A `preset` fills any field not given."""

    preset: str | None = None
    accelerator: Accelerator
    link: Link
    host: Host = Field(default_factory=Host)
    links: tuple[Link, ...] | None = Field(None, max_length=MAX_STAGES)  # per consecutive stage pair (K-1)
    stage_to_device: tuple[DeviceId, ...] | None = Field(None, max_length=MAX_STAGES)
    # A cluster: devices 0..N-1 in nodes of `devices_per_node` (None: one node); `network` joins
    # nodes (a port per device, or `per: node` NICs shared by a node's devices), `link` devices
    # within a node. `placement[d][r]`: the device of
    # replica d's rank r (default: Megatron-LM's order, replicas of a stage on neighbouring devices).
    devices_per_node: DeviceCount | None = None
    network: Network | None = None
    placement: tuple[tuple[DeviceId, ...], ...] | None = Field(None, max_length=MAX_STAGES)
    # What a device costs per hour, in any currency (gpipe_sim.results.run_cost); None: no cost figures.
    price_per_device_hour: Price | None = None

    @model_validator(mode="after")
    def _nics_fit_the_node(self) -> "Hardware":
        net = self.network
        if net is not None and net.per == "node" and self.devices_per_node is not None \
                and net.nics > self.devices_per_node:
            raise ValueError(f"network.nics: {net.nics} NICs for nodes of {self.devices_per_node} devices "
                             "(at most one per device)")
        return self

    def network_ports(self, devices: Any, per_node: int) -> Any:
        """The network port each device (an int or an integer numpy array) sends through to
        other nodes: its own (the device id) with a port per device; else its node's NIC,
        node * nics + (index in the node) * nics // per_node. Ports number less than devices."""
        net = self.network
        if net is None or net.per == "device":
            return devices
        nics = min(net.nics, per_node)
        return (devices // per_node) * nics + (devices % per_node) * nics // per_node

    def network_ring_bandwidth(self, rings: int = 1) -> float:
        """Bandwidth of each of `rings` all-reduce rings that leave every node at once (a pipeline
        rank's T tensor-parallel devices each reduce their own shard, so T rings): with `per:
        node`, the node's NICs' bandwidth (the network's times `nics`) shared by the rings; with
        a port per device, each ring's own port's."""
        net = self.network or self.link
        if isinstance(net, Network) and net.per == "node":
            return net.bandwidth * net.nics / max(1, rings)
        return net.bandwidth

    def ring_ports(self, device: int, per_node: int) -> list[int]:
        """The network ports an all-reduce ring leaving `device`'s node holds: the device's own
        port, or every NIC of its node with `per: node`."""
        net = self.network
        if net is None or net.per == "device":
            return [device]
        nics = min(net.nics, per_node)
        return [(device // per_node) * nics + k for k in range(nics)]

    def link_between(self, stage: int) -> Link:
        """The link carrying transfers between stage `stage` and stage `stage + 1` (`link` where
        `links` gives none: there is no pair with one stage)."""
        if self.links and 0 <= stage < len(self.links):
            return self.links[stage]
        return self.link

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("preset") is None:
            return data
        from gpipe_sim.hardware.presets import hardware_preset

        name = data["preset"]
        if not isinstance(name, str):
            raise ValueError("hardware.preset: expected the name of a hardware preset")
        base = hardware_preset(name)
        merged = {k: v for k, v in base.items() if k in _PRESET_FIELDS}
        for key, value in data.items():
            if key in merged and isinstance(value, dict):
                nested = merged[key].get("gpu")
                if isinstance(nested, dict) and isinstance(value.get("gpu"), dict):  # the kernel tables' fields
                    value = {**value, "gpu": {**nested, **value["gpu"]}}
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
        return merged
