"""Random accuracy cases: zoo models, sizes, batch, M, schedule and remat drawn from wide ranges by a seed."""

from __future__ import annotations

import random
from typing import Any, Sequence

from gpipe_sim.schedule import SCHEDULES, schedule_family
from gpipe_sim.model.layers import build_layers, layer_count
from gpipe_sim.scenario.scenario import Scenario, parse_scenario

FAMILIES = ("transformer", "convnet", "mlp")
REMATS = ("none", "except_last", "always")
BATCHES = (8, 12, 16, 24, 32, 48, 64)
MICRO_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16)
CHUNKS = (1, 2, 3)
# One step's work (forward and backward FLOPs of the whole batch), so that a case stays measurable
# (the runtime's own time not all of it) and runs in about a second or less on one CPU core per stage.
MIN_STEP_FLOPS = 1.0e9
MAX_STEP_FLOPS = 30.0e9
DEVICE_MAPS = {2: [0, 1], 4: [0, 0, 1, 1]}  # K=4 shares the two cores (the hardware says so)


def _model(rng: random.Random, family: str) -> dict[str, Any]:
    """One model of `family`, each size drawn uniformly from its range."""
    if family == "transformer":
        heads = rng.choice((2, 3, 4, 6, 8))
        d_model = heads * rng.choice((16, 24, 32, 48))
        return {"preset": "transformer", "layers": rng.randint(2, 8), "d_model": d_model,
                "d_ff": d_model * rng.choice((2, 3, 4)), "heads": heads, "seq_len": rng.randint(8, 96),
                "vocab": rng.randint(64, 2048)}
    if family == "convnet":
        return {"preset": "convnet", "layers": rng.randint(2, 9), "channels": rng.choice((4, 8, 12, 16, 24, 32)),
                "image_size": rng.choice((8, 12, 16, 24, 32, 48)), "num_classes": rng.choice((10, 100))}
    return {"preset": "mlp", "layers": rng.randint(2, 10), "width": rng.choice((128, 256, 512, 768, 1024, 2048)),
            "input_dim": rng.choice((32, 64, 256, 784, 1024)), "num_classes": rng.choice((10, 100, 1000))}


def step_flops(scenario: Scenario) -> float:
    """Forward and backward FLOPs of one step (the whole batch, without re-computation)."""
    layers = build_layers(scenario.model)
    per_sample = sum((x.forward_flops_per_sample or 0.0) + (x.backward_flops_per_sample or 0.0) for x in layers)
    return per_sample * scenario.pipeline.batch_size


def _pipeline(rng: random.Random, K: int, layers: int, batch: int) -> dict[str, Any] | None:
    """Schedule, chunks per rank, M and remat that the schedule's family accepts for this K and this
    many layers (None when the drawn schedule accepts none of the M and v tried)."""
    schedule = rng.choice(sorted(SCHEDULES))
    family = schedule_family(schedule)
    Ms = [M for M in MICRO_BATCHES if M <= batch]
    rng.shuffle(Ms)
    vs = list(CHUNKS)
    rng.shuffle(vs)
    remat = rng.choice(REMATS)
    for M in Ms:
        for v in vs:
            if K * v <= layers and family.problem(K, M, v) is None:
                return {"stages": K, "chunks": v, "micro_batches": M, "batch_size": batch,
                        "schedule": schedule, "remat": remat, "partition": "time"}
    return None


def draw_case(rng: random.Random, K: int = 2) -> Scenario:
    """One case: a family, its sizes, a batch within the step-FLOPs range, then a schedule (any
    registered family), M, v and remat it accepts; redrawn until all of that holds."""
    while True:
        family = rng.choice(FAMILIES)
        model = _model(rng, family)
        batch = rng.choice(BATCHES)
        base = parse_scenario({"model": model})
        flops = step_flops(base.with_updates({"pipeline.batch_size": batch, "pipeline.micro_batches": 1}))
        if not MIN_STEP_FLOPS <= flops <= MAX_STEP_FLOPS:
            continue
        pipeline = _pipeline(rng, K, layer_count(base.model), batch)
        if pipeline is None:
            continue
        return parse_scenario({
            "model": model,
            "hardware": {"preset": "cpu", "stage_to_device": DEVICE_MAPS[K]},
            "pipeline": pipeline,
            "training": {"optimizer": rng.choice(("sgd", "momentum", "adam"))},
        })


def draw_cases(count: int, seed: int, K: int = 2) -> list[Scenario]:
    """`count` cases drawn from `seed` alone: the same seed gives the same cases on any machine."""
    rng = random.Random(f"gpipe-accuracy:{seed}:{K}")
    return [draw_case(rng, K) for _ in range(count)]


def case_text(sc: Scenario) -> str:
    """A short line naming the case: model and sizes, batch, K, v, M, schedule, remat."""
    m = sc.model
    sizes: Sequence[tuple[str, Any]]
    if m.preset == "transformer":
        sizes = (("L", m.layers), ("d", m.d_model), ("ff", m.d_ff), ("h", m.heads), ("seq", m.seq_len),
                 ("vocab", m.vocab))
    elif m.preset == "convnet":
        sizes = (("L", m.layers), ("ch", m.channels), ("img", m.image_size), ("cls", m.num_classes))
    else:
        sizes = (("L", m.layers), ("w", m.width), ("in", m.input_dim), ("cls", m.num_classes))
    p = sc.pipeline
    v = f" v={p.chunks}" if p.chunks > 1 else ""
    return (f"{m.preset}({' '.join(f'{k}{v_}' for k, v_ in sizes)}) B={p.batch_size} K={p.stages}{v} "
            f"M={p.micro_batches} {p.schedule_name} remat={p.remat}")
