"""Real tensor memory of a rank: live storages counted by category (CPU) or the caching allocator's peak (CUDA).

Independent of the saved-tensor hooks (`SavedBytesMeter`): `StorageTracker` is a TorchDispatchMode
that sees every tensor an operator returns and counts its storage's bytes (once per storage, views
and aliases included) from the moment it appears until it is freed (a weak reference's callback).
Storages made outside the mode count only when registered with `track` (parameters, buffers,
gradients, optimizer states, data, receive buffers). What it does not see: memory outside torch's
tensors (gloo's own transport buffers, the Python objects, the interpreter), and tensors made
outside the mode and never registered. On CUDA `AllocatorPeak` reads the caching allocator's
`active_bytes.all.peak` instead (every live block, rounded as the allocator rounds it).
"""

from __future__ import annotations

import gc

import weakref
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gpipe_exec.measure.meters import local_data

# Categories a storage is counted under (`breakdown`): static state, then what the step's actions made.
PARAMETERS, BUFFERS, GRADIENTS, OPTIMIZER = "parameters", "buffers", "gradients", "optimizer_states"
INPUTS, RECEIVE_BUFFERS = "inputs", "receive_buffers"  # the data and targets; buffers receives land in
CATEGORIES = (PARAMETERS, BUFFERS, GRADIENTS, OPTIMIZER, INPUTS, RECEIVE_BUFFERS, "forward", "recompute", "backward",
              "backward_input", "backward_weight", "update", "send", "recv", "allreduce")


class StorageTracker(TorchDispatchMode):
    """Bytes of live tensor storages: `total` now, `peak` since `reset_peak`, and the total per
    category at the peak (`peak_breakdown`).

    A storage is counted under the category current when it first appears (`phase`), or the one
    `track` gives it; `track` moves an already counted storage to its new category (a gradient
    made by a backward pass becomes `gradients` once accumulated). `mark()` starts an interval:
    `interval_peak` is the largest total since then (an action's peak, its transients included).
    `resized`: storages may change size in place (FSDP2 frees a gathered parameter's storage by
    `resize_(0)` and regrows it for the next gather), so every count first re-reads the live
    storages' sizes (slower: for sharded runs only).
    """

    def __init__(self, resized: bool = False) -> None:
        super().__init__()
        self.resized = resized
        self._live: dict[int, tuple[weakref.ref, int, str]] = {}  # id(storage) -> (ref, bytes, category)
        self.by_category: dict[str, int] = {}
        self.total = 0
        self.peak = 0
        self.peak_breakdown: dict[str, int] = {}
        self.interval_peak = 0
        self.phase = "other"

    # -- counting ------------------------------------------------------------------------------

    def _freed(self, key: int) -> None:
        entry = self._live.pop(key, None)
        if entry is not None:
            _, nbytes, category = entry
            self.total -= nbytes
            self.by_category[category] -= nbytes

    def _count(self, t: torch.Tensor, category: str, move: bool) -> None:
        t = local_data(t)  # a DTensor: its local shard
        if t.device.type == "meta" or t.is_sparse:
            return
        storage = t.untyped_storage()
        key = id(storage)
        entry = self._live.get(key)
        if entry is not None:
            ref, nbytes, old = entry
            if ref() is storage:
                if move and old != category:
                    self.by_category[old] -= nbytes
                    self.by_category[category] = self.by_category.get(category, 0) + nbytes
                    self._live[key] = (ref, nbytes, category)
                if self.resized:  # a regrown storage is written to as it is gathered into
                    self._seen()
                return
            self._freed(key)  # an id reused after its storage died before its callback ran
        nbytes = int(storage.nbytes())
        ref = weakref.ref(storage, lambda _r, key=key: self._freed(key))
        self._live[key] = (ref, nbytes, category)
        self.total += nbytes
        self.by_category[category] = self.by_category.get(category, 0) + nbytes
        self._seen()

    def _refresh(self) -> None:
        """Re-read the size of every live storage (`resized`)."""
        for key, (ref, nbytes, category) in list(self._live.items()):
            storage = ref()
            now = nbytes if storage is None else int(storage.nbytes())
            if now != nbytes:
                self._live[key] = (ref, now, category)
                self.total += now - nbytes
                self.by_category[category] += now - nbytes

    def _seen(self) -> None:
        if self.resized:
            self._refresh()
        if self.total > self.interval_peak:
            self.interval_peak = self.total
        if self.total > self.peak:
            self.peak = self.total
            self.peak_breakdown = {k: v for k, v in self.by_category.items() if v}

    def track(self, tensors: Iterable[Any], category: str) -> None:
        """Count (or move to `category`) the storages of these tensors (nested containers allowed;
        None and non-tensors are skipped)."""
        leaves, _ = tree_flatten(list(tensors))
        for t in leaves:
            if isinstance(t, torch.Tensor):
                self._count(t, category, move=True)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        leaves, _ = tree_flatten(out)
        for t in leaves:
            if isinstance(t, torch.Tensor):
                self._count(t, self.phase, move=False)
        return out

    # -- intervals -----------------------------------------------------------------------------

    def reset_peak(self) -> None:
        """Start a new peak from the bytes live now."""
        self.peak = self.interval_peak = self.total
        self.peak_breakdown = {k: v for k, v in self.by_category.items() if v}

    def mark(self) -> None:
        """Start an interval: `interval_peak` restarts from the bytes live now."""
        self.interval_peak = self.total

    @contextmanager
    def during(self, phase: str) -> Iterator[None]:
        """New storages made inside count under `phase` (an action kind's name)."""
        before, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = before


