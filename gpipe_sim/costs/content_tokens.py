"""Small ints naming immutable values by content, so that caches keyed on them compare ints, not deep values."""

from __future__ import annotations

import itertools
from typing import Callable, Generic, Hashable, TypeVar

T = TypeVar("T")

_NEXT = itertools.count()  # tokens are never reused, even after a table starts afresh


class ContentTokens(Generic[T]):
    """`tokens(value)`: one int per distinct `content(value)`, found once per object (by identity,
    the object kept while its entry lives, so its id is not reused meanwhile). Values of equal
    content get equal tokens while both are remembered; a token never names another content.
    At most `size` objects are remembered (then forgotten: found again by content) and `size`
    contents (then it starts afresh: later values get new tokens, which only costs the caches
    keyed on them a miss)."""

    def __init__(self, content: Callable[[T], Hashable], size: int = 8192) -> None:
        self._content = content
        self._size = size
        self._by_id: dict[int, tuple[T, int]] = {}
        self._tokens: dict[Hashable, int] = {}

    def __call__(self, value: T) -> int:
        kept = self._by_id.get(id(value))
        if kept is not None and kept[0] is value:
            return kept[1]
        if len(self._tokens) >= self._size:
            self._tokens.clear()
            self._by_id.clear()
        elif len(self._by_id) >= self._size:  # objects forgotten, their contents' tokens kept
            self._by_id.clear()
        content = self._content(value)
        token = self._tokens.get(content)
        if token is None:
            token = self._tokens[content] = next(_NEXT)
        self._by_id[id(value)] = (value, token)
        return token


__all__ = ["ContentTokens"]
