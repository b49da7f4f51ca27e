"""Per-layer profiler: measures each layer on this device and writes gpipe_sim's LayerSpec table."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

from gpipe_exec.measure import SavedBytesMeter, tensor_bytes
from gpipe_exec.stage import make_optimizer
from gpipe_exec.zoo import build_layer, check_buildable, loss_sum, make_batch
from gpipe_sim.models import layer_count
from gpipe_sim.scenario import LayerSpec, Scenario


@dataclass(frozen=True)
class ProfileOptions:
    """Micro-batch sizes to time, warm-up and timed repeats (the median is kept), where to run."""

    micro_batches: tuple[int, ...] = ()
    warmup: int = 2
    repeats: int = 5
    threads: int = 1
    meta: bool = False  # FLOPs, parameters and bytes only, on the meta device (no timings)
    device: str = "cpu"


def default_sizes(scenario: Scenario) -> tuple[int, ...]:
    """The micro-batch sizes the scenario runs (tensor_split gives at most two)."""
    from gpipe_sim.partition import micro_batch_sizes

    p = scenario.pipeline
    return tuple(sorted(set(micro_batch_sizes(p.batch_size, p.effective_micro_batches))))


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


def _median_time(fn: Callable[[], tuple[float, float]], warmup: int, repeats: int) -> tuple[float, float]:
    for _ in range(warmup):
        fn()
    samples = [fn() for _ in range(max(1, repeats))]
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


def profile_layer(layer: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, *, index: int,
                  last: bool, name: str, sizes: Sequence[int], options: ProfileOptions,
                  optimizer: str) -> dict[str, Any]:
    """One table row: parameters, FLOPs, output and saved bytes per sample, timings per size."""
    device = x.device
    first = index == 0
    big = max(sizes)
    xb, tb = x[:big], target[:big]
    meter = SavedBytesMeter([layer])
    with FlopCounterMode(display=False) as counter:
        out, end = _pass(layer, xb, last, first, tb, big, meter)
    forward_flops = counter.get_total_flops()
    grad = None if last else _grad_like(out, index)
    with FlopCounterMode(display=False) as counter:
        _backward(end, last, grad)
    backward_flops = counter.get_total_flops()
    row: dict[str, Any] = {
        "name": name,
        "params": int(sum(p.numel() for p in layer.parameters())),
        "activation_bytes_per_sample": meter.peak / big,
        "output_bytes_per_sample": tensor_bytes(out) / big,
        "forward_flops_per_sample": forward_flops / big,
        "backward_flops_per_sample": backward_flops / big,
    }
    if options.meta:
        return row
    timings = []
    for b in sorted(set(sizes)):
        xs, ts = x[:b], target[:b]
        g = None if last else _grad_like(out[:b].detach(), index)

        def once() -> tuple[float, float]:
            layer.zero_grad(set_to_none=True)
            _sync(device)
            t0 = time.perf_counter()
            _, e = _pass(layer, xs, last, first, ts, b, None)
            _sync(device)
            t1 = time.perf_counter()
            _backward(e, last, g)
            _sync(device)
            return t1 - t0, time.perf_counter() - t1

        fwd, bwd = _median_time(once, options.warmup, options.repeats)
        timings.append({"micro_batch": b, "forward_s": fwd, "backward_s": bwd})
    row["timings"] = timings
    params = list(layer.parameters())
    if params:
        opt = make_optimizer(params, optimizer)

        def step() -> tuple[float, float]:
            _sync(device)
            t0 = time.perf_counter()
            opt.step()
            _sync(device)
            return time.perf_counter() - t0, 0.0

        row["update_s"] = _median_time(step, options.warmup, options.repeats)[0]
    return row


def profile_model(scenario: Scenario, options: ProfileOptions = ProfileOptions(), *, seed: int = 0,
                  dropout: float | None = None,
                  progress: Callable[[int, int, str], None] | None = None) -> dict[str, Any]:
    """The model's per-layer table ({"layers": [...], "input_bytes_per_sample": ...}).

    Layers are built and measured one at a time (the activations flow from one to the next), so
    only one layer's parameters are in memory; with `meta` nothing is allocated at all.
    """
    from gpipe_exec.zoo import layer_names

    check_buildable(scenario.model)
    torch.set_num_threads(max(1, options.threads))
    dtype = scenario.training.dtype
    sizes = options.micro_batches or default_sizes(scenario)
    device = torch.device("meta" if options.meta else options.device)
    names = layer_names(scenario.model)
    x, y = make_batch(scenario.model, max(sizes), seed=seed, dtype=dtype)
    h, y = x.to(device), y.to(device)
    table = {"input_bytes_per_sample": tensor_bytes(x) / max(sizes), "layers": []}
    n = layer_count(scenario.model)
    for i in range(n):
        if progress:
            progress(i, n, names[i])
        with torch.device(device):
            layer = build_layer(scenario.model, i, seed=seed, dropout=dropout, dtype=dtype)
        layer.to(device)
        row = profile_layer(layer, h, y, index=i, last=i == n - 1, name=names[i], sizes=sizes,
                            options=options, optimizer=scenario.training.optimizer)
        LayerSpec.model_validate(row)  # the row format gpipe_sim loads
        table["layers"].append(row)
        with torch.no_grad():
            h = layer(h)
        del layer
    return table


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
