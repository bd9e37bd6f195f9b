"""`/metrics`: the exposition parses, and its counts equal what the test sent and what the
responses reported (requests by route and status, tokens, latency histogram counts, rows)."""

import json
import threading
import time
from collections import Counter

import httpx
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from prometheus_client.parser import text_string_to_metric_families

MESSAGES = [{"role": "user", "content": "Count to three."}]
NO_EOS = {"151643": -100, "151645": -100}  # Qwen3's end tokens: generation runs to max_tokens

Samples = dict[tuple[str, frozenset], float]


def scrape(url: str) -> Samples:
    r = httpx.get(url + "/metrics", timeout=30)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s series whose labels include `labels` (PromQL's `sum by`)."""
    want = frozenset(labels.items())
    return sum(v for (n, labs), v in samples.items() if n == name and want <= labs)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def stream_usage(url: str, body: dict) -> tuple[dict, str]:
    """Usage and finish reason of a streamed request (include_usage)."""
    usage, finish = None, None
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url, json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            frame = json.loads(line[6:])
            if frame.get("usage"):
                usage = frame["usage"]
            for choice in frame["choices"]:
                finish = choice["finish_reason"] or finish
    assert usage is not None and finish is not None
    return usage, finish


def test_counts_match_what_was_sent(qwen3_server) -> None:
    url = qwen3_server.url
    before = scrape(url)
    usages: dict[str, list[dict]] = {"chat": [], "completions": []}
    reasons: Counter[tuple[str, str]] = Counter()
    with httpx.Client(timeout=60) as c:
        for max_tokens in (3, 4, 5):
            r = c.post(
                url + "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": max_tokens}
            )
            assert r.status_code == 200
            usages["chat"].append(r.json()["usage"])
            reasons["chat", r.json()["choices"][0]["finish_reason"]] += 1
        usage, finish = stream_usage(
            url + "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4}
        )
        usages["chat"].append(usage)
        reasons["chat", finish] += 1
        r = c.post(url + "/v1/completions", json={"prompt": "Once upon", "max_tokens": 6})
        assert r.status_code == 200
        usages["completions"].append(r.json()["usage"])
        reasons["completions", r.json()["choices"][0]["finish_reason"]] += 1
        assert (
            c.post(
                url + "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 0}
            ).status_code
            == 400
        )
        assert c.get(url + "/v1/no-such-route").status_code == 404
        assert c.get(url + "/no/such/path/either").status_code == 404
        assert c.get(url + "/v1/chat/completions").status_code == 405
    after = scrape(url)

    def requests(endpoint: str, status: str, **model: str) -> float:
        labels = {"endpoint": endpoint, "status": status, **model}
        return delta(before, after, "mlxd_requests_total", **labels)

    # Every request-level series carries the served model's name (test_metrics_per_model.py
    # tells two models apart); a request no model answered counts under "".
    model = qwen3_server.state.provider.default.name
    assert requests("/v1/chat/completions", "200", model=model) == 4
    assert requests("/v1/completions", "200", model=model) == 1
    assert requests("/v1/chat/completions", "400") == 1
    assert requests("/v1/chat/completions", "405") == 1
    assert requests("other", "404", model="") == 2  # unknown paths share one label
    assert requests("/metrics", "200", model="") == 1  # the first scrape (this one after it)
    endpoints = {dict(k[1]).get("endpoint") for k in after if k[0] == "mlxd_requests_total"}
    assert not {"/v1/no-such-route", "/no/such/path/either"} & endpoints

    for ep, sent in usages.items():
        prompt = sum(u["prompt_tokens"] for u in sent)
        generated = sum(u["completion_tokens"] for u in sent)
        cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in sent)
        lab = {"endpoint": ep, "model": model}
        assert delta(before, after, "mlxd_prompt_tokens_total", **lab) == prompt
        assert delta(before, after, "mlxd_generation_tokens_total", **lab) == generated
        assert delta(before, after, "mlxd_cached_prompt_tokens_total", **lab) == cached
        # One first token per request; every later token is one gap.
        ttft = delta(before, after, "mlxd_time_to_first_token_seconds_count", **lab)
        assert ttft == len(sent)
        gaps = delta(before, after, "mlxd_inter_token_latency_seconds_count", **lab)
        assert gaps == generated - len(sent)
        ttft_s = delta(before, after, "mlxd_time_to_first_token_seconds_sum", **lab)
        assert ttft_s > 0
        # The engine's split of each first token's wait: one queue and one prefill time per
        # row, inside the server's TTFT (it starts earlier, at the request's submit).
        waits = {}
        for part in ("queue", "prefill"):
            name = f"mlxd_request_{part}_seconds"
            assert delta(before, after, name + "_count", **lab) == len(sent)
            waits[part] = delta(before, after, name + "_sum", **lab)
            assert waits[part] >= 0
        assert 0 < waits["queue"] + waits["prefill"] <= ttft_s
    for (ep, reason), n in reasons.items():
        reason = "stop" if reason == "tool_calls" else reason
        lab = {"endpoint": ep, "reason": reason, "model": model}
        assert delta(before, after, "mlxd_requests_finished_total", **lab) == n, (ep, reason)
    assert sum(reasons.values()) == 5


