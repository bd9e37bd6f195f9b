"""`/metrics` by model: a pool of two tiny models (qwen3 and llama on the qwen3 tokenizer)
answers requests to each, and every request-level series counts each request under the model
that served it (requests by route and status, tokens, latency histograms, finished rows), a
name given by alias under the model's name, embeddings too; a request refused before a model
was chosen counts under model ""; a --lora-modules adapter counts under its own name; an
engine's restarts show as `mlxd_engine_restarts_total{model}`."""

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures.adapters import tiny_adapter_dir
from serve.conftest import LiveServer, start_server
from serve.test_metrics import delta, scrape, stream_usage, value

MESSAGES = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def pool(tiny_model, tmp_path_factory) -> Iterator[LiveServer]:
    """qwen (the default) and llama (alias `l`), both loaded on their first request."""
    tmp = tmp_path_factory.mktemp("pool")
    entries = [
        {"name": "qwen", "path": str(tiny_model("qwen3")), "pinned": True},
        {"name": "llama", "path": str(tiny_model("llama")), "aliases": ["l"]},
    ]
    (tmp / "models.json").write_text(json.dumps(entries))
    live = start_server(model=None, models_file=str(tmp / "models.json"), strict_model_names=True,
                        data_dir=str(tmp / "data"))  # fmt: skip
    yield live
    live.stop()


def test_each_model_counts_its_own_requests(pool) -> None:
    url = pool.url
    before = scrape(url)
    sent: dict[tuple[str, str], list[dict]] = {}  # (endpoint, model) -> usages
    reasons: Counter[tuple[str, str, str]] = Counter()
    with httpx.Client(timeout=60) as c:
        for model, path, body in [
            ("qwen", "/chat/completions", {"messages": MESSAGES, "max_tokens": 3}),
            ("llama", "/chat/completions", {"messages": MESSAGES, "max_tokens": 5}),
            ("llama", "/completions", {"prompt": "Once upon", "max_tokens": 6}),
        ]:
            name = "l" if model == "llama" else model  # an alias counts under the model's name
            r = c.post(pool.v1 + path, json={**body, "model": name})
            assert r.status_code == 200, r.text
            ep = "chat" if path == "/chat/completions" else "completions"
            sent.setdefault((ep, model), []).append(r.json()["usage"])
            reasons[ep, model, r.json()["choices"][0]["finish_reason"]] += 1
        # Streamed: the answer starts before the row ends, and still counts under its model.
        body = {"model": "qwen", "messages": MESSAGES, "max_tokens": 4}
        usage, finish = stream_usage(pool.v1 + "/chat/completions", body)
        sent["chat", "qwen"].append(usage)
        reasons["chat", "qwen", finish] += 1
        body = {"model": "no-such-model", "messages": MESSAGES, "max_tokens": 3}
        assert c.post(pool.v1 + "/chat/completions", json=body).status_code == 404
        # No Generation runs for embeddings: the endpoint names the model itself.
        r = c.post(pool.v1 + "/embeddings", json={"model": "l", "input": "a colour"})
        assert r.status_code == 200, r.text
    after = scrape(url)

    def requests(endpoint: str, status: str, model: str) -> float:
        labels = {"endpoint": endpoint, "status": status, "model": model}
        return delta(before, after, "mlxd_requests_total", **labels)

    assert requests("/v1/chat/completions", "200", "qwen") == 2
    assert requests("/v1/chat/completions", "200", "llama") == 1
    assert requests("/v1/completions", "200", "llama") == 1
    assert requests("/v1/completions", "200", "qwen") == 0
    assert requests("/v1/chat/completions", "404", "") == 1  # no model was chosen
    assert requests("/v1/embeddings", "200", "llama") == 1
    assert requests("/metrics", "200", "") == 1  # the first scrape
    models = {dict(k[1])["model"] for k in after if k[0] == "mlxd_requests_total"}
    assert models == {"qwen", "llama", ""}  # neither the alias nor the unknown name

    for (ep, model), usages in sent.items():
        lab = {"endpoint": ep, "model": model}
        generated = sum(u["completion_tokens"] for u in usages)
        prompt = sum(u["prompt_tokens"] for u in usages)
        cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
        assert generated > len(usages)  # some gaps to count
        assert delta(before, after, "mlxd_prompt_tokens_total", **lab) == prompt
        assert delta(before, after, "mlxd_generation_tokens_total", **lab) == generated
        assert delta(before, after, "mlxd_cached_prompt_tokens_total", **lab) == cached
        assert delta(before, after, "mlxd_spec_draft_tokens_total", **lab) == 0
        ttft = delta(before, after, "mlxd_time_to_first_token_seconds_count", **lab)
        assert ttft == len(usages), (ep, model)
        gaps = delta(before, after, "mlxd_inter_token_latency_seconds_count", **lab)
        assert gaps == generated - len(usages), (ep, model)
        for part in ("queue", "prefill"):
            count = delta(before, after, f"mlxd_request_{part}_seconds_count", **lab)
            assert count == len(usages), (part, ep, model)
        # The histogram's +Inf bucket holds every observation of that model's series.
        inf = {**lab, "le": "+Inf"}
        assert delta(before, after, "mlxd_time_to_first_token_seconds_bucket", **inf) == ttft
    for (ep, model, reason), n in reasons.items():
        lab = {"endpoint": ep, "model": model, "reason": reason}
        assert delta(before, after, "mlxd_requests_finished_total", **lab) == n
    assert value(after, "mlxd_generation_tokens_total", endpoint="completions", model="qwen") == 0


class Restarted:
    """The served engine as one that runs in a child process sees it after two restarts."""

    restarts = 2

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def test_engine_restarts_by_model(pool) -> None:
    provider = pool.state.provider
    provider.load("qwen")
    provider.load("llama")
    served = provider.pool.find("llama").served
    real = served.engine
    served.engine = Restarted(real)
    try:
        text = httpx.get(pool.url + "/metrics", timeout=30).text
    finally:
        served.engine = real
    lines = text.splitlines()
    assert "# TYPE mlxd_engine_restarts_total counter" in lines
    assert 'mlxd_engine_restarts_total{model="llama"} 2.0' in lines
    assert 'mlxd_engine_restarts_total{model="qwen"} 0.0' in lines  # an in-process engine
    again = scrape(pool.url)
    assert value(again, "mlxd_engine_restarts_total", model="llama") == 0


def test_an_adapter_counts_under_its_name(make_server, qwen3_model_dir: Path) -> None:
    adapter = tiny_adapter_dir(qwen3_model_dir, "lora", seed=1)
    live = make_server(lora_modules=[f"a={adapter}"])
    base = live.state.provider.default.name
    before = scrape(live.url)
    body = {"model": "a", "messages": MESSAGES, "max_tokens": 4}
    r = httpx.post(live.v1 + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    after = scrape(live.url)
    generated = r.json()["usage"]["completion_tokens"]
    assert generated > 0
    assert delta(before, after, "mlxd_generation_tokens_total", endpoint="chat", model="a") == (
        generated
    )
    assert delta(before, after, "mlxd_generation_tokens_total", model=base) == 0
    labels = {"endpoint": "/v1/chat/completions", "status": "200", "model": "a"}
    assert delta(before, after, "mlxd_requests_total", **labels) == 1
