"""The user guide builds as a site (`mkdocs build --strict`: no broken link or anchor, no page left
out), and the measurement logs are dated and tied to commits."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from user_docs import ROOT

MEASUREMENTS = ROOT / "docs" / "measurements"
ENTRY = re.compile(r"^## (?P<date>\d{4}-\d{2}-\d{2}), (?P<commit>[0-9a-f]{7,40}): \S")


def test_mkdocs_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")  # the `docs` extra; with it, a missing Material theme fails the build
    site = tmp_path / "site"
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(site)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    home = (site / "index.html").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs" / "guide").glob("*.md")):  # every guide page, others' too, is in the nav
        assert (site / "guide" / page.stem / "index.html").is_file(), page.name
        assert f'href="guide/{page.stem}/"' in home, f"{page.name} is not in the site's navigation"


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def test_measurement_entries_name_their_date_and_commit():
    """Every entry of a log is headed `## YYYY-MM-DD, COMMIT: what`; where the checkout has the
    history, the commit exists and was authored that day. No entry speaks of work periods."""
    logs = sorted(MEASUREMENTS.glob("*.md"))
    assert {p.name for p in logs} >= {"accuracy.md", "benchmarks.md"}
    history = _git("rev-parse", "--is-shallow-repository").stdout.strip() == "false"
    for log in logs:
        text = log.read_text(encoding="utf-8")
        assert not re.search(r"\bsessions?\b", text, re.IGNORECASE), f"{log.name} speaks of sessions"
        headings = [line for line in text.splitlines() if line.startswith("## ")]
        assert headings, log.name
        for heading in headings:
            entry = ENTRY.match(heading)
            assert entry, f"{log.name}: `{heading}` names no date and commit"
            if history:
                shown = _git("show", "-s", "--format=%as", f"{entry['commit']}^{{commit}}")
                assert shown.returncode == 0, f"{log.name}: no commit {entry['commit']}"
                assert shown.stdout.strip() == entry["date"], f"{log.name}: {entry['commit']} is not of {entry['date']}"


def _log_sections(log: str) -> dict[str, str]:
    """Each heading's anchor (as the site slugs it) -> its text up to the next heading."""
    from markdown.extensions.toc import slugify

    parts = re.split(r"(?m)^(#{2,3} .*)$", log)
    return {slugify(re.sub(r"[`*]", "", head.lstrip("# ")), "-"): body for head, body in zip(parts[1::2], parts[2::2])}


def test_the_accuracy_page_quotes_its_log():
    """Every figure of the accuracy page's summary is in the log entry its row links to."""
    pytest.importorskip("markdown")
    page = (ROOT / "docs" / "guide" / "accuracy.md").read_text(encoding="utf-8")
    sections = _log_sections((MEASUREMENTS / "accuracy.md").read_text(encoding="utf-8"))
    rows = re.findall(r"(?m)^\|([^|]*)\|([^|]*)\|.*\(\.\./measurements/accuracy\.md#([^)]+)\) \|$", page)
    assert len(rows) >= 5
    for _, figures, anchor in rows:
        assert anchor in sections, f"no log entry {anchor}"
        for figure in re.findall(r"\d+\.\d+%?|\d+%", figures):
            assert figure in sections[anchor], f"{figure} is not in the log entry {anchor}"
