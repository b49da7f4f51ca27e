"""held.undominated against its definition, written out by brute force."""

from __future__ import annotations

import numpy as np
import pytest

from gpipe_sim.plan.held import undominated


def _by_definition(rows: np.ndarray, cap: int | None):
    """The distinct rows no other distinct row is >= everywhere, by total (largest first), equal
    totals in lexicographic order; None when more than `cap`."""
    distinct = sorted({tuple(r) for r in rows.tolist()})
    kept = [r for r in distinct if not any(o != r and all(a >= b for a, b in zip(o, r)) for o in distinct)]
    kept.sort(key=lambda r: -sum(r))  # stable: lexicographic among equal totals
    if cap is not None and len(kept) > cap:
        return None
    return np.array(kept, dtype=float).reshape(len(kept), rows.shape[1])


@pytest.mark.parametrize("seed", range(4))
def test_undominated_levels_are_the_definitions(seed):
    rng = np.random.default_rng(seed)
    for trial in range(60):
        n, width = int(rng.integers(0, 120)), int(rng.integers(1, 8))
        rows = np.vstack([np.zeros((1, width)), np.cumsum(rng.integers(-3, 4, size=(n, width)), axis=0)]).astype(float)
        if trial % 2:
            rows = np.vstack([rows, rows[::3]])  # repeated levels
        cap = (None, 4, 40)[trial % 3]
        got, want = undominated(rows, cap), _by_definition(rows, cap)
        assert (got is None) == (want is None)
        if want is not None:
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("seed", range(3))
def test_undominated_levels_with_columns_always_zero(seed):
    """Columns zero in every row (a schedule that re-computes nothing leaves two of each chunk's
    three at 0) decide nothing: the same rows as the definition, down to one column or none."""
    rng = np.random.default_rng(100 + seed)
    for trial in range(60):
        n, width = int(rng.integers(0, 80)), int(rng.integers(1, 7))
        rows = np.vstack([np.zeros((1, width)), np.cumsum(rng.integers(-3, 4, size=(n, width)), axis=0)]).astype(float)
        live = int(rng.integers(0, width + 1)) if trial % 3 else 1
        rows[:, rng.permutation(width)[live:]] = 0.0
        cap = (None, 2, 40)[trial % 3]
        got, want = undominated(rows, cap), _by_definition(rows, cap)
        assert (got is None) == (want is None)
        if want is not None:
            np.testing.assert_array_equal(got, want)
