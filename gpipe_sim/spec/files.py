"""Reading YAML and JSON files with one-line errors that name the file and the line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from gpipe_sim.errors import GpipeError, ScenarioError


def read_data_file(path: str | Path, what: str, error: type[GpipeError] = ScenarioError) -> Any:
    """Parse `path` (JSON if it ends in .json, else YAML); raise `error` with one line on failure.

    `what` names the file's role in the message ("scenario", "sweep", "layer table").
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise error(f"cannot read {what} {str(path)!r}: {exc.strerror}") from None
    try:
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise error(f"malformed JSON in {str(path)!r} at line {exc.lineno}: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        lines = str(exc).strip().splitlines()
        problem = getattr(exc, "problem", None) or (lines[0] if lines else "invalid YAML")
        raise error(f"malformed YAML in {str(path)!r}{where}: {problem}") from None
