"""How the profiler measures a layer's memory figures: FLOPs, saved and transient bytes, the split backward's."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch.utils.flop_counter import FlopCounterMode

from gpipe_exec.measure.meters import SavedBytesMeter, local_data, tensor_bytes
from gpipe_exec.profiling.layers import LossFn
from gpipe_exec.zoo import loss_sum


def grad_like(out: torch.Tensor, seed: int) -> torch.Tensor:
    """A random gradient for `out` (its shape, dtype and device), the same for the same seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out.shape, generator=g, dtype=torch.float32).to(out.dtype).to(out.device)


def forward_pass(layer: torch.nn.Module, x: torch.Tensor, last: bool, first: bool, target: torch.Tensor,
                 batch: int, meter: SavedBytesMeter | None,
                 loss: LossFn = loss_sum) -> tuple[torch.Tensor, torch.Tensor]:
    """(the layer's output, what its backward starts from: the `loss` on the model's `last` layer,
    else the output) for input `x` detached (taking a gradient unless `first`), counted by `meter`
    if given."""
    x = x.detach()
    if not first and x.is_floating_point():
        x.requires_grad_(True)
    if meter is not None:
        with meter.track(0):
            out = layer(x)
            end = loss(out, target, batch) if last else out
    else:
        out = layer(x)
        end = loss(out, target, batch) if last else out
    return out, end


def backward_pass(end: torch.Tensor, last: bool, grad: torch.Tensor | None) -> None:
    """The backward from `forward_pass`'s `end`: of the loss on the `last` layer, else with `grad`."""
    if last:
        end.backward()
    else:
        torch.autograd.backward(end, grad)


def measure_layer_bytes(layer: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, *, first: bool,
                        last: bool, batch: int, loss: LossFn = loss_sum) -> tuple[dict[str, Any], torch.Tensor]:
    """Parameters, FLOPs, output and saved bytes per sample of one layer at `batch` samples, and its
    output detached. Runs on any device, the meta device included (allocating nothing there). A
    split layer's (DTensor) parameters count as this process holds them: their local shards."""
    meter = SavedBytesMeter([layer])
    with FlopCounterMode(display=False) as counter:
        out, end = forward_pass(layer, x[:batch], last, first, target[:batch], batch, meter, loss)
    forward_flops = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        backward_pass(end, last, None if last else grad_like(out, 0))
    layer.zero_grad(set_to_none=True)
    sizes = [local_data(p).numel() for p in layer.parameters()]
    row = {
        "params": int(sum(sizes)),
        "largest_tensor_params": int(max(sizes, default=0)),
        "activation_bytes_per_sample": meter.peak / batch,
        "output_bytes_per_sample": tensor_bytes(out) / batch,
        "forward_flops_per_sample": forward_flops / batch,
        "backward_flops_per_sample": counter.get_total_flops() / batch,
    }
    return row, out.detach()


