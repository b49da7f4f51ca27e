"""Shared test fixtures."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from gpipe_sim.scenario.scenario import Scenario, parse_scenario


def make_uniform(
    stages: int,
    micro_batches: int,
    batch_size: int = 64,
    layers: int = 16,
    schedule: str = "gpipe",
    remat: str = "none",
    hardware: dict[str, Any] | None = None,
    chunks: int = 1,
    **model: Any,
) -> Scenario:
    """A uniform-layer scenario on ideal hardware unless `hardware` says otherwise."""
    return parse_scenario({
        "model": {"preset": "uniform", "layers": layers, **model},
        "hardware": hardware or {"preset": "ideal"},
        "pipeline": {"stages": stages, "chunks": chunks, "micro_batches": micro_batches,
                     "batch_size": batch_size, "schedule": schedule, "remat": remat},
    })


@pytest.fixture(scope="session")
def uniform() -> Callable[..., Scenario]:
    return make_uniform


# Multi-rank tests run on CPU (gloo) unless they test the GPU path: on a machine with one GPU, two
# ranks would otherwise share it. GPU tests (`-m gpu`) ask for CUDA outright.
import os  # noqa: E402

os.environ.setdefault("GPIPE_EXEC_DEVICE", "cpu")
