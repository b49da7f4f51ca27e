"""The parallel mesh: the sizes D, K, v, T, C, E and the (replica, rank, context, tensor) -> process -> device -> node map."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any, TypeVar

IndexT = TypeVar("IndexT")  # one index (int), or a numpy array of them

# Megatron-LM's default rank order (--rank-order "tp-cp-ep-dp-pp"): tensor-parallel ranks innermost,
# then context-parallel, then data-parallel, then pipeline. A pipeline rank of one replica therefore
# occupies T x C consecutive devices; its tensor-parallel groups are T consecutive ones and its
# context-parallel groups every T-th of them; the replicas of a pipeline rank are T x C devices
# apart (an expert group is E of them) and consecutive pipeline ranks D x T x C apart.
#
# A *program rank* g = d*K + r runs pipeline rank r's program for replica d (the simulator times
# the T x C devices of a program rank as one). The executor runs one *process* per device, process
# (g*C + c)*T + t for context rank c and tensor rank t (the process grid (replica, pipeline rank,
# context rank, tensor rank), row-major), on device rank_devices[g] + c*T + t.


@dataclass(frozen=True)
class Mesh:
    """Every parallel size of a step and where each of its processes runs: made once from a
    scenario (`Mesh.of`, `Scenario.mesh`), checked there (`mesh_problem`). `rank_devices[g]` is
    the first device of program rank g = d*K + r: `given_devices` (`hardware.placement`'s rows, or
    `hardware.stage_to_device` for one replica) where given, else Megatron-LM's order
    (`megatron_rank_devices`, made when first asked for: the sizes alone cost nothing)."""

    data_parallel: int = 1  # D: replicas of the pipeline
    stages: int = 1  # K: pipeline ranks
    chunks: int = 1  # v: model chunks per pipeline rank
    tensor_parallel: int = 1  # T: devices a layer's weights are split over
    context_parallel: int = 1  # C: devices a sample's sequence is split over
    expert_parallel: int = 1  # E: replicas a layer's routed experts are split over (carved from D)
    given_devices: tuple[int, ...] = ()  # per program rank d*K + r, as written; () -> Megatron-LM's order
    devices_per_node: int | None = None  # None: one node

    @cached_property
    def rank_devices(self) -> tuple[int, ...]:
        """The first device of each program rank d*K + r (its T x C devices follow it)."""
        return self.given_devices or megatron_rank_devices(self.stages, self.data_parallel, self.devices_per_rank)

    @classmethod
    def of(cls, scenario: Any) -> "Mesh":
        """The mesh of a validated scenario (its `pipeline` and `hardware` sections)."""
        p, hw = scenario.pipeline, scenario.hardware
        if hw.placement is not None:
            given: tuple[int, ...] = tuple(device for row in hw.placement for device in row)
        else:
            given = tuple(hw.stage_to_device or ())
        return cls(p.data_parallel, p.stages, p.chunks, p.tensor_parallel, p.context_parallel,
                   p.expert_parallel, given, hw.devices_per_node)

    # ---- sizes ------------------------------------------------------------------------------

    @property
    def devices_per_rank(self) -> int:
        """T x C: the devices one pipeline rank of one replica runs on."""
        return self.tensor_parallel * self.context_parallel

    @property
    def num_ranks(self) -> int:
        """D x K: the program ranks (every replica's pipeline ranks)."""
        return self.data_parallel * self.stages

    @property
    def num_processes(self) -> int:
        """D x K x C x T: the executor's processes, one per device of every program rank."""
        return self.num_ranks * self.devices_per_rank

    @property
    def num_devices(self) -> int:
        """Every device of the step: T x C from each distinct device a program rank starts on
        (fewer than `num_processes` where ranks share a device)."""
        return len(set(self.rank_devices)) * self.devices_per_rank

    @cached_property
    def device_span(self) -> int:
        """max(rank_devices) + 1: the device ids up to the last a program rank starts on (the base of
        the link keys, gpipe_sim.plan.links)."""
        return max(self.rank_devices) + 1

    @property
    def node_size(self) -> int:
        """The devices a node holds: `devices_per_node`, or where the hardware has no nodes (one
        node) `device_span`."""
        return self.devices_per_node or self.device_span

    @property
    def gradient_group(self) -> int:
        """D x C: the devices each weight's gradient is reduced over (Megatron-LM reduces over the
        data-parallel group with context parallelism, DP x CP: every context-parallel rank holds the
        same weights and computes their gradient on its part of the sequence)."""
        return self.data_parallel * self.context_parallel

    @property
    def expert_gradient_group(self) -> int:
        """D x C / E: the devices holding the same routed experts, over which their gradients are
        reduced (Megatron-LM's expert-data-parallel group)."""
        return self.gradient_group // self.expert_parallel

    @property
    def whole_layers(self) -> bool:
        """Whether one device's layer table is the whole model's (no T, C or E split: T x C x E = 1)."""
        return self.devices_per_rank * self.expert_parallel == 1

    # ---- indices ----------------------------------------------------------------------------

    def program_rank(self, replica: int, rank: IndexT) -> IndexT:
        """g = d*K + r: the program rank of pipeline rank `rank` (or of each of an array of them)
        in replica `replica`."""
        return replica * self.stages + rank

    def replica(self, program_rank: IndexT) -> IndexT:
        """d: the replica of a program rank g = d*K + r (or of each of an array of them)."""
        return program_rank // self.stages

    def pipeline_rank(self, program_rank: IndexT) -> IndexT:
        """r: the pipeline rank of a program rank g = d*K + r (or of each of an array of them)."""
        return program_rank % self.stages

    def device(self, program_rank: int, context_rank: int = 0, tensor_rank: int = 0) -> int:
        """The device of a program rank's context rank c and tensor rank t: its first + c*T + t."""
        return self.rank_devices[program_rank] + context_rank * self.tensor_parallel + tensor_rank

    def process(self, program_rank: int, context_rank: int = 0, tensor_rank: int = 0) -> int:
        """The executor's process of a program rank's context rank c and tensor rank t: (g*C + c)*T + t."""
        return (program_rank * self.context_parallel + context_rank) * self.tensor_parallel + tensor_rank

    def coordinates(self, process: int) -> tuple[int, int, int]:
        """(program rank g, context rank c, tensor rank t) of a process: the inverse of `process`."""
        rest, t = divmod(process, self.tensor_parallel)
        g, c = divmod(rest, self.context_parallel)
        return g, c, t

    @property
    def process_grid(self) -> tuple[tuple[str, int], ...]:
        """The processes as a named grid, outermost first, in `process` order: (dp, D), (pp, K),
        then (cp, C) where C > 1, then (tp, T) -- a torch DeviceMesh's shape and dimension names."""
        dims = (("dp", self.data_parallel), ("pp", self.stages), ("cp", self.context_parallel),
                ("tp", self.tensor_parallel))
        return tuple((name, size) for name, size in dims if name != "cp" or size > 1)

    def replica_processes(self, rank: int, context_rank: int = 0, tensor_rank: int = 0) -> list[int]:
        """The processes of pipeline rank `rank`'s (context, tensor) position in each of the D
        replicas: its data-parallel group."""
        return [self.process(self.program_rank(d, rank), context_rank, tensor_rank) for d in range(self.data_parallel)]

    def process_devices(self) -> tuple[int, ...]:
        """The device of every process, in process order (what the executor launches on)."""
        return tuple(self.device(*self.coordinates(q)) for q in range(self.num_processes))

    def node(self, device: IndexT) -> IndexT:
        """The node holding `device` (or each of an array of devices): `node_of`."""
        return node_of(device, self.devices_per_node)

    def context_members(self, first_device: int) -> list[int]:
        """The C devices of the context-parallel group of the tensor rank at `first_device`."""
        return context_members(first_device, self.tensor_parallel, self.context_parallel)

    def expert_members(self, first_device: int) -> list[int]:
        """The E devices of the expert group of the replica at `first_device`: every (T x C)-th
        device (the next replicas of the same pipeline rank, Megatron-LM's order)."""
        return [first_device + i * self.devices_per_rank for i in range(self.expert_parallel)]

    def gradient_members(self, rank: int) -> list[int]:
        """The D x C first devices (one per tensor ring) whose ring reduces pipeline rank `rank`'s
        gradients: each replica's context-parallel group of that rank."""
        return list(_gradient_members(self.rank_devices, self.stages, self.data_parallel, self.tensor_parallel,
                                      self.context_parallel, rank))


@lru_cache(maxsize=4096)
def _gradient_members(rank_devices: tuple[int, ...], K: int, D: int, T: int, C: int, rank: int) -> tuple[int, ...]:
    """`Mesh.gradient_members`, made once per mesh layout and rank (the planner asks per candidate)."""
    return tuple(member for d in range(D) for member in context_members(rank_devices[d * K + rank], T, C))


@lru_cache(maxsize=1024)
def megatron_rank_devices(ranks: int, replicas: int, width: int = 1) -> tuple[int, ...]:
    """The first device of each program rank d*K + r in Megatron-LM's order: replicas inside,
    pipeline ranks outside, each rank `width` (T x C) devices wide: width x (r*D + d)."""
    return tuple(width * (r * replicas + d) for d in range(replicas) for r in range(ranks))


def node_of(device: IndexT, devices_per_node: int | None) -> IndexT:
    """The node holding `device` (or each of an array of devices): devices 0..N-1 fill nodes of
    `devices_per_node` in order; 0 where the hardware has no nodes (None)."""
    return device * 0 if devices_per_node is None else device // devices_per_node


def tensor_members(first_device: int, tp: int) -> list[int]:
    """The T devices of the tensor-parallel group from `first_device` (its group's first): T consecutive ones."""
    return list(range(first_device, first_device + tp))


def tensor_parallel_rank(process: int, tp: int) -> tuple[int, int]:
    """(program rank g, tensor rank t) of a process at C = 1: `Mesh.coordinates` without its c."""
    return divmod(process, tp)


def context_members(first_device: int, tp: int, cp: int) -> list[int]:
    """The C devices of the context-parallel group of the tensor rank at `first_device` (its
    group's first device): every T-th device from it."""
    return [first_device + c * tp for c in range(cp)]


# ---- validation ------------------------------------------------------------------------------

def mesh_problem(pipeline: Any, hardware: Any) -> str | None:
    """Why the scenario's ranks cannot be laid out on its devices, in one line naming the field, or
    None: `device_lists_problem`, then `layout_problem`."""
    return device_lists_problem(pipeline, hardware) or layout_problem(pipeline, hardware)


def device_lists_problem(pipeline: Any, hardware: Any) -> str | None:
    """Why the device lists do not fit the sizes, naming the field, or None:
    `hardware.stage_to_device` gives one device per stage of one replica, `hardware.placement`
    one row of K devices per replica, and not both."""
    p, given, placement = pipeline, hardware.stage_to_device, hardware.placement
    if given is not None and len(given) != p.stages:
        return f"hardware.stage_to_device: {len(given)} entries for {p.stages} stages"
    if placement is not None:
        if len(placement) != p.data_parallel or any(len(row) != p.stages for row in placement):
            return f"hardware.placement: give {p.data_parallel} rows (one per replica) of {p.stages} devices"
        if given is not None:
            return "hardware.placement: give either placement or stage_to_device, not both"
    elif p.data_parallel > 1 and given is not None:
        return "hardware.stage_to_device: with data_parallel > 1 give hardware.placement instead"
    return None


def layout_problem(pipeline: Any, hardware: Any) -> str | None:
    """Why a rank's T, then T x C, devices cannot be laid out on the hardware (`rank_layout_problem`),
    naming the field, or None."""
    T, C = pipeline.tensor_parallel, pipeline.context_parallel
    if T > 1:
        problem = rank_layout_problem(hardware, T, "pipeline.tensor_parallel", str(T), f"tensor_parallel {T}",
                                      TENSOR_TILING_FIX)
        if problem:
            return problem
    if C > 1:
        return rank_layout_problem(hardware, T * C, "pipeline.context_parallel", f"{T} x {C}",
                                   f"tensor_parallel {T} and context_parallel {C}")
    return None


TENSOR_TILING_FIX = ": give a T that divides a node's devices or a multiple of them (whole nodes)"


def tiles_nodes(devices_per_node: int | None, width: int) -> bool:
    """Whether ranks `width` devices wide tile nodes of `devices_per_node` (None: one node): each
    lies in one node (divides its devices) or fills whole nodes (a multiple of them)."""
    return devices_per_node is None or devices_per_node % width == 0 or width % devices_per_node == 0


def rank_layout_problem(hardware: Any, width: int, field: str, count: str, what: str, fix: str = "") -> str | None:
    """Why ranks `width` devices wide (`count` of them, as the fields give it; `what`, the fields
    with their values) cannot be laid out on `hardware`, in one line naming the field, or None:
    they must tile its nodes (`tiles_nodes`: `field` is named, `fix` appended) and each
    must start on a multiple of `width` (a rank takes `width` consecutive devices from the one its
    placement or stage_to_device gives)."""
    per_node = hardware.devices_per_node
    if not tiles_nodes(per_node, width):
        return f"{field}: {count} devices per rank do not tile nodes of {per_node} (hardware.devices_per_node){fix}"
    ids = [d for row in (hardware.placement or ()) for d in row] + list(hardware.stage_to_device or ())
    odd = next((d for d in ids if d % width), None)
    if odd is not None:
        where = "placement" if hardware.placement else "stage_to_device"
        return (f"hardware.{where}: device {odd} is not a multiple of {width}: with {what} each rank "
                f"takes {width} consecutive devices, from the one given")
    return None


__all__ = ["Mesh", "TENSOR_TILING_FIX", "context_members", "device_lists_problem", "layout_problem",
           "megatron_rank_devices", "mesh_problem", "node_of", "rank_layout_problem", "tensor_members",
           "tensor_parallel_rank", "tiles_nodes"]
