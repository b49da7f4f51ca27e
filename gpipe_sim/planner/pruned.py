"""Why each configuration the planner did not simulate was pruned, held as arrays over the space."""

from __future__ import annotations

from typing import Iterator, MutableMapping, Sequence

import numpy as np

Reason = tuple[str, float, float]  # (code: "memory", "bound", "preferred" or "infeasible:..."; figure; threshold)


class Pruned(MutableMapping[int, Reason]):
    """A mapping of configuration index -> (reason code, figure, threshold) over a space of `n`,
    kept as three arrays so that the hundreds of thousands a bound prunes at once are noted in
    one step (`set_many`) and read by code (`where`); iteration is in index order."""

    def __init__(self, n: int) -> None:
        self.code = np.full(n, -1, dtype=np.int32)  # index into `names`; -1: not pruned
        self.figure = np.full(n, np.nan)
        self.limit = np.full(n, np.nan)
        self.names: list[str] = []
        self._ids: dict[str, int] = {}
        self._count = 0

    def code_of(self, name: str) -> int:
        """The code of a reason's name (new names get the next one)."""
        got = self._ids.get(name)
        if got is None:
            got = self._ids[name] = len(self.names)
            self.names.append(name)
        return got

    def __getitem__(self, i: int) -> Reason:
        if i not in self:
            raise KeyError(i)
        code = int(self.code[i])
        return self.names[code], float(self.figure[i]), float(self.limit[i])

    def __setitem__(self, i: int, value: Reason) -> None:
        if not 0 <= i < len(self.code):
            raise KeyError(i)
        name, figure, limit = value
        self._count += self.code[i] < 0
        self.code[i], self.figure[i], self.limit[i] = self.code_of(name), figure, limit

    def __delitem__(self, i: int) -> None:
        if i not in self:
            raise KeyError(i)
        self.code[i] = -1
        self._count -= 1

    def __contains__(self, i: object) -> bool:
        return isinstance(i, (int, np.integer)) and 0 <= i < len(self.code) and self.code[i] >= 0

    def __iter__(self) -> Iterator[int]:
        return iter(np.flatnonzero(self.code >= 0).tolist())

    def __len__(self) -> int:
        return self._count

    def set_many(self, indices: np.ndarray | Sequence[int], name: str, figures: np.ndarray | Sequence[float],
                 limit: float) -> None:
        """Note each of `indices` (distinct) pruned for `name`, its figure from `figures`, against `limit`."""
        indices = np.asarray(indices, dtype=np.int64)
        self._count += int((self.code[indices] < 0).sum())
        self.code[indices] = self.code_of(name)
        self.figure[indices] = figures
        self.limit[indices] = limit

    def where(self, *names: str) -> np.ndarray:
        """The indices pruned for any of `names`, ascending."""
        codes = [self._ids[n] for n in names if n in self._ids]
        return np.flatnonzero(np.isin(self.code, codes)) if codes else np.zeros(0, dtype=np.int64)
