"""The user documentation the tests hold to what the code does: the README and the guide's pages."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUT_MARKER = re.compile(r"(?ms)^<!-- output(?P<excerpt>-excerpt)?: (?P<command>.+?) -->\n(?P<body>.*?)^<!-- end output -->")
PROGRAMS = ("gpipe-sim", "gpipe-exec")


def user_docs() -> list[Path]:
    """README.md, the guide's home page and every page under docs/guide/ (measurement logs are
    dated records of their commit, not promises about today's code, and are left out)."""
    return [ROOT / "README.md", ROOT / "docs" / "index.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]


@dataclass(frozen=True)
class QuotedOutput:
    """A command's output as a page quotes it, between `<!-- output: COMMAND -->` (all of it) or
    `<!-- output-excerpt: COMMAND -->` (these lines, in this order) and `<!-- end output -->`."""

    page: str
    command: str
    lines: tuple[str, ...]
    excerpt: bool


def quoted_outputs(page: Path) -> list[QuotedOutput]:
    """The quoted outputs of one page: a code fence around the body and a first `$ COMMAND` line
    (which must repeat the marker's command) are not part of the output; markers shown inside a
    four-backtick fence are examples, not quotes."""
    found = []
    text = re.sub(r"(?ms)^````.*?^````", "", page.read_text(encoding="utf-8"))  # examples of markers
    for match in OUTPUT_MARKER.finditer(text):
        lines = [line.rstrip() for line in match["body"].strip("\n").split("\n")]
        if lines and lines[0].startswith("```"):
            lines = lines[1:-1] if lines[-1] == "```" else lines[1:]
        if lines and lines[0].startswith("$ "):
            if lines[0][2:].strip() != match["command"].strip():
                raise AssertionError(f"{page.name}: the block's `{lines[0]}` is not its marker's command")
            lines = lines[1:]
        found.append(QuotedOutput(page.relative_to(ROOT).as_posix(), match["command"].strip(), tuple(lines),
                                  bool(match["excerpt"])))
    return found


def fenced_commands(text: str) -> list[str]:
    """Every command line of the page's bash/shell code fences: continuation lines joined, `# ...`
    comments and a `$ ` prompt removed, `A && B` split into A and B, redirections (`> FILE`)
    dropped and a pipe's later programs left out."""
    commands = []
    for block in re.findall(r"(?ms)^```(?:bash|sh|shell|console)\n(.*?)^```", text):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.strip().removeprefix("$ ")
            if not line or line.startswith("#"):
                continue
            words = shlex.split(line, comments=True)
            command: list[str] = []
            redirected = False
            for word in words + ["&&"]:
                if word in ("&&", ";", "|"):
                    if command:
                        commands.append(shlex.join(command))
                    command, redirected = [], word == "|"
                elif word in (">", ">>", "2>", "<") or redirected:
                    redirected = True  # a redirection, then (after a pipe) another program: not ours
                else:
                    command.append(word)
    return commands


def program_argv(command: str) -> tuple[str, list[str]] | None:
    """(program, argv) of a gpipe-sim or gpipe-exec command, however its path is written
    (`.venv/bin/gpipe-sim`); optional parts written `[--flag value]` are taken as given; None for
    any other command."""
    words = shlex.split(re.sub(r"\[(-[^\]]*)\]", r"\1", command))
    if not words or Path(words[0]).name not in PROGRAMS:
        return None
    return Path(words[0]).name, words[1:]
