"""Every repository path the README and the user guide name in backticks, and every file the README
links to, exists (files move; the docs must follow)."""

from __future__ import annotations

import itertools
import re

import pytest

from user_docs import ROOT, user_docs

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


@pytest.mark.parametrize("page", user_docs(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_readme_paths_exist(page):
    paths = readme_paths(page.read_text(encoding="utf-8"))
    missing = [p for p in paths if not (any(ROOT.glob(p)) if "*" in p else (ROOT / p.rstrip("/")).exists())]
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


def test_the_docs_name_many_paths():
    assert sum(len(readme_paths(p.read_text(encoding="utf-8"))) for p in user_docs()) > 40  # a regex gone wrong finds none


def test_readme_links_exist():
    """The README's relative links (into the guide, its pictures) name files that exist; the guide's
    own links are checked by `mkdocs build --strict` (tests/test_docs_site.py)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t]
    assert len(targets) >= 10
    assert [t for t in targets if t and not (ROOT / t).exists()] == []


def test_readme_path_finder():
    text = "see `gpipe_sim/schedule/\n  lower.py`, `scenarios/x_{a,b}.yaml`, `results.csv`\n```\napp/nope.py\n```"
    assert readme_paths(text) == ["gpipe_sim/schedule/lower.py", "scenarios/x_a.yaml", "scenarios/x_b.yaml"]


def test_readme_says_to_activate_the_venv():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "source .venv/bin/activate" in text and ".venv/bin/gpipe-sim" in text
