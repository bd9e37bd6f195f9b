"""The ASGI app: routes per API, errors in each API's shape, CORS and the API key."""

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response

from . import models_api, openai_api
from .auth import APIKeyMiddleware
from .errors import APIError, error_response
from .offload import offload
from .schemas import body_schema
from .state import ServerState

log = logging.getLogger("mlxd.serve")


def _post(app: FastAPI, path: str, endpoint: Any, schema: str) -> None:
    app.add_api_route(
        path, endpoint, methods=["POST"], openapi_extra=body_schema(schema), response_model=None
    )


def build_app(state: ServerState) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        # uvicorn re-raises SIGTERM after shutdown, so `serve`'s finally never runs then: stop
        # the engines and flush the disk tier's queue here (close() is idempotent).
        await offload(state.provider.close)

    app = FastAPI(title="mlxd", version="0.1.0", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.mlxd = state
    _post(app, "/v1/chat/completions", openai_api.chat_completions, "chat")
    _post(app, "/chat/completions", openai_api.chat_completions, "chat")
    _post(app, "/v1/completions", openai_api.completions, "completions")
    app.add_api_route("/v1/models", models_api.list_models, methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", models_api.get_model, methods=["GET"])
    app.add_api_route("/health", models_api.health, methods=["GET"])
    for extra in _optional_routes():
        extra(app, state)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> Response:
        return error_response(exc, request.url.path)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        message = "Not Found" if exc.status_code == 404 else str(exc.detail)
        return error_response(APIError(exc.status_code, message), request.url.path)

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path)
        err = APIError(500, f"internal error: {type(exc).__name__}: {exc}")
        return error_response(err, request.url.path)

    origins = state.args.allowed_origins
    app.add_middleware(
        CORSMiddleware,
        allow_origins=origins if isinstance(origins, list) else [origins],
        allow_methods=["*"],
        allow_headers=["*"],
    )
    app.add_middleware(APIKeyMiddleware, key=state.args.api_key)
    if state.metrics is not None:
        state.metrics.install(app)
    return app


def _optional_routes() -> list[Any]:
    """Route groups living in their own modules (Anthropic, Responses, metrics)."""
    routes = []
    for name in ("anthropic_api", "responses_api", "metrics"):
        try:
            module = __import__(f"mlxd.serve.{name}", fromlist=["add_routes"])
        except ModuleNotFoundError as e:
            if e.name != f"mlxd.serve.{name}":
                raise
            continue
        routes.append(module.add_routes)
    return routes