def module_state(tracker: StorageTracker, modules: Iterable[torch.nn.Module],
                 optimizers: Iterable[torch.optim.Optimizer]) -> None:
    """Register the modules' parameters, buffers and gradients and the optimizers' states."""
    modules, optimizers = list(modules), list(optimizers)
    for module in modules:
        tracker.track(module.parameters(), PARAMETERS)
        tracker.track(module.buffers(), BUFFERS)
        tracker.track([p.grad for p in module.parameters()], GRADIENTS)
    for opt in optimizers:
        tracker.track([opt.state[p] for group in opt.param_groups for p in group["params"] if p in opt.state],
                      OPTIMIZER)


@contextmanager
def gradients_as_gradients(tracker: StorageTracker, params: Iterable[torch.nn.Parameter]) -> Iterator[None]:
    """While inside, each parameter's gradient is moved to `gradients` as soon as it is accumulated."""
    handles = [p.register_post_accumulate_grad_hook(lambda q: tracker.track([q.grad], GRADIENTS))
               for p in params if p.requires_grad]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def live_cuda_bytes(device: torch.device) -> int:
    """On CUDA, the caching allocator's bytes of live blocks once unreachable tensors are collected
    (`gc.collect`: reference cycles can hold tensors of finished work); 0 on other devices."""
    if device.type != "cuda":
        return 0
    gc.collect()
    torch.cuda.synchronize(device)
    return int(torch.cuda.memory_stats(device).get("active_bytes.all.current", 0))


class AllocatorPeak:
    """CUDA: the caching allocator's bytes of live blocks (`active_bytes.all.current`) and their
    peak since `reset_peak` (`active_bytes.all.peak`), less `baseline` (bytes live before the
    measured work began, owned by something else in the process); `mark`/`interval_peak` as
    StorageTracker's."""

    def __init__(self, device: torch.device, baseline: int = 0) -> None:
        self.device = device
        self.baseline = baseline
        self._mark_peak = 0

    def _stats(self) -> dict[str, Any]:
        return torch.cuda.memory_stats(self.device)

    @property
    def total(self) -> int:
        return int(self._stats().get("active_bytes.all.current", 0)) - self.baseline

    @property
    def peak(self) -> int:
        return int(self._stats().get("active_bytes.all.peak", 0)) - self.baseline

    def reset_peak(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)

    def mark(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)

    @property
    def interval_peak(self) -> int:
        torch.cuda.synchronize(self.device)
        return self.peak

    def track(self, tensors: Iterable[Any], category: str) -> None:
        """Nothing to register: the allocator sees every block, whoever made it."""

    def __enter__(self) -> "AllocatorPeak":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def pass_meter(device: torch.device, modules: Iterable[torch.nn.Module],
               inputs: Iterable[torch.Tensor]) -> "StorageTracker | AllocatorPeak":
    """A meter of what passes allocate on `device`, used as `with meter: meter.mark(); ...;
    meter.interval_peak - meter.total`: on CPU a StorageTracker with the modules' state and
    `inputs` registered beforehand (a per-operator hook), on CUDA the caching allocator's own
    statistics (`AllocatorPeak`: no hook, nothing added to the passes' time)."""
    if device.type == "cuda":
        return AllocatorPeak(device)
    tracker = StorageTracker()
    module_state(tracker, list(modules), [])
    tracker.track(list(inputs), INPUTS)
    return tracker