def test_histogram_buckets_are_cumulative_and_bounded(qwen3_server) -> None:
    httpx.post(
        qwen3_server.v1 + "/chat/completions",
        json={"messages": MESSAGES, "max_tokens": 3},
        timeout=60,
    ).raise_for_status()
    samples = scrape(qwen3_server.url)
    name = "mlxd_inter_token_latency_seconds_bucket"
    buckets = sorted(
        (float(dict(k[1])["le"]), v)
        for k, v in samples.items()
        if k[0] == name and dict(k[1])["endpoint"] == "chat"
    )
    bounds = [b for b, _ in buckets]
    assert bounds[0] == 0.001 and bounds[-2] == 30.0 and bounds[-1] == float("inf")
    counts = [v for _, v in buckets]
    assert counts == sorted(counts) and counts[-1] > 0
    assert counts[-1] == value(samples, "mlxd_inter_token_latency_seconds_count", endpoint="chat")


def test_engine_gauges_while_a_row_runs(make_server, qwen3_server) -> None:
    """A second server in the same process has its own registry: nothing leaks between them."""
    budget = 64 << 20
    live = make_server(kv_budget=budget)
    model = live.state.provider.default.name
    idle = scrape(live.url)
    assert value(idle, "mlxd_kv_budget_bytes", model=model) == budget
    assert value(idle, "mlxd_running_rows", model=model) == 0
    assert value(idle, "mlxd_kv_bytes_in_use", model=model) == 0
    assert not any(k[0] == "mlxd_prompt_tokens_total" for k in idle)  # the other server's
    served = live.state.provider.default.model  # mlx-lm's caches after 256 tokens, measured
    cache = make_prompt_cache(served)
    served(mx.arange(256)[None], cache=cache)
    mx.eval([c.state for c in cache])
    per_token = sum(c.nbytes for c in cache) / 256
    assert value(idle, "mlxd_kv_bytes_per_token", model=model, scheme="unquantized") == per_token
    body = {"messages": MESSAGES, "max_tokens": 400, "logit_bias": NO_EOS, "stream": True}
    with httpx.stream("POST", live.v1 + "/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        busy = scrape(live.url)
    assert value(busy, "mlxd_running_rows", model=model) == 1
    assert value(busy, "mlxd_waiting_rows", model=model) == 0
    assert 0 < value(busy, "mlxd_kv_bytes_in_use", model=model) <= budget
    deadline = time.time() + 10
    while value(scrape(live.url), "mlxd_running_rows", model=model) != 0:
        assert time.time() < deadline, "the closed stream's row kept running"
        time.sleep(0.1)


def post_quietly(v1: str, body: dict) -> None:
    """A client that gives up after 3 s (its row is cancelled then)."""
    try:
        httpx.post(v1 + "/chat/completions", json=body, timeout=3)
    except httpx.TimeoutException:
        pass


def test_waiting_rows_gauge(make_server) -> None:
    live = make_server(batch=1)
    model = live.state.provider.default.name
    body = {"messages": MESSAGES, "max_tokens": 300, "logit_bias": NO_EOS}
    threads = [threading.Thread(target=post_quietly, args=(live.v1, body)) for _ in range(2)]
    for t in threads:
        t.start()
    # Both requests are in the engine once one runs and one waits; a loaded CI box can take
    # seconds to get there (tokenizing, admitting), so the wait is long and the pair is checked.
    deadline, seen = time.time() + 60, None
    while time.time() < deadline:
        seen = scrape(live.url)
        if value(seen, "mlxd_waiting_rows", model=model) == 1 and (
            value(seen, "mlxd_running_rows", model=model) == 1
        ):
            break
        time.sleep(0.05)
    assert value(seen, "mlxd_running_rows", model=model) == 1
    assert value(seen, "mlxd_waiting_rows", model=model) == 1
    for t in threads:
        t.join()


def test_prefix_store_metrics_count_the_hits(make_server) -> None:
    live = make_server()
    url = live.url + "/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": "Name three sorting algorithms."}]}
    before = scrape(live.url)
    cached = []
    for _ in range(3):
        r = httpx.post(url, json={**body, "max_tokens": 3}, timeout=60)
        cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    after = scrape(live.url)
    model = live.state.provider.default.name
    assert delta(before, after, "mlxd_prefix_store_lookups_total", model=model) == 3
    assert delta(before, after, "mlxd_prefix_store_hits_total", model=model, tier="ram") == 2
    hit_tokens = delta(before, after, "mlxd_prefix_store_hit_tokens_total", model=model)
    assert hit_tokens == sum(cached) > 0
    stored = value(after, "mlxd_prefix_store_bytes", model=model, tier="ram")
    assert stored == live.state.provider.default.engine.sharing.store.ram.nbytes > 0


def test_mlx_memory_gauge_reads_the_allocator(make_server) -> None:
    """The limit is --memory-budget's; active holds at least the weights; the peak never reads
    below active, and a request's step leaves buffers in the cache or on the peak."""
    from mlx.utils import tree_flatten

    live = make_server(memory_budget="3000000000")
    weights = sum(v.nbytes for _, v in tree_flatten(live.state.provider.default.model.parameters()))
    before = scrape(live.url)
    assert value(before, "mlxd_mlx_memory_bytes", kind="limit") == 3_000_000_000
    assert value(before, "mlxd_mlx_memory_bytes", kind="active") >= weights
    body = {"messages": MESSAGES, "max_tokens": 8}
    assert httpx.post(live.v1 + "/chat/completions", json=body, timeout=60).status_code == 200
    after = scrape(live.url)
    assert value(after, "mlxd_mlx_memory_bytes", kind="peak") >= value(
        after, "mlxd_mlx_memory_bytes", kind="active"
    )
    assert value(after, "mlxd_mlx_memory_bytes", kind="peak") > weights
