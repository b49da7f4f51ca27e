"""Per-layer profiler: measures each layer on this device and writes gpipe_sim's LayerSpec table."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, NamedTuple, Sequence

import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

from gpipe_exec.measure.allocator import cache_host_memory
from gpipe_exec.measure.meters import SavedBytesMeter, tensor_bytes
from gpipe_exec.runtime.update import Update
from gpipe_exec.zoo import build_layer, check_buildable, loss_sum, make_batch
from gpipe_sim.spec.layers import layer_count
from gpipe_sim.spec.model import LayerSpec
from gpipe_sim.spec.scenario import Scenario


@dataclass(frozen=True)
class ProfileOptions:
    """Micro-batch sizes to time, warm-up and timed repeats (see `typical_repeats`), the clock, where to run."""

    micro_batches: tuple[int, ...] = ()
    warmup: int = 2
    repeats: int = 7  # at least; `typical_repeats` keeps the middle half of them
    min_time_s: float = 1.0  # more repeats (up to max_repeats) until the timed ones add up to this
    max_repeats: int = 100
    threads: int = 1
    meta: bool = False  # FLOPs, parameters and bytes only, on the meta device (no timings)
    device: str = "cpu"
    cache_host_memory: bool = True  # as the executor's ranks do (allocator.cache_host_memory)
    # Time backward passes with gradients already there to add to, as a stage's micro-batches after
    # its first (2% more on the transformer at 2 samples); None: when the scenario has M > 1.
    accumulate: bool | None = None
    # Also time each layer's backward split as zero-bubble schedules run it (the executor's
    # split_backward: the input's gradient I, then the weights' W), written as each timing's
    # backward_input_s / backward_weight_s and the row's *_s_per_sample (at the largest size).
    split_backward: bool = False
    # On CPU, what a time is: "thread", the CPU time of the thread that runs the pass (user and
    # system; it stops while other processes hold the core), or "wall", the elapsed time. On a
    # machine shared with other work, wall times follow the share of the core this process got
    # (x2-x4 here at load 4-7, changing within seconds); the thread's time is the pass's own work.
    # On a core to itself the two agree. CUDA devices always time with events; with `threads` > 1
    # the thread's own time would miss the others' work, so those profiles take wall time.
    clock: str = "thread"


def too_large_to_build(scenario: Scenario, fraction: float = 0.5) -> bool:
    """Whether the model's parameters (gpipe_sim's analytic count) exceed `fraction` of this
    machine's memory: then only the meta device can profile it."""
    import os

    from gpipe_sim.spec.layers import build_layers

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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _grad_like(out: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out.shape, generator=g, dtype=torch.float32).to(out.dtype).to(out.device)


def _pass(layer: torch.nn.Module, x: torch.Tensor, last: bool, first: bool, target: torch.Tensor,
          batch: int, meter: SavedBytesMeter | None) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach()
    if not first and x.is_floating_point():
        x.requires_grad_(True)
    if meter is not None:
        with meter.track(0):
            out = layer(x)
            end = loss_sum(out, target, batch) if last else out
    else:
        out = layer(x)
        end = loss_sum(out, target, batch) if last else out
    return out, end


def _backward(end: torch.Tensor, last: bool, grad: torch.Tensor | None) -> None:
    if last:
        end.backward()
    else:
        torch.autograd.backward(end, grad)


OUTLIER_FACTOR = 3.0


def typical(samples: Sequence[float]) -> float:
    """The mean of the samples, leaving out gross outliers (above 3x the median: a preempted
    repeat). A step adds up many actions, so it takes their mean, occasional slow ones included;
    each layer's median would miss those (1-5% less than the mean here)."""
    limit = OUTLIER_FACTOR * statistics.median(samples)
    kept = [v for v in samples if v <= limit]
    return statistics.fmean(kept)


