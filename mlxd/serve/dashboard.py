"""The live dashboard at `/dashboard`: what the engines are doing, from a JSON endpoint.

`GET /v1/dashboard` (behind --api-key) answers, per loaded model, its rows (engine/snapshot.py),
queue, KV budget, memory and prefix-store counters, plus tokens/s and TTFT over the last
minutes: samples of each engine's token counter and of the TTFT histogram (metrics.py), taken
when the endpoint is polled. The page's static files are under `/ui/dashboard/`."""

import time
from collections import deque
from importlib import resources
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from .metrics import model_label
from .metrics_collectors import MEMORY_KINDS
from .streaming import offload

WINDOW_S = 300.0  # the plots' span
MIN_GAP_S = 0.9  # one sample a second, however many pages poll
STATIC = resources.files("mlxd.serve") / "dashboard_static"
# The page runs only its own script and talks only to this server.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)


class History:
    """Per model: (time, tokens generated so far, TTFT sum, TTFT count) samples; each point
    between two samples is a rate of tokens and the mean TTFT of the requests in between."""

    def __init__(self) -> None:
        self.samples: dict[str, deque[tuple[float, int, float, int]]] = {}

    def add(self, name: str, now: float, tokens: int, ttft: tuple[float, int]) -> None:
        ring = self.samples.setdefault(name, deque(maxlen=int(WINDOW_S / MIN_GAP_S) + 2))
        if ring and now - ring[-1][0] < MIN_GAP_S:
            return
        ring.append((now, tokens, *ttft))
        while ring and now - ring[0][0] > WINDOW_S + MIN_GAP_S:
            ring.popleft()

    def points(self, name: str) -> list[dict[str, Any]]:
        ring = list(self.samples.get(name, ()))
        out = []
        for (t0, n0, s0, c0), (t1, n1, s1, c1) in zip(ring, ring[1:], strict=False):
            # a restarted engine process counts from zero again: no negative rates
            rate = max(0, n1 - n0) / (t1 - t0)
            ttft = (s1 - s0) / (c1 - c0) if c1 > c0 else None
            out.append({"t": round(t1, 3), "tokens_per_s": round(rate, 2),
                        "ttft_s": round(ttft, 4) if ttft is not None else None,
                        "first_tokens": max(0, c1 - c0)})  # fmt: skip
        return out

    def forget(self, keep: set[str]) -> None:
        for name in set(self.samples) - keep:
            del self.samples[name]


