"""The dashboard page in Chromium against a real server on the tiny qwen3: while two streaming
requests run it shows both rows decoding and the tokens/s plot draws; with --api-key it asks
for the key, keeps it under "mlxd-api-key" and sends it; the theme switches. The page test
also makes docs/img/dashboard.png where it is missing."""

import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve.conftest import LiveServer, start_server

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "dashboard.png"
SCREENSHOT_DARK = SCREENSHOT.with_name("dashboard-dark.png")
BODY = {"messages": [{"role": "user", "content": "Count slowly to a thousand, please."}],
        "max_tokens": 20_000, "temperature": 0.0, "ignore_eos": True, "stream": True}  # fmt: skip


class Stream(threading.Thread):
    """A streaming chat request read until `stop` is set, then dropped (the row is cancelled)."""

    def __init__(self, live: LiveServer, headers: dict[str, str] | None = None) -> None:
        super().__init__(daemon=True)
        self.live, self.headers = live, headers or {}
        self.stop, self.lines = threading.Event(), 0

    def run(self) -> None:
        with httpx.stream("POST", self.live.v1 + "/chat/completions", json=BODY,
                          headers=self.headers, timeout=300) as r:  # fmt: skip
            for _ in r.iter_lines():
                self.lines += 1
                if self.stop.is_set():
                    return


@pytest.fixture(scope="module")
def server(tiny_model: Callable[..., Path], tmp_path_factory) -> Iterator[LiveServer]:
    live = start_server(model=str(tiny_model("qwen3")), data_dir=str(tmp_path_factory.mktemp("d")))
    yield live
    live.stop()


@pytest.fixture
def streams() -> Iterator[Callable[..., list[Stream]]]:
    started: list[Stream] = []

    def start(live: LiveServer, n: int = 2, **headers: str) -> list[Stream]:
        new = [Stream(live, headers) for _ in range(n)]
        for s in new:
            s.start()
        started.extend(new)
        return new

    yield start
    for s in started:
        s.stop.set()
    for s in started:
        s.join(timeout=60)


def errors_of(page: Any) -> list[str]:
    """Console errors and page exceptions (a CSP violation is a console error)."""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors


def test_two_streams_show_as_two_rows_and_the_plots_draw(page, server, streams, tmp_path) -> None:
    errors = errors_of(page)
    page.goto(server.url + "/dashboard")
    page.wait_for_selector("#status.ok")
    assert page.locator("#no-rows").is_visible()
    # a finished request first: its first token is a TTFT point
    short = {**BODY, "stream": False, "max_tokens": 4}
    assert httpx.post(server.v1 + "/chat/completions", json=short, timeout=60).status_code == 200
    streams(server)
    decoding = page.locator('#rows tbody tr[data-state="decode"]')
    page.wait_for_function(
        "() => document.querySelectorAll('#rows tbody tr[data-state=\"decode\"]').length === 2",
        timeout=60_000,
    )
    name = server.state.provider.names[0]
    assert decoding.count() == 2
    assert {decoding.nth(i).get_attribute("data-model") for i in range(2)} == {name}
    assert not page.locator("#no-rows").is_visible()
    assert page.locator("#t-running").text_content() == "2"
    # the tokens/s line needs two points: three samples a second apart (the predicates are
    # functions, not strings: the page's CSP forbids eval)
    page.wait_for_function(
        "() => Number(document.getElementById('plot-tps').dataset.points) >= 4", timeout=30_000
    )
    assert int(page.locator("#plot-ttft").get_attribute("data-points")) >= 1
    assert page.locator("#plot-ttft circle.dot, #plot-ttft polyline.line").count() >= 1
    line = page.locator("#plot-tps polyline.line")
    assert line.count() >= 1 and len(line.first.get_attribute("points").split()) >= 2
    generated = decoding.first.locator("td").nth(4).text_content()
    assert generated.split(" / ")[0].isdigit() and int(generated.split(" / ")[0]) > 0
    card = page.locator(f'#models article[data-model="{name}"]')
    assert card.count() == 1 and "prefix store" in card.text_content()
    assert "weights + KV" in card.text_content() and "KV budget used" in card.text_content()
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    assert 0 < shot.stat().st_size < 150_000
    if not SCREENSHOT.exists():  # the docs' copy: delete it and run this test to remake it
        shutil.copyfile(shot, SCREENSHOT)
    page.evaluate("() => { document.documentElement.dataset.theme = 'dark'; }")
    dark = tmp_path / "dashboard-dark.png"
    page.screenshot(path=str(dark), full_page=True)
    assert 0 < dark.stat().st_size < 150_000
    if not SCREENSHOT_DARK.exists():
        shutil.copyfile(dark, SCREENSHOT_DARK)
    assert errors == []


def test_the_page_asks_for_the_key_and_sends_it(page, tiny_model, tmp_path, streams) -> None:
    live = start_server(model=str(tiny_model("qwen3")), api_key="sesame",
                        data_dir=str(tmp_path / "data"))  # fmt: skip
    try:
        page.goto(live.url + "/dashboard")
        page.wait_for_selector("#key-form:not([hidden])")
        assert page.locator("#status").text_content() == "API key needed"
        page.fill("#key-input", "wrong")
        page.click("#key-form button[type=submit]")
        page.wait_for_selector("#key-form:not([hidden])")
        page.wait_for_function(
            "() => document.getElementById('key-error').textContent.includes('refused')"
        )
        page.fill("#key-input", "sesame")
        page.click("#key-form button[type=submit]")
        page.wait_for_selector("#status.ok")
        assert page.evaluate("localStorage.getItem('mlxd-api-key')") == "sesame"
        streams(live, 1, Authorization="Bearer sesame")
        page.wait_for_selector('#rows tbody tr[data-state="decode"]', timeout=60_000)
        page.reload()  # the stored key is used without asking
        page.wait_for_selector("#status.ok")
        assert page.locator("#key-form").is_hidden()
    finally:
        for s in threading.enumerate():
            if isinstance(s, Stream):
                s.stop.set()
        live.stop()


def test_the_theme_switches_and_stays(page, server) -> None:
    page.emulate_media(color_scheme="light")
    page.goto(server.url + "/dashboard")
    page.wait_for_selector("#status.ok")
    bg = "getComputedStyle(document.body).backgroundColor"
    light = page.evaluate(bg)
    page.click("#theme")
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    dark = page.evaluate(bg)
    assert light != dark
    page.reload()
    page.wait_for_selector("#status.ok")
    assert page.evaluate(bg) == dark
