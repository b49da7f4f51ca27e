"""Reading YAML and JSON files with one-line errors that name the file and the line.

Before any parsing: the file's size is capped (a device like /dev/zero is refused after reading
`MAX_FILE_BYTES`), it must be UTF-8 text, and a YAML file's nesting depth and alias expansion are
measured on the parser's event stream (so an alias bomb or a 100,000-deep list is refused without
being built). After parsing, the data's shape is checked again (`limits.data_shape`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from gpipe_sim.errors import GpipeError, ScenarioError, first_line
from gpipe_sim.schema import limits

YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's safe loader where built (10x the Python one)
_OPEN = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSE = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


def shown_path(path: str | Path) -> str:
    """A file name for a message: quoted, on one line, not too long."""
    text = str(path)
    if len(text) > 200:
        text = "..." + text[-197:]
    return repr(text)


def read_text_file(path: str | Path, error: type[GpipeError], limit: int, *, what: str = "",
                   prefix: str = "") -> str:
    """The UTF-8 text of `path`, read at most `limit` bytes; `error` with one line naming the file
    (`prefix` + `what` + its shown path) if it cannot be read, is larger or is not UTF-8 text."""
    name = shown_path(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(limit + 1)
    except OSError as exc:
        raise error(f"{prefix}cannot read {what}{name}: {exc.strerror or type(exc).__name__}") from None
    except ValueError as exc:  # a NUL in the name
        raise error(f"{prefix}cannot read {what}{name}: {exc}") from None
    if len(raw) > limit:
        raise error(f"{prefix}{what}{name} is larger than the limit of {limit // 2**20} MiB")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise error(f"{prefix}{what}{name} is not UTF-8 text: byte 0x{raw[exc.start]:02x} at line {line}") from None


def read_data_file(path: str | Path, what: str, error: type[GpipeError] = ScenarioError) -> Any:
    """Parse `path` (JSON if it ends in .json, else YAML); raise `error` with one line on failure.

    `what` names the file's role in the message ("scenario", "sweep", "layer table").
    """
    path = Path(path)
    name = shown_path(path)
    text = read_text_file(path, error, limits.MAX_FILE_BYTES, what=f"{what} ")
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            _check_yaml_shape(text)
            data = yaml.load(text, Loader=YAML_LOADER)
    except _ShapeError as exc:
        raise error(f"{what} {name}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise error(f"malformed JSON in {name} at line {exc.lineno}: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        lines = str(exc).strip().splitlines()
        problem = getattr(exc, "problem", None) or (lines[0] if lines else "invalid YAML")
        if "nesting depth" in problem:  # libyaml >= 0.2.6 stops deep flow collections itself
            raise error(f"{what} {name}: {_too_deep()}") from None
        raise error(f"malformed {_kind(path)} in {name}{where}: {_one_line(problem)}") from None
    except RecursionError:
        raise error(
            f"{what} {name}: nested more than {limits.MAX_DEPTH} levels deep (the limit)"
        ) from None
    except (ValueError, OverflowError) as exc:  # an integer over Python's digit limit, say
        digits = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 4300
        if "digits" in str(exc):
            message = f"a number with more than {digits} digits"
        else:
            message = _one_line(first_line(exc))
        raise error(f"malformed {_kind(path)} in {name}: {message}") from None
    except (IndexError, KeyError, TypeError, AttributeError) as exc:  # PyYAML's own slips, e.g. `!!float ""`
        raise error(f"malformed {_kind(path)} in {name}: a value its tag cannot hold ({type(exc).__name__})") from None
    problem = limits.data_shape(data)
    if problem:
        raise error(f"{what} {name}: {problem}")
    return data


def _kind(path: Path) -> str:
    return "JSON" if path.suffix.lower() == ".json" else "YAML"


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= 300 else text[:297] + "..."


class _ShapeError(Exception):
    pass


def _check_yaml_shape(text: str) -> None:
    """Walk the YAML event stream (no objects built): refuse nesting deeper than MAX_DEPTH and
    more than MAX_NODES values once aliases are expanded (billion laughs)."""
    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (expanded values, height)
    stack: list[list[Any]] = []  # per open collection: [anchor, values, height]
    total = 0

    def add(size: int, height: int) -> None:
        nonlocal total
        if stack:
            frame = stack[-1]
            frame[1] += size
            frame[2] = max(frame[2], height + 1)
            if frame[1] > limits.MAX_NODES:
                raise _ShapeError(_too_many())
            if len(stack) + height > limits.MAX_DEPTH:
                raise _ShapeError(_too_deep())
        else:
            total += size
            if total > limits.MAX_NODES:
                raise _ShapeError(_too_many())

    for event in yaml.parse(text, Loader=YAML_LOADER):
        if isinstance(event, _OPEN):
            stack.append([event.anchor, 1, 1])  # height: container levels, itself included
            if len(stack) > limits.MAX_DEPTH:
                raise _ShapeError(_too_deep())
        elif isinstance(event, _CLOSE):
            anchor, size, height = stack.pop()
            if anchor is not None:
                anchors[anchor] = (size, height)
            add(size, height)
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor is not None:
                anchors[event.anchor] = (1, 0)
            add(1, 0)
        elif isinstance(event, yaml.AliasEvent):
            size, height = anchors.get(event.anchor, (1, 0))
            add(size, height)


def _too_deep() -> str:
    return f"nested more than {limits.MAX_DEPTH} levels deep (the limit)"


def _too_many() -> str:
    return f"more than {limits.MAX_NODES:,} values once YAML aliases are expanded (the limit)"
