"""report.html opened in a real browser: Debian's Chromium, headless, driven by Playwright.

Builds the report of a 6-arm x 5-lag experiment with three eval sets (the size the figures must
stay readable at), opens it from disk, and checks that every figure decoded (naturalWidth > 0),
that nothing logged a console error or a page error, and that no request failed. A full-page
screenshot is kept as the test's artifact, under $HARNESS_TEST_ARTIFACTS (default
`test-artifacts/` in the repository, git-ignored); the path is printed.

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


def test_report_html_renders_in_chromium(sync_playwright, tmp_path: Path) -> None:
    root = write_experiment(tmp_path / "exp", SPEC)
    report = build_report(root, tmp_path / "report", CONFIG)
    expected_figures = len(report.figure_paths)
    assert expected_figures >= 10  # every figure of a multi-eval-set experiment was drawn

    errors: list[str] = []
    with sync_playwright() as driver:
        context = driver.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a fresh user-data-dir
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            page = context.new_page()
            page.on(
                "console",
                lambda m: (
                    errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None
                ),
            )
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.on(
                "requestfailed", lambda r: errors.append(f"request failed: {r.url} {r.failure}")
            )
            page.goto(report.html_path.resolve().as_uri(), wait_until="load", timeout=60_000)
            images = page.evaluate(
                "() => Array.from(document.images).map(i => "
                "({alt: i.alt, complete: i.complete, width: i.naturalWidth}))"
            )
            title = page.title()
            shot = _artifact_dir() / "report.png"
            # PNG (the page outgrows JPEG's 65,535-pixel limit) with a generous timeout: the
            # ~10 MB capture outlasts Playwright's 30 s default on a loaded 2-core machine.
            height = page.evaluate("() => document.documentElement.scrollHeight")
            page.screenshot(path=str(shot), full_page=True, timeout=180_000)
        finally:
            context.close()
    print(f"screenshot: {shot} (page height {height} px)")

    assert title.startswith("Comparison report")
    assert len(images) == expected_figures
    broken = [i["alt"] for i in images if not i["complete"] or i["width"] <= 0]
    assert broken == [], f"figures that did not load: {broken}"
    assert errors == []
    assert shot.stat().st_size > 10_000  # a real full-page capture, not a blank image
