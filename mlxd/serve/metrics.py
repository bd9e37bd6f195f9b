"""Prometheus `/metrics`: requests by route and status (an ASGI middleware), per-generation
latency and token counts (`Metrics.finished`, called by every Generation), and the engines'
rows and KV read at scrape time. Each app has its own registry, so servers can share a process.
The request log (request_log.py) hangs off the same two hooks: its middleware and `finished`.

`mlxd_kv_bytes_in_use` is the KV *reservation* admission holds for the running rows (their
worst case, prompt + max_tokens); without a `--kv-budget` / `--memory-budget` nothing is
reserved and it reads 0. Reading the live caches would mean touching MLX arrays off the engine
thread, which the engine forbids: every gauge here reads plain numbers (the engines' and
stores' counters, MLX's allocator), never an MLX array."""

from collections.abc import Iterator
from typing import Any

import mlx.core as mx
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match

from .errors import APIError
from .request_log import RequestLogMiddleware, generation_finished
from .streaming import offload

# 1 ms .. 30 s, roughly x2.5 per step: decode gaps on a GPU through long prefills on a CPU.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0,
)  # fmt: skip
OTHER = "other"  # paths no route knows: one label, so a scanner cannot grow the series
CLIENT_GONE = "499"  # the client went away before any response started (nginx's code)


class EngineCollector:
    """Gauges from every loaded engine's `stats()`, read when scraped."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        lab = ["model"]
        running = GaugeMetricFamily("mlxd_running_rows", "Rows decoding or prefilling", labels=lab)
        waiting = GaugeMetricFamily("mlxd_waiting_rows", "Rows queued for admission", labels=lab)
        in_use = GaugeMetricFamily(
            "mlxd_kv_bytes_in_use",
            "KV bytes reserved for the running rows (worst case; 0 without a KV budget)",
            labels=lab,
        )
        budget = GaugeMetricFamily(
            "mlxd_kv_budget_bytes", "KV budget in bytes (absent without one)", labels=lab
        )
        speed = GaugeMetricFamily(
            "mlxd_tokens_per_second", "Generated tokens per busy second of the engine", labels=lab
        )
        per_token = GaugeMetricFamily(
            "mlxd_kv_bytes_per_token",
            "Bytes one token of context adds to the full-attention KV layers, per KV scheme",
            labels=[*lab, "scheme"],
        )
        loras = GaugeMetricFamily(
            "mlxd_lora_adapters_loaded", "LoRA adapters resident in the engine", labels=lab
        )
        provider = getattr(self.state, "provider", None)
        for served in provider.loaded() if provider is not None else []:
            loras.add_metric([served.name], len(served.engine.adapter_names()))
            stats = served.engine.stats()
            name = [served.name]
            running.add_metric(name, stats["active"])
            waiting.add_metric(name, stats["waiting"])
            in_use.add_metric(name, stats["kv_bytes_reserved"])
            if stats["kv_budget"] is not None:
                budget.add_metric(name, stats["kv_budget"])
            speed.add_metric(name, stats["tokens_per_s"])
            for scheme, n in stats["kv_bytes_per_token"].items():
                per_token.add_metric([*name, scheme], n)
        yield from (running, waiting, in_use, budget, speed, per_token, loras)


class StoreCollector:
    """Each served model's prefix store, by tier."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        tier = ["model", "tier"]
        held = GaugeMetricFamily("mlxd_prefix_store_bytes", "Bytes the store holds", labels=tier)
        count = GaugeMetricFamily("mlxd_prefix_store_entries", "Entries in the store", labels=tier)
        lookups = CounterMetricFamily(
            "mlxd_prefix_store_lookups", "Admissions that looked a prompt up", labels=["model"]
        )
        hits = CounterMetricFamily(
            "mlxd_prefix_store_hits", "Lookups served a prefix, by tier", labels=tier
        )
        tokens = CounterMetricFamily(
            "mlxd_prefix_store_hit_tokens",
            "Prompt tokens served instead of prefilled",
            labels=["model"],
        )
        bad = CounterMetricFamily(
            "mlxd_prefix_store_quarantined", "Disk entries that failed a check", labels=["model"]
        )
        provider = getattr(self.state, "provider", None)
        for served in provider.loaded() if provider is not None else []:
            sharing = served.engine.sharing
            if sharing is None:
                continue
            s = sharing.store.stats()
            name = served.name
            held.add_metric([name, "ram"], s["ram_bytes"])
            count.add_metric([name, "ram"], s["ram_entries"])
            lookups.add_metric([name], s["lookups"])
            hits.add_metric([name, "ram"], s["hits"] - s["ssd_hits"])
            hits.add_metric([name, "ssd"], s["ssd_hits"])
            tokens.add_metric([name], s["hit_tokens"])
            if (ssd := s.get("ssd")) is not None:
                held.add_metric([name, "ssd"], ssd["bytes"])
                count.add_metric([name, "ssd"], ssd["entries"])
                bad.add_metric([name], ssd["quarantined"])
        yield from (held, count, lookups, hits, tokens, bad)


