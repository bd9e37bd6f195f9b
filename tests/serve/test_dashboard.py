"""`GET /v1/dashboard` on a real server with the tiny qwen3: two streaming rows show up as two
decoding rows whose token counts grow and match what the clients receive; after they end the
rows are gone and the counters say what happened (tokens, first tokens, the prefix store). The
engine in a child process answers the same shape; --api-key guards the endpoint."""

import json
import threading
import time
from typing import Any

import httpx
from serve.conftest import LiveServer

MAX_TOKENS = 400
BODY = {"messages": [{"role": "user", "content": "Count slowly to a thousand, please."}],
        "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}}  # fmt: skip


def dashboard(live: LiveServer, **headers: str) -> dict[str, Any]:
    r = httpx.get(live.v1 + "/dashboard", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


class Stream(threading.Thread):
    """One streaming chat request read to its end: the content chunks it got and its usage."""

    def __init__(self, live: LiveServer, body: dict[str, Any] = BODY) -> None:
        super().__init__(daemon=True)
        self.live, self.body, self.chunks, self.usage = live, body, 0, None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.live.v1 + "/chat/completions", json=self.body,
                              timeout=300) as r:  # fmt: skip
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        self.usage = chunk["usage"]
                    self.chunks += sum(1 for c in chunk.get("choices", ()) if c["delta"])
        except BaseException as e:  # noqa: BLE001 - the test reports it
            self.error = e


def rows_until(live: LiveServer, ok: Any, timeout: float = 120) -> dict[str, Any]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        d = dashboard(live)
        if ok(d["models"][0]["rows"]):
            return d
        time.sleep(0.05)
    raise AssertionError(f"the dashboard never showed the rows asked for: {d['models'][0]}")


def decoding(n: int) -> Any:
    return lambda rows: sum(r["state"] == "decode" for r in rows) == n


def check_run(live: LiveServer) -> None:
    before = dashboard(live)
    model = before["models"][0]
    assert model["rows"] == [] and model["running"] == 0 and model["waiting"] == 0
    tokens_before = model["tokens_generated"]
    time.sleep(1.0)  # the next poll is a sample of its own (one a second)
    streams = [Stream(live), Stream(live)]
    for s in streams:
        s.start()
    first = rows_until(live, decoding(2))["models"][0]
    assert first["running"] == 2 and len(first["rows"]) == 2
    assert len({r["id"] for r in first["rows"]}) == 2
    for r in first["rows"]:
        assert 1 <= r["generated_tokens"] < MAX_TOKENS and r["max_tokens"] == MAX_TOKENS
        assert r["adapter"] is None and r["speculative"] is False
        assert r["ttft_s"] is not None and 0 < r["ttft_s"] <= r["age_s"]
    kv, mem = first["kv"], first["memory"]
    per_token = kv["bytes_per_token"]["unquantized"]
    in_cache = sum(r["prompt_tokens"] + r["generated_tokens"] for r in first["rows"])
    assert per_token > 0 and kv["in_use_bytes"] == int(in_cache * per_token)
    if kv["budget_bytes"] is None:  # no budget: admission reserves nothing, memory estimates
        assert kv["reserved_bytes"] == 0 and mem["kv_bytes"] == kv["in_use_bytes"]
    else:  # each row reserves its worst case: its whole max_tokens
        assert kv["reserved_bytes"] >= 2 * MAX_TOKENS * per_token
        assert mem["kv_bytes"] == kv["reserved_bytes"] <= kv["budget_bytes"]
    assert mem["weight_bytes"] > 0
    assert mem["total_bytes"] == mem["weight_bytes"] + mem["kv_bytes"]
    counts = {r["id"]: r["generated_tokens"] for r in first["rows"]}
    later = rows_until(
        live,
        lambda rows: (
            len(rows) == 2
            and all(r["generated_tokens"] > counts.get(r["id"], 1 << 30) for r in rows)
        ),
    )["models"][0]
    assert all(r["tokens_per_s"] > 0 for r in later["rows"])
    for s in streams:
        s.join(timeout=300)
        assert s.error is None and not s.is_alive()
    after = rows_until(live, lambda rows: rows == [], timeout=30)
    model = after["models"][0]
    assert model["running"] == 0 and model["waiting"] == 0
    # The counters the plots are made of: every token, and both requests' first tokens.
    assert model["tokens_generated"] - tokens_before == 2 * MAX_TOKENS
    for s in streams:
        assert s.usage["completion_tokens"] == MAX_TOKENS
        assert s.usage["prompt_tokens"] == first["rows"][0]["prompt_tokens"]
    time.sleep(1.0)
    history = dashboard(live)["models"][0]["history"]
    assert sum(p["first_tokens"] for p in history) == 2
    assert any(p["tokens_per_s"] > 0 for p in history)
    assert all(p["ttft_s"] is None or p["ttft_s"] > 0 for p in history)
    store = model["store"]
    for key in ("ram_bytes", "ram_entries", "ssd_bytes", "ssd_entries", "hits_ram", "hits_ssd",
                "ssd_restores", "lookups"):  # fmt: skip
        assert key in store
    assert store["lookups"] >= 2 and store["ram_entries"] >= 1 and store["ram_bytes"] > 0


def test_two_streams_show_as_two_growing_rows_then_none(qwen3_server: LiveServer) -> None:
    check_run(qwen3_server)


def test_the_engine_in_a_child_process_answers_the_same(make_server) -> None:
    live = make_server(isolation="process", kv_budget=1 << 30)
    check_run(live)
    assert dashboard(live)["models"][0]["isolation"] == "process"


def test_a_row_past_the_batch_waits_and_speculation_shows(make_server) -> None:
    live = make_server(batch=1)
    body = {**BODY, "max_tokens": 60, "speculative": "ngram"}
    streams = [Stream(live, body), Stream(live, body)]
    for s in streams:
        s.start()
    d = rows_until(live, lambda rows: [r["state"] for r in rows] == ["decode", "waiting"])
    model = d["models"][0]
    running, waiting = model["rows"]
    assert model["running"] == 1 and model["waiting"] == 1 and d["totals"]["waiting"] == 1
    assert running["speculative"] is True and running["speculation"] == "ngram"
    assert waiting["speculative"] is True and waiting["generated_tokens"] == 0
    assert waiting["ttft_s"] is None and waiting["prompt_tokens"] == running["prompt_tokens"]
    for s in streams:
        s.join(timeout=300)
        assert s.error is None and s.usage["completion_tokens"] == 60
    rows_until(live, lambda rows: rows == [], timeout=30)


def test_the_endpoint_needs_the_key_and_the_page_does_not(make_server) -> None:
    live = make_server(api_key="sesame")
    r = httpx.get(live.v1 + "/dashboard", timeout=30)
    assert r.status_code == 401 and r.json()["error"]["message"] == "missing or invalid API key"
    wrong = httpx.get(live.v1 + "/dashboard", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    d = dashboard(live, Authorization="Bearer sesame")
    assert [m["name"] for m in d["models"]] and d["totals"]["running"] == 0
    page = httpx.get(live.url + "/dashboard", timeout=30)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp
    for name in ("dashboard.js", "dashboard.css", "theme.js"):
        r = httpx.get(f"{live.url}/ui/dashboard/{name}", timeout=30)
        assert r.status_code == 200 and len(r.content) > 100, name


def test_no_ui_has_no_dashboard(make_server) -> None:
    live = make_server(no_ui=True)
    assert httpx.get(live.url + "/dashboard", timeout=30).status_code == 404
    assert httpx.get(live.v1 + "/dashboard", timeout=30).status_code == 404


def test_the_pool_models_not_loaded_are_listed(make_server, tiny_model) -> None:
    other = str(tiny_model("llama"))
    live = make_server(models=[other])
    d = dashboard(live)
    assert [m["name"] for m in d["models"]] == [live.state.provider.names[0]]
    assert d["unloaded"] == [{"id": other, "state": "unloaded", "pinned": False,
                              "size_bytes": d["unloaded"][0]["size_bytes"]}]  # fmt: skip
    assert d["unloaded"][0]["size_bytes"] > 0
