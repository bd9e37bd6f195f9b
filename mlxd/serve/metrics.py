"""Prometheus `/metrics`: requests by route, status and model (an ASGI middleware),
per-generation latency and token counts by endpoint and model (`Metrics.finished`, called by
every Generation), and the series read at scrape time (metrics_collectors.py). Each app has its
own registry, so servers can share a process. The request log (request_log.py) hangs off the
same two hooks: its middleware and `finished`.

The `model` label is the served model's id as /v1/models lists it (an adapter of
--lora-modules: the adapter's). A request answered before any model was chosen (a 404 for an
unknown name, /health, /metrics) counts under model "": the requested name is the client's
text, and a scanner could grow the series without end."""

from contextvars import ContextVar
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match

from .errors import APIError
from .metrics_collectors import EngineCollector, MemoryCollector, PoolCollector, StoreCollector
from .request_log import RequestLogMiddleware, generation_finished
from .streaming import offload

# 1 ms .. 30 s, roughly x2.5 per step: decode gaps on a GPU through long prefills on a CPU.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0,
)  # fmt: skip
OTHER = "other"  # paths no route knows: one label, so a scanner cannot grow the series
CLIENT_GONE = "499"  # the client went away before any response started (nginx's code)
NO_MODEL = ""  # a request answered before a model was chosen

# The request being handled: its model's label once one is chosen (a list, so the handler's
# tasks write what the middleware reads).
_chosen: ContextVar[list[str] | None] = ContextVar("mlxd_metrics_model", default=None)


def model_label(served: Any) -> str:
    """A served model's `model` label: the id /v1/models lists for it (--lora-modules routes
    to the base model's Served with `adapter` set, and the adapter is what was named)."""
    return served.adapter or served.name


def note_model(served: Any) -> None:
    """The request being handled runs on `served`: its mlxd_requests_total counts under it."""
    slot = _chosen.get()
    if slot is not None:
        slot[0] = model_label(served)


class Metrics:
    def __init__(self, state: Any) -> None:
        self.registry = r = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "mlxd_requests",
            "HTTP requests by route, status and model",
            ["endpoint", "status", "model"],
            registry=r,
        )
        ep = ["endpoint", "model"]

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
            ["endpoint", "reason", "model"],
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

    def started(self, gen: Any) -> None:
        """A Generation was made for the request being handled (before its answer starts)."""
        note_model(gen.served)

    def finished(self, gen: Any) -> None:
        generation_finished(gen)
        ep = (gen.endpoint or OTHER, model_label(gen.served))
        if gen.ttft_s is not None:
            self.ttft.labels(*ep).observe(gen.ttft_s)
        itl = self.itl.labels(*ep)
        for gap in gen.gaps:
            itl.observe(gap)
        for done in (h.done for h in gen.handles):
            if done is not None and done.completion_tokens and done.timings:
                t = done.timings
                self.queue.labels(*ep).observe(t["queue_s"])
                self.prefill.labels(*ep).observe(t["ttft_s"] - t["queue_s"])
        u = gen.usage
        self.prompt.labels(*ep).inc(u.prompt_tokens)
        self.cached.labels(*ep).inc(u.cached_tokens)
        self.generated.labels(*ep).inc(u.completion_tokens)
        self.drafted.labels(*ep).inc(u.drafted_tokens)
        self.accepted.labels(*ep).inc(u.accepted_tokens)
        reasons = list(gen.finish_reasons)
        reasons += ["cancelled"] * (len(gen.handles) - len(reasons))  # abandoned rows
        for reason in reasons:
            self.finished_total.labels(ep[0], reason or "unknown", ep[1]).inc()

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
    so a client that has its answer also finds it counted; by then a streamed answer's model is
    chosen (`note_model`, through `Metrics.started`)."""

    def __init__(self, app: Any, metrics: Metrics, router: Any) -> None:
        self.app, self.metrics, self.router = app, metrics, router

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        endpoint = route_template(self.router, scope)
        started = False
        model = [NO_MODEL]

        async def counting_send(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                self.metrics.requests.labels(endpoint, str(message["status"]), model[0]).inc()
            await send(message)

        token = _chosen.set(model)
        try:
            await self.app(scope, receive, counting_send)
        finally:
            _chosen.reset(token)
            if not started:
                self.metrics.requests.labels(endpoint, CLIENT_GONE, model[0]).inc()


async def metrics_endpoint(request: Request) -> Response:
    metrics = request.app.state.mlxd.metrics
    if metrics is None:
        raise APIError(404, "metrics are not enabled")
    body = await offload(metrics.exposition)  # stats() takes the engines' locks
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def add_routes(app: Any) -> None:
    app.add_api_route("/metrics", metrics_endpoint, methods=["GET"], include_in_schema=False)