def typical_repeats(totals: Sequence[float]) -> list[int]:
    """The repeats whose times to average, given each repeat's total (every layer's forward and
    backward at one size): those in the middle half of the totals (all of them below 4), in their
    order. A repeat is a pass through the whole model, as a step is a pass of every micro-batch:
    a burst of other work that slows a whole repeat drops it, as it drops a step from the median
    step that a run reports, while the hiccups inside the kept repeats are averaged in, as a step
    adds them up. Chosen by the total, the kept repeats are the same for every layer, so the
    layers' times add up to a repeat that ran (each layer's own mean or median would not)."""
    n = len(totals)
    if n < 4:
        return list(range(n))
    order = sorted(range(n), key=lambda i: (totals[i], i))
    cut = n // 4
    return sorted(order[cut:n - cut])


def _typical_time(fn: Callable[[], float], warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    return typical([fn() for _ in range(max(1, repeats))])


def measure_layer_bytes(layer: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, *, first: bool,
                    last: bool, batch: int) -> tuple[dict[str, Any], torch.Tensor]:
    """Parameters, FLOPs, output and saved bytes per sample of one layer at `batch` samples."""
    meter = SavedBytesMeter([layer])
    with FlopCounterMode(display=False) as counter:
        out, end = _pass(layer, x[:batch], last, first, target[:batch], batch, meter)
    forward_flops = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        _backward(end, last, None if last else _grad_like(out, 0))
    layer.zero_grad(set_to_none=True)
    row = {
        "params": int(sum(p.numel() for p in layer.parameters())),
        "largest_tensor_params": int(max((p.numel() for p in layer.parameters()), default=0)),
        "activation_bytes_per_sample": meter.peak / batch,
        "output_bytes_per_sample": tensor_bytes(out) / batch,
        "forward_flops_per_sample": forward_flops / batch,
        "backward_flops_per_sample": counter.get_total_flops() / batch,
    }
    return row, out.detach()


def profile_model(scenario: Scenario, options: ProfileOptions = ProfileOptions(), *, seed: int = 0,
                  dropout: float | None = None,
                  progress: Callable[[int, int, str], None] | None = None,
                  hold: Callable[[], ContextManager[None]] = nullcontext) -> dict[str, Any]:
    """The model's per-layer table ({"layers": [...], "input_bytes_per_sample": ...}).

    Bytes and FLOPs are measured layer by layer (with `meta`, on the meta device, allocating
    nothing). Times are measured with the layers chained as a stage runs them: each repeat times
    every layer's forward in order, then every layer's backward in reverse order (one autograd
    call); per micro-batch size, each layer's mean over the repeats `typical_repeats` keeps.
    """
    from gpipe_exec.zoo import layer_names

    check_buildable(scenario.model)
    torch.set_num_threads(max(1, options.threads))
    if options.cache_host_memory and not options.meta:
        cache_host_memory()
    dtype = scenario.training.dtype
    sizes = tuple(sorted(set(options.micro_batches or default_sizes(scenario))))
    big = max(sizes)
    small = min(sizes) if len(sizes) > 1 else max(1, big // 2)  # memory is measured at both
    device = torch.device("meta" if options.meta else options.device)
    names = layer_names(scenario.model)
    x, y = make_batch(scenario.model, big, seed=seed, dtype=dtype)
    x, y = x.to(device), y.to(device)
    n = layer_count(scenario.model)
    rows: list[dict[str, Any]] = []
    layers: list[torch.nn.Module] = []
    h = x
    previous_saves_output = False
    for i in range(n):
        if progress:
            progress(i, n + len(sizes), names[i])
        with torch.device(device):
            layer = build_layer(scenario.model, i, seed=seed, dropout=dropout, dtype=dtype)
        layer.to(device)
        h_in = h
        if not options.meta:  # before the static pass, which leaves gradients behind
            fixed, per_sample = transient_fit(
                small, transient_parts(layer, h, y, first=i == 0, last=i == n - 1, batch=small),
                big, transient_parts(layer, h, y, first=i == 0, last=i == n - 1, batch=big))
        row, h = measure_layer_bytes(layer, h, y, first=i == 0, last=i == n - 1, batch=big)
        rows.append({"name": names[i], **row})
        if not options.meta:
            rows[-1]["transient_bytes_per_sample"] = per_sample
            rows[-1]["transient_bytes"] = fixed
        if not options.meta:
            saves_input, saves_output = saves_input_output(layer, h_in[:big], y[:big], first=i == 0, last=i == n - 1)
            if saves_input and previous_saves_output:
                rows[-1]["saved_with_previous_bytes_per_sample"] = tensor_bytes(h_in[:big]) / big
            previous_saves_output = saves_output
        if not options.meta and any(p.requires_grad for p in layer.parameters()):  # for split backwards
            kept = split_saved_bytes(layer, h_in[:big], first=i == 0)["kept_gradients"]
            rows[-1]["kept_for_weight_bytes_per_sample"] = kept / big
            if i > 0:  # the model's first layer takes no input gradient: its input pass does nothing
                at = {b: input_pass_memory(layer, h_in, y, last=i == n - 1, batch=b) for b in {small, big}}
                rows[-1]["input_pass_bytes_per_sample"] = max(m.peak / b for b, m in at.items())
                rows[-1]["freed_after_input_pass_bytes_per_sample"] = min(
                    at[big].freed / big, rows[-1]["activation_bytes_per_sample"])
        if not options.meta:
            layers.append(layer)
    table: dict[str, Any] = {"input_bytes_per_sample": tensor_bytes(x) / big, "layers": rows}
    if options.meta:
        return table
    timings: list[list[dict[str, float]]] = [[] for _ in range(n)]
    # One thread's CPU time misses the work of torch's other intra-op threads: with more, wall time.
    clock = options.clock if options.threads <= 1 else "wall"
    accumulate = options.accumulate
    if accumulate is None:
        accumulate = scenario.pipeline.micro_batches > 1
    for j, b in enumerate(sizes):
        if progress:
            progress(n + j, n + len(sizes), f"timing micro-batch {b}")
        samples = []
        split_samples: list[tuple[list[float], list[float]]] = []
        timed, r = 0.0, 0
        while r < options.warmup + max(1, options.repeats) or (
                timed < options.min_time_s and r < options.warmup + options.max_repeats):
            if not accumulate:
                for layer in layers:
                    layer.zero_grad(set_to_none=True)
            times = _chain_times_with_grads(layers, x, y, b, device, hold, clock=clock)
            split = (_split_times(layers, x, y, b, device, hold, clock=clock)
                     if options.split_backward else None)
            if r >= options.warmup:
                samples.append(times)
                timed += sum(times[0]) + sum(times[1])
                if split is not None:
                    split_samples.append(split)
            r += 1
        steady = [samples[k] for k in typical_repeats([sum(f) + sum(g) for f, g in samples])]
        kept_split = [split_samples[k] for k in typical_repeats([sum(f) + sum(g) for f, g in split_samples])]
        for i in range(n):
            timings[i].append({
                "micro_batch": b,
                "forward_s": statistics.fmean(t[0][i] for t in steady),
                "backward_s": statistics.fmean(t[1][i] for t in steady),
            })
            if kept_split:
                timings[i][-1]["backward_input_s"] = statistics.fmean(t[0][i] for t in kept_split)
                timings[i][-1]["backward_weight_s"] = statistics.fmean(t[1][i] for t in kept_split)
    for i, layer in enumerate(layers):
        rows[i]["timings"] = timings[i]
        if options.split_backward:
            at_big = timings[i][-1]  # sizes are sorted: the largest, the least noisy per sample
            rows[i]["backward_input_s_per_sample"] = at_big["backward_input_s"] / at_big["micro_batch"]
            rows[i]["backward_weight_s_per_sample"] = at_big["backward_weight_s"] / at_big["micro_batch"]
        params = list(layer.parameters())
        if params:
            opt = Update(params, scenario)
            stamps = _Stamps(device, clock)

            def step() -> float:
                _sync(device)
                t0 = stamps.now()
                opt.step()
                t1 = stamps.now()
                _sync(device)
                return stamps.seconds(t0, t1)

            rows[i]["update_s"] = _typical_time(step, options.warmup, options.repeats)
        LayerSpec.model_validate(rows[i])  # the row format gpipe_sim loads
    return table


CLOCKS = ("thread", "wall")


class _Stamps:
    """Timestamps on the device's clock: on CPU the calling thread's CPU time (`clock` "thread",
    which autograd's CPU backward also runs on) or perf_counter ("wall"); CUDA events (read once
    synchronized)."""

    def __init__(self, device: torch.device, clock: str = "wall") -> None:
        if clock not in CLOCKS:
            raise ValueError(f"clock: {clock!r} is not one of {', '.join(CLOCKS)}")
        self.cuda = device.type == "cuda"
        self.read = time.thread_time if clock == "thread" else time.perf_counter

    def now(self) -> Any:
        if not self.cuda:
            return self.read()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a


def _chain_times_with_grads(layers: list[torch.nn.Module], x: torch.Tensor, target: torch.Tensor,
                            batch: int, device: torch.device,
                            hold: Callable[[], ContextManager[None]] = nullcontext, clock: str = "wall"
                            ) -> tuple[list[float], list[float]]:
    """Per-layer forward and backward seconds of one pass through the chained layers, run as a
    stage runs them: one forward through all layers, then one autograd call for the backward,
    timed layer by layer by a hook on each layer's input gradient. (Timed as one backward call per
    layer instead, each call's fixed cost counted once per layer: on the convnet at 2 samples the
    layers' backward added up to 9% more than the chain's.)"""
    n = len(layers)
    stamps = _Stamps(device, clock)
    fwd, bwd = [0.0] * n, [0.0] * n
    marks: dict[int, Any] = {}  # layer -> when its input's gradient was ready

    def at(i: int) -> Callable[[torch.Tensor], None]:
        def hook(_grad: torch.Tensor) -> None:
            marks[i] = stamps.now()
        return hook

    with hold():
        _sync(device)
        ticks = [stamps.now()]
        h = x[:batch]
        for i, layer in enumerate(layers):
            if i > 0 and h.requires_grad:
                h.register_hook(at(i))
            h = layer(h)
            if i == n - 1:
                h = loss_sum(h, target[:batch], batch)
            ticks.append(stamps.now())
        _sync(device)
    for i in range(n):
        fwd[i] = stamps.seconds(ticks[i], ticks[i + 1])
    if not h.requires_grad:
        return fwd, bwd
    with hold():
        _sync(device)
        marks[n] = stamps.now()
        h.backward()
        done = stamps.now()
        _sync(device)
    for i in reversed(range(n)):
        if i + 1 not in marks:
            continue  # no gradient reaches this layer (nothing before it is trained)
        bwd[i] = stamps.seconds(marks[i + 1], marks.get(i, done))
    return fwd, bwd


def _split_times(layers: list[torch.nn.Module], x: torch.Tensor, target: torch.Tensor, batch: int,
                 device: torch.device, hold: Callable[[], ContextManager[None]] = nullcontext,
                 clock: str = "wall") -> tuple[list[float], list[float]]:
    """Per-layer seconds of the backward split in two, as the executor runs it for a zero-bubble
    schedule (`split_backward.backward_input` then `backward_weight`, "reuse" mode), one layer at
    a time: a forward through the layers, each taking its predecessor's output detached (so each
    layer's I and W reach no further than its own input), then from the last layer to the first,
    I (which gives the gradient the layer before it starts from) and W. The first layer, whose
    input takes no gradient, has no I: its W is its full backward, as in the executor."""
    from gpipe_exec.runtime.split_backward import backward_input, backward_weight

    n = len(layers)
    stamps = _Stamps(device, clock)
    ins, outs = [], []
    with hold():
        h = x[:batch]
        for i, layer in enumerate(layers):
            h = h.detach()
            if i > 0 and h.is_floating_point():
                h.requires_grad_(True)
            ins.append(h)
            out = layer(h)
            outs.append(loss_sum(out, target[:batch], batch) if i == n - 1 else out)
            h = out
    ti, tw = [0.0] * n, [0.0] * n
    grad: torch.Tensor | None = None
    for i in reversed(range(n)):
        if not outs[i].requires_grad:
            break  # nothing before this layer is trained
        params = [p for p in layers[i].parameters() if p.requires_grad]
        with hold():
            _sync(device)
            t0 = stamps.now()
            g_in, work = backward_input(outs[i], grad, ins[i], params)
            t1 = stamps.now()
            _sync(device)
        with hold():
            _sync(device)
            t2 = stamps.now()
            backward_weight(work, params)
            t3 = stamps.now()
            _sync(device)
        ti[i], tw[i] = stamps.seconds(t0, t1), stamps.seconds(t2, t3)
        outs[i] = None  # type: ignore[call-overload]  # its graph may go
        grad = g_in
        if grad is None:
            break
    return ti, tw


def split_saved_bytes(layer: torch.nn.Module, x: torch.Tensor, *, first: bool = False) -> dict[str, Any]:
    """What the weight pass W still needs of what the forward saved, for one layer (a block), with
    the executor's split (`split_backward`, "reuse"): bytes autograd saved in the forward
    (`forward`, parameters and buffers left out, counted per save as SavedBytesMeter counts them),
    bytes of those that W reads (`read_by_w`: the saved tensors of the nodes W runs again, an upper
    bound, since a node reads all it saved even where it computes only a weight gradient),
    bytes of the gradients I keeps for W (`kept_gradients`: at each node where a parameter's
    branch meets the input's path), and what I alone reads (`read_by_i_only`: freeable after I)."""
    from gpipe_exec.runtime.split_backward import backward_input, backward_weight

    static = {t.untyped_storage().data_ptr() for t in [*layer.parameters(), *layer.buffers()]}
    saved: dict[int, torch.Tensor] = {}
    read: dict[str, set[int]] = {"I": set(), "W": set()}
    phase = ["F"]

    def pack(t: torch.Tensor) -> Any:
        if t.untyped_storage().data_ptr() in static:
            return ("static", t)
        key = len(saved)
        saved[key] = t
        return ("saved", key)

    def unpack(handle: Any) -> torch.Tensor:
        kind, value = handle
        if kind == "static":
            return value
        read[phase[0]].add(value)
        return saved[value]

    x = x.detach()
    if not first and x.is_floating_point():
        x.requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = layer(x)
    grad = _grad_like(out, 0)
    params = [p for p in layer.parameters() if p.requires_grad]
    phase[0] = "I"
    _, work = backward_input(out, grad, x, params)
    kept_storages = {g.untyped_storage().data_ptr(): g.untyped_storage().nbytes() for group in work.groups
                     for saved_grads in group.grads for g in (saved_grads or ()) if g is not None}
    kept = sum(kept_storages.values())  # a gradient two meeting nodes keep (or views of one) counted once
    phase[0] = "W"
    backward_weight(work, params)
    layer.zero_grad(set_to_none=True)
    size = lambda keys: float(sum(tensor_bytes(saved[k]) for k in keys))  # noqa: E731
    return {"forward": size(saved), "read_by_w": size(read["W"]), "kept_gradients": float(kept),
            "read_by_i_only": size(read["I"] - read["W"]), "mode": work.mode}


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


def saves_input_output(layer: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, *, first: bool,
                       last: bool) -> tuple[bool, bool]:
    """Whether the layer's forward saves (for backward) its input, and its output, themselves."""
    packed: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "meta":
            packed.add(t.data_ptr())
        return t

    x = x.detach()
    if not first and x.is_floating_point():
        x.requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, _ = _pass(layer, x, last, first, target, x.shape[0], None)
    return x.data_ptr() in packed, out.data_ptr() in packed


def transient_parts(layer: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, *, first: bool,
                    last: bool, batch: int) -> tuple[float, float]:
    """The most bytes the layer's forward, and its backward, at `batch` samples allocate beyond
    what they hold at their end: of the forward, the peak minus the bytes live after it (what it
    saves and its output, and the loss on the model's last layer, stay); of the backward, the peak
    minus the bytes live at its start (the saved bytes it frees as it goes are not subtracted, as
    gpipe_sim frees them at the pass's end). Counted by a StorageTracker (every storage an
    operator makes), with the parameters' gradients already there, as they are for a stage's
    micro-batches after its first (gpipe_sim counts gradients as static). (0, 0) on meta."""
    from gpipe_exec.measure.memory import INPUTS, StorageTracker, module_state

    if x.device.type == "meta":
        return 0.0, 0.0
    params = [p for p in layer.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    x, target = x[:batch].detach(), target[:batch]
    grad = None
    try:
        tracker = StorageTracker()
        module_state(tracker, [layer], [])  # made before: not the pass's (an in-place add returns a gradient)
        tracker.track([x, target], INPUTS)
        with tracker:
            tracker.mark()
            out, end = _pass(layer, x, last, first, target, batch, None)
            forward = tracker.interval_peak - tracker.total
            grad = None if last else _grad_like(out, 0)
            del out
            tracker.mark()
            at_start = tracker.total
            _backward(end, last, grad)
            backward = tracker.interval_peak - at_start
            del end
    finally:
        layer.zero_grad(set_to_none=True)
    return float(max(forward, 0)), float(max(backward, 0))


class InputPassMemory(NamedTuple):
    """A layer's input-gradient pass in bytes at one micro-batch size (`input_pass_memory`)."""

    peak: float  # the most it holds above what was live at its start
    freed: float  # of what the forward saved, what goes when it has run and the graph is let go


def input_pass_memory(layer: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, *, last: bool,
                      batch: int) -> InputPassMemory:
    """The layer's input-gradient pass (runtime.split_backward.backward_input, as the executor runs
    it) at `batch` samples, counted by a StorageTracker: the most it holds above what was live at
    its start (the gradients it keeps for the weight pass, its input's gradient, its temporaries:
    LayerSpec's `input_pass_bytes_per_sample` x batch), and what the forward saved that goes when
    the runtime then lets the graph go, keeping what the weight pass needs (the executor drops the
    micro-batch's output: `freed_after_input_pass_bytes_per_sample` x batch). The layer's input and
    output stay held, as the previous layer or chunk and the sent tensor hold them."""
    from gpipe_exec.measure.memory import INPUTS, StorageTracker, module_state
    from gpipe_exec.runtime.split_backward import backward_input

    params = [p for p in layer.parameters() if p.requires_grad]
    x, target = x[:batch].detach(), target[:batch]
    try:
        tracker = StorageTracker()
        module_state(tracker, [layer], [])
        tracker.track([x, target], INPUTS)
        with tracker:
            x = x.requires_grad_(True)
            out = layer(x)
            held = None if last else out.detach()  # the output itself stays (sent, or the next layer's input)
            end = loss_sum(out, target, batch) if last else out
            grad = None if last else _grad_like(out, 0)
            del out
            tracker.mark()
            at_start = tracker.total
            _, work = backward_input(end, grad, x, params)
            peak = tracker.interval_peak - at_start
            before = tracker.total
            del end  # the graph goes; `work` keeps what the weight pass needs
            freed = before - tracker.total
            del work, held
    finally:
        layer.zero_grad(set_to_none=True)
    return InputPassMemory(float(max(peak, 0)), float(max(freed, 0)))


def transient_bytes(layer: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, *, first: bool,
                    last: bool, batch: int) -> float:
    """The larger of the layer's forward and backward transients at `batch` samples (`transient_parts`)."""
    return max(transient_parts(layer, x, target, first=first, last=last, batch=batch))


def transient_fit(small: int, at_small: tuple[float, float], big: int,
                  at_big: tuple[float, float]) -> tuple[float, float]:
    """(fixed bytes, bytes per sample) of a layer's transient (LayerSpec's `transient_bytes`,
    `transient_bytes_per_sample`) from its (forward, backward) transients measured at `small` and
    `big` samples. The backward's line through both sizes gives the fixed part (its value at 0
    samples, the weight gradients' share; at least 0) and a slope; the part per sample is the
    largest of that slope and the forward's bytes per sample at either size. So a forward is
    predicted at or above its measurement at both sizes, and a backward at both ends of the line
    (above it where the slope was raised). One size (`big <= small`): all of it per sample."""
    (f_small, b_small), (f_big, b_big) = at_small, at_big
    if big <= small:
        return 0.0, max(f_big, b_big) / big
    slope = (b_big - b_small) / (big - small)
    fixed = b_big - slope * big
    if slope < 0:  # a backward that shrinks as the batch grows: its largest, fixed
        fixed, slope = max(b_small, b_big), 0.0
    elif fixed < 0:
        fixed, slope = 0.0, b_big / big
    return fixed, max(slope, f_small / small, f_big / big)


def write_table(table: dict[str, Any], path: str | Path) -> None:
    """Write the table as YAML (or JSON for a .json path); `model: {preset: table, path: ...}` loads it."""
    path = Path(path)
    if path.suffix == ".json":
        import json

        path.write_text(json.dumps(table, indent=1))
    else:
        path.write_text(yaml.safe_dump(table, sort_keys=False))


def table_scenario(scenario: Scenario, table: dict[str, Any], updates: dict[str, Any] | None = None) -> Scenario:
    """The scenario with its model replaced by the measured table (plus any other dotted updates)."""
    changes: dict[str, Any] = {"model": {"preset": "table", **table}}
    changes.update(updates or {})
    return scenario.with_updates(changes)


def profile_on_rank(scenario: Scenario, options: ProfileOptions, rank: int) -> dict[str, Any]:
    """This rank's profile of the whole model, run while every other rank profiles too: ranks that
    share a device take turns under its device lock, a forward or backward pass each, as stages do."""
    from gpipe_exec.runtime.device_lock import device_lock

    lock = device_lock(rank, scenario.device_map)
    return profile_model(scenario, options, hold=nullcontext if lock is None else lock.hold)


def _profile_task(rank: int, device: Any, clock: Any, payload: dict[str, Any]) -> dict[str, Any] | None:
    table = profile_on_rank(payload["scenario"], payload["options"], rank)
    return table if rank == 0 else None


def profile_on_devices(scenario: Scenario, options: ProfileOptions = ProfileOptions(),
                       launch_options: Any = None) -> dict[str, Any]:
    """Profile as the pipeline will run: one process per stage placed on the scenario's devices, all
    profiling at once (sharing caches, memory bandwidth and the host; stages of one device taking
    turns, see `profile_on_rank`); rank 0's table. `profile_model` profiles in this process alone.

    Measured on 2 cores (convnet, K=4 on two shared cores, M=16): stage compute in the run was
    1.26-1.43x the profile taken by one process per device, 1.05-1.2x this one."""
    from gpipe_exec.launch.spawn import LaunchOptions, launch

    payload = {"scenario": scenario, "options": options}
    return launch(payload, scenario.device_map, launch_options or LaunchOptions(), task=_profile_task)