class PoolCollector:
    """The model pool (pool.py): which models are loaded, and why each was unloaded."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        loaded = GaugeMetricFamily("mlxd_model_loaded", "1 while loaded", labels=["model"])
        why = "Model unloads by reason (ttl, budget, request)"
        unloads = CounterMetricFamily("mlxd_model_unloads", why, labels=["model", "reason"])
        pool = getattr(getattr(self.state, "provider", None), "pool", None)
        for entry in list(pool.entries.values()) if pool is not None else []:
            loaded.add_metric([entry.name], 1 if entry.served is not None else 0)
        for (name, reason), n in dict(pool.unloads if pool is not None else {}).items():
            unloads.add_metric([name, reason], n)
        yield from (loaded, unloads)


# MLX's allocator in this process: its buffer cache is what grows on CUDA, where mlxd never
# clears it (`--prefill-clear-cache auto`), so the gauge shows how close the process is to its
# limit.
MEMORY_KINDS = {
    "active": mx.get_active_memory,  # the live arrays: weights, KV, a step's intermediates
    "cache": mx.get_cache_memory,  # freed buffers kept for reuse
    "peak": mx.get_peak_memory,  # active's high-water mark since start
    "limit": mx.get_memory_limit,  # past it the cache is trimmed: --memory-budget or MLX's own
}


class MemoryCollector:
    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "mlxd_mlx_memory_bytes",
            "MLX allocator bytes in this process (every model served here), by kind",
            labels=["kind"],
        )
        for kind, read in MEMORY_KINDS.items():
            gauge.add_metric([kind], read())
        yield gauge


class Metrics:
    def __init__(self, state: Any) -> None:
        self.registry = r = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "mlxd_requests", "HTTP requests by route and status", ["endpoint", "status"], registry=r
        )
        ep = ["endpoint"]

        def latency(name: str, text: str) -> Histogram:
            return Histogram(name, text, ep, buckets=LATENCY_BUCKETS, registry=r)

        self.ttft = latency(
            "mlxd_time_to_first_token_seconds", "Submit to first token, per request"
        )
        self.itl = latency(
            "mlxd_inter_token_latency_seconds",
            "Gaps between a request's tokens as they reach the server",
        )
        # The engine's split of a first token's wait (vLLM's queue / prefill times): what TTFT
        # is made of when many agents arrive at once.
        self.queue = latency(
            "mlxd_request_queue_seconds",
            "Submit to admission into a row, per row that produced a token",
        )
        self.prefill = latency(
            "mlxd_request_prefill_seconds",
            "Admission to the row's first token (prefix fetch, prefill, join), per row",
        )
        self.prompt = Counter("mlxd_prompt_tokens", "Prompt tokens", ep, registry=r)
        self.cached = Counter(
            "mlxd_cached_prompt_tokens", "Prompt tokens served from the cache", ep, registry=r
        )
        self.generated = Counter("mlxd_generation_tokens", "Generated tokens", ep, registry=r)
        spec = "mlxd_spec_draft_tokens", "mlxd_spec_accepted_tokens"  # speculative decoding
        self.drafted = Counter(spec[0], "Draft tokens the model verified", ep, registry=r)
        self.accepted = Counter(spec[1], "Draft tokens the model kept", ep, registry=r)
        self.finished_total = Counter(
            "mlxd_requests_finished",
            "Finished rows (each of n choices) by finish reason",
            ["endpoint", "reason"],
            registry=r,
        )
        r.register(EngineCollector(state))
        r.register(StoreCollector(state))
        r.register(PoolCollector(state))
        r.register(MemoryCollector())

    def install(self, app: Any) -> None:
        """Outermost middleware: it also sees the 401s and CORS answers given before routing;
        the request log outside it (each request's line, its X-Request-Id)."""
        app.add_middleware(MetricsMiddleware, metrics=self, router=app.router)
        app.add_middleware(RequestLogMiddleware)

    def finished(self, gen: Any) -> None:
        generation_finished(gen)
        ep = gen.endpoint or OTHER
        if gen.ttft_s is not None:
            self.ttft.labels(ep).observe(gen.ttft_s)
        itl = self.itl.labels(ep)
        for gap in gen.gaps:
            itl.observe(gap)
        for done in (h.done for h in gen.handles):
            if done is not None and done.completion_tokens and done.timings:
                t = done.timings
                self.queue.labels(ep).observe(t["queue_s"])
                self.prefill.labels(ep).observe(t["ttft_s"] - t["queue_s"])
        u = gen.usage
        self.prompt.labels(ep).inc(u.prompt_tokens)
        self.cached.labels(ep).inc(u.cached_tokens)
        self.generated.labels(ep).inc(u.completion_tokens)
        self.drafted.labels(ep).inc(u.drafted_tokens)
        self.accepted.labels(ep).inc(u.accepted_tokens)
        reasons = list(gen.finish_reasons)
        reasons += ["cancelled"] * (len(gen.handles) - len(reasons))  # abandoned rows
        for reason in reasons:
            self.finished_total.labels(ep, reason or "unknown").inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def route_template(router: Any, scope: dict) -> str:
    """The path template of the route a request hits (a 405 counts under its path too)."""
    partial = None
    for route in router.routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return getattr(route, "path", OTHER)
        if match is Match.PARTIAL and partial is None:
            partial = getattr(route, "path", OTHER)
    return partial or OTHER


class MetricsMiddleware:
    """Pure ASGI (a BaseHTTPMiddleware would buffer streams): counts when the response starts,
    so a client that has its answer also finds it counted."""

    def __init__(self, app: Any, metrics: Metrics, router: Any) -> None:
        self.app, self.metrics, self.router = app, metrics, router

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        endpoint = route_template(self.router, scope)
        started = False

        async def counting_send(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                self.metrics.requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            if not started:
                self.metrics.requests.labels(endpoint, CLIENT_GONE).inc()


async def metrics_endpoint(request: Request) -> Response:
    metrics = request.app.state.mlxd.metrics
    if metrics is None:
        raise APIError(404, "metrics are not enabled")
    body = await offload(metrics.exposition)  # stats() takes the engines' locks
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def add_routes(app: Any) -> None:
    app.add_api_route("/metrics", metrics_endpoint, methods=["GET"], include_in_schema=False)
