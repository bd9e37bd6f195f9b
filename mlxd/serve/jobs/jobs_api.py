"""mlxd's one job envelope: `POST /v1/jobs` ({"type": "fine_tune" | "quantize", ...}),
`GET /v1/jobs[?type=&status=]`, `GET /v1/jobs/{id}`, `/events` (a page, or `?stream=true`
for server-sent events until the job is done), and `POST .../cancel` (`?force=true` kills at
once), `.../stop` (end now, keep the work) and `.../resume`."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import bad_request, read_json
from ..streaming import offload, sse_data, sse_stream
from . import requests as job_requests
from .store import DONE
from .views import job_object, page

POLL_S = 0.25  # how often a stream looks for new events


def manager(request: Request) -> Any:
    return request.app.state.mlxd.jobs


async def create(request: Request) -> JSONResponse:
    state = request.app.state.mlxd
    body = await read_json(request)
    kind = body.get("type")
    if kind not in ("fine_tune", "quantize"):
        raise bad_request("type must be fine_tune or quantize", "type")
    parse = job_requests.fine_tune if kind == "fine_tune" else job_requests.quantize
    model, req, spec, priority, lease = await offload(lambda: parse(state, body))
    job = state.jobs.create(kind, model, req, spec, priority, lease)
    return JSONResponse(job_object(job))


def limit_of(request: Request, default: int = 20) -> int:
    raw = request.query_params.get("limit", str(default))
    if not raw.isdigit() or not 1 <= int(raw) <= 1000:
        raise bad_request("limit is an integer from 1 to 1000", "limit")
    return int(raw)


async def list_jobs(request: Request) -> JSONResponse:
    q = request.query_params
    jobs = [j for j in manager(request).jobs(q.get("type")) if q.get("status") in (None, j.status)]
    items = [job_object(j) for j in reversed(jobs)]  # newest first
    return JSONResponse(page(items, q.get("after"), limit_of(request)))


async def get_job(request: Request) -> JSONResponse:
    return JSONResponse(job_object(manager(request).get(request.path_params["job_id"])))


async def events(request: Request) -> Response:
    jobs, job_id = manager(request), request.path_params["job_id"]
    jobs.get(job_id)  # a 404 before any stream starts
    if request.query_params.get("stream") in ("true", "1"):
        return sse_stream(follow(jobs, job_id, job_object))
    q = request.query_params
    after = int(q["after"]) if q.get("after", "").isdigit() else 0  # a `seq`
    items = [e for e in jobs.events(job_id) if e["seq"] > after]
    return JSONResponse({"object": "list", "data": items[: limit_of(request, 100)],
                         "has_more": len(items) > limit_of(request, 100)})  # fmt: skip


async def follow(
    jobs: Any, job_id: str, snapshot: Any, event_view: Any = None
) -> AsyncIterator[str]:
    """Every event as it lands, a job frame when its status or progress moves, `[DONE]`
    once the job has ended and its last events are out."""
    sent, last = 0, None
    while True:
        job = jobs.get(job_id)
        done = job.status in DONE  # read before the events: none can land after it
        new = jobs.events(job_id)[sent:]
        for e in new:
            yield sse_data(event_view(e) if event_view else {"object": "job.event", **e})
        sent += len(new)
        frame = (job.status, round(job.progress, 4), job.stage)
        if frame != last:
            last = frame
            yield sse_data(snapshot(job))
        if done:
            yield "data: [DONE]\n\n"
            return
        await asyncio.sleep(POLL_S)


async def cancel(request: Request) -> JSONResponse:
    force = request.query_params.get("force") in ("true", "1")
    job = manager(request).cancel(request.path_params["job_id"], force=force)
    return JSONResponse(job_object(job))


async def stop(request: Request) -> JSONResponse:
    return JSONResponse(job_object(manager(request).stop(request.path_params["job_id"])))


async def resume(request: Request) -> JSONResponse:
    return JSONResponse(job_object(manager(request).resume(request.path_params["job_id"])))


def add_routes(app: FastAPI) -> None:
    one = "/v1/jobs/{job_id}"
    routes = (("POST", "/v1/jobs", create), ("GET", "/v1/jobs", list_jobs), ("GET", one, get_job),
              ("GET", one + "/events", events), ("POST", one + "/cancel", cancel),
              ("POST", one + "/stop", stop), ("POST", one + "/resume", resume))  # fmt: skip
    for method, path, endpoint in routes:
        app.add_api_route(path, endpoint, methods=[method], include_in_schema=False)
