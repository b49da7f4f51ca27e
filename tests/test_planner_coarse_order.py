"""The coarse queue sorted a chunk at a time reads as the whole queue sorted at once: (bound, index)
order, ties in index order, NaN last; what is left unread is every pair not read."""

from __future__ import annotations

import numpy as np
import pytest

from gpipe_sim.planner import coarse_order
from gpipe_sim.planner.coarse_order import CoarseOrder


def _read(order: CoarseOrder, upto: int) -> None:
    while len(order.bounds) < upto:
        order.more()


@pytest.mark.parametrize("first_chunk", [1, 3, 16, 1 << 16])
@pytest.mark.parametrize("seed", range(6))
def test_read_in_chunks_is_the_stable_sort(monkeypatch, first_chunk, seed):
    monkeypatch.setattr(coarse_order, "FIRST_CHUNK", first_chunk)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    bounds = rng.choice([0.5, 1.0, 1.5, 2.0, np.inf, np.nan], n) if seed % 2 else rng.integers(0, 20, n) / 7.0
    indices = np.sort(rng.choice(10 * n, n, replace=False))
    want = np.argsort(bounds, kind="stable")
    order = CoarseOrder(bounds.copy(), indices.copy())
    stop = int(rng.integers(0, n + 1))
    _read(order, stop)
    assert len(order) == n and len(order.bounds) >= stop
    assert order.indices[:stop] == indices[want][:stop].tolist()
    assert np.array_equal(np.array(order.bounds[:stop]), bounds[want][:stop], equal_nan=True)
    rest_bounds, rest_indices = order.rest(stop)
    unread = indices[want][stop:]
    assert sorted(rest_indices.tolist()) == sorted(unread.tolist())
    by_index = dict(zip(indices.tolist(), bounds.tolist()))
    assert all(b == by_index[i] or (b != b and by_index[i] != by_index[i])
               for b, i in zip(rest_bounds.tolist(), rest_indices.tolist()))
    _read(order, n)
    assert order.indices == indices[want].tolist() and len(order.bounds) == n
