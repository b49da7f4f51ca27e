"""How the profiler times passes: the device's clock (`Stamps`), the passes it times, and which repeats count."""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Sequence

import torch

from gpipe_exec.profiling.options import ProfileOptions
from gpipe_exec.profiling.layers import LossFn
from gpipe_exec.zoo import loss_sum

CLOCKS = ("thread", "wall")
OUTLIER_FACTOR = 3.0

Hold = Callable[[], ContextManager[None]]
# Per layer, in order: one timing per micro-batch size ({"micro_batch", "forward_s", "backward_s", ...}).
LayerTimings = list[list[dict[str, float]]]
# Whether to time another repeat, given this process's wish: the processes of a split layer's mesh
# must agree (each repeat's passes are collectives among them); one process decides alone.
Agree = Callable[[bool], bool]


def alone(more: bool) -> bool:
    """`Agree` for a profile run by one process: its own wish."""
    return more


class Stamps:
    """Timestamps on the device's clock: the one place that knows how a device is timed.

    The interface is device-independent: `sync()` waits for the work queued on the device, `now()`
    takes a stamp, `seconds(a, b)` the seconds from stamp a to stamp b (valid once a `sync()`
    follows b), `host_seconds(a, b)` the host's seconds between taking them (what issuing the work
    took), `interval(fn)` the seconds `fn()` takes. On CPU a stamp is the calling thread's CPU time
    (`clock` "thread", which autograd's CPU backward also runs on) or perf_counter ("wall"), and
    the host's seconds are the device's; on CUDA a stamp is an event recorded on the current
    stream with the host's perf_counter beside it (the clock is then ignored). Events come from a
    pool made outside the timed region (`sync` refills it), so taking a stamp allocates nothing.
    An event's time between two stamps includes any time the GPU waited for the host to issue
    the work: a pass whose kernels are too small to keep the GPU busy is timed as it runs.
    Raises ValueError for a clock not in CLOCKS.
    """

    POOL = 256

    def __init__(self, device: torch.device, clock: str = "wall") -> None:
        if clock not in CLOCKS:
            raise ValueError(f"clock: {clock!r} is not one of {', '.join(CLOCKS)}")
        self.device = device
        self.cuda = device.type == "cuda"
        self.read = time.thread_time if clock == "thread" else time.perf_counter
        self._pool: list[Any] = []
        self._refill()

    @classmethod
    def for_profile(cls, device: torch.device, options: ProfileOptions, collectives: bool = False) -> "Stamps":
        """The clock a profile with `options` times on: `options.clock`, or wall time with more than
        one thread (one thread's CPU time misses the work of torch's other intra-op threads) or
        with `collectives` inside the passes (split layers: the thread's CPU time misses its waits
        for its peers, which a stage's pass waits as well)."""
        return cls(device, options.clock if options.threads <= 1 and not collectives else "wall")

    def _refill(self) -> None:
        if self.cuda:
            self._pool.extend(torch.cuda.Event(enable_timing=True) for _ in range(self.POOL - len(self._pool)))

    def sync(self) -> None:
        """Wait until the device has run the work queued on it (nothing to wait for on CPU)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self._refill()

    def now(self) -> Any:
        """A stamp: a float of seconds on CPU; on CUDA (a recorded event, the host's perf_counter)."""
        if not self.cuda:
            return self.read()
        event = self._pool.pop() if self._pool else torch.cuda.Event(enable_timing=True)
        event.record()
        return event, time.perf_counter()

    def seconds(self, a: Any, b: Any) -> float:
        """Seconds from stamp `a` to stamp `b` on the device."""
        return a[0].elapsed_time(b[0]) / 1e3 if self.cuda else b - a

    def host_seconds(self, a: Any, b: Any) -> float:
        """Seconds the host took from stamp `a` to stamp `b` (the device's on CPU)."""
        return b[1] - a[1] if self.cuda else b - a

    def interval(self, fn: Callable[[], Any]) -> float:
        """Seconds `fn()` takes on the device, the device synchronized before and after."""
        self.sync()
        t0 = self.now()
        fn()
        t1 = self.now()
        self.sync()
        return self.seconds(t0, t1)


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


def typical_time(fn: Callable[[], float], warmup: int, repeats: int) -> float:
    """`typical` of `repeats` (at least 1) calls of `fn` (each returning seconds) after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    return typical([fn() for _ in range(max(1, repeats))])


def time_update(step: Callable[[], Any], stamps: Stamps, warmup: int, repeats: int) -> float:
    """Seconds of one optimizer `step()` on the stamps' device (`typical_time` of its intervals)."""
    return typical_time(lambda: stamps.interval(step), warmup, repeats)


def chain_times(layers: list[torch.nn.Module], x: torch.Tensor, target: torch.Tensor, batch: int,
                stamps: Stamps, hold: Hold = nullcontext, host: list[list[float]] | None = None,
                loss: LossFn = loss_sum) -> tuple[list[float], list[float]]:
    """Per-layer forward and backward seconds of one pass through the chained layers, run as a
    stage runs them: one forward through all layers, then one autograd call for the backward,
    timed layer by layer by a hook on each layer's input gradient. (Timed as one backward call per
    layer instead, each call's fixed cost counted once per layer: on the convnet at 2 samples the
    layers' backward added up to 9% more than the chain's.) A layer no gradient reaches has 0 s of
    backward. Each of the forward and the backward runs inside one `hold()`; `loss` ends the
    last layer's forward (a split head's: the vocabulary-parallel one). With `host`, the
    host's seconds to issue each layer's forward and backward are appended to it as two lists.
    (On CUDA, where the backward's per-layer hooks run on autograd's device thread, each layer's
    backward host time is its share of the whole backward call's by device time.)"""
    n = len(layers)
    fwd, bwd = [0.0] * n, [0.0] * n
    marks: dict[int, Any] = {}  # layer -> when its input's gradient was ready

    def at(i: int) -> Callable[[torch.Tensor], None]:
        def hook(_grad: torch.Tensor) -> None:
            marks[i] = stamps.now()
        return hook

    with hold():
        stamps.sync()
        ticks = [stamps.now()]
        h = x[:batch]
        for i, layer in enumerate(layers):
            if i > 0 and h.requires_grad:
                h.register_hook(at(i))
            h = layer(h)
            if i == n - 1:
                h = loss(h, target[:batch], batch)
            ticks.append(stamps.now())
        stamps.sync()
    for i in range(n):
        fwd[i] = stamps.seconds(ticks[i], ticks[i + 1])
    fwd_host = [stamps.host_seconds(ticks[i], ticks[i + 1]) for i in range(n)]
    if not h.requires_grad:
        if host is not None:
            host.extend([fwd_host, [0.0] * n])
        return fwd, bwd
    with hold():
        stamps.sync()
        marks[n] = stamps.now()
        h.backward()
        done = stamps.now()
        stamps.sync()
    for i in reversed(range(n)):
        if i + 1 not in marks:
            continue  # no gradient reaches this layer (nothing before it is trained)
        bwd[i] = stamps.seconds(marks[i + 1], marks.get(i, done))
    if host is not None:
        whole, device = stamps.host_seconds(marks[n], done), sum(bwd)
        host.extend([fwd_host, [whole * b / device if device > 0 else 0.0 for b in bwd]])
    return fwd, bwd


def split_times(layers: list[torch.nn.Module], x: torch.Tensor, target: torch.Tensor, batch: int,
                stamps: Stamps, hold: Hold = nullcontext, loss: LossFn = loss_sum) -> tuple[list[float], list[float]]:
    """Per-layer seconds of the backward split in two, as the executor runs it for a zero-bubble
    schedule (`split_backward.backward_input` then `backward_weight`, "reuse" mode), one layer at
    a time: a forward through the layers, each taking its predecessor's output detached (so each
    layer's I and W reach no further than its own input), then from the last layer to the first,
    I (which gives the gradient the layer before it starts from) and W. The first layer, whose
    input takes no gradient, has no I: its W is its full backward, as in the executor."""
    from gpipe_exec.runtime.split_backward import backward_input, backward_weight

    n = len(layers)
    ins, outs = [], []
    with hold():
        h = x[:batch]
        for i, layer in enumerate(layers):
            h = h.detach()
            if i > 0 and h.is_floating_point():
                h.requires_grad_(True)
            ins.append(h)
            out = layer(h)
            outs.append(loss(out, target[:batch], batch) if i == n - 1 else out)
            h = out
    ti, tw = [0.0] * n, [0.0] * n
    grad: torch.Tensor | None = None
    for i in reversed(range(n)):
        if not outs[i].requires_grad:
            break  # nothing before this layer is trained
        params = [p for p in layers[i].parameters() if p.requires_grad]
        with hold():
            stamps.sync()
            t0 = stamps.now()
            g_in, work = backward_input(outs[i], grad, ins[i], params)
            t1 = stamps.now()
            stamps.sync()
        with hold():
            tw[i] = stamps.interval(lambda: backward_weight(work, params))
        ti[i] = stamps.seconds(t0, t1)
        outs[i] = None  # type: ignore[call-overload]  # its graph may go
        grad = g_in
        if grad is None:
            break
    return ti, tw


Sample = tuple[list[float], list[float]]  # per layer: (forward or I seconds, backward or W seconds)


def _repeat(layers: list[torch.nn.Module], x: torch.Tensor, target: torch.Tensor, batch: int, stamps: Stamps,
            options: ProfileOptions, accumulate: bool, hold: Hold, loss: LossFn, agree: Agree
            ) -> tuple[list[Sample], list[Sample], list[Sample]]:
    """The timed repeats at one size (chain times, split times with `options.split_backward`, and
    on CUDA the host's issue times of the chain): `options.warmup` untimed, then at least
    `options.repeats`, and on while the timed ones add up to less than `options.min_time_s` (at
    most `options.max_repeats` timed), as long as `agree` does (before each repeat, untimed)."""
    samples: list[Sample] = []
    split_samples: list[Sample] = []
    host_samples: list[Sample] = []
    timed, r = 0.0, 0
    while agree(r < options.warmup + max(1, options.repeats) or (
            timed < options.min_time_s and r < options.warmup + options.max_repeats)):
        if not accumulate:
            for layer in layers:
                layer.zero_grad(set_to_none=True)
        host: list[list[float]] | None = [] if stamps.cuda else None
        times = chain_times(layers, x, target, batch, stamps, hold, host, loss)
        split = split_times(layers, x, target, batch, stamps, hold, loss) if options.split_backward else None
        if r >= options.warmup:
            samples.append(times)
            if host is not None:
                host_samples.append((host[0], host[1]))
            timed += sum(times[0]) + sum(times[1])
            if split is not None:
                split_samples.append(split)
        r += 1
    return samples, split_samples, host_samples


def _kept(samples: list[Sample]) -> list[Sample]:
    return [samples[k] for k in typical_repeats([sum(f) + sum(g) for f, g in samples])]


def _kept_with(samples: list[Sample], others: list[Sample]) -> list[Sample]:
    """Of `others` (one per repeat of `samples`), those of the repeats `_kept` keeps."""
    return [others[k] for k in typical_repeats([sum(f) + sum(g) for f, g in samples])] if others else []


def time_layers(layers: list[torch.nn.Module], x: torch.Tensor, target: torch.Tensor, sizes: Sequence[int],
                stamps: Stamps, options: ProfileOptions, *, accumulate: bool, hold: Hold = nullcontext,
                on_size: Callable[[int, int], None] | None = None, loss: LossFn = loss_sum,
                agree: Agree = alone) -> LayerTimings:
    """Per layer, one timing per micro-batch size of `sizes` (in their order): {"micro_batch",
    "forward_s", "backward_s"}, plus "backward_input_s" and "backward_weight_s" with
    `options.split_backward` and on CUDA "forward_host_s" and "backward_host_s" (`chain_times`);
    each the layer's mean over the repeats `typical_repeats` keeps of those `_repeat` runs. `x`
    and `target` hold at least max(sizes) samples. Without `accumulate`, the layers' gradients are
    cleared before every repeat. `on_size(j, size)` is called before the j-th size is timed;
    `loss` ends the last layer's forward; split layers' processes time together, as `agree` says."""
    timings: LayerTimings = [[] for _ in layers]
    for j, b in enumerate(sizes):
        if on_size:
            on_size(j, b)
        samples, split_samples, host_samples = _repeat(layers, x, target, b, stamps, options, accumulate, hold, loss,
                                                       agree)
        steady, kept_split, kept_host = _kept(samples), _kept(split_samples), _kept_with(samples, host_samples)
        for i, timing in enumerate(timings):
            timing.append({
                "micro_batch": b,
                "forward_s": statistics.fmean(t[0][i] for t in steady),
                "backward_s": statistics.fmean(t[1][i] for t in steady),
            })
            if kept_host:  # CUDA: what issuing the passes took the host
                timing[-1]["forward_host_s"] = statistics.fmean(t[0][i] for t in kept_host)
                timing[-1]["backward_host_s"] = statistics.fmean(t[1][i] for t in kept_host)
            if kept_split:
                timing[-1]["backward_input_s"] = statistics.fmean(t[0][i] for t in kept_split)
                timing[-1]["backward_weight_s"] = statistics.fmean(t[1][i] for t in kept_split)
    return timings
