"""The ASGI app: each API's routes, errors in each API's shape, CORS and the API key, and what
the handlers share (`ServerState`); `/v1/models` and `/health` are here too."""

import contextlib
import hmac
import json
import logging
import platform
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
from fastapi import FastAPI
from mlx_lm import __version__ as mlx_lm_version
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..config import ServeConfig
from .errors import (
    APIError,
    anthropic_body,
    error_response,
    is_anthropic_path,
    openai_body,
    read_json,
)
from .limits import ReleaseAfterLargeBodies
from .openapi import operation
from .provider import ModelProvider, context_length
from .schemas import body_schema
from .streaming import offload

log = logging.getLogger("mlxd.serve")


def system_fingerprint() -> str:
    """mlx_lm.server's fingerprint: versions, platform and the device architecture."""
    try:
        arch = mx.device_info().get("architecture", "")
    except Exception:  # noqa: BLE001 - some backends have no device info
        arch = ""
    return f"{mlx_lm_version}-{mx.__version__}-{platform.platform()}-{arch}"


@dataclass
class ServerState:
    config: ServeConfig
    provider: ModelProvider
    metrics: Any = None  # metrics.Metrics
    store: Any = None  # responses_store.ResponseStore
    jobs: Any = None  # jobs.manager.JobManager
    started: float = field(default_factory=time.time)
    fingerprint: str = field(default_factory=system_fingerprint)

    def close(self) -> None:
        """Jobs first (a running one is failed as `server_restarted`), then the engines."""
        if self.jobs is not None:
            self.jobs.close()
        self.provider.close()


def build_app(state: ServerState) -> FastAPI:
    from . import (  # they import ServerState
        anthropic_api,
        embeddings_api,
        lora,
        metrics,
        openai_api,
        responses_api,
    )
    from .jobs import routes as jobs_routes

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        # uvicorn re-raises SIGTERM after shutdown, so `serve`'s finally never runs then: stop
        # the engines and flush the disk tier's queue here (close() is idempotent).
        await offload(state.close)

    app = FastAPI(title="mlxd", version="0.1.0", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.mlxd = state
    for path, endpoint, schema in (
        ("/v1/chat/completions", openai_api.chat_completions, "chat"),
        ("/chat/completions", openai_api.chat_completions, "chat"),
        ("/v1/completions", openai_api.completions, "completions"),
    ):
        extra = {**body_schema(schema), **operation(path, schema, stream=True)}
        app.add_api_route(
            path, endpoint, methods=["POST"], openapi_extra=extra, response_model=None
        )
    for path, endpoint, ok, params in (
        ("/v1/models", list_models, "models", {}),
        ("/v1/models/{model_id:path}", get_model, "model", {"model_id": "A model's id"}),
        ("/health", health, "health", {}),
    ):
        extra = operation(path, ok, **params)
        app.add_api_route(path, endpoint, methods=["GET"], openapi_extra=extra)
    anthropic_api.add_routes(app)
    embeddings_api.add_routes(app)
    responses_api.add_routes(app, state)
    metrics.add_routes(app)
    lora.add_routes(app)
    jobs_routes.add_routes(app, state)
    if not state.config.no_ui:  # the chat page and the live dashboard (static files, no key)
        from . import dashboard, ui

        ui.add_routes(app)
        dashboard.add_routes(app)
    pool_routes = {"/v1/models/load": load_model, "/v1/models/unload": unload_model}
    for path, endpoint in pool_routes.items():  # llama.cpp's router paths too
        for route in (path, path.removeprefix("/v1")):
            app.add_api_route(route, endpoint, methods=["POST"], include_in_schema=False)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> Response:
        return error_response(exc, request.url.path)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        message = "Not Found" if exc.status_code == 404 else str(exc.detail)
        headers = dict(exc.headers or {})  # a 405's Allow header lists the methods the path takes
        return error_response(APIError(exc.status_code, message, headers=headers), request.url.path)

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path)
        err = APIError(500, f"internal error: {type(exc).__name__}: {exc}")
        return error_response(err, request.url.path)

    origins = state.config.allowed_origins
    app.add_middleware(
        CORSMiddleware,
        allow_origins=origins if isinstance(origins, list) else [origins],
        allow_methods=["*"],
        allow_headers=["*"],
    )
    app.add_middleware(APIKeyMiddleware, key=state.config.api_key)
    app.add_middleware(ReleaseAfterLargeBodies)
    if state.metrics is not None:
        state.metrics.install(app)
    return app


class APIKeyMiddleware:
    """`--api-key`: every endpoint but /health and the pages' static files needs
    `Authorization: Bearer KEY` or Anthropic's `x-api-key: KEY`; a wrong or missing key is a
    401 in the API's shape. CORS preflights pass. The pages ask for the key and send it."""

    OPEN_PATHS = {"/health", "/", "/dashboard"}
    OPEN_PREFIX = "/ui/"  # the pages' scripts, styles and vendored libraries

    def __init__(self, app, key: str | None) -> None:
        self.app, self.key = app, key

    def _presented(self, headers: dict[bytes, bytes]) -> str | None:
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        key = headers.get(b"x-api-key")
        return key.decode("latin-1").strip() if key is not None else None

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "")
        if self.key is None or scope["type"] != "http" or path in self.OPEN_PATHS:
            return await self.app(scope, receive, send)
        if path.startswith(self.OPEN_PREFIX) and scope["method"] in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        if scope["method"] == "OPTIONS":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        given = self._presented(headers)
        if given is not None and hmac.compare_digest(given.encode(), self.key.encode()):
            return await self.app(scope, receive, send)
        err = APIError(401, "missing or invalid API key")
        path = scope["path"]
        body = json.dumps(anthropic_body(err) if is_anthropic_path(path) else openai_body(err))
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer")],
            }
        )  # fmt: skip
        await send({"type": "http.response.body", "body": body.encode()})


