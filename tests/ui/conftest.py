"""A headless Chromium (Debian's `chromium`, driven by Playwright; no browser download) for the
page tests. Without the browser the tests fail with how to install it: they are never skipped."""

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

BROWSER_PATHS = ("chromium", "chromium-browser", "google-chrome")


def chromium_path() -> str:
    for name in BROWSER_PATHS:
        if (path := shutil.which(name)) is not None:
            return path
    raise RuntimeError("no Chromium on PATH: `apt-get install chromium` (.ci/run does)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Per module: Playwright's sync API keeps an event loop running in this thread while it is
    open, and the next module's tests (asyncio.run in other folders) must not find one."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh context per test (its own storage: IndexedDB starts empty)."""
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    p = context.new_page()
    yield p
    context.close()
