"""OpenAI's fine-tuning API over mlxd's jobs, so `client.fine_tuning.jobs.*` of the OpenAI SDK
works: create, list, retrieve, cancel, events (newest first, `after`/`limit`, or `stream`),
checkpoints, and pause/resume (pause is a cancel that keeps the work at its step: resume runs
on from that checkpoint)."""

from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import APIError, read_json
from ..streaming import offload, sse_stream
from . import requests as job_requests
from .jobs_api import follow, limit_of, manager
from .views import checkpoints, fine_tuning_job, openai_event, page


def _files(request: Request) -> dict[str, str]:
    return {f.path: f.id for f in manager(request).store.files()}


def _job(request: Request) -> Any:
    job = manager(request).get(request.path_params["job_id"])
    if job.type != "fine_tune":
        raise APIError(404, f"fine-tuning job {job.id!r} not found", param="fine_tuning_job_id")
    return job


async def create(request: Request) -> JSONResponse:
    state = request.app.state.mlxd
    body = await read_json(request)
    model, req, spec, priority, lease = await offload(lambda: job_requests.fine_tune(state, body))
    job = state.jobs.create("fine_tune", model, req, spec, priority, lease)
    return JSONResponse(fine_tuning_job(job, _files(request)))


async def list_jobs(request: Request) -> JSONResponse:
    files = _files(request)
    items = [fine_tuning_job(j, files) for j in reversed(manager(request).jobs("fine_tune"))]
    return JSONResponse(page(items, request.query_params.get("after"), limit_of(request)))


async def retrieve(request: Request) -> JSONResponse:
    return JSONResponse(fine_tuning_job(_job(request), _files(request)))


async def cancel(request: Request) -> JSONResponse:
    job = manager(request).cancel(_job(request).id)
    return JSONResponse(fine_tuning_job(job, _files(request)))


async def pause(request: Request) -> JSONResponse:
    job = manager(request).cancel(_job(request).id)
    return JSONResponse(fine_tuning_job(job, _files(request)))


async def resume(request: Request) -> JSONResponse:
    job = manager(request).resume(_job(request).id)
    return JSONResponse(fine_tuning_job(job, _files(request)))


async def events(request: Request) -> Response:
    job, jobs = _job(request), manager(request)
    if request.query_params.get("stream") in ("true", "1"):
        files = _files(request)
        return sse_stream(follow(jobs, job.id, lambda j: fine_tuning_job(j, files), openai_event))
    items = [openai_event(e) for e in reversed(jobs.events(job.id))]
    return JSONResponse(page(items, request.query_params.get("after"), limit_of(request)))


async def list_checkpoints(request: Request) -> JSONResponse:
    job = _job(request)
    items = checkpoints(job, manager(request).events(job.id))
    return JSONResponse(page(items, request.query_params.get("after"), limit_of(request, 10)))


def add_routes(app: FastAPI) -> None:
    base, one = "/v1/fine_tuning/jobs", "/v1/fine_tuning/jobs/{job_id}"
    routes = (("POST", base, create), ("GET", base, list_jobs), ("GET", one, retrieve),
              ("POST", one + "/cancel", cancel), ("POST", one + "/pause", pause),
              ("POST", one + "/resume", resume), ("GET", one + "/events", events),
              ("GET", one + "/checkpoints", list_checkpoints))  # fmt: skip
    for method, path, endpoint in routes:
        app.add_api_route(path, endpoint, methods=[method], include_in_schema=False)