def split_saved_bytes(layer: torch.nn.Module, x: torch.Tensor, *, first: bool = False) -> dict[str, Any]:
    """What the weight pass W still needs of what the forward saved, for one layer (a block), with
    the executor's split (`split_backward`, "reuse"): bytes autograd saved in the forward
    (`forward`, parameters and buffers left out, counted per save as SavedBytesMeter counts them),
    bytes of those that W reads (`read_by_w`: the saved tensors of the nodes W runs again, an upper
    bound, since a node reads all it saved even where it computes only a weight gradient),
    bytes of the gradients I keeps for W (`kept_gradients`: at each node where a parameter's
    branch meets the input's path), and what I alone reads (`read_by_i_only`: freeable after I)."""
    from gpipe_exec.runtime.split_backward import backward_input, backward_weight

    static = {local_data(t).untyped_storage().data_ptr() for t in [*layer.parameters(), *layer.buffers()]}
    saved: dict[int, torch.Tensor] = {}
    read: dict[str, set[int]] = {"I": set(), "W": set()}
    phase = ["F"]

    def pack(t: torch.Tensor) -> Any:
        if local_data(t).untyped_storage().data_ptr() in static:
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
    grad = grad_like(out, 0)
    params = [p for p in layer.parameters() if p.requires_grad]
    phase[0] = "I"
    _, work = backward_input(out, grad, x, params)
    kept_storages = {s.data_ptr(): s.nbytes() for group in work.groups for saved_grads in group.grads
                     for g in (saved_grads or ()) if g is not None for s in (local_data(g).untyped_storage(),)}
    kept = sum(kept_storages.values())  # a gradient two meeting nodes keep (or views of one) counted once
    phase[0] = "W"
    backward_weight(work, params)
    layer.zero_grad(set_to_none=True)
    size = lambda keys: float(sum(tensor_bytes(saved[k]) for k in keys))  # noqa: E731
    return {"forward": size(saved), "read_by_w": size(read["W"]), "kept_gradients": float(kept),
            "read_by_i_only": size(read["I"] - read["W"]), "mode": work.mode}


def saves_input_output(layer: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, *, first: bool,
                       last: bool, loss: LossFn = loss_sum) -> tuple[bool, bool]:
    """Whether the layer's forward saves (for backward) its input, and its output, themselves."""
    packed: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "meta":
            packed.add(local_data(t).data_ptr())
        return t

    x = x.detach()
    if not first and x.is_floating_point():
        x.requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, _ = forward_pass(layer, x, last, first, target, x.shape[0], None, loss)
    return x.data_ptr() in packed, local_data(out).data_ptr() in packed


def transient_parts(layer: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, *, first: bool,
                    last: bool, batch: int, loss: LossFn = loss_sum) -> tuple[float, float]:
    """The most bytes the layer's forward, and its backward, at `batch` samples allocate beyond
    what they hold at their end: of the forward, the peak minus the bytes live after it (what it
    saves and its output, and the loss on the model's last layer, stay); of the backward, the peak
    minus the bytes live at its start (the saved bytes it frees as it goes are not subtracted, as
    gpipe_sim frees them at the pass's end). Counted by `measure.memory.pass_meter` (on CPU every
    storage an operator makes, on CUDA the caching allocator's statistics), with the parameters' gradients already there, as they are for a stage's
    micro-batches after its first (gpipe_sim counts gradients as static). (0, 0) on meta."""
    from gpipe_exec.measure.memory import pass_meter

    if x.device.type == "meta":
        return 0.0, 0.0
    params = [p for p in layer.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    x, target = x[:batch].detach(), target[:batch]
    grad = None
    try:
        # the state made before is not the pass's (an in-place add returns a gradient)
        tracker = pass_meter(x.device, [layer], [x, target])
        with tracker:
            tracker.mark()
            out, end = forward_pass(layer, x, last, first, target, batch, None, loss)
            forward = tracker.interval_peak - tracker.total
            grad = None if last else grad_like(out, 0)
            del out
            tracker.mark()
            at_start = tracker.total
            backward_pass(end, last, grad)
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
                      batch: int, loss: LossFn = loss_sum) -> InputPassMemory:
    """The layer's input-gradient pass (runtime.split_backward.backward_input, as the executor runs
    it) at `batch` samples, counted by a StorageTracker: the most it holds above what was live at
    its start (the gradients it keeps for the weight pass, its input's gradient, its temporaries:
    LayerSpec's `input_pass_bytes_per_sample` x batch), and what the forward saved that goes when
    the runtime then lets the graph go, keeping what the weight pass needs (the executor drops the
    micro-batch's output: `freed_after_input_pass_bytes_per_sample` x batch). The layer's input and
    output stay held, as the previous layer or chunk and the sent tensor hold them."""
    from gpipe_exec.measure.memory import pass_meter
    from gpipe_exec.runtime.split_backward import backward_input

    params = [p for p in layer.parameters() if p.requires_grad]
    x, target = x[:batch].detach(), target[:batch]
    try:
        tracker = pass_meter(x.device, [layer], [x, target])
        with tracker:
            x = x.requires_grad_(True)
            out = layer(x)
            held = None if last else out.detach()  # the output itself stays (sent, or the next layer's input)
            end = loss(out, target, batch) if last else out
            grad = None if last else grad_like(out, 0)
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
                    last: bool, batch: int, loss: LossFn = loss_sum) -> float:
    """The larger of the layer's forward and backward transients at `batch` samples (`transient_parts`)."""
    return max(transient_parts(layer, x, target, first=first, last=last, batch=batch, loss=loss))


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


