"""`/v1/models` (the served model, models loaded on request, and the mlx-lm models in the
local Hugging Face cache, as mlx_lm.server scans it) and `/health`."""

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from .errors import APIError
from .state import ServerState

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
        out.append({"id": repo.repo_id, "object": "model", "created": int(repo.last_modified)})
    return out


def _listing(state: ServerState) -> list[dict[str, Any]]:
    now = int(state.started)
    seen, data = set(), []
    for served in state.provider.loaded():
        if served.name not in seen:
            seen.add(served.name)
            data.append({"id": served.name, "object": "model", "created": now, "owned_by": "mlxd"})
    for entry in _hf_cache_models():
        if entry["id"] not in seen:
            seen.add(entry["id"])
            data.append(entry)
    return data


async def list_models(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.mlxd
    return JSONResponse({"object": "list", "data": _listing(state)})


async def get_model(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.mlxd
    wanted = request.path_params["model_id"]
    for entry in _listing(state):
        if entry["id"] == wanted:
            return JSONResponse(entry)
    raise APIError(404, f"model '{wanted}' not found", param="model", code="model_not_found")


async def health(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.mlxd
    if state.provider.default.engine.alive:
        return JSONResponse({"status": "ok", "uptime_s": round(time.time() - state.started, 1)})
    return JSONResponse({"status": "unavailable"}, status_code=503)
