"""Theme (the system's, or the toggle's), a phone-sized viewport, and the screenshots in docs/img.
`cd tests && ../.venv/bin/python -m ui.test_chat_layout` writes docs/img/chat-{light,dark}.png
from the same canned conversation the screenshot test draws."""

import io
import sys
from pathlib import Path
from typing import Any

from PIL import Image, ImageStat
from ui.helpers import (
    DONE,
    FakeAPI,
    TinyServer,
    canned,
    delta,
    fake_site_fixture,  # noqa: F401 - the fake_site fixture
    finish,
    fulfill_sse,
    open_chat,
    send,
    usage,
    wait_idle,
)

DARK, LIGHT = "rgb(13, 17, 23)", "rgb(255, 255, 255)"
MAX_PNG = 150_000
ANSWER = """Here is a function that returns the **n-th Fibonacci number**:

```python
def fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
```

It runs in *O(n)* time and constant memory."""


def background(page: Any) -> str:
    return page.evaluate("getComputedStyle(document.body).backgroundColor")


def test_theme_follows_the_system_and_the_toggle(page: Any, fake_site) -> None:
    _, server = fake_site
    page.emulate_media(color_scheme="dark")
    open_chat(page, server.url)
    assert background(page) == DARK and page.inner_text("#theme-toggle") == "◐ Auto"
    page.emulate_media(color_scheme="light")
    assert background(page) == LIGHT
    page.click("#theme-toggle")
    assert background(page) == DARK and page.inner_text("#theme-toggle") == "☾ Dark"
    page.click("#theme-toggle")
    assert background(page) == LIGHT
    page.emulate_media(color_scheme="dark")
    page.reload()  # the choice is kept, over the system's
    open_chat(page, server.url)
    assert background(page) == LIGHT and page.inner_text("#theme-toggle") == "☀ Light"
    page.click("#theme-toggle")  # back to the system's
    assert background(page) == DARK


def test_phone_viewport(page: Any, fake_site) -> None:
    _, server = fake_site
    fulfill_sse(page, canned(delta(ANSWER), finish(), DONE))
    page.set_viewport_size({"width": 390, "height": 780})
    open_chat(page, server.url)
    send(page, "fibonacci?")
    wait_idle(page)
    side = page.locator("#sidebar").bounding_box()
    assert side["x"] + side["width"] <= 0  # the list is off screen
    assert page.evaluate("document.documentElement.scrollWidth") <= 390  # no sideways scroll
    for sel in ("#input", "#send", "#model", "#settings-toggle"):
        box = page.locator(sel).bounding_box()
        assert 0 <= box["x"] and box["x"] + box["width"] <= 390, sel
    page.click("#open-side")
    side = "document.getElementById('sidebar').getBoundingClientRect()"
    page.wait_for_function(f"() => {side}.x >= 0")
    page.click("text=fibonacci?")  # opening a conversation closes the list
    page.wait_for_function(f"() => {side}.right <= 0")


def shoot(page: Any, url: str, theme: str) -> bytes:
    """The canned conversation in `theme`, as a PNG."""
    frames = [delta(reasoning="The user wants Fibonacci; an iterative loop is simplest.")]
    frames += [delta(ANSWER), finish(), usage(prompt=38, completion=71, cached=0), DONE]
    fulfill_sse(page, canned(*frames))
    page.set_viewport_size({"width": 1000, "height": 640})
    page.emulate_media(color_scheme=theme)
    open_chat(page, url)
    send(page, "Write a Python function for the n-th Fibonacci number.")
    wait_idle(page)
    page.evaluate("document.querySelector('.stats').textContent = 'prompt 38 · cached 0 · "
                  "completion 71 · TTFT 85 ms · 62.4 tok/s'")  # fmt: skip
    return page.screenshot(type="png")


def test_screenshots_small_and_themed(page: Any, browser: Any, fake_site) -> None:
    _, server = fake_site
    light = shoot(page, server.url, "light")
    other = browser.new_context()
    try:
        dark = shoot(other.new_page(), server.url, "dark")
    finally:
        other.close()
    brightness = {}
    for name, png in (("light", light), ("dark", dark)):
        assert len(png) < MAX_PNG, (name, len(png))
        brightness[name] = ImageStat.Stat(Image.open(io.BytesIO(png)).convert("L")).mean[0]
    assert brightness["light"] > 200 > 60 > brightness["dark"], brightness


def main(out: Path) -> None:
    from playwright.sync_api import sync_playwright
    from ui.conftest import chromium_path

    fake = FakeAPI()
    server = TinyServer(fake.app())
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        for theme in ("light", "dark"):
            context = browser.new_context()
            png = shoot(context.new_page(), server.url, theme)
            # a palette of 64 colours: a quarter of the size, the text still sharp
            image = Image.open(io.BytesIO(png)).convert("RGB").quantize(64)
            image.save(out / f"chat-{theme}.png", optimize=True)
            context.close()
        browser.close()
    server.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parents[2] / "docs" / "img")
