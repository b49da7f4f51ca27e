"""The profiler's layer table: profiling a model into it, averaging, writing it, and profiling on every rank."""

from __future__ import annotations

import statistics
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

import torch
import yaml

from gpipe_exec.context_parallel import SequenceShard
from gpipe_exec.measure.allocator import cache_host_memory
from gpipe_exec.moe import ExpertGroup
from gpipe_exec.measure.meters import tensor_bytes
from gpipe_exec.profiling.layer_memory import measure_layer
from gpipe_exec.profiling.options import ProfileOptions
from gpipe_exec.profiling.layers import LayerBuilder, check_meta, expert_parameters, local_parameters
from gpipe_exec.profiling.timing import Stamps, time_layers, time_update
from gpipe_exec.runtime.context_parallel import shard_batch
from gpipe_exec.runtime.update import Update
from gpipe_exec.zoo import check_buildable, make_batch
from gpipe_sim.api import model_figures
from gpipe_sim.model.layers import layer_count
from gpipe_sim.model.model import LayerSpec
from gpipe_sim.scenario.scenario import Scenario

Progress = Callable[[int, int, str], None]


def too_large_to_build(scenario: Scenario, fraction: float = 0.5) -> bool:
    """Whether the model's parameters (gpipe_sim's analytic count) exceed `fraction` of this
    machine's memory: then only the meta device can profile it."""
    import os

    from gpipe_sim.model.layers import build_layers

    params = sum(layer.params for layer in build_layers(scenario.model))
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return False
    return params * scenario.training.dtype_bytes > fraction * memory


