"""The page against a real mlxd server on the tiny random qwen3 model (its text is random: what
is checked is that replies stream to the end, with the server's usage, in two tabs at once)."""

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from serve.conftest import LiveServer, start_server
from ui.helpers import open_chat, send

# when each reply started and ended (the Stop button shown, then hidden), in the page's clock
SPANS = """
window.__spans = [];
new MutationObserver(() => {
  const stop = document.getElementById('stop');
  if (!stop) return;
  const spans = window.__spans, last = spans[spans.length - 1];
  if (!stop.hidden && (!last || last.end)) spans.push({start: Date.now()});
  if (stop.hidden && last && !last.end) last.end = Date.now();
}).observe(document, {subtree: true, attributes: true, childList: true});
"""


@pytest.fixture(scope="module")
def live(
    tiny_model: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    data = tmp_path_factory.mktemp("data")
    server = start_server(model=str(tiny_model("qwen3")), data_dir=str(data))
    yield server
    server.stop()


def stats(page: Any) -> dict[str, int]:
    text = page.locator(".msg.assistant .stats").last.inner_text()
    return {k: int(v) for k, v in re.findall(r"(prompt|cached|completion) (\d+)", text)}


def set_max_tokens(page: Any, n: int) -> None:
    page.click("#settings-toggle")
    page.fill("#set-max_tokens", str(n))
    page.press("#set-max_tokens", "Tab")


def test_send_and_the_reply_completes(page: Any, live: LiveServer) -> None:
    errors: list[str] = []  # console errors (a CSP violation is one) and uncaught exceptions
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    open_chat(page, live.url)
    set_max_tokens(page, 12)
    send(page, "Hello there")
    page.wait_for_selector("#send:not([hidden])", timeout=60_000)
    page.wait_for_selector(".msg.assistant:not(.streaming)")
    assert page.locator(".msg.assistant .error").is_hidden()
    got = stats(page)
    assert got["prompt"] > 3 and got["completion"] == 12, got
    reply = page.locator(".msg.assistant").inner_text()
    assert reply.strip(), "no text from twelve tokens"
    send(page, "And again")  # a second turn in the same conversation (its prefix cached)
    page.wait_for_function("() => document.querySelectorAll('.msg.assistant .stats').length === 2")
    page.wait_for_selector("#send:not([hidden])", timeout=60_000)
    assert stats(page)["prompt"] > got["prompt"] + got["completion"]
    assert errors == []


def test_two_tabs_stream_at_the_same_time(page: Any, live: LiveServer) -> None:
    second = page.context.new_page()
    tabs = [page, second]
    for tab in tabs:
        tab.add_init_script(SPANS)
        open_chat(tab, live.url)
        set_max_tokens(tab, 150)
    for i, tab in enumerate(tabs):
        send(tab, f"Tab {i} says hello")
    for tab in tabs:
        tab.wait_for_selector("#send:not([hidden])", timeout=60_000)
        assert tab.locator(".msg.assistant .error").is_hidden()
        assert stats(tab)["completion"] == 150
    (a,), (b,) = (tab.evaluate("window.__spans") for tab in tabs)
    assert a["start"] < b["end"] and b["start"] < a["end"], (a, b)  # the streams overlapped
    page.reload()  # each tab saved its own conversation
    open_chat(page, live.url)
    listed = page.locator("#conv-list .conv-title").all_inner_texts()
    assert sorted(listed) == ["Tab 0 says hello", "Tab 1 says hello"]


def test_api_key_on_a_real_server(
    page: Any, tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    """The server's key check leaves the page and its files open; the page asks for the key."""
    server = start_server(
        model=str(tiny_model("qwen3")), data_dir=str(tmp_path), api_key="real-key"
    )
    try:
        for path, status in (("/", 200), ("/ui/app.js", 200), ("/v1/models", 401)):
            assert page.request.get(server.url + path).status == status, path
        page.goto(server.url + "/")
        page.wait_for_selector("#key-dialog[open]")
        page.fill("#key-input", "real-key")
        page.click("#key-save")
        page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
        set_max_tokens(page, 4)
        send(page, "hi")
        page.wait_for_selector("#send:not([hidden])", timeout=60_000)
        page.wait_for_selector(".msg.assistant:not(.streaming)")
        assert page.locator(".msg.assistant .error").is_hidden()
        assert stats(page)["completion"] == 4
    finally:
        server.stop()