def combined(series: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The models' points summed by sample time (one poll samples every model at one time):
    tokens/s added, TTFT weighted by each model's first tokens."""
    by_t: dict[float, list[float]] = {}
    for points in series:
        for p in points:
            acc = by_t.setdefault(p["t"], [0.0, 0.0, 0])
            acc[0] += p["tokens_per_s"]
            if p["ttft_s"] is not None:
                acc[1] += p["ttft_s"] * p["first_tokens"]
                acc[2] += p["first_tokens"]
    return [{"t": t, "tokens_per_s": round(rate, 2), "first_tokens": int(n),
             "ttft_s": round(total / n, 4) if n else None}
            for t, (rate, total, n) in sorted(by_t.items())]  # fmt: skip


def _ttft(metrics: Any, label: str) -> tuple[float, int]:
    """The TTFT histogram's sum and count for one model, over its endpoints."""
    total, count = 0.0, 0
    if metrics is None:
        return total, count
    for family in metrics.ttft.collect():
        for s in family.samples:
            if s.labels.get("model") != label:
                continue
            if s.name.endswith("_sum"):
                total += s.value
            elif s.name.endswith("_count"):
                count += int(s.value)
    return total, count


def store_stats(raw: dict[str, Any] | None) -> dict[str, Any] | None:
    """The prefix store's counters as the page shows them (the store's own dict in `raw`)."""
    if not raw:
        return None
    ssd = raw.get("ssd") or {}
    hits, ssd_hits = int(raw.get("hits", 0)), int(raw.get("ssd_hits", 0))
    return {
        "ram_bytes": int(raw.get("ram_bytes", 0)),
        "ram_bytes_max": raw.get("ram_bytes_max"),
        "ram_entries": int(raw.get("ram_entries", 0)),
        "ssd_bytes": int(ssd.get("bytes", 0)) if ssd else None,
        "ssd_entries": int(ssd.get("entries", 0)) if ssd else None,
        "lookups": int(raw.get("lookups", 0)),
        "hits": hits,
        "hits_ram": hits - ssd_hits,
        "hits_ssd": ssd_hits,
        "hit_tokens": int(raw.get("hit_tokens", 0)),
        "ssd_restores": int(ssd.get("restored", 0)) if ssd else 0,
        "raw": raw,
    }


def _model(served: Any, state: Any, history: History, now: float) -> dict[str, Any]:
    engine = served.engine
    stats = engine.stats()
    rows = engine.rows_snapshot()
    sharing = getattr(engine, "sharing", None)
    store = sharing.store.stats() if sharing is not None else None
    reserved = int(stats.get("kv_bytes_reserved") or 0)
    # The rows' tokens in cache at the unquantized rate: an estimate, for servers with no KV
    # budget (their admission reserves nothing).
    per_token = (stats.get("kv_bytes_per_token") or {}).get("unquantized") or 0
    in_cache = sum(r["prefilled_tokens"] + r["generated_tokens"] for r in rows)
    in_use = int(in_cache * per_token)
    kv = reserved if stats.get("kv_budget") else in_use
    label = model_label(served)
    history.add(label, now, int(stats.get("tokens_generated") or 0), _ttft(state.metrics, label))
    points = history.points(label)
    return {
        "name": served.name,
        "adapter": served.adapter,
        "alive": bool(engine.alive),
        "down_reason": getattr(engine, "down_reason", None),
        "isolation": "process" if served.model is None else "thread",
        "rows": rows,
        "running": sum(r["state"] != "waiting" for r in rows),
        "waiting": sum(r["state"] == "waiting" for r in rows),
        "batch": getattr(engine, "batch", None),
        "tokens_generated": int(stats.get("tokens_generated") or 0),
        "tokens_per_s": points[-1]["tokens_per_s"] if points else 0.0,
        "history": points,
        "kv": {
            "reserved_bytes": reserved,
            "budget_bytes": stats.get("kv_budget"),
            "in_use_bytes": in_use,
            "bytes_per_token": stats.get("kv_bytes_per_token"),
        },
        "memory": {
            "weight_bytes": int(served.weight_bytes),
            "kv_bytes": kv,
            "total_bytes": int(served.weight_bytes) + kv,
        },  # fmt: skip
        "store": store_stats(store),
    }


def snapshot(state: Any, history: History) -> dict[str, Any]:
    """The whole dashboard: loaded models, the pool's other models, this process's memory."""
    now = time.time()
    models = [_model(served, state, history, now) for served in state.provider.loaded()]
    history.forget({m["adapter"] or m["name"] for m in models})
    loaded = {m["name"] for m in models}
    entries = list(state.provider.pool.entries.values())
    others = [{"id": e.name, "state": e.state, "size_bytes": e.size(), "pinned": e.spec.pinned}
              for e in entries if e.name not in loaded]  # fmt: skip
    return {
        "time": round(now, 3),
        "uptime_s": round(now - state.started, 1),
        "window_s": WINDOW_S,
        "models": models,
        "unloaded": others,
        "totals": {
            "running": sum(m["running"] for m in models),
            "waiting": sum(m["waiting"] for m in models),
            "tokens_per_s": round(sum(m["tokens_per_s"] for m in models), 2),
            "history": combined([m["history"] for m in models]),
        },
        "process_memory": {kind: int(read()) for kind, read in MEMORY_KINDS.items()},
    }


async def dashboard_json(request: Request) -> JSONResponse:
    state = request.app.state.mlxd
    history: History = request.app.state.dashboard_history
    # an engine process answers over its socket: off the event loop
    return JSONResponse(await offload(lambda: snapshot(state, history)))


async def dashboard_page(_: Request) -> Response:
    headers = {"Content-Security-Policy": CSP, "Cache-Control": "no-cache"}
    return FileResponse(str(STATIC / "index.html"), headers=headers)


def add_routes(app: FastAPI) -> None:
    """The JSON endpoint, the page and its static files."""
    app.state.dashboard_history = History()
    app.add_api_route("/v1/dashboard", dashboard_json, methods=["GET"], include_in_schema=False)
    app.add_api_route("/dashboard", dashboard_page, methods=["GET"], include_in_schema=False)
    # First in the routes: a mount of the chat page's `/ui` would otherwise take these paths.
    files = Mount("/ui/dashboard", StaticFiles(directory=str(STATIC)), name="dashboard-static")
    app.router.routes.insert(0, files)
