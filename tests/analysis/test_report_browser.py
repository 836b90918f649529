"""report.html opened in a real browser: Debian's Chromium, headless, driven by Playwright.

Builds the report of a 6-arm x 5-lag experiment with three eval sets (the size the figures must
stay readable at) and of a quickstart-shaped one (four arms, lag 0 only), opens each from disk
in one browser session, and checks that every figure decoded (naturalWidth > 0), that nothing
logged a console error or a page error, and that no request failed. A full-page screenshot of
each is kept as the test's artifacts (`report.png`, `report_quickstart.png`), under
$HARNESS_TEST_ARTIFACTS (default `test-artifacts/` in the repository, git-ignored); the paths
are printed. That the figures' text fits is checked without a browser
(`test_figure_layout.py`).

Chromium comes from `scripts/setup.sh` (apt's `chromium`); Playwright only drives it
(`executable_path`, no browser download).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from analysis import ReportConfig, build_report
from analysis.synthetic import SyntheticSpec, write_experiment
from tests.analysis.experiments import QUICKSTART_SHAPED

pytestmark = pytest.mark.e2e  # a real browser (Chromium)

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
# Root in a container needs --no-sandbox; the rest keeps a headless run quiet and offline.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SPEC = SyntheticSpec(
    skill={
        "gspo": 0.7,
        "gspo_token": 0.68,
        "grpo": 0.6,
        "grpo_seq": 0.58,
        "dr_grpo": 0.62,
        "ppo": 0.5,
    },
    seeds=(0, 1),
    lags=(0, 1, 2, 4, 8),
    steps=20,
    eval_every=5,
    rows_per_part=50,
    eval_sets=("heldout", "hard", "ood"),
    tokens_per_step=1000.0,
)
CONFIG = ReportConfig(n_resamples=200, curve_resamples=100, figure_dpi=60)


def _artifact_dir() -> Path:
    base = Path(os.environ.get("HARNESS_TEST_ARTIFACTS", REPO / "test-artifacts"))
    out = base / "report_browser"
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def sync_playwright():
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing; scripts/setup.sh installs Debian's chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is missing; scripts/setup.sh installs the dev extra")
    return sync_playwright


def _open(context, html: Path, shot: Path) -> dict:
    """Open `html` in a new page of `context`; what it loaded, what went wrong, a screenshot."""
    errors: list[str] = []
    page = context.new_page()
    page.on(
        "console",
        lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
    )
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url} {r.failure}"))
    page.goto(html.resolve().as_uri(), wait_until="load", timeout=60_000)
    images = page.evaluate(
        "() => Array.from(document.images).map(i => "
        "({alt: i.alt, complete: i.complete, width: i.naturalWidth}))"
    )
    height = page.evaluate("() => document.documentElement.scrollHeight")
    # PNG (the page outgrows JPEG's 65,535-pixel limit) with a generous timeout: the ~10 MB
    # capture outlasts Playwright's 30 s default on a loaded 2-core machine.
    page.screenshot(path=str(shot), full_page=True, timeout=180_000)
    print(f"screenshot: {shot} (page height {height} px)")
    return {"title": page.title(), "images": images, "errors": errors, "shot": shot}


def _check(seen: dict, expected_figures: int) -> None:
    assert seen["title"].startswith("Comparison report")
    assert len(seen["images"]) == expected_figures
    broken = [i["alt"] for i in seen["images"] if not i["complete"] or i["width"] <= 0]
    assert broken == [], f"figures that did not load: {broken}"
    assert seen["errors"] == []
    assert seen["shot"].stat().st_size > 10_000  # a real full-page capture, not a blank image


def test_report_html_renders_in_chromium(sync_playwright, tmp_path: Path) -> None:
    report = build_report(write_experiment(tmp_path / "exp", SPEC), tmp_path / "report", CONFIG)
    assert len(report.figure_paths) >= 10  # every figure of a multi-eval-set experiment
    quick_root = write_experiment(tmp_path / "quick", QUICKSTART_SHAPED)
    quick = build_report(quick_root, tmp_path / "quick_report", CONFIG)
    out = _artifact_dir()
    with sync_playwright() as driver:
        context = driver.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a fresh user-data-dir
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            grid = _open(context, report.html_path, out / "report.png")
            quickstart = _open(context, quick.html_path, out / "report_quickstart.png")
        finally:
            context.close()
    _check(grid, len(report.figure_paths))
    _check(quickstart, len(quick.figure_paths))
