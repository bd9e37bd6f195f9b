"""OpenAI's Files API for training data: `POST /v1/files` (multipart `file` + `purpose`),
list, retrieve, content and delete. A `fine-tune` file is checked line by line at upload: each
line a JSON object in OpenAI's chat format (`messages`), or mlx-lm's `prompt`/`completion` or
`text`, one format for the whole file; the first bad line is a 400 naming it."""

import json
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse

from ..errors import APIError, bad_request
from .store import File

PURPOSES = ("fine-tune", "calibration")  # calibration: plain text for quantize's sensitivity
FORMATS = (("messages",), ("prompt", "completion"), ("text",))


def file_object(f: File) -> dict[str, Any]:
    return {"id": f.id, "object": "file", "bytes": f.bytes, "created_at": f.created_at,
            "filename": f.filename, "purpose": f.purpose, "status": "processed",
            "expires_at": None, "status_details": None}  # fmt: skip


def check_training_lines(data: bytes) -> int:
    """The number of examples; a 400 naming the first line that is not one."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"file is not UTF-8: {e}", "file") from e
    seen: tuple[str, ...] | None = None
    count = 0
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise bad_request(f"line {n} is not JSON: {e.msg}", "file") from e
        keys = next(
            (f for f in FORMATS if isinstance(row, dict) and all(k in row for k in f)), None
        )
        if keys is None:
            raise bad_request(
                f"line {n} has none of `messages`, `prompt` + `completion`, `text`", "file"
            )
        if seen is not None and keys != seen:
            raise bad_request(
                f"line {n} is in another format than line 1 ({'/'.join(seen)})", "file"
            )
        if keys == ("messages",) and not (isinstance(row["messages"], list) and row["messages"]):
            raise bad_request(f"line {n}: `messages` is a non-empty list", "file")
        seen, count = keys, count + 1
    if count == 0:
        raise bad_request("the file has no examples", "file")
    return count


async def _body(request: Request) -> bytes:
    limit = request.app.state.mlxd.config.max_request_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(
            413, f"request body is {declared} bytes; the limit is {limit} (--max-request-bytes)"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(
                413, f"request body exceeds the limit of {limit} bytes (--max-request-bytes)"
            )
        chunks.append(chunk)
    return b"".join(chunks)


async def upload(request: Request) -> JSONResponse:
    jobs = request.app.state.mlxd.jobs
    raw = await _body(request)

    async def receive() -> dict:
        return {"type": "http.request", "body": raw, "more_body": False}

    try:
        form = await Request(request.scope, receive).form(max_files=1, max_fields=8)
    except Exception as e:  # noqa: BLE001 - starlette's parser errors are the client's
        raise bad_request(
            f"expected a multipart/form-data body with `file` and `purpose`: {e}"
        ) from e
    purpose, upload_file = form.get("purpose"), form.get("file")
    if purpose not in PURPOSES:
        raise bad_request(f"purpose must be one of {', '.join(PURPOSES)}", "purpose")
    if upload_file is None or isinstance(upload_file, str):
        raise bad_request("`file` is a file part", "file")
    data = await upload_file.read()
    if purpose == "fine-tune":
        check_training_lines(data)
    file_id = f"file-{uuid.uuid4().hex[:24]}"
    folder: Path = jobs.store.root.parent / "files"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / file_id).write_bytes(data)
    name = Path(upload_file.filename or "upload").name
    f = File(file_id, name, purpose, len(data), int(time.time()), str(folder / file_id))
    jobs.store.add_file(f)
    return JSONResponse(file_object(f))


def find_file(request: Request, file_id: str, param: str = "file_id") -> File:
    for f in request.app.state.mlxd.jobs.store.files():
        if f.id == file_id:
            return f
    raise APIError(404, f"No such File object: {file_id}", param=param, code="file_not_found")


async def list_files(request: Request) -> JSONResponse:
    purpose = request.query_params.get("purpose")
    files = [f for f in request.app.state.mlxd.jobs.store.files() if purpose in (None, f.purpose)]
    if request.query_params.get("order", "desc") == "desc":
        files.reverse()
    return JSONResponse(
        {"object": "list", "data": [file_object(f) for f in files], "has_more": False}
    )


async def get_file(request: Request) -> JSONResponse:
    return JSONResponse(file_object(find_file(request, request.path_params["file_id"])))


async def file_content(request: Request) -> FileResponse:
    f = find_file(request, request.path_params["file_id"])
    return FileResponse(f.path, media_type="application/octet-stream", filename=f.filename)


async def delete_file(request: Request) -> JSONResponse:
    f = find_file(request, request.path_params["file_id"])
    request.app.state.mlxd.jobs.store.delete_file(f.id)
    Path(f.path).unlink(missing_ok=True)
    return JSONResponse({"id": f.id, "object": "file", "deleted": True})


def add_routes(app: FastAPI) -> None:
    app.add_api_route("/v1/files", upload, methods=["POST"], include_in_schema=False)
    app.add_api_route("/v1/files", list_files, methods=["GET"], include_in_schema=False)
    app.add_api_route("/v1/files/{file_id}", get_file, methods=["GET"], include_in_schema=False)
    app.add_api_route(
        "/v1/files/{file_id}", delete_file, methods=["DELETE"], include_in_schema=False
    )
    app.add_api_route(
        "/v1/files/{file_id}/content", file_content, methods=["GET"], include_in_schema=False
    )
