"""Conversations kept in the browser: reload, the list (rename, delete, search), export/import,
versions of the last turn (edit, regenerate), and storage failures shown, never a silent wipe."""

import json
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
    wait_idle,
)


def answers(page: Any, *texts: str) -> list[dict[str, Any]]:
    return fulfill_sse(page, *(canned(delta(t), finish(), DONE) for t in texts))


def chat(page: Any, text: str) -> None:
    send(page, text)
    wait_idle(page)


def titles(page: Any) -> list[str]:
    return page.locator("#conv-list .conv-title").all_inner_texts()


def test_reload_keeps_conversations(page: Any, fake_site) -> None:
    _, server = fake_site
    answers(page, "first answer", "second answer", "other answer")
    open_chat(page, server.url)
    chat(page, "first question")
    chat(page, "second question")
    page.click("#new-chat")
    chat(page, "another topic")
    page.reload()
    open_chat(page, server.url)
    assert titles(page) == ["another topic", "first question"]  # the latest first
    assert page.locator(".msg.assistant .content").inner_text() == "other answer"
    page.click("text=first question")
    replies = page.locator(".msg.assistant .content").all_inner_texts()
    assert replies == ["first answer", "second answer"]


def test_rename_delete_and_search(page: Any, fake_site) -> None:
    _, server = fake_site
    answers(page, "about cats", "about dogs")
    open_chat(page, server.url)
    chat(page, "cats?")
    page.click("#new-chat")
    chat(page, "dogs?")
    page.locator(".conv", has_text="cats?").locator(".rename").click()
    page.fill(".rename-input", "Felines")
    page.press(".rename-input", "Enter")
    page.wait_for_selector(".conv-title:has-text('Felines')")
    page.fill("#search", "dogs")  # by the messages' text too
    assert titles(page) == ["dogs?"]
    page.fill("#search", "feli")
    assert titles(page) == ["Felines"]
    page.fill("#search", "")
    delete = page.locator(".conv", has_text="dogs?").locator(".delete")
    delete.click()  # the first click asks, the second deletes
    assert titles(page) == ["dogs?", "Felines"]
    delete.click()
    page.wait_for_function("() => document.querySelectorAll('#conv-list .conv').length === 1")
    page.reload()
    open_chat(page, server.url)
    assert titles(page) == ["Felines"]


def test_export_import_round_trip(page: Any, browser: Any, fake_site, tmp_path) -> None:
    _, server = fake_site
    answers(page, "**bold** reply")
    open_chat(page, server.url)
    chat(page, "export me")
    with page.expect_download() as download:
        page.click("#export")
    path = tmp_path / "chats.json"
    download.value.save_as(path)
    data = json.loads(path.read_text())
    [conv] = data["conversations"]
    alt = conv["turns"][0]["alts"][0]
    assert (alt["user"], alt["reply"]["content"]) == ("export me", "**bold** reply")

    other = browser.new_context()  # empty storage: what a second machine would see
    try:
        fresh = other.new_page()
        open_chat(fresh, server.url)
        assert titles(fresh) == []
        bad = tmp_path / "bad.json"
        bad.write_text('{"something": "else"}')
        fresh.set_input_files("#import-file", str(bad))
        fresh.wait_for_selector("#banner:has-text('Import failed')")
        fresh.set_input_files("#import-file", str(path))
        fresh.wait_for_selector(".conv-title:has-text('export me')")
        fresh.click("text=export me")
        assert fresh.locator(".msg.assistant .content strong").inner_text() == "bold"
        fresh.reload()
        open_chat(fresh, server.url)
        assert titles(fresh) == ["export me"]
    finally:
        other.close()


def test_edit_and_regenerate_keep_every_version(page: Any, fake_site) -> None:
    _, server = fake_site
    seen = answers(page, "answer one", "answer two", "answer three")
    open_chat(page, server.url)
    chat(page, "question")
    page.click(".regen-btn")
    wait_idle(page)
    assert page.locator(".alt-label").inner_text() == "2/2"
    assert page.locator(".msg.assistant .content").inner_text() == "answer two"
    page.click(".edit-btn")
    page.fill(".edit textarea", "question, edited")
    page.click(".edit button[type=submit]")
    wait_idle(page)
    assert page.locator(".alt-label").inner_text() == "3/3"
    assert seen[-1]["messages"] == [{"role": "user", "content": "question, edited"}]
    page.reload()
    open_chat(page, server.url)
    page.click("button[aria-label='Previous version']")
    page.click("button[aria-label='Previous version']")
    assert page.locator(".alt-label").inner_text() == "1/3"
    assert page.locator(".user-text").inner_text() == "question"
    assert page.locator(".msg.assistant .content").inner_text() == "answer one"
    page.click("button[aria-label='Next version']")
    assert page.locator(".msg.assistant .content").inner_text() == "answer two"


def test_follow_up_sends_the_chosen_versions_without_reasoning(page: Any, fake_site) -> None:
    _, server = fake_site
    seen = answers(page, "<think>hmm</think>Paris", "Lyon")
    open_chat(page, server.url)
    chat(page, "capital?")
    chat(page, "and second city?")
    assert seen[-1]["messages"] == [
        {"role": "user", "content": "capital?"},
        {"role": "assistant", "content": "Paris"},
        {"role": "user", "content": "and second city?"},
    ]


BROKEN_IDB = """
indexedDB.open = () => { throw new DOMException('disk is full', 'QuotaExceededError'); };
"""


def test_storage_failure_is_shown_and_the_chat_goes_on(page: Any, fake_site) -> None:
    _, server = fake_site
    answers(page, "still answered")
    page.add_init_script(BROKEN_IDB)
    open_chat(page, server.url)
    page.wait_for_selector("#banner:has-text('could not be loaded (nothing was deleted)')")
    chat(page, "hello")
    assert page.locator(".msg.assistant .content").inner_text() == "still answered"
    assert "Could not save" in page.locator("#banner").inner_text()
    assert "disk is full" in page.locator("#banner").inner_text()
