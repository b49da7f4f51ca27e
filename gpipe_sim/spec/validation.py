"""Pydantic's validation errors in the user's words: one line led by the field of the file they wrote."""

from __future__ import annotations

import re
from typing import Any, Sequence

from gpipe_sim.errors import one_line

_NAMES_FIELD = re.compile(r"^[a-z_]+(\.[a-z_0-9]+)+: ")
# Path segments pydantic adds for its own validators (union members, dict keys, wrappers):
# "literal['uniform','time','memory']", "function-after[...]", "tuple[int, ...]", "[key]", "str".
_INTERNAL_SEGMENT = re.compile(r"[\[\]'\"(),]")
_INTERNAL_NAMES = {"str", "int", "float", "bool", "bytes", "none", "dict", "list", "tuple"}
_USER_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")


def user_key(key: Any) -> str:
    """A key the user wrote, shown as it is when it is a plain name, else quoted (one line, short)."""
    text = str(key) if isinstance(key, (str, int)) and not isinstance(key, bool) else repr(key)
    if _USER_KEY.match(text) or (isinstance(key, int) and not isinstance(key, bool) and abs(key) < 10**20):
        return text
    if len(text) > 40:
        text = text[:37] + "..."
    return repr(text)


def error_location(loc: Sequence[Any], kind: str = "") -> str:
    """Pydantic's error location in the user's words: the scenario path of the field, without
    pydantic's internal segments; a key the user wrote is quoted if it is not a plain name."""
    parts: list[str] = []
    last = len(loc) - 1
    for i, part in enumerate(loc):
        if isinstance(part, int) and not isinstance(part, bool):
            parts.append(str(part))
            continue
        text = str(part)
        user_written = (kind == "extra_forbidden" and i == last) or (i + 1 <= last and loc[i + 1] == "[key]")
        if user_written:
            parts.append(user_key(part))
        elif text == "[key]" or text in _INTERNAL_NAMES or _INTERNAL_SEGMENT.search(text):
            continue
        else:
            parts.append(text)
    return ".".join(parts)


def clean_message(msg: str) -> str:
    """A pydantic message without its "Value error, " prefix, on one line."""
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix) :]
    return one_line(msg)


def describe_error(error: dict[str, Any], root: str, *, unknown_key: str = "unknown key",
                   names_field: re.Pattern[str] = _NAMES_FIELD) -> str:
    """One pydantic error (`ValidationError.errors()` entry) as one line: "FIELD: what is wrong",
    FIELD the user's path to it (`root` for the whole document). A validator's message that
    already names its field (`names_field`) is shown as it is; an unknown key says
    `unknown_key`; a required one that is absent says so."""
    raw = list(error.get("loc", ()))
    kind = str(error.get("type", ""))
    where = error_location(raw, kind) or root
    msg = str(error.get("msg", "invalid"))
    if kind == "extra_forbidden":
        return f"{where}: {unknown_key}"
    if raw and raw[-1] == "[key]":
        return f"{where}: unknown key ({clean_message(msg).replace('Input should be', 'should be', 1)})"
    if kind == "missing":
        return f"{where}: required field is missing"
    msg = clean_message(msg)
    if names_field.match(msg):
        return msg
    return f"{where}: {msg}"
