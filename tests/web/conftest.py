"""Fixtures for the dashboard's browser tests: a live pool and a headless Debian chromium.

The browser is the system's chromium (``/usr/bin/chromium``, or ``$GPUPOOL_CHROMIUM``) driven
by Playwright for Python; Playwright's own browser download is never used. Without chromium
or the playwright package the tests skip with a reason, except under ``CI=true`` where they
fail: CI installs chromium (see ``.ci/run``). Screenshots go to ``test-output/web/``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI, REPO_ROOT
from tests.web.pool import LivePool

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
OUTPUT = REPO_ROOT / "test-output" / "web"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in ("test_dashboard.py", "test_modules.py"):
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.slow)


def _missing(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (mandatory in CI: .ci/run installs Debian's chromium)")
    pytest.skip(reason)


def chromium_path() -> str | None:
    explicit = os.environ.get("GPUPOOL_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    for candidate in ("/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if Path(candidate).is_file():
            return candidate
    return shutil.which("chromium")


#: The browser lives while the tests of tests/web run, not for the session: Playwright's sync
#: API runs its asyncio loop in the test's own thread, so while it is open every other test on
#: that xdist worker that calls ``asyncio.run`` fails ("cannot be called from a running event
#: loop"), and a second ``sync_playwright()`` (tests/cli/test_report_browser.py) refuses to
#: start. Package scope: pytest closes it before the worker's next test outside tests/web.
@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed: pip install -e '.[dev]'")
    path = chromium_path()
    if path is None:
        where = os.environ.get("GPUPOOL_CHROMIUM") or "/usr/bin/chromium"
        _missing(f"chromium not found at {where} (apt-get install chromium, or GPUPOOL_CHROMIUM)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="package")
def pool(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Iterator[LivePool]:
    """One server and one agent (6 simulated GPUs) for the browser tests."""
    p = LivePool(tmp_path_factory.mktemp("webpool"))
    try:
        p.start()
        yield p
    finally:
        p.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context (empty sessionStorage) and page.

    Uncaught page errors and content-security-policy violations fail the test.
    """
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))

    def on_console(msg: Any) -> None:
        if msg.type == "error" and "Content Security Policy" in msg.text:
            errors.append(msg.text)

    pg.on("console", on_console)
    try:
        yield pg
    finally:
        context.close()
    assert not errors, f"JavaScript errors or CSP violations in the page: {errors}"


@pytest.fixture(scope="session")
def shots() -> Path:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    return OUTPUT
