"""``report --format html`` opens as a standalone page in headless chromium and its charts draw.

The page is built from a fixed report (no server needed). Every request the page makes is
recorded: a self-contained page makes none beyond its own file. "Drew" means each chart's bars
have a size on screen and the chart colours are present in the screenshot's pixels.
"""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pytest

from gpupool.cli.report_html import COST, IDLE, USED, render_html
from gpupool.schemas.nodes import UsageLineView, UsageReport

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
T0 = 1_796_000_000.0

pytestmark = pytest.mark.browser


def _line(tenant: str, hours: float, util: float, cost: float) -> UsageLineView:
    return UsageLineView(
        key={"tenant": tenant},
        gpu_hours=hours,
        milli_seconds=hours * 3.6e6,
        mib_seconds=hours * 3600 * 8192,
        busy_milli_seconds=hours * util * 3.6e6,
        utilization_ratio=util,
        idle_ratio=1 - util,
        cost=cost,
        jobs=3,
    )


def _report(start: float, end: float, scale: float = 1.0) -> UsageReport:
    return UsageReport(
        start=start,
        end=end,
        group_by=["tenant"],
        lines=[_line("vision", 12 * scale, 0.7, 30 * scale), _line("nlp", 4 * scale, 0.3, 8)],
    )


def _rgb(hex_colour: str) -> tuple[float, float, float]:
    return tuple(int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5))  # type: ignore[return-value]


@pytest.fixture
def page_file(tmp_path: Path) -> Path:
    day = 86400.0
    buckets = [_report(T0 + i * day, T0 + (i + 1) * day, scale=(i + 1) / 7) for i in range(7)]
    path = tmp_path / "usage.html"
    path.write_text(render_html(_report(T0, T0 + 7 * day), buckets), encoding="utf-8")
    return path


def test_html_report_renders_offline_with_charts(page_file: Path, tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"chromium is required in CI and was not found at {CHROMIUM}")
        pytest.skip(f"chromium not found at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    import matplotlib.image as mpimg
    import numpy as np

    requests: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 900, "height": 1400})
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_file.as_uri())
            page.wait_for_load_state("load")
            charts = page.locator("svg.chart")
            assert charts.count() == 3
            for i in range(3):
                bars = charts.nth(i).locator("rect.bar")
                assert bars.count() >= 2
                sizes = bars.evaluate_all(
                    "els => els.map(e => { const b = e.getBoundingClientRect();"
                    " return [b.width, b.height]; })"
                )
                assert all(w > 0 and h > 0 for w, h in sizes)
            png = page.screenshot(full_page=True, path=str(tmp_path / "report.png"))
        finally:
            browser.close()
    assert requests == [page_file.as_uri()]  # nothing fetched but the page itself
    pixels = mpimg.imread(io.BytesIO(png), format="png")[..., :3]
    for colour in (USED, IDLE, COST):
        near = np.all(np.abs(pixels - np.array(_rgb(colour))) < 0.02, axis=-1)
        assert near.sum() > 200, f"chart colour {colour} not drawn"