# `/v1/models`: the served model, models loaded on request, and the mlx-lm models in the local
# Hugging Face cache, as mlx_lm.server scans it; each with its context length (vLLM's field).
_HF_FILES = ("config.json", "model.safetensors.index.json", "tokenizer_config.json")


def _hf_cache_models() -> list[dict[str, Any]]:
    """Repos in the HF cache that look like mlx-lm models (mlx_lm.server's rule)."""
    try:
        from huggingface_hub import constants, scan_cache_dir

        info = scan_cache_dir(constants.HF_HUB_CACHE)  # read now, not at hub import
    except Exception:  # noqa: BLE001 - no cache or an unreadable one: nothing to list
        return []
    out = []
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        files = {f.file_name for rev in repo.revisions for f in rev.files}
        if not all(f in files for f in _HF_FILES):
            continue
        entry = {"id": repo.repo_id, "object": "model", "created": int(repo.last_modified)}
        newest = max(repo.revisions, key=lambda r: r.last_modified)
        entry["max_model_len"] = context_length(newest.snapshot_path)
        out.append(entry)
    return out


def _entry(served: Any, created: int) -> dict[str, Any]:
    return {
        "id": served.name,
        "object": "model",
        "created": created,
        "owned_by": "mlxd",
        "max_model_len": served.context_length,
    }


def _pool_entry(entry: Any, created: int) -> dict[str, Any]:
    """A pool model: its state, size in bytes (loaded weights, else the files on disk) and
    whether it is pinned."""
    served, spec = entry.served, entry.spec
    if served is not None:
        ctx = served.context_length
    else:
        ctx = context_length(Path(spec.path).expanduser()) if spec.path else None
    return {"id": entry.name, "object": "model", "created": created, "owned_by": "mlxd",
            "max_model_len": ctx, "state": entry.state, "size_bytes": entry.size(),
            "pinned": spec.pinned, "aliases": list(spec.aliases)}  # fmt: skip


def _listing(state: ServerState) -> list[dict[str, Any]]:
    from .lora import model_entries

    now = int(state.started)
    seen, data = set(), []
    provider = state.provider
    for entry in list(provider.pool.entries.values()):
        seen.add(entry.name)
        data.append(_pool_entry(entry, now))
    for served in provider.loaded():  # request-named adapters over a model
        if served.name not in seen:
            seen.add(served.name)
            data.append(_entry(served, now))
    if provider.loras.entries():  # the LoRA adapters, with `parent`
        for entry in model_entries(state, now):
            if entry["id"] not in seen:
                seen.add(entry["id"])
                data.append(entry)
    for entry in _hf_cache_models():
        if entry["id"] not in seen:
            seen.add(entry["id"])
            data.append(entry)
    return data


async def list_models(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.mlxd
    return JSONResponse({"object": "list", "data": _listing(state)})


async def get_model(request: Request) -> JSONResponse:
    """A listed id, or any name a request may give for the served model (its other names,
    `default_model`, a bare name that falls back): that model's entry under the name asked."""
    state: ServerState = request.app.state.mlxd
    wanted = request.path_params["model_id"]
    for entry in _listing(state):
        if entry["id"] == wanted:
            return JSONResponse(entry)
    provider = state.provider
    if (found := provider.pool.find(wanted)) is not None:
        return JSONResponse({**_pool_entry(found, int(state.started)), "id": wanted,
                             "root": found.name})  # fmt: skip
    if provider.serves(wanted) or provider.falls_back(wanted):
        entry = _pool_entry(provider.pool.entries[provider.names[0]], int(state.started))
        return JSONResponse({**entry, "id": wanted, "root": entry["id"]})
    raise APIError(404, f"model '{wanted}' not found", param="model", code="model_not_found")


async def _pool_name(request: Request) -> str:
    body = await read_json(request)
    name = body.get("model")
    if not isinstance(name, str) or not name or len(name) > 1024 or "\x00" in name:
        raise APIError(400, "model must be a model's name", param="model")
    return name


async def load_model(request: Request) -> JSONResponse:
    """llama.cpp router's `POST /models/load` {"model"}: answers once the model is loaded."""
    state: ServerState = request.app.state.mlxd
    name = await _pool_name(request)
    await offload(lambda: state.provider.load(name))
    return JSONResponse({"success": True})


async def unload_model(request: Request) -> JSONResponse:
    """llama.cpp router's `POST /models/unload` {"model"}: 409 while it runs rows."""
    state: ServerState = request.app.state.mlxd
    name = await _pool_name(request)
    await offload(lambda: state.provider.unload(name))
    return JSONResponse({"success": True})


async def health(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.mlxd
    loaded = state.provider.loaded()
    if all(served.engine.alive for served in loaded):
        return JSONResponse({"status": "ok", "uptime_s": round(time.time() - state.started, 1)})
    # An engine process restarting after a crash says why; the server keeps serving the rest.
    reasons = {s.name: getattr(s.engine, "down_reason", None) or "stopped"
               for s in loaded if not s.engine.alive}  # fmt: skip
    return JSONResponse({"status": "degraded", "reasons": reasons}, status_code=503)
