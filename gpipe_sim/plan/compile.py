"""The compiled pipeline: a scenario's partition into chunks, their placement on ranks and devices,
their costs, and the flat program the engines run."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Sequence

import numpy as np

from gpipe_sim.plan.costed_program import Program, costed_program
from gpipe_sim.plan.replica_symmetry import ReplicaSymmetry, replica_symmetry
from gpipe_sim.plan.pass_collectives import sharded_passes
from gpipe_sim.plan.buckets import overlaps_step_reduction
from gpipe_sim.mesh import Mesh
from gpipe_sim.plan.chunk_times import chunk_times
from gpipe_sim.model.context_parallel import local_model
from gpipe_sim.plan.sharding import (accumulated_bytes_per_param, bytes_per_param, reduce_scatter_copy_bytes,
                                     shard_degree)
from gpipe_sim.plan.partition import MemoryTable, held_activations, micro_batch_sizes, resolve_partition
from gpipe_sim.results.result import Layout
from gpipe_sim.errors import ScenarioError, ScheduleError
from gpipe_sim.schedule import SCHEDULES, Action, GlobalProgram, Kind, Schedule, build_schedule, global_program, lower
from gpipe_sim.schedule.registry import fill_drain_bubble
from gpipe_sim.costs.layer_rows import pass_rows
from gpipe_sim.costs.twins import pricing_key
from gpipe_sim.costs.layer_time import update_seconds
from gpipe_sim.model.layers import input_bytes_per_sample
from gpipe_sim.schema.limits import MAX_PASSES
from gpipe_sim.plan.layer_table import held_parameters, scenario_layers
from gpipe_sim.costs.fp8 import check_fp8
from gpipe_sim.model.recompute import per_layer, recompute_peak_bytes
from gpipe_sim.model.model import LayerSpec
from gpipe_sim.schema.files import shown_path
from gpipe_sim.scenario.scenario import OPTIMIZER_SCRATCH, Scenario, read_schedule_csv


@dataclass(frozen=True)
class ChunkPlan:
    """One model chunk: its layers, rank, static memory and per-micro-batch costs."""

    index: int
    rank: int
    first_layer: int
    last_layer: int
    params: int
    param_bytes: float
    state_bytes: float  # gradients, optimizer states and master weights
    # per micro-batch (NumPy arrays of length M):
    forward_s: np.ndarray
    backward_s: np.ndarray
    backward_input_s: np.ndarray
    backward_weight_s: np.ndarray
    activation_bytes: np.ndarray  # saved for backward
    input_bytes: np.ndarray  # the chunk input, kept under re-materialization
    output_bytes: np.ndarray  # sent to the next chunk (and its gradient sent back)
    update_s: float
    # Bytes a compute pass of this chunk allocates beyond the chunk's saved bytes, freed by its
    # end (`chunk_transient_bytes` at the micro-batch's samples): a forward, re-computation or
    # input pass (the layers' part per sample), a full backward (both parts) and a weight pass
    # (the fixed part: weight gradients). Zero unless the table says.
    transient_bytes: np.ndarray | None = None
    backward_transient_bytes: np.ndarray | None = None
    weight_pass_transient_bytes: np.ndarray | None = None
    # Bytes its input-gradient pass keeps for its weight-gradient pass (from I's end to W's end)
    # when the backward is split: the layers' kept_for_weight_bytes_per_sample x samples; none on
    # the model's first chunk, whose input (the data) takes no gradient: its I has nothing to do
    # and its W is the whole backward.
    kept_for_weight_bytes: np.ndarray | None = None
    # Of the chunk's output, the bytes its last layer saves as well (known where the next layer
    # saves that tensor too: its saved_with_previous_bytes_per_sample) x samples.
    output_saved_bytes: np.ndarray | None = None
    # What its input-gradient pass holds above its start while it runs (`input_pass_bytes`; none
    # on the model's first chunk, whose input pass has nothing to do); None: `transient_bytes`.
    input_pass_transient_bytes: np.ndarray | None = None
    # Of its saved bytes, those freed when its input-gradient pass ends (what only that pass reads:
    # the layers' freed_after_input_pass_bytes_per_sample x samples; none on the model's first chunk).
    freed_after_input_bytes: np.ndarray | None = None
    # Of its passes' seconds, what the tensor-parallel collectives add per micro-batch (forward: to
    # each forward and re-computation; backward: to each full backward or input pass), past what
    # the host's issue and the weight-gradient GEMMs hide of them; None at T = 1.
    tp_forward_s: np.ndarray | None = None
    tp_backward_s: np.ndarray | None = None

    @property
    def layer_count(self) -> int:
        return self.last_layer - self.first_layer + 1


@dataclass(frozen=True)
class RankPlan:
    """One pipeline rank: the device it runs on and the chunks it holds."""

    index: int
    device: int
    chunks: tuple[int, ...]
    param_bytes: float
    state_bytes: float
    update_s: float
    update_scratch_bytes: float = 0.0  # what its update allocates and frees (`update_scratch_bytes`)


@dataclass(frozen=True)
class Plan:
    """Everything the engines and the memory accountant need, computed once from a scenario."""

    scenario: Scenario
    schedule: Schedule
    layers: tuple[LayerSpec, ...]
    chunks: tuple[ChunkPlan, ...]
    ranks: tuple[RankPlan, ...]
    micro_batch_sizes: tuple[int, ...]
    mesh: Mesh  # the parallel sizes and where each rank runs (the scenario's)
    # The replicas the program holds: all D (None), or replica 0 alone (1) standing for D alike
    # replicas (`simulated`, gpipe_sim.plan.replica_symmetry)
    program_replicas: int | None = None

    @property
    def device_map(self) -> tuple[int, ...]:
        """The first device of each program rank d*K + r (`Mesh.rank_devices`)."""
        return self.mesh.rank_devices

    @property
    def num_devices(self) -> int:
        """Every device of the step (`Mesh.num_devices`)."""
        return self.mesh.num_devices

    @property
    def replicas(self) -> int:
        """D: data-parallel replicas of the pipeline."""
        return self.scenario.pipeline.data_parallel

    @property
    def num_ranks(self) -> int:
        """The ranks the program runs: D replicas x K pipeline ranks (every process of the step),
        or K where replica 0 stands for all (`program_replicas`)."""
        return (self.program_replicas or self.replicas) * len(self.ranks)

    @cached_property
    def symmetry(self) -> ReplicaSymmetry:
        """Whether the D replicas are alike (gpipe_sim.plan.replica_symmetry)."""
        return replica_symmetry(self.scenario, self.schedule)

    def simulated(self) -> "Plan":
        """The plan the simulator times: replica 0 alone where the replicas are alike (every
        figure as with all D), else this plan; ScenarioError naming pipeline.data_parallel where
        replicas that differ would make the program exceed the pass limit."""
        if self.program_replicas == 1 or self.replicas == 1:
            return self
        if not self.symmetry.alike:
            passes = self.replicas * self.schedule.ranks * self.schedule.chunks * self.schedule.micro_batches
            if passes > MAX_PASSES:
                raise ScenarioError(
                    f"pipeline.data_parallel: the {self.replicas} replicas differ ({self.symmetry.reason}), so each "
                    f"is simulated: {passes:,} passes, over the limit of {MAX_PASSES:,} (replicas alike are "
                    "simulated once: docs/guide/scale.md)")
            return self
        once = replace(self, program_replicas=1)
        once.__dict__["symmetry"] = self.symmetry
        return once

    @property
    def memory_capacity_bytes(self) -> float:
        return self.scenario.hardware.accelerator.usable_memory_bytes

    @property
    def layer_counts(self) -> list[int]:
        """Layers per chunk, in model order: the partition written out."""
        return [c.layer_count for c in self.chunks]

    @property
    def layout(self) -> Layout:
        """Each chunk's layers and rank and each rank's device, as a Result records them."""
        return Layout(tuple((c.first_layer, c.last_layer) for c in self.chunks),
                      tuple(c.rank for c in self.chunks), self.mesh, self.num_ranks // len(self.ranks))

    @property
    def analytic_bubble_fraction(self) -> float:
        """The schedule family's textbook bubble for this K, M and v (fill-drain's if unregistered)."""
        s = self.schedule
        family = SCHEDULES.get(s.name)
        bubble = family.analytic_bubble if family is not None else fill_drain_bubble
        return bubble(s.ranks, s.micro_batches, s.chunks)

    def action(self, i: int) -> Action:
        """Action i of the flattened program (for messages: which action a rank waits at)."""
        prog = self.program
        return Action.of(int(prog.kind[i]), int(prog.chunk[i]), int(prog.micro_batch[i]),
                         int(prog.peer[i]), int(prog.tensor[i]), bool(prog.save[i]))

    @cached_property
    def global_program(self) -> GlobalProgram:
        """The global program every engine and every executor rank runs (built once)."""
        return global_program(self.schedule, self.replicas, self.program_replicas,
                              overlaps_step_reduction(self.scenario),
                              reduced=self.mesh.gradient_group > 1)

    @cached_property
    def program(self) -> Program:
        """The global program with each action's costs, as the engines run it."""
        return costed_program(self)


