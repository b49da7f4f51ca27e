"""`distinct_sorted` is `np.unique` (values only) on the arrays the start-up path gives it, and
`gpipe-sim simulate` of the default scenario no longer imports numpy.ma."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpipe_sim.plan.distinct import distinct_sorted

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("seed", range(20))
def test_distinct_sorted_is_np_unique(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 40))
    ints = rng.integers(-5, 6, size=n)
    floats = np.round(rng.random(n) * 4, 1)
    for values in (ints, floats, ints.astype(float) * 0.1, np.zeros(n)):
        got = distinct_sorted(values)
        assert got.dtype == values.dtype
        np.testing.assert_array_equal(got, np.unique(values))


def test_simulate_start_up_leaves_numpy_ma_out() -> None:
    code = ("import sys; from gpipe_sim import cli; cli.main(['simulate', 'scenarios/default.yaml']); "
            "sys.stderr.write(str('numpy.ma' in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stderr.strip().endswith("False")
