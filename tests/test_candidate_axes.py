"""`Candidate.shown` and `Candidate.differs_only_in`, the reports' per-candidate shortcuts, against
the definitions they stand for (`shown_axes()[key]`, `_replace(...) == self`) over a whole space."""

from __future__ import annotations

import itertools

from gpipe_sim.planner.space import AXES, Candidate, PlanOptions, candidate_space
from gpipe_sim.scenario.scenario import parse_scenario

BASE = {"model": {"preset": "transformer", "layers": 8, "d_model": 256, "d_ff": 1024, "heads": 4,
                  "seq_len": 256, "vocab": 1000},
        "hardware": {"preset": "a100-80gb", "devices_per_node": 4},
        "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": 8}}


def _space() -> list[Candidate]:
    return candidate_space(parse_scenario(BASE), PlanOptions(devices=4, micro_batches=(1, 2, 4)))


def test_shown_is_shown_axes_for_every_axis_and_candidate() -> None:
    space = _space()
    assert any(c.stages == 1 for c in space) and any(c.stages > 1 for c in space)
    for c in space:
        axes = c.shown_axes()
        assert [c.shown(key) for key in AXES] == list(axes.values())


def test_differs_only_in_is_replace_equality() -> None:
    space = _space()
    for axis in ("remat", "zero", "M", "partition"):
        field = Candidate._fields[list(AXES).index(axis)]
        hits = 0
        for a, b in itertools.product(space[::13], space):
            expected = b._replace(**{field: getattr(a, field)}) == a
            assert a.differs_only_in(axis, b) == expected
            hits += expected and a != b
        assert hits > 0
