"""Saved-tensor hooks that nest: an inner pair composes with the pairs around it instead of hiding them."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

Pack = Callable[[torch.Tensor], Any]
Unpack = Callable[[Any], torch.Tensor]

_STACK: list[tuple[Pack, Unpack]] = []  # the pairs entered through `nested_saved_tensors_hooks`, outermost first


@contextmanager
def nested_saved_tensors_hooks(pack: Pack, unpack: Unpack) -> Iterator[None]:
    """`torch.autograd.graph.saved_tensors_hooks(pack, unpack)` composed with the pairs entered
    through this function around it: a tensor saved inside is packed by the innermost `pack`
    first, then by each enclosing one outwards, and unpacked the other way round (the outermost
    `unpack` first). torch's own contexts shadow the ones around them; with these, a meter that
    counts what autograd saves (measure.meters.SavedBytesMeter) still sees what an inner pair
    packs, such as a tensor-parallel GEMM's input resharded (runtime.tensor_parallel). Every
    `pack` but the innermost receives what the one inside it returned, so the pairs that enclose
    others must take and give tensors. A torch context entered between two of these is skipped."""
    _STACK.append((pack, unpack))
    packs = [p for p, _ in reversed(_STACK)]  # innermost first
    unpacks = [u for _, u in _STACK]  # outermost first

    def pack_all(t: torch.Tensor) -> Any:
        for p in packs:
            t = p(t)
        return t

    def unpack_all(packed: Any) -> torch.Tensor:
        for u in unpacks:
            packed = u(packed)
        return packed

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack_all, unpack_all):
            yield
    finally:
        _STACK.pop()
