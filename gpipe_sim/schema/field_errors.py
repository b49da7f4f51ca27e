"""Pydantic's validation errors in the user's words: one line led by the field of the file they wrote."""

from __future__ import annotations

import difflib
import re
import typing
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


def _models_in(annotation: Any) -> list[type]:
    """The pydantic model classes an annotation holds (through Annotated, unions and containers)."""
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return [annotation]
    found: list[type] = []
    for arg in typing.get_args(annotation):
        found.extend(_models_in(arg))
    return found


def _preset_tag(cls: type) -> Any:
    field = cls.model_fields.get("preset")  # type: ignore[attr-defined]
    return None if field is None else field.default


def valid_keys(model: type | None, loc: Sequence[Any]) -> list[str]:
    """The field names valid at `loc[:-1]` (pydantic's location of an unknown key) in `model`:
    nested models followed by field name, a union's member picked by its preset tag where the
    location names one, pydantic's internal segments and list indices skipped."""
    if model is None:
        return []
    current = [model]
    for part in list(loc)[:-1]:
        fields = [cls for cls in current if part in cls.model_fields]  # type: ignore[attr-defined]
        if fields:
            current = [m for cls in fields for m in _models_in(cls.model_fields[part].annotation)]  # type: ignore[attr-defined]
        else:
            tagged = [cls for cls in current if _preset_tag(cls) == part]
            current = tagged or current  # a discriminated union's tag, or an internal segment
        if not current:
            return []
    names: list[str] = []
    for cls in current:
        names.extend(name for name in cls.model_fields if name not in names)  # type: ignore[attr-defined]
    return names


def closest_key(key: Any, choices: Sequence[str]) -> str | None:
    """The closest of `choices` to a misspelled `key` (difflib, case aside), or None."""
    if not isinstance(key, str) or not choices:
        return None
    close = difflib.get_close_matches(key, list(choices), n=1, cutoff=0.6)
    if close:
        return close[0]
    lowered = difflib.get_close_matches(key.lower(), [c.lower() for c in choices], n=1, cutoff=0.6)
    return next((c for c in choices if lowered and c.lower() == lowered[0]), None)


def did_you_mean(key: Any, choices: Sequence[str]) -> str:
    """" (did you mean NAME?)" for the closest of `choices` to a misspelled `key`, else ""."""
    close = closest_key(key, choices)
    return f" (did you mean {close}?)" if close else ""


def describe_error(error: dict[str, Any], root: str, *, unknown_key: str = "unknown key",
                   names_field: re.Pattern[str] = _NAMES_FIELD, model: type | None = None) -> str:
    """One pydantic error (`ValidationError.errors()` entry) as one line: "FIELD: what is wrong",
    FIELD the user's path to it (`root` for the whole document). A validator's message that
    already names its field (`names_field`) is shown as it is; an unknown key says
    `unknown_key`, with the closest valid key at that place in `model` (a pydantic model class,
    when given): "pipeline.micro_batchs: unknown key (did you mean micro_batches?)"; a required one
    that is absent says so."""
    raw = list(error.get("loc", ()))
    kind = str(error.get("type", ""))
    where = error_location(raw, kind) or root
    msg = str(error.get("msg", "invalid"))
    if kind == "extra_forbidden":
        hint = did_you_mean(raw[-1], valid_keys(model, raw)) if raw else ""
        return f"{where}: {unknown_key}{hint}"
    if raw and raw[-1] == "[key]":
        return f"{where}: unknown key ({clean_message(msg).replace('Input should be', 'should be', 1)})"
    if kind == "missing":
        return f"{where}: required field is missing"
    msg = clean_message(msg)
    if names_field.match(msg):
        return msg
    return f"{where}: {msg}"