def _split_backward_figures(layer: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, *, first: bool,
                            last: bool, small: int, big: int, saved_per_sample: float,
                            loss: LossFn) -> dict[str, float]:
    """A trained layer's figures for split backwards (LayerSpec's `kept_for_weight_bytes_per_sample`,
    and but for the model's first layer, whose input pass does nothing, `input_pass_bytes_per_sample`
    at the worse of both sizes and `freed_after_input_pass_bytes_per_sample`, at most what it saves)."""
    kept = split_saved_bytes(layer, x[:big], first=first)["kept_gradients"]
    figures = {"kept_for_weight_bytes_per_sample": kept / big}
    if not first:
        at = {b: input_pass_memory(layer, x, target, last=last, batch=b, loss=loss) for b in sorted({small, big})}
        figures["input_pass_bytes_per_sample"] = max(m.peak / b for b, m in at.items())
        figures["freed_after_input_pass_bytes_per_sample"] = min(at[big].freed / big, saved_per_sample)
    return figures


def measure_layer(layer: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, *, first: bool, last: bool,
                  small: int, big: int, meta: bool = False, after_saved_output: bool = False,
                  loss: LossFn = loss_sum) -> tuple[dict[str, Any], torch.Tensor, bool]:
    """One layer's memory figures, the profiler's one entry point for them: (its LayerSpec row's
    bytes, FLOPs and parameters, its output detached (the next layer's input), whether its forward
    saves its output (the next layer's `after_saved_output`)). `x` and `target` hold `big` samples.

    The figures are measured at `big` samples (`measure_layer_bytes`); unless `meta`, also the
    transient at `small` and `big` (`transient_fit`), the input's bytes saved a second time when
    the previous layer saved its output (`after_saved_output`) and this one saves it as its input,
    and the split backward's (`_split_backward_figures`). The counts are of the storages tensors
    own (SavedBytesMeter, StorageTracker), on any device; with `meta` nothing is allocated. `loss`
    ends the model's last layer's passes (a split head's: the vocabulary-parallel one); a split
    layer's collectives run inside every pass, so all processes of its mesh measure it together.
    """
    if meta:
        row, out = measure_layer_bytes(layer, x, target, first=first, last=last, batch=big, loss=loss)
        return row, out, False
    fixed, per_sample = transient_fit(  # before the static pass, which leaves gradients behind
        small, transient_parts(layer, x, target, first=first, last=last, batch=small, loss=loss),
        big, transient_parts(layer, x, target, first=first, last=last, batch=big, loss=loss))
    row, out = measure_layer_bytes(layer, x, target, first=first, last=last, batch=big, loss=loss)
    row["transient_bytes_per_sample"] = per_sample
    row["transient_bytes"] = fixed
    saves_input, saves_output = saves_input_output(layer, x[:big], target[:big], first=first, last=last, loss=loss)
    if saves_input and after_saved_output:
        row["saved_with_previous_bytes_per_sample"] = tensor_bytes(x[:big]) / big
    if any(p.requires_grad for p in layer.parameters()):
        row.update(_split_backward_figures(layer, x, target, first=first, last=last, small=small, big=big,
                                           saved_per_sample=row["activation_bytes_per_sample"], loss=loss))
    return row, out, saves_output