def scenario_schedule(scenario: Scenario) -> Schedule:
    """The scenario's schedule as programs: a registered one built for its K, M and v, or per-rank
    pass orders read from torch's CSV (`pipeline.schedule: {csv: PATH}`), lowered and checked the
    same way (ScheduleError with one line naming the field)."""
    p = scenario.pipeline
    path = p.schedule_csv
    if path is None:
        schedule = build_schedule(p.stages, p.micro_batches, p.schedule_name, p.remat, p.chunks)
    else:
        read = read_schedule_csv(path)
        try:
            schedule = lower(p.schedule_name, read.orders, read.placement, read.micro_batches, p.remat, read.chunks)
        except ScheduleError as exc:
            raise ScheduleError(f"pipeline.schedule.csv: {shown_path(path)}: {exc}") from None
    if per_layer(p.remat) and schedule.count(Kind.BACKWARD_INPUT):
        raise ScheduleError(f"pipeline.remat: {p.remat} recomputes inside each block's backward, which schedule "
                            f"{p.schedule_name} splits into input and weight passes; choose a schedule with "
                            "one backward pass (gpipe, 1f1b, interleaved) or remat none, except_last or always")
    return schedule


def compile_plan(scenario: Scenario) -> Plan:
    """Build the layer table, partition it into K*v chunks, place and cost them, build the programs."""
    check_fp8(scenario)
    p, training, accel, mesh = scenario.pipeline, scenario.training, scenario.hardware.accelerator, scenario.mesh
    dtype, dtype_bytes = training.dtype, training.dtype_bytes
    layers = scenario_layers(scenario)
    M = p.micro_batches
    sizes = micro_batch_sizes(p.batch_size // p.data_parallel, M)  # one replica's share
    largest = max(sizes)
    times = pass_rows(layers, largest, accel, dtype, dtype_bytes)  # each layer's `layer_seconds` first
    remat_factor = 0.0 if p.remat == "none" or per_layer(p.remat) else 1.0  # whole chunks re-computed
    time_weights = [f * (1 + remat_factor) + b for f, b, _, _ in times]
    bpp = training.bytes_per_param
    (weight_per_param, state_per_param), (expert_weight, expert_state) = (
        local_bytes_per_param(scenario), expert_bytes_per_param(scenario))
    schedule = scenario_schedule(scenario)
    model_input = input_bytes_per_sample(local_model(scenario.model, p.context_parallel), dtype_bytes)
    # what each rank holds under this schedule, and what a device has
    memory = partition_memory_table(scenario, layers, schedule, sizes) if p.partition in ("memory", "fit") else None
    counts = resolve_partition(p.partition, schedule.num_chunks, time_weights, memory)
    distinct, size_index = np.unique(sizes, return_inverse=True)
    distinct = distinct.tolist()
    samples = np.asarray(sizes, dtype=float)
    update_share, copied = _update_share(scenario), reduce_scatter_copy_bytes(scenario)
    chunks = []
    first = 0
    for c, count in enumerate(counts):
        own = layers[first : first + count]
        content = tuple(map(pricing_key, own))  # the layers' content, for the transients' memo
        per_size, tp_seconds = chunk_times(scenario, own, first, mesh.rank_devices[schedule.placement[c]],
                                            distinct)
        params, experts = held_parameters(scenario, own, count == len(layers)), sum(x.expert_params for x in own)
        # ZeRO-3 without pipelining gathers in each pass, ZeRO-2 reduce-scatters in each backward
        per_size, in_flight = sharded_passes(scenario, own, schedule.placement[c], params, experts, distinct, per_size)
        per_size = per_size[size_index]
        input_per_sample = model_input if c == 0 else layers[first - 1].output_bytes_per_sample
        # a tensor two adjacent layers of the chunk both save is one allocation
        act_per_sample = sum(layer.activation_bytes_per_sample for layer in own) - sum(
            layer.saved_with_previous_bytes_per_sample for layer in own[1:])
        backward = per_size[:, 1]
        chunks.append(
            ChunkPlan(
                index=c,
                rank=schedule.placement[c],
                first_layer=first,
                last_layer=first + count - 1,
                params=params,
                param_bytes=float(params * weight_per_param + experts * (expert_weight - weight_per_param)),
                state_bytes=float(params * state_per_param + experts * (expert_state - state_per_param)),
                forward_s=per_size[:, 0].copy(),
                backward_s=backward.copy(),
                backward_input_s=per_size[:, 2].copy(),
                backward_weight_s=per_size[:, 3].copy(),
                activation_bytes=act_per_sample * samples,
                input_bytes=input_per_sample * samples,
                output_bytes=own[-1].output_bytes_per_sample * samples,
                update_s=update_seconds(own, accel, dtype_bytes, bpp, scenario.optimizer_step) / update_share,
                transient_bytes=chunk_transient_bytes(own, samples, fixed=False, content=content) + in_flight[0],
                backward_transient_bytes=in_flight[1] + chunk_transient_bytes(own, samples, recomputed=True,
                                                                              copied=copied, content=content),
                # the model's first chunk has nothing to do in its input pass: its weight pass is a
                # full backward
                weight_pass_transient_bytes=chunk_transient_bytes(own, samples, per_sample=c == 0, content=content),
                kept_for_weight_bytes=(0.0 if c == 0 else math.fsum(
                    layer.kept_for_weight_bytes_per_sample for layer in own)) * samples,
                output_saved_bytes=(layers[first + count].saved_with_previous_bytes_per_sample
                                    if first + count < len(layers) else 0.0) * samples,
                input_pass_transient_bytes=(0.0 if c == 0 else input_pass_bytes(own)) * samples,
                freed_after_input_bytes=(0.0 if c == 0 else math.fsum(
                    layer.freed_after_input_pass_bytes_per_sample for layer in own)) * samples,
                tp_forward_s=None if tp_seconds is None else tp_seconds[size_index, 0].copy(),
                tp_backward_s=None if tp_seconds is None else tp_seconds[size_index, 1].copy(),
            )
        )
        first += count
    ranks = _rank_plans(scenario, schedule, layers, chunks)
    return Plan(scenario, schedule, tuple(layers), tuple(chunks), ranks, tuple(sizes), mesh)


def _rank_plans(scenario: Scenario, schedule: Schedule, layers: Sequence[LayerSpec],
                chunks: Sequence[ChunkPlan]) -> tuple[RankPlan, ...]:
    """Each pipeline rank: its device, its chunks, and their summed static bytes and update."""
    ranks = []
    for r in range(schedule.ranks):
        mine = schedule.chunks_of(r)
        ranks.append(RankPlan(
            index=r, device=scenario.mesh.rank_devices[r], chunks=mine,
            param_bytes=math.fsum(chunks[c].param_bytes for c in mine),
            state_bytes=math.fsum(chunks[c].state_bytes for c in mine),
            update_s=math.fsum(chunks[c].update_s for c in mine),
            update_scratch_bytes=update_scratch_bytes(
                scenario, [layer for c in mine for layer in layers[chunks[c].first_layer:chunks[c].last_layer + 1]]),
        ))
    return tuple(ranks)


def local_bytes_per_param(scenario: Scenario) -> tuple[float, float]:
    """(weight, other) bytes a rank holds all step per parameter: the weight (the training dtype's,
    or under ZeRO-3 without pipelining its shard), and beside it the gradient, the optimizer states
    and fp32 master weights, as `training.zero` shards them (gpipe_sim.plan.sharding) over the D x C
    devices that hold the same weights (`shard_members`)."""
    return bytes_per_param(scenario.training, scenario.mesh.gradient_group, shard_members(scenario),
                           scenario.pipeline.stages)


def shard_members(scenario: Scenario) -> int:
    """The devices a ZeRO stage shards a weight's states over: the shard group's replicas
    (`shard_degree`) x C, as Megatron-LM's distributed optimizer shards over the data-parallel
    group with context parallelism (ZeRO-3 with C > 1 is refused there)."""
    return shard_degree(scenario) * scenario.pipeline.context_parallel


def expert_bytes_per_param(scenario: Scenario) -> tuple[float, float]:
    """(weight, other) bytes a rank holds all step per routed expert's parameter: sharded as
    `training.zero` shards over the D / E replicas that hold the same experts (Megatron-LM's
    expert-data-parallel group; torchtitan's dp_shard_mod_ep), not over D x C."""
    mesh = scenario.mesh
    return bytes_per_param(scenario.training, mesh.expert_gradient_group,
                           max(1, shard_members(scenario) // mesh.expert_parallel), mesh.stages)


def _update_share(scenario: Scenario) -> int:
    """The devices a rank's optimizer update is shared among: the shard group under ZeRO
    (`shard_members`), else 1."""
    return shard_members(scenario) if scenario.training.zero and scenario.mesh.gradient_group > 1 else 1


def update_scratch_per_layer(scenario: Scenario, layers: Sequence[LayerSpec]) -> tuple[list[float], list[float]]:
    """What the optimizer update allocates and frees again, for these layers' parameters under one
    optimizer (as gpipe-exec has one a rank), layer by layer as (summed, largest): a rank's figure
    is the sum of the first over its layers plus the largest of the second.

    The step's temporaries are OPTIMIZER_SCRATCH fp32 copies of what it works on at once
    (`Scenario.optimizer_step`): the largest tensor, one tensor at a time ("for_loop": largest; the
    previous tensor's last temporary, alive until the next one's are made, is left out: usually a
    bias's); every parameter ("foreach": summed); nothing ("fused"). In mixed precision (bf16,
    fp16) the fp32 master weights are stepped from an fp32 copy of every gradient (4 B a parameter,
    summed). Under ZeRO-1 the one tensor stepped is the rank's flat shard, 1/D of every parameter
    (summed; the shard's padding left out); with `hardware.host.step_buffers` the runtime's shard
    gradient and all-gather buffers, larger and later in the update, are counted instead
    (gpipe_sim.plan.memory_timeline's data-parallel bytes), so nothing here."""
    training = scenario.training
    step = scenario.optimizer_step
    factor = 4.0 * OPTIMIZER_SCRATCH[step][training.optimizer]  # fp32 copies
    upcast = 0.0 if training.dtype == "fp32" else 4.0  # the gradients' fp32 copies
    none = [0.0] * len(layers)
    if training.zero and scenario.mesh.gradient_group > 1:
        share = 0.0 if scenario.hardware.host.step_buffers else (factor + upcast) / shard_members(scenario)
        return [share * layer.params for layer in layers], none
    if step == "foreach":
        return [(factor + upcast) * layer.params for layer in layers], none
    largest = [factor * (layer.params if layer.largest_tensor_params is None else layer.largest_tensor_params)
               for layer in layers]
    return [upcast * layer.params for layer in layers], largest


def update_scratch_bytes(scenario: Scenario, layers: Sequence[LayerSpec]) -> float:
    """The optimizer update's temporaries for a rank holding these layers (update_scratch_per_layer)."""
    summed, largest = update_scratch_per_layer(scenario, layers)
    return math.fsum(summed) + max(largest, default=0.0)


def partition_memory_table(scenario: Scenario, layers: list[LayerSpec], schedule: Schedule,
                           sizes: tuple[int, ...]) -> MemoryTable:
    """What the `memory` and `fit` partitions see of the scenario's memory (MemoryTable): static
    bytes, saved and input bytes per layer, the schedule's held micro-batches, and each layer's
    largest transient on the largest micro-batch. Where the schedule splits backward passes, a
    layer's saved bytes count what its input pass keeps for its weight pass too (held from the
    input pass to the weight pass, inside the window the saved bytes are held: an upper bound), a
    layer's transient is at least its input pass's bytes (which count its kept gradients again: an
    upper bound), and the optimizer step's temporaries per layer (update_scratch_per_layer)."""
    dtype_bytes = scenario.training.dtype_bytes
    weight_per_param, state_per_param = local_bytes_per_param(scenario)
    state_per_param += accumulated_bytes_per_param(scenario)  # held all step here: an upper bound
    largest = max(sizes)
    split = schedule.count(Kind.BACKWARD_INPUT) > 0
    update = update_scratch_per_layer(scenario, layers)
    return MemoryTable(
        static_bytes=[float(layer.params * (weight_per_param + state_per_param)) for layer in layers],
        activation_bytes=[float(layer.activation_bytes_per_sample
                                + (layer.kept_for_weight_bytes_per_sample if split else 0.0)) for layer in layers],
        input_bytes=[float(input_bytes_per_sample(local_model(scenario.model, scenario.pipeline.context_parallel), dtype_bytes))]
        + [float(layer.output_bytes_per_sample) for layer in layers[:-1]],
        held=held_activations(schedule, sizes),
        device_map=scenario.mesh.rank_devices,
        capacity_bytes=scenario.hardware.accelerator.usable_memory_bytes,
        transient_bytes=[max(layer.transient_bytes + largest * (layer.transient_bytes_per_sample
                                                                 + recompute_peak_bytes(layer)),
                             largest * input_pass_bytes([layer]) if split else 0.0) for layer in layers],
        update_bytes=update[0],
        update_largest_bytes=update[1],
    )


_TRANSIENTS: dict[tuple, np.ndarray] = {}  # the last chunks' transients, by all `chunk_transient_bytes` reads
_TRANSIENTS_SIZE = 1 << 14


def chunk_transient_bytes(layers: Sequence[LayerSpec], samples: np.ndarray, *, fixed: bool = True,
                          per_sample: bool = True, recomputed: bool = False, kept: float = 0.0,
                          copied: float = 0.0, content: tuple[int, ...] | None = None) -> np.ndarray:
    """`_transient_bytes`, a new array, remembered by the layers' content (`pricing_key`: every
    field but the name; `content`, where the caller has made it), the samples and the flags: a
    search compiles the same chunks many times."""
    samples = np.asarray(samples, dtype=float)
    key = (tuple(map(pricing_key, layers)) if content is None else content, samples.shape, samples.tobytes(), fixed, per_sample, recomputed, kept,
           copied)
    found = _TRANSIENTS.get(key)
    if found is None:
        if len(_TRANSIENTS) >= _TRANSIENTS_SIZE:
            _TRANSIENTS.clear()
        found = _TRANSIENTS[key] = _transient_bytes(layers, samples, fixed=fixed, per_sample=per_sample,
                                                    recomputed=recomputed, kept=kept, copied=copied)
        found.flags.writeable = False
    return found.copy()


def _transient_bytes(layers: Sequence[LayerSpec], samples: np.ndarray, *, fixed: bool = True,
                     per_sample: bool = True, recomputed: bool = False, kept: float = 0.0,
                     copied: float = 0.0) -> np.ndarray:
    """A chunk's transient bytes on micro-batches of `samples` each, beyond all its layers' saved
    bytes, counting the layers' fixed part (`fixed`: weight gradients, in a full backward and a
    weight pass) and their part per sample (`per_sample`: activations and their gradients, in a
    forward, re-computation, full backward and input pass). Layers run one at a time, so their
    transients never add up, and while layer j runs (its forward, before the later layers save
    anything; its backward, after they have freed what they saved) the layers after j hold
    nothing: max over j of (transient_j - saved bytes of the layers after j), at least 0 (what a
    layer saves in common with its previous one counted once). `recomputed` (a full backward):
    a layer's transient counts what it re-makes before its backward too (`recompute_peak_bytes`).
    `kept`: bytes per parameter a layer's backward leaves allocated (the layers after j keep theirs
    while j runs: pipelined ZeRO-3's first backward, gpipe_sim.plan.accumulated_gradients); `copied`:
    bytes per parameter of a layer's unsharded gradient and of its reduce-scatter copy (ZeRO-2:
    `reduce_scatter_copy_bytes`): as j starts the copy of the last layer after j with parameters,
    as it ends its gradient and its own copy (FSDP2 copies the gradient into the reduce-scatter's
    input before freeing it, the previous copy reclaimed first), its saved bytes freed."""
    samples = np.asarray(samples, dtype=float)
    offsets, slopes, after, kept_after, copy = [], [], 0.0, 0.0, 0.0
    for layer in reversed(layers):
        own = copied * layer.params
        own_fixed = (layer.transient_bytes if fixed else 0.0) + kept_after + copy
        own_slope = (layer.transient_bytes_per_sample
                     + (recompute_peak_bytes(layer) if recomputed else 0.0)) if per_sample else 0.0
        if own_fixed or own_slope:
            offsets.append(own_fixed)
            slopes.append(own_slope - after)
        kept_after, copy = kept_after + kept * layer.params, own or copy
        after += layer.activation_bytes_per_sample - layer.saved_with_previous_bytes_per_sample
        if own:  # its end: the gradient and its copy, the layer's saved bytes freed
            offsets.append(kept_after + 2 * own)
            slopes.append(-after)
    if not offsets:
        return np.zeros_like(samples)
    lines = np.asarray(offsets)[:, None] + np.asarray(slopes)[:, None] * samples[None, :]
    return np.maximum(lines.max(axis=0), 0.0)


def input_pass_bytes(layers: Sequence[LayerSpec]) -> float:
    """Per sample, the most a chunk's input-gradient pass holds above what was live at its start:
    while layer j runs its pass (its own `input_pass_bytes_per_sample`), the layers after j have
    made the gradients they keep for the weight pass and free nothing (their saved bytes stay for
    the weight pass): max over j of (layer j's bytes + the kept bytes of the layers after j).
    (Exact against the tracker on the zoo's chunks where the layers' figures are measured.)"""
    best, after = 0.0, 0.0
    for layer in reversed(layers):
        own = layer.input_pass_bytes_per_sample
        if own is None:
            own = layer.transient_bytes_per_sample + layer.kept_for_weight_bytes_per_sample
        best = max(best, own + after)
        after += layer.kept_for_weight_bytes_per_sample
    return best
