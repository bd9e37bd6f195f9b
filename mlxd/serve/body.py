"""Reading a request body: size cap (413), JSON (400 naming the problem), an object (400)."""

import json
from typing import Any

from starlette.requests import Request

from .errors import APIError, bad_request

MAX_BODY_BYTES = 64 << 20


async def read_json(request: Request, limit: int = MAX_BODY_BYTES) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"request body is {declared} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise bad_request(f"request body is not valid UTF-8: {e}") from e
    except json.JSONDecodeError as e:
        raise bad_request(f"Invalid JSON in request body: {e}") from e
    except RecursionError as e:
        raise bad_request("request body nests too deeply") from e
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    return body
