"""Every repository path the README names in backticks exists (files move; the README must follow)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = ("app", "gpipe_sim", "gpipe_exec", "tests", "scenarios", "docs")  # the repository's own folders


def _expand(path: str) -> list[str]:
    """`a_{x,y}_b` -> a_x_b, a_y_b (shell brace lists, as the README writes families of files)."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def readme_paths(text: str) -> list[str]:
    """The repository paths in the README's inline code: a word under one of TOP, a span broken
    across lines after a "/" joined again; fenced blocks (commands and their output) left out."""
    text = re.sub(r"(?ms)^```.*?^```", "", text)
    found = []
    for span in re.findall(r"`([^`]+)`", text):
        span = re.sub(r"/\s*\n\s*", "/", span)
        for word in span.split():
            word = word.strip("(),;:'\"")
            if word.split("/", 1)[0] in TOP and "/" in word and "://" not in word:
                found.extend(_expand(word))
    return found


def test_readme_paths_exist():
    paths = readme_paths((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(paths) > 20  # the README names many; a regex gone wrong finds none
    missing = [p for p in paths if not (any(ROOT.glob(p)) if "*" in p else (ROOT / p.rstrip("/")).exists())]
    assert not missing, f"README names paths that do not exist: {missing}"


def test_readme_path_finder():
    text = "see `gpipe_sim/schedule/\n  lower.py`, `scenarios/x_{a,b}.yaml`, `results.csv`\n```\napp/nope.py\n```"
    assert readme_paths(text) == ["gpipe_sim/schedule/lower.py", "scenarios/x_a.yaml", "scenarios/x_b.yaml"]


def test_readme_says_to_activate_the_venv():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "source .venv/bin/activate" in text and ".venv/bin/gpipe-sim" in text
