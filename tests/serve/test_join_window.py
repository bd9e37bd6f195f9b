"""`mlxd serve --join-window`: every generating endpoint holds the engine's ticket while it
builds the prompt and releases it at submit, or when the request fails, and turns that are
built together join one wave instead of the first running alone."""

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import mlxd.serve.anthropic_api as anthropic_api
import mlxd.serve.openai_api as openai_api
import mlxd.serve.responses_api as responses_api

MESSAGES = [{"role": "user", "content": "Tell me a story."}]
NO_EOS = {"151643": -100, "151645": -100}  # Qwen3's end tokens: rows run to max_tokens
ENDPOINTS = {  # path: (module, the prompt builder it calls, a body)
    "/v1/chat/completions": (openai_api, "chat_prompt", {"messages": MESSAGES, "max_tokens": 3}),
    "/v1/messages": (
        anthropic_api,
        "render",
        {"model": "m", "messages": MESSAGES, "max_tokens": 3},
    ),
    "/v1/responses": (responses_api, "chat_prompt", {"input": "hi", "max_output_tokens": 3}),
}


def _engine(live):
    return live.state.provider.default.engine


def _pending(live) -> int:
    return live.state.provider.arrivals.pending


@pytest.mark.parametrize("path", list(ENDPOINTS))
def test_each_endpoint_holds_a_ticket_while_it_builds_the_prompt(
    make_server, monkeypatch, path
) -> None:
    live = make_server(join_window=5.0)
    module, name, body = ENDPOINTS[path]
    build, seen = getattr(module, name), []

    def spying(*args, **kwargs):
        seen.append(_pending(live))
        return build(*args, **kwargs)

    monkeypatch.setattr(module, name, spying)
    r = httpx.post(live.url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert seen == [1] and _pending(live) == 0
    assert "wave held for arrivals" not in _engine(live).stats()["paths"]  # it came alone


def test_a_request_that_fails_releases_its_ticket(make_server, monkeypatch) -> None:
    live = make_server(join_window=5.0)

    def failing(*args, **kwargs):
        raise ValueError("the template broke")

    monkeypatch.setattr(openai_api, "chat_prompt", failing)
    r = httpx.post(live.v1 + "/chat/completions", json={"messages": MESSAGES}, timeout=60)
    assert r.status_code >= 400
    bad = httpx.post(live.v1 + "/chat/completions", json={"messages": 5}, timeout=60)
    assert bad.status_code == 400
    assert _pending(live) == 0
    monkeypatch.undo()
    ok = httpx.post(live.v1 + "/chat/completions", json={"messages": MESSAGES, "max_tokens": 2})
    assert ok.status_code == 200  # and the server keeps serving


@pytest.mark.parametrize("window", [5.0, 0.0])
def test_turns_built_together_join_one_wave(make_server, monkeypatch, window) -> None:
    live = make_server(join_window=window, batch=8)
    together = threading.Barrier(4, timeout=30)  # all four prompts are being built at once
    build = openai_api.chat_prompt

    def barrier(*args, **kwargs):
        out = build(*args, **kwargs)
        index = together.wait()
        if index:  # the others follow the first once it has queued: the engine sees them on
            threading.Event().wait(0.5)  # their way (all four queued first needed no hold)
        return out

    monkeypatch.setattr(openai_api, "chat_prompt", barrier)
    body = {"messages": MESSAGES, "max_tokens": 4, "logit_bias": NO_EOS}
    with ThreadPoolExecutor(4) as pool:
        codes = list(
            pool.map(
                lambda _: httpx.post(live.v1 + "/chat/completions", json=body, timeout=60),
                range(4),
            )
        )
    assert [c.status_code for c in codes] == [200] * 4
    paths = _engine(live).stats()["paths"]
    if window:
        assert paths["batched"] == 4 and paths.get("serial", 0) == 0
        assert paths["wave held for arrivals"] >= 1
    else:  # without the window, the first submitted starts alone
        assert paths["serial"] >= 1 and "wave held for arrivals" not in paths


@pytest.mark.parametrize("window", [5.0, 0.0])
def test_turns_that_come_back_apart_join_one_wave(make_server, window) -> None:
    """Four agents' replies end; one is back at once and three 0.4 s later, while nothing is on
    its way: the ended replies are turns expected back, so the first waits for the others."""
    live = make_server(join_window=window, batch=8)
    body = {"messages": MESSAGES, "max_tokens": 4, "logit_bias": NO_EOS}
    engine = _engine(live)
    before: dict[str, int] = {}
    together = threading.Barrier(4, timeout=60, action=lambda: before.update(engine.paths))

    def agent(i: int) -> int:
        first = httpx.post(live.v1 + "/chat/completions", json=body, timeout=60)
        assert first.status_code == 200
        together.wait()  # every turn 1 has ended before any turn 2 is sent
        if i:
            threading.Event().wait(0.4)
        return httpx.post(live.v1 + "/chat/completions", json=body, timeout=60).status_code

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(agent, range(4))) == [200] * 4
    paths = engine.stats()["paths"]
    turn_2 = {k: paths.get(k, 0) - before.get(k, 0) for k in paths}
    if window:
        assert turn_2.get("serial", 0) == 0 and turn_2["batched"] == 4
        assert turn_2["wave held for arrivals"] == 1
    else:  # the first one back starts alone
        assert turn_2["serial"] >= 1 and "wave held for arrivals" not in paths


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", list(ENDPOINTS))
def test_a_lone_agents_next_turn_is_never_held(make_server, path, stream) -> None:
    """Its reply is counted as ended before the client can send the next turn (or the next
    turn would wait the whole window for itself)."""
    live = make_server(join_window=5.0)
    body = {**ENDPOINTS[path][2], "stream": stream}
    for _ in range(3):
        with httpx.stream("POST", live.url + path, json=body, timeout=60) as r:
            assert r.status_code == 200
            r.read()
    assert len(live.state.provider.arrivals.ends) == 3  # each reply counted
    assert "wave held for arrivals" not in _engine(live).stats()["paths"]