def default_sizes(scenario: Scenario) -> tuple[int, ...]:
    """The micro-batch sizes the scenario runs (tensor_split gives at most two)."""
    from gpipe_sim.plan.partition import micro_batch_sizes

    p = scenario.pipeline
    return tuple(sorted(set(micro_batch_sizes(p.batch_size // p.data_parallel, p.micro_batches))))


def profile_device(name: str | None) -> torch.device:
    """The device a profile runs on: one named outright ("cpu", "cuda:1"), else the type
    `launch.devices.device_type` resolves ("cuda": the current GPU)."""
    from gpipe_exec.launch.devices import device_type

    if name is not None and (name == "cpu" or name.startswith("cuda:")):
        return torch.device(name)
    kind = device_type(name)
    return torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" else torch.device("cpu")


def _measure_layers(builder: LayerBuilder, options: ProfileOptions, x: torch.Tensor, y: torch.Tensor,
                    sizes: Sequence[int], progress: Progress | None
                    ) -> tuple[list[dict[str, Any]], list[torch.nn.Module], int]:
    """(each layer's row of memory figures (`measure_layer`), named; the layers `builder` built, on
    the profile's device, to time: none with `options.meta`; the whole layers' parameters). Each
    layer takes its predecessor's output; memory is measured at the largest of `sizes` and at the
    smallest (or half the largest). At E > 1 a row of a layer holding routed experts says how many
    of its parameters are theirs (`expert_params`, their gradients reduced over D x C / E). Split layers' rows hold no FLOPs: FlopCounterMode
    counts a split GEMM at its whole (DTensor) shape but the attention at the device's heads, and
    neither a ring's steps nor the experts' rows as the whole model's."""
    from gpipe_exec.zoo import layer_names

    names = layer_names(builder.scenario.model)
    n = layer_count(builder.scenario.model)
    big = max(sizes)
    small = min(sizes) if len(sizes) > 1 else max(1, big // 2)  # memory is measured at both
    device = x.device
    rows: list[dict[str, Any]] = []
    layers: list[torch.nn.Module] = []
    h, after_saved_output, loss, parameters = x, False, builder.loss(), 0
    for i in range(n):
        if progress:
            progress(i, n + len(sizes), names[i])
        layer, whole = builder.build(i, device)
        parameters += whole
        row, h, after_saved_output = measure_layer(layer, h, y, first=i == 0, last=i == n - 1, small=small,
                                                   big=big, meta=options.meta, after_saved_output=after_saved_output,
                                                   loss=loss)
        if builder.split:
            del row["forward_flops_per_sample"], row["backward_flops_per_sample"]
        experts = expert_parameters(layer) if builder.expert_parallel > 1 else 0  # reduced over D x C / E
        rows.append({"name": names[i], **row, **({"expert_params": experts} if experts else {})})
        if not options.meta:
            layers.append(layer)
    return rows, layers, parameters


def _add_times(row: dict[str, Any], timings: list[dict[str, float]], layer: torch.nn.Module, scenario: Scenario,
               stamps: Stamps, options: ProfileOptions) -> None:
    """Complete a layer's row with its timings, the split backward's seconds per sample (at the
    largest size, the least noisy per sample) and its optimizer update's seconds (of the parameters
    as this process holds them: a split layer's local shards); check its format."""
    row["timings"] = timings
    if options.split_backward:
        at_big = timings[-1]  # sizes are sorted: the largest last
        row["backward_input_s_per_sample"] = at_big["backward_input_s"] / at_big["micro_batch"]
        row["backward_weight_s_per_sample"] = at_big["backward_weight_s"] / at_big["micro_batch"]
    params = local_parameters(layer)
    if params:
        row["update_s"] = time_update(Update(params, scenario).step, stamps, options.warmup, options.repeats)
    LayerSpec.model_validate(row)  # the row format gpipe_sim loads


def profile_model(scenario: Scenario, options: ProfileOptions = ProfileOptions(), *, seed: int = 0,
                  dropout: float | None = None, progress: Progress | None = None,
                  hold: Callable[[], ContextManager[None]] = nullcontext, mesh: Any = None,
                  together: Any = None, sequence: SequenceShard | None = None,
                  experts: ExpertGroup | None = None) -> dict[str, Any]:
    """The model's per-layer table ({"layers": [...], "input_bytes_per_sample": ...}).

    With `mesh` (the tensor-parallel DeviceMesh of a rank's T processes, which must all call this
    at once), each layer is split over it as the executor splits it (`LayerBuilder`): every figure
    is this process's (one device's share: local parameters, bytes and times with the DTensor
    dispatch and the collectives inside; no FLOPs), and the table says `tensor_parallel: T`, the
    only T the simulator runs it at, and the whole model's `parameters`; the processes of `together` (a process group; None: the mesh's)
    time their repeats in step. With `sequence` (this process's place in its context-parallel group)
    or `experts` (its expert group), likewise: each layer runs this device's s/C tokens and each
    block's attention the group's ring, or holds its experts / E routed experts and dispatches by
    all-to-all (`LayerBuilder`), every figure this process's with the exchanges inside its times,
    and the table says `context_parallel: C` or `expert_parallel: E` (the only C and E the
    simulator runs it at) and the whole model's figures; every member of the groups must call this
    at once, `together` (e.g. the world) holding them all.

    Bytes and FLOPs are measured layer by layer (with `meta`, on the meta device, allocating
    nothing). Times are measured with the layers chained as a stage runs them: each repeat times
    every layer's forward in order, then every layer's backward in reverse order (one autograd
    call); per micro-batch size, each layer's mean over the repeats `typical_repeats` keeps.
    `progress(done, total, what)` is called before each layer is measured and each size timed;
    `hold()` is held around each timed pass (see `profile_on_rank`).
    """
    check_buildable(scenario.model)
    builder = LayerBuilder(scenario, seed, dropout, mesh, together, sequence, experts)
    check_meta(options.meta, builder.tensor_parallel, builder.context_parallel, builder.expert_parallel)
    torch.set_num_threads(max(1, options.threads))
    if options.cache_host_memory and not options.meta:
        cache_host_memory()
    sizes = tuple(sorted(set(options.micro_batches or default_sizes(scenario))))
    big = max(sizes)
    device = torch.device("meta") if options.meta else profile_device(options.device)
    if device.type == "cuda":
        from gpipe_exec.launch.devices import configure_cuda_math

        configure_cuda_math()
    x, y = make_batch(scenario.model, big, seed=seed, dtype=scenario.training.dtype)
    if sequence is not None:  # this device's tokens of every sequence, as the run's loader gives them
        x, y = (shard_batch(t, sequence) for t in (x, y))
    x, y = x.to(device), y.to(device)
    rows, layers, parameters = _measure_layers(builder, options, x, y, sizes, progress)
    table: dict[str, Any] = {"input_bytes_per_sample": tensor_bytes(x) / big, "layers": rows}
    if builder.split:
        table.update({name: value for name, value in (("tensor_parallel", builder.tensor_parallel),
                                                      ("context_parallel", builder.context_parallel),
                                                      ("expert_parallel", builder.expert_parallel)) if value > 1})
        table.update(parameters=parameters, **_whole_figures(scenario))
    if options.meta:
        return table
    n = len(rows)
    stamps = Stamps.for_profile(device, options, collectives=builder.split)
    accumulate = scenario.pipeline.micro_batches > 1 if options.accumulate is None else options.accumulate

    def on_size(j: int, b: int) -> None:
        if progress:
            progress(n + j, n + len(sizes), f"timing micro-batch {b}")

    timings = time_layers(layers, x, y, sizes, stamps, options, accumulate=accumulate, hold=hold, on_size=on_size,
                          loss=builder.loss(), agree=builder.agree)
    for row, timing, layer in zip(rows, timings, layers):
        _add_times(row, timing, layer, scenario, stamps, options)
    return table


def average_tables(tables: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One table from profiles of the same model taken at once on several devices (`profile_on_rank`
    on every rank): the first table with each measured time (every timing's seconds, the split's
    seconds per sample, `update_s`) replaced by its mean over the tables. Each device's profile
    carries its own noise; their mean is steadier, and the pipeline's stages run on all of them."""
    import copy

    out = copy.deepcopy(tables[0])
    timed = ("forward_s", "backward_s", "backward_input_s", "backward_weight_s")
    per_sample = ("backward_input_s_per_sample", "backward_weight_s_per_sample", "update_s")
    for i, row in enumerate(out["layers"]):
        rows = [t["layers"][i] for t in tables]
        for key in per_sample:
            if row.get(key) is not None:
                row[key] = statistics.fmean(r[key] for r in rows)
        for j, timing in enumerate(row.get("timings", [])):
            for key in timed:
                if timing.get(key) is not None:
                    timing[key] = statistics.fmean(r["timings"][j][key] for r in rows)
    return out


def write_table(table: dict[str, Any], path: str | Path) -> None:
    """Write the table as YAML (or JSON for a .json path); `model: {preset: table, path: ...}` loads it."""
    path = Path(path)
    if path.suffix == ".json":
        import json

        path.write_text(json.dumps(table, indent=1))
    else:
        path.write_text(yaml.safe_dump(table, sort_keys=False))


def _whole_figures(scenario: Scenario) -> dict[str, float]:
    """The whole (unsplit) model's forward + backward FLOPs and tokens per sample, as the simulator
    counts them for the scenario's model: what a table of one device's share (T, C or E > 1) records for
    the step's figures (FlopCounterMode counts a DTensor GEMM at its whole size, so the rows hold no
    FLOPs)."""
    figures = model_figures(scenario.with_updates({"pipeline.tensor_parallel": 1, "pipeline.sequence_parallel": False,
                                                   "pipeline.context_parallel": 1, "pipeline.expert_parallel": 1}))
    batch = scenario.pipeline.batch_size
    out: dict[str, float] = {}
    if figures.model_flops_per_step is not None:
        out["flops_per_sample"] = figures.model_flops_per_step / batch
    if figures.tokens_per_step is not None:
        out["tokens_per_sample"] = figures.tokens_per_step / batch
    return out


def table_scenario(scenario: Scenario, table: dict[str, Any], updates: dict[str, Any] | None = None) -> Scenario:
    """The scenario with its model replaced by the measured table (plus any other dotted updates)."""
    changes: dict[str, Any] = {"model": {"preset": "table", **table}}
    changes.update(updates or {})
    return scenario.with_updates(changes)


def profile_on_rank(scenario: Scenario, options: ProfileOptions, rank: int) -> dict[str, Any]:
    """This process's profile of the whole model, run while every other process profiles too:
    ranks that share a device take turns under its device lock, a forward or backward pass each,
    as stages do. With tensor parallelism (T > 1; `rank` is then a process, one of a pipeline
    rank's T) the T processes of each pipeline rank profile the model split over them together,
    on the job's (dp, pp, tp) mesh, all pipeline ranks timing each repeat at once, and take no
    device lock, as the executor's ranks take none. Likewise with context or expert parallelism
    (T = 1; C or E > 1): each process profiles its share of the sequence, the ring among its
    context-parallel group, or its share of the experts, dispatching among its expert group
    (the executor's groups: runtime.context_parallel.context_groups, runtime.experts.expert_groups)."""
    import torch.distributed as dist

    from gpipe_exec.runtime.device_lock import device_lock
    from gpipe_exec.runtime.tensor_parallel import device_mesh

    p = scenario.pipeline
    if p.tensor_parallel > 1:  # with C or E > 1 too: each tensor rank's ring and expert group
        mesh = device_mesh(profile_device(options.device).type, scenario.mesh)
        sequence, experts = (split_groups(scenario, rank, profile_device(options.device))
                             if p.context_parallel * p.expert_parallel > 1 else (None, None))
        return profile_model(scenario, options, mesh=mesh["tp"], together=dist.group.WORLD, sequence=sequence,
                             experts=experts)
    if p.context_parallel * p.expert_parallel > 1:
        sequence, experts = split_groups(scenario, rank, profile_device(options.device))
        return profile_model(scenario, options, together=dist.group.WORLD, sequence=sequence, experts=experts)
    lock = device_lock(rank, scenario.mesh.rank_devices)
    return profile_model(scenario, options, hold=nullcontext if lock is None else lock.hold)


def split_groups(scenario: Scenario, process: int, device: torch.device
                 ) -> tuple[SequenceShard | None, ExpertGroup | None]:
    """(`process`'s share of each sequence with its context-parallel ring, None at C = 1; its expert
    group, None at E = 1), as the executor's rank makes them. Collective: every process calls it."""
    from gpipe_exec.runtime.context_parallel import context_groups
    from gpipe_exec.runtime.experts import expert_groups

    mesh = scenario.mesh
    experts, _ = expert_groups(mesh, process)
    if mesh.context_parallel == 1:
        return None, experts
    group, _ = context_groups(mesh, process)
    _, c, _ = mesh.coordinates(process)
    seq_len: int = scenario.model.seq_len  # type: ignore[attr-defined]
    return SequenceShard.of(seq_len, mesh.context_parallel, c, group, device), experts


def profile_together(scenario: Scenario, options: ProfileOptions, rank: int) -> dict[str, Any] | None:
    """Every process of a launch calls this at once: each profiles (`profile_on_rank`), and
    process 0 returns their tables averaged (`average_tables`; None on the others). The one
    definition of a profile taken as the pipeline runs, for `gpipe-exec profile` and validate."""
    import torch.distributed as dist

    mine = profile_on_rank(scenario, options, rank)
    tables: list[Any] = [None] * dist.get_world_size() if rank == 0 else []
    dist.gather_object(mine, tables if rank == 0 else None, dst=0)
    return average_tables(tables) if rank == 0 else None


def _profile_task(rank: int, device: Any, clock: Any, payload: dict[str, Any]) -> dict[str, Any] | None:
    return profile_together(payload["scenario"], payload["options"], rank)


def profile_on_devices(scenario: Scenario, options: ProfileOptions = ProfileOptions(),
                       launch_options: Any = None) -> dict[str, Any]:
    """Profile as the pipeline will run: one process per stage (T per stage with tensor
    parallelism) placed on the scenario's devices, all profiling at once (sharing caches, memory
    bandwidth and the host; stages of one device taking turns, see `profile_on_rank`); their
    tables averaged (`profile_together`, as validate takes them). `profile_model` profiles in this process alone (whole layers).

    Measured on 2 cores (convnet, K=4 on two shared cores, M=16): stage compute in the run was
    1.26-1.43x the profile taken by one process per device, 1.05-1.2x this one."""
    from gpipe_exec.launch.spawn import LaunchOptions, launch

    payload = {"scenario": scenario, "options": options}
    return launch(payload, scenario.mesh.process_devices(), launch_options or LaunchOptions(), task=_profile_task)
