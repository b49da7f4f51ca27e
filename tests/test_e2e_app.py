"""End to end: `streamlit run` on localhost driven in headless Chromium; change K, check the bubble;
every page; the Plan page's search run on request."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpipe_sim import load_scenario, simulate
from gpipe_sim.schedule.registry import fill_drain_bubble

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app" / "streamlit_app.py"
DEFAULT_SCENARIO = ROOT / "gpipe_sim" / "scenarios" / "default.yaml"
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run"]
READY_TIMEOUT_S = 60
# True once the page shows the wanted bubble and analytic values (checked every animation frame).
SHOWN = """([bubble, analytic]) => {
  const value = (label) => [...document.querySelectorAll('[data-testid="stMetric"]')]
    .filter((m) => m.innerText.includes(label))
    .map((m) => m.querySelector('[data-testid="stMetricValue"]').innerText.trim())[0];
  return value("Bubble fraction") === bubble && value("Analytic bubble") === analytic;
}"""
# True once the script run has finished (Streamlit's running indicator is gone).
IDLE = """() => !document.querySelector('[data-testid="stStatusWidget"]')"""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"streamlit exited with {proc.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.read().strip() == b"ok":
                    return
        time.sleep(0.25)
    pytest.fail(f"streamlit not ready within {READY_TIMEOUT_S} s: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (/usr/bin/chromium)")
    pytest.importorskip("playwright.sync_api")
    port = _free_port()
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    env = {**os.environ, "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true",
             "--server.port", str(port), "--server.address", "127.0.0.1",
             "--server.fileWatcherType", "none", "--browser.gatherUsageStats", "false"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, proc, log)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


DOC_IMAGES = Path(__file__).resolve().parents[1] / "docs" / "images"


def _screenshot(page, name: str) -> None:
    """The whole page: Streamlit scrolls inside its main block, so grow the viewport to fit it."""
    height = page.evaluate(
        "() => Math.max(...[...document.querySelectorAll('[data-testid=\"stMain\"], "
        "[data-testid=\"stMainBlockContainer\"]')].map((e) => e.scrollHeight), 1100)")
    page.set_viewport_size({"width": 1500, "height": min(int(height) + 100, 6000)})
    page.wait_for_timeout(800)  # let plotly re-lay out at the new size
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)
    if os.environ.get("GPIPE_UPDATE_SCREENSHOTS"):  # the README's pictures: docs/images/
        DOC_IMAGES.mkdir(parents=True, exist_ok=True)
        (DOC_IMAGES / name).write_bytes((ARTIFACTS / name).read_bytes())
    page.set_viewport_size({"width": 1500, "height": 1100})


def _expected_bubble(stages: int, micro_batches: int) -> str:
    scenario = load_scenario(DEFAULT_SCENARIO).with_updates(
        {"pipeline.stages": stages, "pipeline.micro_batches": micro_batches})
    return f"{simulate(scenario, engine='auto').bubble_fraction:.4f}"


def test_change_k_in_the_browser_updates_the_bubble(app_url, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    from test_app_support import sweep_table, write_validation

    validation = tmp_path / "validate.json"
    write_validation(validation, 4, 8)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    sweep_table().to_parquet(sweep / "results.parquet", index=False)

    ARTIFACTS.mkdir(exist_ok=True)
    latencies: list[tuple[str, float, float, float]] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.set_default_timeout(30_000)
            page.goto(app_url)

            def metric(label: str):
                return (page.locator('[data-testid="stMetric"]').filter(has_text=label)
                        .locator('[data-testid="stMetricValue"]'))

            bubble, analytic = metric("Bubble fraction"), metric("Analytic bubble")
            scenario = load_scenario(DEFAULT_SCENARIO)
            K, M = scenario.pipeline.stages, scenario.pipeline.micro_batches
            expect(bubble).to_have_text(_expected_bubble(K, M), timeout=60_000)
            expect(analytic).to_have_text(f"{fill_drain_bubble(K, M):.4f}")
            expect(page.locator(".js-plotly-plot").first).to_be_visible()
            _screenshot(page, "explore_default.png")

            for field, K, M in (("stages K", 8, M), ("stages K", 16, M), ("micro-batches M", 16, 64),
                                ("stages K", 2, 64), ("stages K", 8, 64)):
                want = (_expected_bubble(K, M), f"{fill_drain_bubble(K, M):.4f}")
                box = page.get_by_label(field, exact=True)
                box.fill(str(K if field == "stages K" else M))
                page.wait_for_timeout(1000)  # a person's pace: the previous page has finished drawing
                started = time.perf_counter()
                box.press("Enter")
                page.wait_for_function(SHOWN, arg=list(want), polling="raf")
                shown = time.perf_counter() - started
                page.wait_for_function(IDLE, polling="raf")
                done = time.perf_counter() - started
                server = page.get_by_text("Page computed in").inner_text().split()[3]
                latencies.append((f"K={K} M={M}", shown, done, float(server) / 1000))
                expect(bubble).to_have_text(want[0])
                expect(analytic).to_have_text(want[1])
            expect(page.locator('[data-testid="stStatusWidget"]')).to_have_count(0, timeout=10_000)
            _screenshot(page, "explore_k8_m64.png")

            page.get_by_role("link", name="Compare").click()
            expect(page.get_by_text("Compare configurations")).to_be_visible()
            expect(page.get_by_text("Figures", exact=False).first).to_be_visible()
            _screenshot(page, "compare.png")

            page.get_by_role("link", name="Validate").click()
            expect(page.get_by_text("No validation loaded")).to_be_visible()
            page.get_by_label("... or a path on the server").fill(str(validation))
            page.get_by_label("... or a path on the server").press("Enter")
            expect(metric("Predicted bubble")).to_have_text(f"{fill_drain_bubble(4, 8):.4f}")
            expect(page.locator(".js-plotly-plot")).to_have_count(5)
            _screenshot(page, "validate.png")

            page.get_by_role("link", name="Sweep").click()
            expect(page.get_by_text("No sweep loaded")).to_be_visible()
            box = page.get_by_label("... or a sweep output folder (or results file) on the server")
            box.fill(str(sweep))
            box.press("Enter")
            expect(page.get_by_text("16 scenarios, 1 failed")).to_be_visible()
            expect(page.locator(".js-plotly-plot")).to_have_count(1)
            _screenshot(page, "sweep.png")

            # the Plan page searches only when asked, in the background, then shows the answer
            page.get_by_role("link", name="Plan").click()
            search = page.get_by_role("button", name="Search")
            expect(search).to_be_visible()
            expect(page.get_by_text("Ranked configurations")).to_have_count(0)
            search.click()
            expect(page.get_by_text("Ranked configurations")).to_be_visible(timeout=120_000)
            expect(page.locator(".js-plotly-plot").first).to_be_visible()
        finally:
            browser.close()
    print("\nafter Enter (s): bubble metric shown / run finished in the browser / server script: "
          + ", ".join(f"{name}: {shown:.2f}/{done:.2f}/{server:.2f}"
                      for name, shown, done, server in latencies))
    assert all(shown < 5 for _, shown, _, _ in latencies)
