"""A bounded memo: values made once and kept for the next call with the same key, the oldest forgotten first."""

from __future__ import annotations

from typing import Callable, Generic, Hashable, TypeVar

V = TypeVar("V")


class Kept(Generic[V]):
    """Up to `size` values by key (`get`): a value is made on the first call with its key and
    returned as it is after; past `size`, the first kept is the first forgotten. A key that cannot
    be hashed (a field the user wrote as a list) is made each time, never kept. Two threads that
    forget at once forget two values, without an error. Values are never None."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._values: dict[Hashable, V] = {}

    def get(self, key: Hashable, make: Callable[[], V]) -> V:
        """The value kept for `key`, or `make()`'s, kept."""
        try:
            got = self._values.get(key)
        except TypeError:  # an unhashable key: made each time
            return make()
        if got is None:
            got = make()
            while len(self._values) >= self.size:
                try:
                    self._values.pop(next(iter(self._values)), None)
                except (StopIteration, RuntimeError):  # emptied, or changed, by another thread
                    break
            self._values[key] = got
        return got

    def __len__(self) -> int:
        return len(self._values)

    def clear(self) -> None:
        """Forget every value."""
        self._values.clear()
