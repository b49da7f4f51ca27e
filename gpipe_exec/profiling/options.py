"""The profiler's options: which micro-batch sizes to time, how often, on which clock and device."""

from __future__ import annotations

from dataclasses import dataclass


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
    # "cpu", "cuda", "cuda:N" or "auto"; None: $GPIPE_EXEC_DEVICE, else auto (launch.devices.device_type)
    device: str | None = None
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
