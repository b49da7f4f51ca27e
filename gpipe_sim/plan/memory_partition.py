"""The memory-aware partition methods: `memory` (smallest device peak) and `fit` (fastest that fits)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from gpipe_sim.errors import ScenarioError
from gpipe_sim.mesh import Mesh
from gpipe_sim.plan.balance import balance_by_count, balance_by_weight, check_stages
from gpipe_sim.plan.held import MemoryTable
from gpipe_sim.schema.units import format_bytes


class _RangeMax:
    """The largest of values[a:b] for many segments at once (a sparse table: O(1) per query)."""

    def __init__(self, values: Sequence[float], n: int) -> None:
        level = np.zeros(n) if len(values) == 0 else np.asarray(values, dtype=float)
        self.any = bool(np.any(level > 0))
        self.levels = [level]
        width = 1
        while self.any and 2 * width <= n:
            level = np.maximum(level[:-width], level[width:])
            self.levels.append(level)
            width *= 2

    def __call__(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        if not self.any:
            return np.zeros(np.broadcast(a, b).shape)
        k = np.floor(np.log2(np.maximum(b - a, 1))).astype(np.int64)
        out = np.zeros(np.broadcast(a, b).shape)
        for level in np.unique(k):
            at = k == level
            table = self.levels[int(level)]
            out[at] = np.maximum(table[a[at]], table[b[at] - (1 << int(level))])
        return np.where(b > a, out, 0.0)


class _Layout:
    """Prefix sums and per-rank evaluators over a partition given by its boundaries."""

    def __init__(self, time_weights: Sequence[float], memory: MemoryTable) -> None:
        self.L = len(time_weights)
        self.T = _prefix(time_weights)
        self.S = _prefix(memory.static_bytes)
        self.P = _prefix(memory.activation_bytes)
        self.inp = np.asarray(memory.input_bytes, dtype=float)
        self.transient = _RangeMax(memory.transient_bytes, self.L)
        self.U = _prefix(memory.update_bytes if len(memory.update_bytes) else np.zeros(self.L))
        self.update_largest = _RangeMax(memory.update_largest_bytes, self.L)
        h = memory.held
        self.placement = np.asarray(h.placement, dtype=np.int64)
        self.C = len(h.placement)
        self.rank_chunks = h.rank_chunks
        self.events = h.events
        self.rows = h.rows
        self.rank_rows = h.rank_rows
        self._cache: dict[tuple[int, ...], tuple[float, float]] = {}
        ranks = len(h.rank_chunks)
        # device_map: per global rank g = d*K + r (replica d of pipeline rank r, which holds rank r's chunks)
        self.device_map = np.asarray(memory.device_map, dtype=np.int64)
        _, self.device = np.unique(self.device_map, return_inverse=True)
        self.num_devices = int(self.device.max()) + 1 if len(self.device) else 0
        K = max(ranks, 1)
        self.rank_of = Mesh(len(self.device_map) // K, K).pipeline_rank(np.arange(len(self.device_map)))  # per g
        per_device = np.bincount(self.device, weights=np.array([len(m) for m in h.rank_chunks])[self.rank_of],
                                 minlength=self.num_devices)
        # per rank: the most chunks any device holding a copy of it holds (1: it is alone)
        self.rank_load = np.ones(ranks)
        np.maximum.at(self.rank_load, self.rank_of, per_device[self.device])
        self.capacity = float(memory.capacity_bytes)
        # exact per chunk when every device holds one chunk; otherwise ranks are summed per device
        self.one_chunk_per_device = bool(np.all(per_device == 1)) and all(len(m) == 1 for m in h.rank_chunks)

    # ---- one chunk alone, vectorised over candidate segments [a, b)
    def chunk_memory(self, j: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Chunk j's own peak bytes were it layers [a, b) (per segment): static bytes plus the larger
        of its held activations' peak plus its largest transient and its update's temporaries."""
        A = self.P[b] - self.P[a]
        inp = self.inp[a]
        feats = np.stack([A, inp, np.maximum(A - inp, 0.0)])  # [3, n]
        held = (self.rows[j] @ feats).max(axis=0) + self.transient(a, b)
        return self.S[b] - self.S[a] + np.maximum(held, self.update(a, b))

    def update(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The optimizer update's temporaries of segments [a, b) alone (MemoryTable)."""
        return self.U[b] - self.U[a] + self.update_largest(a, b)

    def chunk_time(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The time weights of layers [a, b) (per segment)."""
        return self.T[b] - self.T[a]

    # ---- exact figures for a whole partition
    def rank_figures(self, r: int, bounds: np.ndarray) -> tuple[float, float]:
        """(rank r's static bytes plus the larger of its activation peak plus its largest transient
        and its update's temporaries, its time), remembered per its chunks' bounds."""
        chunks = self.rank_chunks[r]
        key = (r, *(int(bounds[c]) for c in chunks), *(int(bounds[c + 1]) for c in chunks))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        first, last = bounds[list(chunks)], bounds[[c + 1 for c in chunks]]
        A = self.P[last] - self.P[first]
        inp = self.inp[np.minimum(first, self.L - 1)]
        feat = np.stack([A, inp, np.maximum(A - inp, 0.0)], axis=1).ravel()
        static = float(np.sum(self.S[last] - self.S[first]))
        rows = self.rank_rows[r]
        if rows is not None:
            peak = float((rows @ feat).max(initial=0.0))
        else:
            col, val = self.events[r]
            peak = float(np.cumsum(val * feat[col]).max(initial=0.0))
        transient = float(self.transient(first, last).max(initial=0.0))
        update = float(np.sum(self.U[last] - self.U[first]) + self.update_largest(first, last).max(initial=0.0))
        memory = static + max(max(peak, 0.0) + transient, update)
        hit = (memory, float(np.sum(self.T[last] - self.T[first])))
        if len(self._cache) > 200_000:
            self._cache.clear()
        self._cache[key] = hit
        return hit

    def figures(self, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(peak bytes per device: its ranks' static bytes plus activation peaks, summed when a
        device runs several ranks; time per rank: its chunks' time weights)."""
        mem, time = np.array([self.rank_figures(r, bounds) for r in range(len(self.rank_chunks))]).reshape(-1, 2).T
        return self.per_device(mem), time

    def per_device(self, rank_memory: np.ndarray) -> np.ndarray:
        """Bytes per device: the sum over the global ranks it runs of their ranks' bytes."""
        return np.bincount(self.device, weights=rank_memory[self.rank_of], minlength=self.num_devices)


def _prefix(values: Sequence[float]) -> np.ndarray:
    """Prefix sums (a leading 0) of per-layer values; a ScenarioError unless finite and non-negative."""
    w = np.asarray(values, dtype=float)
    if np.any(w < 0) or not np.all(np.isfinite(w)):
        raise ScenarioError("pipeline.partition: layer weights must be finite and non-negative")
    return np.concatenate(([0.0], np.cumsum(w)))


def _bounds(counts: Sequence[int]) -> np.ndarray:
    """Chunk boundaries (0, ..., the layer count) of layer counts per chunk."""
    return np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


_FAST_WORK = 4_000_000  # chunks x boundaries per feasibility test when chunk costs are monotone
_FULL_WORK = 4_000_000  # chunks x boundaries^2 per feasibility test for any chunk costs


def _reach(lay: _Layout, chunk_ok: Any, keep: bool = False, full: bool = False) -> np.ndarray | None:
    """Boundaries of a contiguous partition whose every chunk passes `chunk_ok(j, a, b)`, or None.

    The boundaries that can end chunk j are propagated chunk by chunk: b ends chunk j when some
    boundary a < b that can end chunk j - 1 starts it. With `full`, every such a is tried (exact
    for any costs); otherwise only the largest, which is exact when a chunk's costs never fall as
    it gains layers (the smallest segment ending at b is then the cheapest) and sound for any.
    """
    L, C = lay.L, lay.C
    idx = np.arange(L + 1)
    reach = np.zeros(L + 1, dtype=bool)
    reach[0] = True
    starts = []
    for j in range(C):
        lo, hi = j + 1, L - (C - 1 - j)
        b = idx[lo : hi + 1]
        if full:
            a_all = np.flatnonzero(reach)
            A, B = np.meshgrid(a_all, b, indexing="ij")
            ok = A < B
            ok[ok] = chunk_ok(j, A[ok], B[ok])
            good = ok.any(axis=0)
            a = np.where(good, a_all[ok.argmax(axis=0)], -1)
        else:
            a = np.maximum.accumulate(np.where(reach, idx, -1))[lo - 1 : hi]  # largest reachable below b
            good = a >= 0
            if good.any():
                good[good] = chunk_ok(j, a[good], b[good])
        reach = np.zeros(L + 1, dtype=bool)
        reach[b[good]] = True
        if keep:
            starts.append(np.where(good, a, -1))
        if not reach.any():
            return None
    if not reach[L]:
        return None
    if not keep:
        return np.zeros(0, dtype=np.int64)
    bounds = np.zeros(C + 1, dtype=np.int64)
    bounds[C] = L
    for j in range(C - 1, -1, -1):
        bounds[j] = starts[j][bounds[j + 1] - (j + 1)]
    return bounds


def _with_slack(cap: float) -> float:
    """`cap` raised by a relative 1e-12 (and the smallest float): a cap a rounding error cannot miss."""
    return cap * (1 + 1e-12) + 1e-300


def _monotone(lay: _Layout) -> bool:
    """A chunk's peak never falls as it gains a layer: true when no chunk holds only its input
    (no re-materialization) or when every chunk after the first starts from inputs of one size."""
    return all(not np.any(rows[:, 1:]) for rows in lay.rows) or lay.L < 2 or np.ptp(lay.inp[1:]) == 0


def _exact_mode(lay: _Layout) -> bool | None:
    """How the exact search runs (False: fast, True: full), or None where it does not apply: a
    device that holds several chunks couples them, and huge tables would take too long."""
    if not lay.one_chunk_per_device:
        return None
    width = lay.L - lay.C + 1
    if _monotone(lay) and lay.C * width <= _FAST_WORK:
        return False
    return True if lay.C * width * width <= _FULL_WORK else None


def _minimise(lay: _Layout, ok_for: Any, score: Any, hi: float, full: bool) -> np.ndarray | None:
    """The partition at the smallest cap that `ok_for(cap)` (a test on each chunk's score) accepts.

    Bisection over the cap, each success lowering it to the largest chunk score actually reached;
    once the bracket is within a relative 1e-6, the cap just under that score (a relative 1e-12)
    is tried: its failure proves the partition optimal to that precision. `score(j, a, b)` is what
    `ok_for` compares, so a partition found at one cap has its largest score within that cap.
    """
    def attempt(cap: float) -> np.ndarray | None:
        return _reach(lay, ok_for(cap), keep=True, full=full)

    def reached(bounds: np.ndarray) -> float:
        return max(float(score(j, bounds[j:j + 1], bounds[j + 1:j + 2])[0]) for j in range(lay.C))

    hi = _with_slack(hi)
    best = attempt(hi)
    for _ in range(8):  # a starting cap that happens to be too small
        if best is not None or not math.isfinite(hi * 2):
            break
        hi *= 2
        best = attempt(hi)
    if best is None:
        return None
    lo, hi = 0.0, reached(best)
    for _ in range(300):
        if hi <= 0:
            break
        if hi - lo <= 1e-6 * hi:
            probe = hi * (1 - 1e-12)
            if probe <= lo:
                break
            found = attempt(probe)
            if found is None:
                break
            best, hi = found, min(reached(found), probe)
            continue
        mid = lo + (hi - lo) / 2
        found = attempt(mid)
        if found is None:
            lo = mid
        else:
            best, hi = found, min(reached(found), mid)
    return best


def _fit_chunks(lay: _Layout, capacity: float, full: bool, time_share: Any = 1.0,
                memory_share: Any = 1.0) -> np.ndarray | None:
    """The partition whose slowest chunk (time / its share) is fastest among those whose every
    chunk's own peak fits its share of `capacity`; None when none fits."""
    t_share = np.broadcast_to(np.asarray(time_share, dtype=float), (lay.C,))
    m_share = np.broadcast_to(np.asarray(memory_share, dtype=float), (lay.C,))

    def score(j: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return lay.chunk_time(a, b) / t_share[j]

    def ok_for(cap_t: float) -> Any:
        return lambda j, a, b: (score(j, a, b) <= cap_t) & (lay.chunk_memory(j, a, b) / m_share[j] <= capacity)

    return _minimise(lay, ok_for, score, float(lay.T[-1]) / max(float(t_share.min()), 1e-300), full)


def _memory_chunks(lay: _Layout, full: bool, share: Any = 1.0) -> np.ndarray | None:
    """The partition whose largest chunk peak (own peak / its share) is smallest."""
    sh = np.broadcast_to(np.asarray(share, dtype=float), (lay.C,))

    def score(j: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return lay.chunk_memory(j, a, b) / sh[j]

    def ok_for(cap: float) -> Any:
        return lambda j, a, b: score(j, a, b) <= cap

    whole = max(float(score(j, np.array([0]), np.array([lay.L]))[0]) for j in range(lay.C))
    return _minimise(lay, ok_for, score, whole, full)


_TOP = 3  # the largest entries a search key compares (a plateau of equal maxima can still be left)


def _leximax_key(values: np.ndarray) -> np.ndarray:
    """The largest `_TOP` values, largest first."""
    return -np.sort(-values)[:_TOP]


def _less(x: Sequence[np.ndarray], y: Sequence[np.ndarray]) -> bool:
    """Lexicographic `x < y` over the parts, each compared entry by entry with a relative tolerance."""
    for u, v in zip(x, y):
        scale = max(float(np.max(np.abs(u), initial=0.0)), float(np.max(np.abs(v), initial=0.0)), 1e-300)
        diff = np.flatnonzero(np.abs(u - v) > 1e-12 * scale)
        if len(diff):
            return bool(u[diff[0]] < v[diff[0]])
    return False


class _Ordered:
    """A search key's parts, ordered by `_less`."""

    def __init__(self, parts: list[np.ndarray]) -> None:
        self.parts = parts

    def __lt__(self, other: "_Ordered") -> bool:
        return _less(self.parts, other.parts)


def _memory_key(mem: np.ndarray, time: np.ndarray) -> list[np.ndarray]:
    """Largest device peaks first (the largest, then the next...), then the slowest ranks."""
    return [_leximax_key(mem), _leximax_key(time)]


def _fit_key(capacity: float) -> Any:
    """Bytes over capacity first, then the slowest rank, then the device peaks and rank times."""
    def key(mem: np.ndarray, time: np.ndarray) -> list[np.ndarray]:
        over = np.array([max(float(mem.max(initial=0.0)) - capacity, 0.0)])
        return [over, np.array([time.max(initial=0.0)]), _leximax_key(mem), _leximax_key(time)]
    return key


_SEARCH_BUDGET = 2500  # partitions one local search evaluates
_SCAN = 64  # a boundary with at most this many places to go tries them all (else steps of 1, 2, 4...)


def _local_search(lay: _Layout, bounds: np.ndarray, key: Any) -> np.ndarray:
    """Improve `key(device peaks, rank times)` by moves while one helps: a boundary to its best
    place, or a run of consecutive boundaries shifted one layer together (a layer handed from one
    chunk to a later or earlier one, the chunks between shifting along)."""
    bounds = bounds.copy()
    ranks = len(lay.rank_chunks)
    mem, time = (np.array(x) for x in zip(*(lay.rank_figures(r, bounds) for r in range(ranks))))
    budget = [_SEARCH_BUDGET]

    def per_device(m: np.ndarray) -> np.ndarray:
        return lay.per_device(m)

    def score(trial: np.ndarray, first: int, last: int) -> tuple[_Ordered, np.ndarray, np.ndarray]:
        """The key with boundaries first..last moved (chunks first-1 .. last change)."""
        m2, t2 = mem.copy(), time.copy()
        for r in {int(x) for x in lay.placement[first - 1 : last + 1]}:
            m2[r], t2[r] = lay.rank_figures(r, trial)
        budget[0] -= 1
        return _Ordered(key(per_device(m2), t2)), m2, t2

    best = _Ordered(key(per_device(mem), time))
    improved = True
    while improved and budget[0] > 0:
        improved = False
        for i in range(1, lay.C):  # one boundary to its best place
            lo, hi = int(bounds[i - 1]) + 1, int(bounds[i + 1]) - 1
            here = int(bounds[i])
            if hi - lo <= _SCAN:
                places = [x for x in range(lo, hi + 1) if x != here]
            else:
                steps = [1 << e for e in range(int(math.log2(hi - lo)) + 1)]
                places = sorted({here + d * s for s in steps for d in (1, -1) if lo <= here + d * s <= hi})
            choice = None
            for x in places:
                if budget[0] <= 0:
                    break
                trial = bounds.copy()
                trial[i] = x
                k, m2, t2 = score(trial, i, i)
                if k < best:
                    best, choice = k, (trial, m2, t2)
            if choice is not None:
                bounds, mem, time = choice
                improved = True
        worst = _critical(lay, mem, time, key)
        for i in range(1, lay.C):  # runs of boundaries i..j shifted together, to or from a critical chunk
            for j in range(i + 1, lay.C):
                if not (worst[i - 1] or worst[j]):
                    continue
                for d in (1, -1):
                    if budget[0] <= 0:
                        break
                    trial = bounds.copy()
                    trial[i : j + 1] += d
                    if trial[i] <= trial[i - 1] or trial[j] >= trial[j + 1]:
                        continue
                    k, m2, t2 = score(trial, i, j)
                    if k < best:
                        best, bounds, mem, time, improved = k, trial, m2, t2, True
    return bounds


def _critical(lay: _Layout, mem: np.ndarray, time: np.ndarray, key: Any) -> np.ndarray:
    """Per chunk: on the device with the largest peak or the slowest rank (where moves matter most)."""
    worst = np.unique(lay.rank_of[lay.device == int(np.argmax(lay.per_device(mem)))])
    return np.isin(lay.placement, worst) | (lay.placement == int(np.argmax(time)))


def _best(lay: _Layout, seeds: list[np.ndarray | None], key: Any, polish: str = "all") -> np.ndarray:
    """The best of `seeds` under `key`, each first improved by `_local_search` unless `polish` is "none"."""
    found = [s for s in seeds if s is not None]
    if polish == "all":
        found = [_local_search(lay, s, key) for s in found]
    return min(found, key=lambda s: _Ordered(key(*lay.figures(s))))


def _simple_seeds(lay: _Layout) -> list[np.ndarray | None]:
    """Starting points: the bounds of the `time` and the `uniform` partitions."""
    return [_bounds(balance_by_weight(np.diff(lay.T), lay.C)), _bounds(balance_by_count(lay.L, lay.C))]


_RANDOM_STARTS = 3  # extra starting points (a fixed seed: the same answer every time) on small tables


def _random_seeds(lay: _Layout) -> list[np.ndarray | None]:
    """`_RANDOM_STARTS` random bounds (seeded: the same every call) for 3+ chunks on small tables; else none."""
    if lay.C < 3 or lay.C * lay.L > 1024:
        return []
    rng = np.random.default_rng(0)
    return [np.concatenate(([0], np.sort(rng.choice(np.arange(1, lay.L), lay.C - 1, replace=False)), [lay.L]))
            for _ in range(_RANDOM_STARTS)]


def _chunk_seed(lay: _Layout, capacity: float | None) -> list[np.ndarray | None]:
    """Where a device holds several chunks: each chunk solved alone with an equal share of its
    device's bytes and of its rank's time (the sum of its chunks' own peaks bounds a device's)."""
    if lay.C * (lay.L - lay.C + 1) > _FAST_WORK:
        return []
    mem_share = 1.0 / lay.rank_load[lay.placement]
    if capacity is None:
        return [_memory_chunks(lay, False, mem_share)]
    time_share = 1.0 / np.bincount(lay.placement)[lay.placement]
    return [_fit_chunks(lay, capacity, False, time_share, mem_share)]


def balance_by_memory(time_weights: Sequence[float], memory: MemoryTable) -> list[int]:
    """Layer counts per chunk that minimise the largest device peak as the schedule holds it
    (static bytes plus the activations its programs hold at their peak), the fastest such.

    Exact (to a relative 1e-12, by bisection over the peak) when every device holds one chunk;
    where a device holds several (v > 1, or ranks sharing a device) the best of several starting
    points, each improved by moving single boundaries while the largest peak falls.
    """
    lay = _Layout(time_weights, memory)
    check_stages(lay.L, lay.C)
    mode = _exact_mode(lay)
    if mode is not None:
        least = _memory_chunks(lay, mode)
        exact = None if least is None else _fit_chunks(lay, _with_slack(float(lay.figures(least)[0].max())), mode)
        return np.diff(_best(lay, [exact, least, *_simple_seeds(lay)], _memory_key, polish="none")).tolist()
    return np.diff(_best(lay, [*_simple_seeds(lay), *_chunk_seed(lay, None), *_random_seeds(lay)], _memory_key)).tolist()


def fastest_fitting(time_weights: Sequence[float], memory: MemoryTable) -> list[int]:
    """Layer counts per chunk of the fastest partition (the slowest rank's time weights smallest)
    among those whose every device fits `memory.capacity_bytes`; a one-line error when none does.

    Exact (to a relative 1e-12) when every device holds one chunk; otherwise the best found from
    several starting points (see `balance_by_memory`).
    """
    lay = _Layout(time_weights, memory)
    check_stages(lay.L, lay.C)
    cap = lay.capacity
    mode = _exact_mode(lay)
    key = _fit_key(cap)
    if mode is not None:
        found = _fit_chunks(lay, cap, mode)
        best = _best(lay, [found, *_simple_seeds(lay)], key, polish="none")
    else:
        best = _best(lay, [*_simple_seeds(lay), *_chunk_seed(lay, cap), *_chunk_seed(lay, None), *_random_seeds(lay)], key)
    mem, _ = lay.figures(best)
    if mem.max(initial=0.0) <= cap:
        return np.diff(best).tolist()
    least = _bounds(balance_by_memory(time_weights, memory))
    mem, _ = lay.figures(least)
    device = int(np.argmax(mem))
    need = float(mem[device])
    over = need - cap
    raise ScenarioError(
        f"pipeline.partition: fit: no partition of the {lay.L} layers into {lay.C} chunks fits "
        f"{format_bytes(cap)} per device; the one with the smallest peak (partition: memory) needs "
        f"{format_bytes(need)} on device {int(np.unique(memory.device_map)[device])}, "
        f"{format_bytes(over)}{f' ({over / cap:.0%})' if cap > 0 else ''} over; try more ranks, "
        "smaller micro-batches or re-materialization"
    )
